"""Cost model v5, the graph rules (issue 63, item 1): where each engine's captured CUDA graphs
end by default (by version's rule, GPU and draft length) and as a user sets them, carried into
the built profile and printed with the eager term that lies past them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specsim.cli import main
from specsim.sim.cost import build as bd
from specsim.sim.cost import paths
from specsim.sim.cost.build_profile import bill, build
from specsim.sim.cost.graphs import capture
from specsim.sim.cost.models import builtin_model


@pytest.mark.parametrize(
    "gpu, drafts, seqs, batched, want",
    [
        ("H100", 7, 256, 8192, 512),  # min(256 x 8 x 2, 512)
        ("B300", 7, 256, 8192, 1024),  # data-center Blackwell's ceiling (vllm PR #49390)
        ("GB200", 0, 256, 8192, 512),  # no speculation: 256 x 1 x 2
        ("H100", 7, 16, 8192, 256),  # a small max_num_seqs: 16 x 8 x 2
        ("B200", 7, 256, 768, 768),  # capped at max_num_batched_tokens
        ("MI300X", 3, 256, 8192, 512),
    ],
)  # fmt: skip
def test_vllms_default_capture_rule(gpu, drafts, seqs, batched, want):
    cap = capture("vllm", gpu, drafts, seqs, batched)
    assert cap.tokens == want, cap
    assert "vllm/config/vllm.py" in cap.rule


def test_sglang_counts_requests_and_a_given_capture_is_the_engines_unit():
    assert capture("sglang", "H100", 7, 256, 8192, given=64).tokens == 64 * 8
    assert "requests" in capture("sglang", "H100", 7, 256, 8192).rule
    assert capture("vllm", "H100", 7, 256, 8192, given=2048).tokens == 2048  # tokens
    given = capture("vllm", "H100", 7, 256, 1024, given=2048)
    assert given.tokens == 1024 and "capped at max_num_batched_tokens" in given.rule


def _dep(**kw):
    return bd.Deployment(model=builtin_model("llama-3-8b"), gpu=kw.pop("gpu", "H100"),
                         drafter="dspark:layers=5,block=7", **kw)  # fmt: skip


def test_the_built_profile_staircases_to_the_rules_edge_per_dp_rank():
    assert build(_dep())[0].capture_max_tokens == 512
    assert build(_dep(gpu="B200"))[0].capture_max_tokens == 1024
    assert build(_dep(max_running=16))[0].capture_max_tokens == 256
    model = build(_dep(dp=2, max_running=16))[0]
    assert model.capture_max_tokens == 2 * 256 and model.max_running == 2 * 16


def test_a_step_past_the_edge_pays_the_eager_term_and_the_bill_says_so():
    model, text = bill(_dep(max_running=16))
    inside, past = model.step_time(256), model.step_time(320)
    from specsim.sim.cost.eager import kernels

    launches = kernels(builtin_model("llama-3-8b"), 1, 1) * 15e-3  # ms at the assumed 15 us
    assert (past - inside) * 1000 > launches  # eager beyond 256: the launches on top
    line = next(ln for ln in text.splitlines() if "CUDA graphs" in ln)
    assert "steps to 256 tokens captured" in line and "max_num_seqs 16 x 8 tokens" in line
    assert f"runs eager: +{launches:.1f} ms" in line and "kernels launched, 15 us each" in line


# ---- the eager term (issue 63, item 1): the model's own kernels x an assumed launch time,
# not v4's one fitted 74.3 ms on every model
def test_an_eager_step_costs_the_models_own_launches():
    from specsim.sim.cost.eager import kernels

    dense = kernels(builtin_model("llama-3-70b"), 4, 1)
    v4 = kernels(builtin_model("deepseek-v4-flash"), 4, 1)
    assert dense == 80 * (2 + 5 + 2 + 3) + 8  # norms, GQA, two all-reduces, MLP; the head
    assert v4 > 4 * dense / 80 * 43  # V4's fitted extra kernels a layer
    for name, tp, lo, hi in (("llama-3-70b", 4, 5.0, 25.0), ("deepseek-v4-flash", 4, 60, 90)):
        p = bd.check(bd.Deployment(model=builtin_model(name), gpu="B300", tp=tp, capture=512))
        jump = bd.table_ms(p, [1024])[0] - sum(bd.step_terms(p, [1024]).values())[0]
        assert lo < jump < hi, (name, jump)


def test_assume_high_prints_the_rows_it_writes():
    _, mid = bill(_dep())
    _, high = bill(_dep(point="high"))

    def row(text: str, name: str) -> float:
        ln = next(x for x in text.splitlines() if x.strip().startswith(name))
        return float(ln.split()[2])  # "engine overhead <value> (<low>-<high>) ..."

    assert row(high, "engine overhead") > row(mid, "engine overhead")
    assert "decode step (high)" in high and "--assume high" in high


def test_the_cli_takes_the_engines_limits(capsys):
    argv = ["profile", "build", "--model", "llama-3-8b", "--gpu", "h100", "--engine", "sglang",
            "--drafter", "dspark:layers=5,block=7", "--capture", "32", "--max-num-seqs", "64",
            "--max-num-batched-tokens", "4096"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "steps to 256 tokens captured (--capture 32 requests" in out
    assert "max_num_seqs 64, max_num_batched_tokens 4096 per DP rank (as given)" in out
    for flag in ("--capture", "--max-num-seqs", "--max-num-batched-tokens"):
        with pytest.raises(SystemExit) as exc:
            main([*argv[:9], flag, "0"])
        assert exc.value.code == 2


# ---- collectives by interconnect (issue 63, item 3): the measured H100 latency at the mid,
# each family's published spread as its range
@pytest.mark.parametrize("gpu, low, high", [("B200", 0.8, 3.0), ("MI355X", 0.8, 2.0)])
def test_all_reduce_latency_ranges_follow_the_interconnect(gpu, low, high):
    dep = bd.Deployment(model=builtin_model("llama-3-70b"), gpu=gpu, tp=4)
    ar = {pt: bd.step_terms(bd.check(replace(dep, point=pt)), [1])["all-reduce"][0]
          for pt in bd.POINTS}  # fmt: skip
    assert ar["low"] < ar["mid"] < ar["high"]
    mid_lat = ar["mid"]  # one token: latency-bound, so the factor shows nearly whole
    assert ar["high"] / mid_lat == pytest.approx(high, rel=0.05)
    assert ar["low"] / mid_lat == pytest.approx(low, rel=0.05)
    assert "all-reduce latency x" in bill(dep)[1]


def test_hopper_all_reduce_is_the_measured_curve():
    dep = bd.Deployment(model=builtin_model("llama-3-70b"), gpu="H200", tp=4)
    ar = {pt: bd.step_terms(bd.check(replace(dep, point=pt)), [1])["all-reduce"][0]
          for pt in bd.POINTS}  # fmt: skip
    assert ar["low"] == ar["mid"] == ar["high"]
    assert "all-reduce latency x" not in bill(dep)[1]


# ---- kernel paths (issue 63, item 2): FP4 weights without FP4 tensor units run W4A16
def test_fp4_weights_on_hopper_compute_at_the_bf16_rate():
    from specsim.sim.cost.accelerators import accelerator
    from specsim.sim.cost.operators import curves

    assert curves("H100", "fp4").flops == accelerator("H100").flops("bf16")
    assert curves("B200", "fp4").flops == accelerator("B200").flops("fp4")
    assert curves("H100", "fp8").flops == accelerator("H100").flops("fp8")


def test_fp4_experts_on_hopper_are_priced_w4a16_and_said_so():
    v4 = builtin_model("deepseek-v4-flash")  # FP8 weights, FP4 experts
    hop = bd.check(bd.Deployment(model=v4, gpu="H800", tp=8))
    bw = bd.check(bd.Deployment(model=v4, gpu="B300", tp=8))
    from specsim.sim.cost.accelerators import accelerator

    assert paths.expert_flops(hop) == accelerator("H800").flops("bf16")
    assert paths.expert_flops(bw) == bw.ops.flops  # native FP4 path: the curves' rate
    assert "W4A16" in bill(bd.Deployment(model=v4, gpu="H800", tp=8))[1]
    assert "W4A16" not in bill(bd.Deployment(model=v4, gpu="B300", tp=8))[1]


# ---- verify attention at long context (issue 63, item 2): compute grows with query tokens x
# context; the step pays the longer of it and the KV read
def _attn(name: str, **kw) -> tuple[float, float]:
    p = bd.check(bd.Deployment(model=builtin_model(name), gpu="B300", **kw))
    return bd.kv_read_us_per_ktoken(p), bd.attn_us_per_qk_ktoken(p)


def test_mla_verify_turns_compute_bound_where_gqa_stays_memory_bound():
    read, comp = _attn("llama-3-70b", tp=4)
    assert 8 * comp < read  # GQA: 8 query tokens still under the KV read
    read, comp = _attn("kimi-k2", tp=1, dp=8, ep=8)  # MLA, attention data-parallel
    assert 8 * comp > read  # the absorbed path: compute-bound for a verify of 8


def test_the_engine_charges_attention_compute_by_verified_tokens_and_context():
    import numpy as np

    from specsim.sim.cost.model import CostModel
    from specsim.sim.simulate import replay

    def run(policy: str, coef: float) -> float:
        cm = CostModel("flat", np.array([1, 4096]), np.array([1.0, 1.0]),
                       attn_us_per_qk_ktoken=coef)  # fmt: skip
        kw = dict(concurrency=2, requests=8, seed=0, profile=cm)
        return replay("synthetic-chat", policy, **kw).summary["sim_time_s"]

    extra7 = run("static:7", 50.0) - run("static:7", 0.0)
    extra1 = run("static:1", 50.0) - run("static:1", 0.0)
    assert extra7 > 0 and extra1 > 0
    assert extra7 / run("static:7", 0.0) > extra1 / run("static:1", 0.0)  # more query tokens


def test_the_drafters_kv_is_split_as_the_targets():
    from specsim.sim.cost.drafters import context_us

    def ctx(name: str, **kw) -> float:
        p = bd.check(bd.Deployment(model=builtin_model(name), gpu="B300", drafter="mtp:1",
                                   **kw))  # fmt: skip
        return context_us(p, p.drafter)

    # MLA's latent is replicated over TP; DP ranks read their own requests' at once
    assert ctx("kimi-k2", tp=8) == pytest.approx(8 * ctx("kimi-k2", tp=1, dp=8, ep=8))
    assert ctx("llama-3-70b", tp=4) == pytest.approx(ctx("llama-3-70b", tp=1) / 4)  # KV heads

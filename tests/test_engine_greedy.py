"""The real engine at temperature 0: its output is the target's plain greedy decoding, token for
token, under every policy, both batch layouts and every drafter; and the batched forward it is
built on computes what the Hugging Face forward computes."""

from __future__ import annotations

import numpy as np
import pytest
from record_tiny import tiny_model

torch = pytest.importorskip("torch")

from specsim.errors import SpecsimError  # noqa: E402
from specsim.policies import get_policy  # noqa: E402
from specsim.record.dspark import DSparkDrafter, config_for_target, init_from_target  # noqa: E402
from specsim.sim.cost.profiles import get_profile  # noqa: E402
from specsim.sim.workload import Workload  # noqa: E402
from specsim.torch_engine.engine import EngineConfig, RealEngine  # noqa: E402
from specsim.torch_engine.proposers import DSparkProposer, NgramProposer, Proposal  # noqa: E402
from specsim.torch_engine.target import FlatTarget  # noqa: E402

GAMMA = 4
POLICIES = (
    "ar",
    "static:2",
    "mtp1",
    "full",
    "threshold:0.5",
    "cum-threshold:0.3",
    "hw-aware",
    "hw-aware-global",
    "zos",
    "goodput",
)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=1).double()  # float64: argmax ties cannot flip between code paths


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(5)
    return [rng.integers(3, 96, n).tolist() for n in (5, 9, 14, 7, 11)]


OUT = (20, 27, 16, 30, 23)


@pytest.fixture(scope="module")
def reference(model, prompts):
    """Plain greedy decoding by Hugging Face generate, one prompt at a time, no EOS stop."""
    refs = []
    for p, n in zip(prompts, OUT, strict=True):
        out = model.generate(
            torch.tensor([p]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        refs.append(out[0, len(p) :].tolist())
    return refs


class NoisyOracle:
    """Drafts the target's true greedy continuation with each token corrupted with probability
    0.3, so every step exercises accepted prefixes, rejections and bonus tokens."""

    feature_layers = (1, 2)

    def __init__(self, model, gamma: int = GAMMA, seed: int = 0) -> None:
        self.model, self.gamma = model, gamma
        self.rng = np.random.default_rng(seed)

    def propose(self, slots, anchors, seq_buf, feat_buf, temperature, generator):  # noqa: ANN001
        toks = []
        for s, a in zip(slots.tolist(), anchors.tolist(), strict=True):
            ctx = seq_buf[s, : a + 1][None]
            out = self.model.generate(
                ctx, max_new_tokens=self.gamma, do_sample=False, eos_token_id=None, pad_token_id=0
            )[0, a + 1 :].numpy()
            bad = self.rng.random(self.gamma) < 0.3
            out = np.where(bad, (out + 1 + self.rng.integers(0, 90, self.gamma)) % 96, out)
            toks.append(out)
        conf = self.rng.uniform(0.05, 0.95, (len(toks), self.gamma))
        return Proposal(tokens=np.stack(toks).astype(np.int64), conf=conf)


def closed(prompts, conc: int, n_jobs: int | None = None) -> Workload:
    n = len(prompts)
    return Workload(
        kind="closed",
        describe=f"closed {conc}",
        arrival_s=None,
        trace_idx=np.arange(n),
        prompt_len=np.array([len(p) for p in prompts]),
        output_len=np.array(OUT),
        concurrency=conc,
        max_jobs=n_jobs or n,
    )


def run(model, proposer, policy, prompts, conc=3, layout="flat", cost="h100-dense-8b"):
    cfg = EngineConfig(layout=layout, max_running=conc, warmup_steps=0)
    return RealEngine(
        model, proposer, get_policy(policy), get_profile(cost), prompts, closed(prompts, conc), cfg
    ).run()


def outputs_by_prompt(res) -> dict[int, list[int]]:
    return {int(t): o for t, o in zip(res.raw.job_trace, res.outputs, strict=True)}


@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_flat_forward_matches_hugging_face(model, prompts, layout):
    """Chunked, multi-request forwards give the logits and hidden states of one full pass."""
    ft = FlatTarget(model, slots=4, cap=64, feature_layers=(1, 3), layout=layout)
    seqs = prompts[:3]
    cut = [2, 5, 1]
    a = ft.forward([0, 2, 3], [s[:c] for s, c in zip(seqs, cut, strict=True)])
    b = ft.forward([0, 2, 3], [s[c:] for s, c in zip(seqs, cut, strict=True)])
    for j, s in enumerate(seqs):
        ref = model(torch.tensor([s]), output_hidden_states=True)
        got = torch.cat(
            [a.logits[a.offsets[j] : a.offsets[j + 1]], b.logits[b.offsets[j] : b.offsets[j + 1]]]
        )
        feats = torch.cat(
            [a.feats[a.offsets[j] : a.offsets[j + 1]], b.feats[b.offsets[j] : b.offsets[j + 1]]]
        )
        want = torch.cat([ref.hidden_states[2][0], ref.hidden_states[4][0]], -1)
        assert torch.allclose(got.double(), ref.logits[0].double(), atol=1e-9)
        assert torch.allclose(feats, want, atol=1e-9)


def test_truncate_rolls_back_rejected_tokens(model, prompts):
    """After truncation the cache is as if the dropped tokens were never fed."""
    p = prompts[1]
    ft = FlatTarget(model, slots=1, cap=64)
    ft.forward([0], [p[:4]])
    ft.forward([0], [[50, 51, 52]])  # three tokens that are then rejected
    ft.truncate(0, 4)
    got = ft.forward([0], [p[4:]]).logits
    ref = model(torch.tensor([p])).logits[0, 4:]
    assert torch.allclose(got.double(), ref.double(), atol=1e-9)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_is_greedy_exact(model, prompts, reference, policy):
    res = run(model, NoisyOracle(model), policy, prompts)
    got = outputs_by_prompt(res)
    for t, ref in enumerate(reference):
        assert got[t] == ref, f"{policy}: prompt {t} differs from greedy decoding"
    s = res.summary
    if policy != "ar":  # the noisy oracle makes both outcomes happen
        assert 0 < s["accepted_draft_tokens"] < s["verified_draft_tokens"]
        assert s["tau"] > 1.0


@pytest.mark.parametrize("layout", ["flat", "padded"])
@pytest.mark.parametrize("conc", [1, 5])
def test_layouts_and_batching_do_not_change_outputs(model, prompts, reference, layout, conc):
    res = run(model, NoisyOracle(model, seed=conc), "hw-aware", prompts, conc=conc, layout=layout)
    assert outputs_by_prompt(res) == dict(enumerate(reference))


def test_dspark_and_ngram_drafters_are_greedy_exact(model, prompts, reference):
    cfg = config_for_target(
        model.config, num_hidden_layers=1, markov_rank=8, block_size=GAMMA, context_window=16
    )
    torch.manual_seed(0)
    drafter = DSparkDrafter(cfg)
    init_from_target(drafter, model, None)
    drafter = drafter.double().eval()
    for prop in (DSparkProposer(drafter, model), NgramProposer(3, GAMMA, 96)):
        res = run(model, prop, "full", prompts)
        assert outputs_by_prompt(res) == dict(enumerate(reference))


def test_dspark_proposer_matches_the_recorders_drafting(model, prompts, reference):
    """Batched drafting in the engine gives the drafts DSparkDrafter.draft gives per sequence."""
    cfg = config_for_target(
        model.config, num_hidden_layers=1, markov_rank=8, block_size=GAMMA, context_window=16
    )
    torch.manual_seed(1)
    drafter = DSparkDrafter(cfg)
    init_from_target(drafter, model, None)
    drafter = drafter.double().eval()
    prop = DSparkProposer(drafter, model)
    seqs = [torch.tensor(p + r) for p, r in zip(prompts[:3], reference[:3], strict=True)]
    cap = max(s.numel() for s in seqs)
    seq_buf = torch.zeros((3, cap), dtype=torch.long)
    feat_buf = torch.zeros((3, cap, 2 * model.config.hidden_size), dtype=torch.float16)
    anchors = []
    for i, s in enumerate(seqs):
        hs = model(s[None], output_hidden_states=True).hidden_states
        f = torch.cat([hs[j + 1][0] for j in cfg.target_layer_ids], -1).to(torch.float16)
        seq_buf[i, : s.numel()] = s
        feat_buf[i, : s.numel()] = f
        anchors.append(len(prompts[i]) + 3)
    got = prop.propose(np.arange(3), np.array(anchors), seq_buf, feat_buf, 0.0, None)
    for i, s in enumerate(seqs):
        want = drafter.draft(feat_buf[i, : s.numel()], s, torch.tensor([anchors[i]]))
        assert np.array_equal(got.tokens[i], want.tokens[0].numpy())
        assert np.allclose(got.conf[i], want.conf[0].numpy(), atol=1e-6)


def test_mutant_verifier_is_caught(model, prompts, reference):
    """A verifier that accepts one draft past the first mismatch must break the equality."""

    class Greedy1More(RealEngine):
        def _accept(self, logits, drafts, q):  # noqa: ANN001
            m, emit = super()._accept(logits, drafts, q)
            if m < drafts.shape[0]:
                return m + 1, [int(x) for x in drafts[: m + 1]] + [int(logits[m + 1].argmax())]
            return m, emit

    cfg = EngineConfig(max_running=3, warmup_steps=0)
    res = Greedy1More(
        model,
        NoisyOracle(model),
        get_policy("full"),
        get_profile("h100-dense-8b"),
        prompts,
        closed(prompts, 3),
        cfg,
    ).run()
    assert outputs_by_prompt(res) != dict(enumerate(reference))


def test_engine_metrics_are_consistent(model, prompts, reference):
    res = run(model, NoisyOracle(model), "full", prompts)
    s, st = res.summary, res.steps
    assert s["output_tokens"] == sum(OUT)
    assert int(st["emitted_tokens"].sum()) == sum(OUT)
    assert int(st["accepted_drafts"].sum()) == s["accepted_draft_tokens"]
    assert (
        st["batch_tokens"] == st["decoding"] + st["verified_drafts"] + st["prefill_tokens"]
    ).all()
    assert (np.diff(st["time_s"]) > 0).all()
    assert np.all(res.requests["ttft_ms"] > 0)
    for col in ("draft_s", "sched_s", "verify_s", "accept_s"):
        assert (st[col] >= 0).all()


def test_oracle_policy_is_refused(model, prompts):
    with pytest.raises(SpecsimError, match="oracle"):
        run(model, NoisyOracle(model), "oracle", prompts)


def test_open_loop_waits_for_arrivals(model, prompts, reference):
    """Open loop: nobody is admitted before arriving; an idle engine sleeps until the next
    arrival; outputs stay greedy-exact."""
    n = len(prompts)
    arrivals = np.array([0.0, 0.05, 0.1, 0.6, 0.61])
    wl = Workload(
        kind="poisson",
        describe="test arrivals",
        arrival_s=arrivals,
        trace_idx=np.arange(n),
        prompt_len=np.array([len(p) for p in prompts]),
        output_len=np.array(OUT),
    )
    cfg = EngineConfig(max_running=2, warmup_steps=0)
    res = RealEngine(
        model,
        NoisyOracle(model),
        get_policy("hw-aware"),
        get_profile("h100-dense-8b"),
        prompts,
        wl,
        cfg,
    ).run()
    raw = res.raw
    assert np.array_equal(raw.arrival_s, arrivals)
    assert np.all(raw.admitted_s >= raw.arrival_s)
    assert np.all(raw.first_token_s > raw.admitted_s)
    assert outputs_by_prompt(res) == dict(enumerate(reference))
    assert res.steps["running"].max() <= 2


@pytest.mark.parametrize("layout", ["flat", "padded"])
def test_logits_only_where_asked(model, prompts, layout):
    """A prompt being prefilled asks for its last row's logits only: the same numbers as the
    full forward's last row, and the other requests' rows unchanged."""
    seqs = prompts[:3]
    full = FlatTarget(model, slots=3, cap=64, layout=layout).forward([0, 1, 2], seqs)
    some = FlatTarget(model, slots=3, cap=64, layout=layout).forward([0, 1, 2], seqs, [1, 99, 2])
    assert some.logits.shape[0] == 1 + len(seqs[1]) + 2
    for j, k in enumerate((1, len(seqs[1]), 2)):
        want = full.logits[full.offsets[j + 1] - k : full.offsets[j + 1]]
        assert torch.allclose(some.logits_of(j), want, atol=1e-9)


def test_cpu_clock_is_virtual(model, prompts, reference):
    """On the CPU clock an idle engine jumps to the next arrival instead of sleeping: an
    arrival 1000 s away costs no wall time, and the outputs stay greedy-exact."""
    from specsim.torch_engine.clock import EngineClock

    clk = EngineClock("cpu")
    clk.start()
    clk.wait_until(50.0)
    assert clk.now() >= 50.0 and clk.wall() < 1.0
    n = len(prompts)
    wl = Workload(
        kind="poisson",
        describe="far arrivals",
        arrival_s=np.array([0.0, 1000.0, 1000.5, 2000.0, 2000.0]),
        trace_idx=np.arange(n),
        prompt_len=np.array([len(p) for p in prompts]),
        output_len=np.array(OUT),
    )
    cfg = EngineConfig(max_running=2, warmup_steps=0, clock="cpu")
    res = RealEngine(
        model, NoisyOracle(model), get_policy("full"), get_profile("h100-dense-8b"), prompts,
        wl, cfg,
    ).run()  # fmt: skip
    raw = res.raw
    assert raw.finish_s.max() > 2000.0 and res.steps["wall_end_s"].max() < 60.0
    assert np.all(raw.admitted_s >= raw.arrival_s)
    assert outputs_by_prompt(res) == dict(enumerate(reference))


def test_closed_loop_retimes_onto_the_wall_clock(model, prompts):
    """One closed-loop run on the CPU clock gives its wall-clock timeline: every time stamp
    maps to the wall clock of the step boundary it sits on."""
    from specsim.sim.steplog import retime

    cfg = EngineConfig(max_running=2, warmup_steps=0, clock="cpu")
    res = RealEngine(
        model, NoisyOracle(model), get_policy("full"), get_profile("h100-dense-8b"), prompts,
        closed(prompts, 2), cfg,
    ).run()  # fmt: skip
    w = retime(res.raw, res.steps)
    st = res.steps
    np.testing.assert_allclose(w.step_log[:, 0], st["wall_start_s"])
    np.testing.assert_allclose(w.step_log[:, 0] + w.step_log[:, 1], st["wall_end_s"])
    assert set(np.round(w.finish_s, 12)) <= set(np.round(st["wall_end_s"], 12))
    assert w.sim_time_s == pytest.approx(float(st["wall_end_s"].iloc[-1]))
    assert np.array_equal(w.emitted, res.raw.emitted)


@pytest.mark.parametrize(
    ("kind", "device", "threads", "needle"),
    [("cpu", "cuda", 1, "GPU"), ("cpu", "cpu", 2, "--threads 1"), ("sun", "cpu", 1, "clock")],
)
def test_clock_refusals(kind, device, threads, needle):
    from specsim.torch_engine.clock import check_clock

    with pytest.raises(SpecsimError, match=needle):
        check_clock(kind, device, threads)

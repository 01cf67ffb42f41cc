"""Reliability v5, tune and its lists: an operator's frictions (issue 62), each on the real CLI
or the function it calls, on shipped traces and a built profile."""

from __future__ import annotations

import warnings

import pytest

from specsim.analysis.tune.configs import render
from specsim.analysis.tune.run import TuneConfig, truncate_block, tune
from specsim.analysis.tune.score import acceptance_check
from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.policies import get_policy
from specsim.sim.simulate import replay
from specsim.trace.io import read_trace


# ---- one rule for every comma-separated list: an empty item is a typo, refused
@pytest.mark.parametrize("text", ["4,,8", "4,", ",4", ""])
def test_an_empty_item_in_a_load_list_is_refused(text, capsys):
    assert main(["tune", "chat", "--engine", "vllm", "--concurrency", text, "--seeds", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--concurrency" in err and ("empty" in err), err


def test_an_empty_item_in_a_knob_list_is_refused(capsys):
    argv = ["tune", "chat", "--engine", "trtllm", "--concurrency", "4", "--gains", "0,,0.04"]
    assert main(argv) == 2
    assert "--gains has an empty item" in capsys.readouterr().err


# ---- a gain past any trim's reach: refused where it is read, no numpy overflow warning
@pytest.mark.parametrize("gains", ["1e308", "inf", "11", "-0.01"])
def test_a_huge_gain_is_refused_in_one_line(gains, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow warning would fail here
        argv = ["tune", "chat", "--engine", "trtllm", "--concurrency", "4", "--gains", gains]
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--gains takes minimum predicted gains in [0, 10]" in err and "overflow" not in err


def test_the_policy_takes_the_same_gain_rule():
    with pytest.raises(SpecsimError, match=r"G, the minimum predicted gain, 0\.\.10"):
        get_policy("trtllm-confidence:1e308")
    assert get_policy("trtllm-confidence:10").name == "trtllm-confidence:10:1"


# ---- what tune recommends, replay takes
@pytest.mark.parametrize("k", [3, 6])
def test_vllm_adaptive_k_is_tunes_first_k_drafts(k):
    """``vllm-adaptive:K`` on the whole trace replays exactly what tune's k-draft setting is
    (the block's first K drafts, drafting K), so the recommendation replays as printed."""
    tr = read_trace("traces/synthetic-chat.parquet")
    opts = dict(concurrency=16, requests=96, seed=3, profile="llama-3-8b-h100")
    a = replay(truncate_block(tr, k), "vllm-adaptive", **opts).summary
    b = replay(tr, f"vllm-adaptive:{k}", **opts).summary
    for key in ("throughput_tok_s", "tau", "engine_steps", "tpot_ms_p90"):
        assert a[key] == b[key], key


def test_replay_takes_vllm_adaptive_k_and_refuses_a_bad_k(capsys):
    argv = ["replay", "synthetic-chat", "--concurrency", "4", "--requests", "16"]
    assert main([*argv, "--policy", "vllm-adaptive:6"]) == 0
    for bad in ("0", "x", "³", "-1"):
        assert main([*argv, "--policy", f"vllm-adaptive:{bad}"]) == 2
        assert "num_speculative_tokens" in capsys.readouterr().err


# ---- the trace's acceptance against a BUILT profile's deployment
def test_the_acceptance_warning_names_a_built_profiles_deployment(tmp_path):
    from specsim.sim.cost.profiles import get_profile

    out = tmp_path / "l8.csv"
    assert main(["profile", "build", "--model", "llama-3-8b", "--gpu", "h100", "--tp", "1",
                 "--engine", "vllm", "--drafter", "dspark:layers=5,block=7",
                 "--out", str(out)]) == 0  # fmt: skip
    chat = read_trace("traces/chat.parquet")
    got = acceptance_check(chat, get_profile(out))
    assert got["warning"] and "llama-3-8b on 1 x H100" in got["warning"], got
    assert got["deployment"].startswith("llama-3-8b on 1 x H100")
    assert (
        acceptance_check(read_trace("traces/synthetic-chat.parquet"), get_profile(out))["warning"]
        is None
    )  # paper-like acceptance: nothing to say
    assert acceptance_check(chat, "smollm2-135m-cpu")["warning"] is None  # its own drafter


# ---- nothing meets the SLA: the least-bad named, the batched-token limit searched
def _tight(**kw):
    cfg = TuneConfig(engine="vllm", concurrency=(64,), profile="llama-3-8b-h100", seeds=1,
                     draft_lens=(3, 7), slo="tpot=9.5", **kw)  # fmt: skip
    return tune("synthetic-chat", cfg).loads[0]


@pytest.mark.slow
def test_no_setting_meeting_the_sla_names_the_least_bad_and_searches_batched_tokens():
    lr = _tight()
    first = [r for r in lr.rows if "tok/step" not in r["candidate"]]  # the profile's limit
    assert len(first) == 5 and not any(r["sla_met"] for r in first)
    tried = [r for r in lr.rows if "tok/step" in r["candidate"]]
    assert tried and {r["knobs"].split("max_batched_tokens=")[-1] for r in tried} >= {"512"}
    assert lr.best is not None and "tok/step" in lr.best_row["candidate"]  # a smaller limit
    assert lr.verdict.startswith("nothing met the SLA at the profile's limit of 8,192 tokens")
    assert "max_batched_tokens=" in lr.recommended_row["knobs"]


def test_the_least_bad_is_named_when_even_the_search_fails():
    lr = _tight(max_batched_tokens=(8192,))  # asked for: no search beyond it
    assert lr.best is None
    # The row nearest the SLA (smallest shortfall), found from the rows: which setting it is
    # depends on the profile (k=3 adaptive on the retired roofline), the naming does not.
    nearest = min(lr.rows, key=lambda r: r["sla_shortfall"])
    assert nearest is not lr.rows[lr.default] and nearest["role"] == "grid"
    assert f"the least-bad is {nearest['candidate']} (" in lr.verdict, lr.verdict
    over = 100.0 * (nearest["sla_shortfall"] - 1.0)
    assert f"{over:.0f}% over the SLA" in lr.verdict and "--max-batched-tokens" in lr.verdict


@pytest.mark.parametrize(
    "engine, line",
    [("vllm", "--max-num-batched-tokens 512"), ("sglang", "--chunked-prefill-size 512"),
     ("llama", "-b 512"), ("trtllm", "max_num_tokens: 512")],
)  # fmt: skip
def test_the_config_to_paste_carries_the_batched_token_limit(engine, line):
    knobs = {
        "vllm": {"num_speculative_tokens": 3, "enable_adaptive_verification": True},
        "sglang": {"speculative_dspark_block_size": 3, "speculative_num_draft_tokens": 4},
        "llama": {"spec_draft_n_max": 3, "spec_draft_p_min": 0.0},
        "trtllm": {"max_draft_len": 3, "enable_confidence_scheduling": False},
    }[engine]
    ec = render(engine, {**knobs, "max_batched_tokens": 512}, block=7)
    assert ec.text.splitlines()[-1] == line
    assert "max_batched_tokens" not in ec.text
    plain = render(engine, knobs, block=7)
    assert line not in plain.text


def test_the_explanation_says_what_a_step_is(capsys):
    argv = ["tune", "synthetic-chat", "--engine", "vllm", "--concurrency", "16",
            "--profile", "llama-3-8b-h100", "--seeds", "1", "--draft-lens", "3,7"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    why = next(ln for ln in out.splitlines() if ln.startswith("why:"))
    assert "prompt chunks included" in why and "tokens on average" in why, why


@pytest.mark.slow
def test_a_smaller_batched_token_limit_says_what_it_costs_in_ttft():
    lr = _tight()
    assert "TTFT is" in lr.verdict and "--slo ttft=MS" in lr.verdict, lr.verdict
    assert "searches it" not in lr.verdict  # the search ran: no advice to run it


# ---- profile: an unknown action is refused, not run as `measure`
@pytest.mark.parametrize("argv", [["profile", "frobnicate"], ["profile", "frobnicate", "--help"]])
def test_an_unknown_profile_action_is_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'frobnicate'" in err and "build" in err


# ---- the operator's path, as docs/vllm.md's "Start here" writes it, runs end to end
@pytest.mark.slow  # a tune at 64 in flight over 5 seeds: ~10 s
def test_the_operators_start_here_path_runs_as_written(tmp_path, monkeypatch, capsys):
    import re
    import shlex
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "vllm.md").read_text()
    section = page.split("## Start here", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    lines = [b.replace("\\\n", " ").strip() for b in blocks]
    assert [ln.split()[1] for ln in lines] == ["profile", "tune"], lines
    monkeypatch.chdir(tmp_path)
    for ln in lines:
        assert main(shlex.split(ln)[1:]) == 0, ln
    out = capsys.readouterr().out
    assert "speculative step (mid)" in out and "config to paste (vLLM):" in out
    assert "--speculative-config" in out

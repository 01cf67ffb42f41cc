"""Reliability v4 (issue #58): each class a hostile tester found on the new surfaces, fixed at
its root and checked here through the real CLI: shipped trace names in every command, report
configs (non-finite numbers, words from a fixed set, whole-number lists), the server audit's
reported laws (ranked by probability, whatever the server's order) and its flags (a server
against itself, --state at T = 0, --out over --state), the SPECSIM_* limits on every command,
masked arrays from a plug-in, temporaries a killed writer left, and --stream to a .PARQUET name.
Every refusal is one line and exit 2, no traceback, nothing written."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_fuzz_cli import run
from test_real_deployments import TINY, _toml

from specsim.errors import SpecsimError

ROOT = Path(__file__).resolve().parent.parent


def _refused(argv: list[str], *says: str) -> str:
    rc, _, err = run(argv)
    assert rc == 2, (argv, rc, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for word in says:
        assert word in err, (word, err)
    return err


# ---- shipped trace names: sweep resolves them as replay, tune and plot do ------------------


@pytest.mark.parametrize("name", ["chat", "synthetic-chat", "traces/chat.parquet"])
def test_sweep_takes_a_shipped_trace_name_from_any_folder(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no traces/ link here: the name must resolve to package data
    out = tmp_path / "s.parquet"
    rc, _, err = run(["sweep", name, "--policies", "ar,static:3", "--concurrency", "2",
                      "--requests", "8", "--allow-unsteady", "--workers", "1",
                      "--out", str(out)])  # fmt: skip
    assert rc == 0, err
    table = pd.read_parquet(out)
    assert len(table) == 2 and set(table["trace"]) == {Path(name).stem}
    assert (table["throughput_tok_s"] > 0).all()


# ---- report configs: one rule per kind of value --------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "key, value, says",
    [("vllm_accept_profile", "nosuch", "'vllm_accept_profile' is 'nosuch'; use one of"),
     ("vllm_concurrency", ["1", "x"], "'vllm_concurrency' must list finite numbers"),
     ("vllm_concurrency", ["2"], "'vllm_concurrency' must list finite numbers"),
     ("vllm_concurrency", [0.5], "'vllm_concurrency' holds 0.5"),
     ("vllm_concurrency", [], "'vllm_concurrency' is empty"),
     ("vllm_prompt_sigma", math.inf, "'vllm_prompt_sigma' is inf; give a finite number"),
     ("vllm_output_median", -3, "'vllm_output_median' is -3; give a number from 1"),
     ("vllm_output_median", 1e30, "'vllm_output_median' is 1e+30; give a number from 1 and at"),
     ("vllm_prompt_median", 0.5, "'vllm_prompt_median' is 0.5; give a number from 1"),
     ("paper_prompt_sigma", 50, "'paper_prompt_sigma' is 50; give a number > 0 and at most 4"),
     ("vllm_arms", [], "'vllm_arms' is empty"),
     ("vllm_arms", ["adaptive", 3], "'vllm_arms' holds 3"),
     ("vllm_dst_gpu", "B9000", "'vllm_dst_gpu' is 'B9000'"),
     ("vllm_dst_gpu", 300, "'vllm_dst_gpu' must be"),
     ("paper_gpus", ["H800", "X1"], "'paper_gpus' holds 'X1'"),
     ("vllm_auroc", 1.5, "'vllm_auroc' is 1.5"),
     ("paper_mtp1_acceptance", 1.2, "'paper_mtp1_acceptance' is 1.2"),
     ("trace_requests", 0, "'trace_requests' is 0")],
)  # fmt: skip
def test_a_bad_real_deployments_config_is_one_line(key, value, says, tmp_path):
    folder = tmp_path / "rd"
    folder.mkdir()
    (folder / "config.toml").write_text(_toml({**TINY, key: value}))
    _refused(["report", "rd", "--root", str(tmp_path)], says)
    assert sorted(p.name for p in folder.iterdir()) == ["config.toml"]  # nothing written


# ---- the server audit: a reported law is ranked by probability -----------------------------


def test_a_law_listed_ascending_is_read_ranked():
    """A reference that lists its top_probs ascending must not make its least likely token
    the argmax: the greedy audit would then call a lossy server identical."""
    from specsim.serve.audit.client import parse_top
    from specsim.serve.audit.margins import Margin

    entry = {"top_probs": [{"id": 9, "prob": 0.05}, {"id": 4, "prob": 0.15},
                           {"id": 7, "prob": 0.8}]}  # fmt: skip
    ids, probs = parse_top(entry, "the reference", "/completion")
    assert ids.tolist() == [7, 4, 9] and probs.tolist() == [0.8, 0.15, 0.05]
    m = Margin(ids, np.log(probs))
    assert m.argmax == 7 and m.margin == pytest.approx(math.log(0.8 / 0.15))
    # exact ties keep the server's own order (its sampler's tie-break)
    tie = {"top_probs": [{"id": 3, "prob": 0.4}, {"id": 1, "prob": 0.4}, {"id": 2, "prob": 0.2}]}
    assert parse_top(tie, "r", "/c")[0].tolist() == [3, 1, 2]


@pytest.mark.parametrize(
    "server, reference",
    [("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
     ("http://127.0.0.1:8080/", "http://localhost:8080"),
     ("http://LOCALHOST:8080", "http://[::1]:8080/")],
)  # fmt: skip
def test_a_server_audited_against_itself_is_refused(server, reference):
    _refused(["check-lossless", "--server", server, "--reference", reference],
             "--server and --reference name one server")  # fmt: skip


def test_state_is_refused_at_temperature_0_and_out_may_not_be_the_state(tmp_path):
    from test_broken_server import refused_url

    a, b = refused_url(), refused_url()
    state = str(tmp_path / "s.json")
    _refused(["check-lossless", "--server", a, "--reference", b, "--temperature", "0",
              "--state", state], "--state resumes the T > 0 audit only")  # fmt: skip
    same = str(tmp_path / "audit.json")
    _refused(["check-lossless", "--server", a, "--reference", b, "--state", same, "--out", same],
             "is the --state file")  # fmt: skip
    assert not any(tmp_path.iterdir())


# ---- SPECSIM_* limits: checked before every command ----------------------------------------


@pytest.mark.parametrize(
    "var, value",
    [("SPECSIM_MAX_REQUESTS", "abc"), ("SPECSIM_MAX_REQUESTS", "0"),
     ("SPECSIM_MAX_CELLS", "-1"), ("SPECSIM_PROGRESS_EVERY", "soon"),
     ("SPECSIM_PROGRESS_EVERY", "nan")],
)  # fmt: skip
@pytest.mark.parametrize("argv", [["traces", "info", "chat"],
                                  ["profile", "show", "llama-3-8b-h100"],
                                  ["replay", "chat", "--requests", "4", "--concurrency", "1",
                                   "--allow-unsteady"]])  # fmt: skip
def test_a_malformed_limit_is_refused_on_every_command(var, value, argv, monkeypatch):
    monkeypatch.setenv(var, value)
    _refused(argv, var)


# ---- plug-ins: a masked array never passes the fast check ----------------------------------

PLUGIN = """
import numpy as np
from specsim.policies.base import Policy

def _schedule(inp):
    return np.full(inp.n_requests, min(2, inp.drafted if inp.drafted is not None else 7))

def policy():
    return Policy(name="masked", {hook}=lambda inp: {value})
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "hook, value",
    [("schedule", "np.ma.masked_array(np.full(inp.n_requests, 2), mask=True)"),
     ("schedule", "np.ma.masked"),
     ("plan", "np.ma.masked")],
)  # fmt: skip
def test_a_masked_plugin_answer_is_refused_not_looped_on(hook, value, tmp_path):
    extra = "" if hook == "schedule" else "schedule=_schedule, "
    code = PLUGIN.replace("{hook}=", extra + hook + "=").replace("{value}", value)
    (tmp_path / "masked_plugin.py").write_text(textwrap.dedent(code))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "SPECSIM_PROGRESS": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "specsim.cli", "replay", "chat", "--policy",
         "masked_plugin:policy", "--requests", "4", "--concurrency", "1", "--allow-unsteady"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "masked" in proc.stderr and "Traceback" not in proc.stderr


def test_a_masked_array_with_nothing_masked_is_read_as_its_values():
    from specsim.policies.base import StepInput, checked_lengths

    inp = StepInput(conf=np.full((3, 7), 0.5), step_time=None)  # type: ignore[arg-type]
    out = checked_lengths(np.ma.masked_array([1, 2, 3], mask=False), inp, "p")
    assert type(out) is np.ndarray and out.tolist() == [1, 2, 3]
    with pytest.raises(SpecsimError, match="masked entries"):
        checked_lengths(np.ma.masked_array([1, 2, 3], mask=[0, 1, 0]), inp, "p")


# ---- outputs: a killed writer's temporary is removed by the next owner ---------------------


@pytest.mark.slow
def test_kill_9_during_a_streamed_replay_leaves_no_temporary_behind(tmp_path):
    out = tmp_path / "req.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPECSIM_PROGRESS": "0"}
    argv = [sys.executable, "-m", "specsim.cli", "replay", "chat", "--concurrency", "64",
            "--stream", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen([*argv, "--requests", "400000"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(tmp_path.glob(".req.parquet.*.tmp")):
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert list(tmp_path.glob(".req.parquet.*.tmp")), "the run never opened its temporary"
    done = subprocess.run([*argv, "--requests", "200"], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["req.parquet"]


def test_stream_writes_to_an_upper_case_parquet_name(tmp_path):
    out = tmp_path / "REQ.PARQUET"
    rc, _, err = run(["replay", "chat", "--requests", "40", "--concurrency", "4", "--stream",
                      "--out", str(out)])  # fmt: skip
    assert rc == 0, err
    assert len(pd.read_parquet(out)) == 40


# ---- reports: the page states what a regeneration from scratch costs -----------------------


def test_a_resumed_report_states_the_from_scratch_time(tmp_path):
    from specsim.analysis.report import ReportContext, _regeneration_time
    from specsim.analysis.reports.common import count_cells

    ctx = ReportContext(name="r", folder=tmp_path, config={}, workers=2)
    assert _regeneration_time(ctx, 3.0) == []  # nothing reused: the run's own time says it
    table = pd.DataFrame({"wall_time_s": [600.0, 840.0, 1.0]})
    table.attrs.update(cells_total=3, cells_reused=3)
    count_cells(ctx, table, "results.parquet")
    line = _regeneration_time(ctx, 26.0)[0]
    # 600 + 840 + 1 + the run's own 26 s = 1,467 s; over 2 workers 746.5 s
    assert "about 24 minutes on one worker, 12 minutes at best on 2 idle" in line, line
    assert "1,441 s" in line, line
    assert "3 of 3 sweep cells were reused" in ctx.notes[0]


def test_a_llama_dspark_cap_past_any_block_is_no_cap():
    """llama-dspark:P:N with N past int64 was an internal error; a cap past the block cuts
    nothing, so it replays exactly as the policy without N."""
    argv = ["replay", "chat", "--requests", "8", "--concurrency", "1", "--allow-unsteady",
            "--json"]  # fmt: skip
    rc, huge, err = run([*argv, "--policy", "llama-dspark:0.5:99999999999999999999"])
    assert rc == 0, err
    rc, plain, err = run([*argv, "--policy", "llama-dspark:0.5"])
    assert rc == 0, err
    a, b = (json.loads(x.strip().splitlines()[-1]) for x in (huge, plain))
    assert a["throughput_tok_s"] == b["throughput_tok_s"] and a["tau"] == b["tau"]


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e400", "2000"])
@pytest.mark.parametrize("fmt", ["table", "sglang"])
def test_tokens_per_request_is_checked_and_refused_where_unused(value, fmt, tmp_path):
    out = str(tmp_path / ("t.csv" if fmt == "table" else "t.json"))
    _refused(["profile", "export", "llama-3-8b-h100", "--format", fmt, "--out", out,
              "--tokens-per-request", value], "--tokens-per-request")  # fmt: skip
    _refused(["profile", "export", "llama-3-8b-h100", "--format", "sglang", "--out", out,
              "--tokens-per-request", "4"], "applies to vllm-adaptive and table")  # fmt: skip
    assert not any(tmp_path.iterdir())

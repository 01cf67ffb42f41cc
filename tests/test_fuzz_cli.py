"""Hostile inputs never end in a traceback or a wrong number.

Hypothesis corrupts valid traces, profiles and arrivals files and generates hostile argument
lists; the CLI runs in-process. Every run must exit 0, 1 (a documented LOSSY verdict) or 2 (a
one-line error), never raise; a run that exits 0 with ``--json`` must print only finite,
non-negative metrics. A request limit (``SPECSIM_MAX_REQUESTS``) keeps every accepted run small,
so the suite is quick; the limit's refusal is itself one of the outcomes checked. The default
run draws a modest number of examples; ``pytest --all`` (CI) draws many more.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specsim.cli import main

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "specsim" / "data" / "profiles" / "smollm2-135m-cpu.csv"
FAST = dict(max_examples=40, suppress_health_check=list(HealthCheck))
MANY = dict(max_examples=500, suppress_health_check=list(HealthCheck))


def _examples(slow_ok: bool = True) -> dict:
    everything = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    return MANY if (everything and slow_ok) else FAST


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("fuzz")
    trace = d / "t.parquet"
    assert main(["traces", "synth", "--out", str(trace), "--requests", "30", "--output-len",
                 "40", "--prompt-len", "64", "--profile", "chat", "--seed", "3"]) == 0  # fmt: skip
    arrivals = d / "a.csv"
    arrivals.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens\n"
        + "".join(f"{0.05 * i},{50 + i},{10 + i % 7}\n" for i in range(20))
    )
    return {"dir": d, "trace": trace, "arrivals": arrivals, "profile": PROFILE}


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse: exit 2 with a usage line
            rc = int(exc.code or 0)
    return rc, out.getvalue(), err.getvalue()


def check(argv: list[str]) -> tuple[int, str, str]:
    rc, out, err = run(argv)
    assert rc in (0, 1, 2), (argv, rc, err)
    assert "Traceback" not in err, (argv, err)
    if rc == 2:
        assert err.strip(), (argv, "exit 2 without a word")
    if rc == 0 and "--json" in argv:
        summary = json.loads(out.strip().splitlines()[-1])
        for key, value in summary.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            assert math.isfinite(value) and value >= 0, (argv, key, value)
    return rc, out, err


@pytest.fixture(autouse=True)
def small_limit(monkeypatch):
    monkeypatch.setenv("SPECSIM_MAX_REQUESTS", "3000")
    monkeypatch.setenv("SPECSIM_PROGRESS", "0")


NUMBERS = st.sampled_from(
    ["-1", "0", "1", "2", "3", "0.5", "nan", "inf", "-inf", "1e20", "1e9", "abc", "", "7",
     "99999999999999999999", "1e-300", "64", "-0"]
)  # fmt: skip
POLICIES = st.sampled_from(
    ["mtp1", "hw-aware", "zos", "goodput", "static:99", "static:-1", "static:x", "threshold:nan",
     "threshold:2", "cum-threshold:-1", "nosuch", "os:system", "json:loads", "oracle", "ar"]
)  # fmt: skip
REPLAY_FLAGS = st.sampled_from(
    ["--rate", "--concurrency", "--requests", "--duration", "--seed", "--sla-tps", "--cv",
     "--burstiness", "--max-running", "--kv-tokens"]
)  # fmt: skip


@pytest.mark.slow
@settings(**_examples())
@given(
    flags=st.lists(st.tuples(REPLAY_FLAGS, NUMBERS), max_size=3),
    policy=POLICIES,
    slo=st.sampled_from([None, "ttft=100", "tpot=-1", "x=1", "ttft=1,tpot=1,e2e=1"]),
)
def test_hostile_replay_arguments(files, flags, policy, slo):
    argv = ["replay", str(files["trace"]), "--policy", policy, "--json"]
    for flag, value in flags:
        argv += [flag, value]
    if slo:
        argv += ["--slo", slo]
    check(argv)


def _corrupt_trace(table: pa.Table, how: str, rng: np.random.Generator) -> pa.Table:
    df = table.to_pandas()
    for col in ("accept_len", "position", "prompt_len", "output_len"):
        df[col] = df[col].astype(np.int64)  # room for out-of-range values
    i = int(rng.integers(len(df)))
    if how == "accept_len_huge":
        df.loc[i, "accept_len"] = 40000
    elif how == "accept_len_negative":
        df.loc[i, "accept_len"] = -3
    elif how == "conf_nan":
        row = np.array(df.loc[i, "confidence"], dtype=np.float32)
        row[0] = np.nan
        df.at[i, "confidence"] = row
    elif how == "conf_short":
        df.at[i, "confidence"] = np.array(df.loc[i, "confidence"])[:-1]
    elif how == "conf_null":
        df.at[i, "confidence"] = None
    elif how == "position_gap":
        df.loc[i, "position"] = df.loc[i, "position"] + 5
    elif how == "output_len_zero":
        df["output_len"] = 0
    elif how == "prompt_negative":
        df.loc[i, "prompt_len"] = -1
    elif how == "request_id_text":
        df["request_id"] = [
            f"r{x}\udcff" if j == i else f"r{x}" for j, x in enumerate(df["request_id"])
        ]
    elif how == "request_id_uint64":
        df["request_id"] = df["request_id"].astype(np.uint64) + np.uint64(2**63 + 5)
    elif how == "empty":
        df = df.iloc[:0]
    elif how == "drop_column":
        df = df.drop(columns=["accept_len"])
    elif how == "block_huge":
        df["confidence"] = [np.full(40000, 0.5, np.float32)] * len(df)
        df["draft_tokens"] = [np.zeros(40000, np.int32)] * len(df)
    out = pa.Table.from_pandas(df, preserve_index=False)
    if how != "no_meta":
        out = out.replace_schema_metadata(table.schema.metadata)
    return out


CORRUPTIONS = [
    "accept_len_huge", "accept_len_negative", "conf_nan", "conf_short", "conf_null",
    "position_gap", "output_len_zero", "prompt_negative", "request_id_text", "request_id_uint64",
    "empty", "drop_column", "block_huge", "no_meta",
]  # fmt: skip


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
@settings(**_examples())
@given(how=st.sampled_from(CORRUPTIONS), seed=st.integers(0, 2**16))
def test_corrupted_traces(files, how, seed):
    table = pq.read_table(files["trace"])
    bad = files["dir"] / f"bad-{how}.parquet"
    try:
        pq.write_table(_corrupt_trace(table, how, np.random.default_rng(seed)), bad)
    except (pa.ArrowException, UnicodeEncodeError):
        return  # pyarrow itself refused to write it: not a file a user can have
    replay = ["replay", str(bad), "--policy", "mtp1", "--json", "--requests", "20"]
    for argv in (["traces", "validate", str(bad)], ["traces", "info", str(bad)], replay):
        check(argv)


PROFILE_EDITS = [
    ("# sched_base_us: 0.0", "# sched_base_us: inf"),
    ("# draft_base_ms: 25.83", "# draft_base_ms: nan"),
    ("# draft_per_request_ms: 1.971", "# draft_per_request_ms: -2"),
    ("# max_running: 256", "# max_running: 0"),
    ("# kv_tokens: 1048576", "# kv_tokens: 1e30"),
    ("# max_batched_tokens: 256", "# max_batched_tokens: abc"),
    ("128,1,88.769", "128,abc,88.769"),
    ("128,2,94.729", "128,1000000000000,94.729"),
    ("128,4,138.295", "128,4,-5"),
    ("128,8,169.573", "128,8,"),
    ("context_tokens,batch_tokens,step_ms", "batch,ms"),
]


@settings(**_examples())
@given(edits=st.lists(st.sampled_from(PROFILE_EDITS), min_size=1, max_size=3), binary=st.booleans())
def test_corrupted_profiles(files, edits, binary):
    text = files["profile"].read_text()
    for old, new in edits:
        text = text.replace(old, new)
    bad = files["dir"] / "bad-profile.csv"
    if binary:
        bad.write_bytes(text.encode()[:200] + bytes(range(128, 256)))
    else:
        bad.write_text(text)
    check(["replay", str(files["trace"]), "--profile", str(bad), "--json", "--requests", "10"])


ARRIVAL_CELLS = st.sampled_from(
    ["1", "0", "-1", "nan", "", "abc", "1e20", "2.5", "inf", "99999999999999999999999"]
)


@settings(**_examples())
@given(cells=st.lists(st.tuples(ARRIVAL_CELLS, ARRIVAL_CELLS, ARRIVAL_CELLS), max_size=4))
def test_corrupted_arrivals(files, cells):
    text = files["arrivals"].read_text().splitlines()
    for i, (a, p, d) in enumerate(cells):
        text[1 + i] = f"{a},{p},{d}"
    bad = files["dir"] / "bad-arrivals.csv"
    bad.write_text("\n".join(text) + "\n")
    check(["replay", str(files["trace"]), "--arrivals", str(bad), "--json", "--policy", "zos"])


SWEEP_ARGS = st.sampled_from(
    [["--concurrency", "1,2"], ["--rates", "1,nan"], ["--rates", "1e9"], ["--concurrency", "0"],
     ["--workers", "0"], ["--workers", "-3"], ["--dask", "garbage"], ["--seeds", "0"],
     ["--requests", "-5"], ["--arrivals", "azure-conv"], ["--duration", "inf"],
     ["--policies", ""], ["--policies", "nosuch"]]
)  # fmt: skip


@settings(**_examples(slow_ok=False))
@given(extra=st.lists(SWEEP_ARGS, max_size=2))
def test_hostile_sweep_arguments(files, extra):
    out = files["dir"] / "sweep.parquet"
    argv = ["sweep", str(files["trace"]), "--policies", "mtp1", "--out", str(out), "--force"]
    argv += ["--workers", "1", "--requests", "12"]
    for e in extra:
        argv += e
    if not any(a in argv for a in ("--concurrency", "--rates", "--arrivals")):
        argv += ["--concurrency", "1"]
    check(argv)


def test_outputs_to_unwritable_places_fail_before_the_work(files, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who may write anywhere (root)")
        rc, _, err = check(["replay", str(files["trace"]), "--out", str(ro / "x.parquet")])
        assert rc == 2 and "not writable" in err
    finally:
        ro.chmod(0o755)
    rc, _, err = check(
        ["replay", str(files["trace"]), "--out", str(tmp_path / "x.csv.parquet.txt")]
    )
    assert rc == 2 and "must end in" in err


def test_out_format_follows_the_name(files, tmp_path):
    for suffix in (".parquet", ".csv", ".json"):
        out = tmp_path / f"req{suffix}"
        rc, _, _ = check(["replay", str(files["trace"]), "--policy", "mtp1", "--out", str(out)])
        assert rc == 0
        head = out.read_bytes()[:4]
        assert (head == b"PAR1") == (suffix == ".parquet")
    frame = pd.read_csv(tmp_path / "req.csv")
    assert len(frame) == 30 and "ttft_ms" in frame.columns


def _running(pid: str) -> bool:
    """A process that still runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
def test_killed_sweep_leaves_no_orphan_and_resumes_identically(files, tmp_path):
    out = tmp_path / "k.parquet"
    argv = [sys.executable, "-m", "specsim.cli", "sweep", str(files["trace"]), "--policies",
            "mtp1,zos,ar", "--concurrency", "1,2", "--requests", "600", "--workers", "2",
            "--out", str(out)]  # fmt: skip
    env = {**os.environ, "SPECSIM_PROGRESS": "0"}
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    parts = out.with_name(out.name + ".parts")
    while time.monotonic() < deadline and not (parts.is_dir() and any(parts.iterdir())):
        time.sleep(0.2)
    children = subprocess.run(
        ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
    ).stdout.split()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    alive = [c for c in children if _running(c)]
    assert not alive, f"workers outlived their sweep: {alive}"
    assert subprocess.run(argv, env=env).returncode == 0
    resumed = pd.read_parquet(out)
    fresh = tmp_path / "fresh.parquet"
    assert subprocess.run([*argv[:-1], str(fresh)], env=env).returncode == 0
    keep = [c for c in resumed.columns if "wall" not in c]
    pd.testing.assert_frame_equal(resumed[keep], pd.read_parquet(fresh)[keep])


HELD_OUT = [  # each one a traceback or a hang before the reliability work
    ["sweep", "{trace}", "--policies", "mtp1", "--concurrency", "1", "--seeds", "100000",
     "--out", "{dir}/m.parquet", "--force"],
    ["plot", "{dir}/nan.parquet", "--kind", "load", "--out", "{dir}/p.txt"],
    ["traces", "synth", "--out", "{dir}/s.parquet", "--block-size", "1000", "--force"],
    ["traces", "synth", "--out", "{dir}/s.parquet", "--output-len", "nan", "--force"],
    ["replay", "{trace}", "--seed", "-1"],
    ["replay", "{trace}", "--requests", "1e12"],
    ["replay", "{trace}", "--rate", "1e9", "--duration", "100"],
    ["replay", "{trace}", "--duration", "1e7"],
    ["replay", "{trace}", "--policy", "os:system", "--requests", "3"],
    ["sweep", "{trace}", "--policies", "mtp1", "--concurrency", "1", "--dask", "garbage",
     "--out", "{dir}/d.parquet"],
    ["sweep", "{trace}", "--policies", "mtp1", "--rates", "1e9", "--duration", "100",
     "--out", "{dir}/r.parquet"],
    ["sweep", "{trace}", "--policies", "mtp1", "--concurrency", "1", "--workers", "0",
     "--out", "{dir}/w.parquet"],
    ["report", "--root", "{dir}/nonexistent"],
    ["replay", "{dir}"],
    ["validate", "--trace", "{trace}", "--prompts", "humaneval[:1]", "--ref-every", "0"],
    ["validate", "--trace", "{trace}", "--prompts", "humaneval[:1]", "--ref-every", "nan"],
    ["validate", "--trace", "{trace}", "--prompts", "humaneval[:1]", "--ref-window", "0"],
    ["validate", "--trace", "{trace}", "--prompts", "humaneval[:1]", "--ref-large", "3"],
    ["validate", "--trace", "{trace}", "--prompts", "humaneval[:1]", "--ref-large", "-1"],
    ["validate", "--trace", "{trace}", "--prompts", "humaneval[:1]", "--ref-large-every", "0"],
    ["validate", "--trace", "{trace}", "--prompts", "humaneval[:1]", "--ref-mid", "64"],
    ["validate", "--trace", "{trace}", "--prompts", "humaneval[:1]", "--workers", "999"],
    ["validate", "--trace", "{trace}", "--prompts", "humaneval[:1]", "--workers", "2",
     "--clock", "wall"],
]  # fmt: skip


@pytest.mark.parametrize("argv", HELD_OUT, ids=lambda a: " ".join(a[:4]))
def test_held_out_hostile_commands_refuse_in_one_line(files, argv):
    pd.DataFrame({"policy": ["mtp1"], "throughput_tok_s": [float("nan")]}).to_parquet(
        files["dir"] / "nan.parquet"
    )
    argv = [a.format(trace=files["trace"], dir=files["dir"]) for a in argv]
    rc, _, err = check(argv)
    assert rc == 2 and err.strip().count("\n") == 0, (argv, err)

"""Reliability v2 (issue #38): each class of failure fixed at its root, checked on generated input.

The classes: outputs (a lock only its owner releases, names that fit the file system, the umask,
format by extension, checked before the work, stdout and stderr failures), plug-in return values
(one validation boundary), bounded list expansion, impossible numbers refused at the summary,
missing optional packages, and hostile plot / report / profile / arrivals inputs. Every refusal
is one line with exit 2; nothing exits 0 with a non-finite number; no result is lost.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz_cli import check, files  # noqa: F401 - the shared fixture and checker

from specsim.errors import SpecsimError
from specsim.outputs import claim, hidden_name, lock

ROOT = Path(__file__).resolve().parent.parent
FAST = dict(max_examples=25, suppress_health_check=list(HealthCheck), deadline=None)
ENV = {**os.environ, "SPECSIM_PROGRESS": "0"}


def _cli(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specsim.cli", *argv],
        capture_output=True,
        text=True,
        env=kw.pop("env", ENV),
        **kw,
    )


def _one_line_refusal(rc: int, err: str) -> None:
    assert rc == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert len(lines) == 1 and lines[0].startswith("specsim"), err
    assert "Traceback" not in err


# ---- the output layer


def test_a_refused_writer_leaves_the_owner_s_lock(tmp_path):
    out = tmp_path / "runs.parquet"
    lock_file = out.with_name(hidden_name(out, "lock"))
    with lock(out):
        for _ in range(2):  # the second refusal proves the first left the lock in place
            with pytest.raises(SpecsimError, match="being written by another specsim run"):
                with claim(out, force=True, suffixes=(".parquet",)):
                    pass
            assert lock_file.exists()
    assert not lock_file.exists()  # the owner removed it on the way out
    with claim(out, suffixes=(".parquet",)) as p:  # and the output is free again
        assert p == out


@pytest.mark.slow
def test_three_writers_to_one_output_one_wins_and_nothing_is_replaced(files, tmp_path):  # noqa: F811
    """A sweep runs; a second to the same --out and a third with --force and another grid are
    both refused while it runs (the old bug: the refused one deleted the lock, the third ran
    beside the first and the first then silently replaced its table)."""
    out = tmp_path / "runs.parquet"
    base = ["sweep", str(files["trace"]), "--workers", "1", "--out", str(out)]
    a = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specsim.cli",
            *base,
            "--policies",
            "mtp1,zos,ar",
            "--concurrency",
            "1,2,4",
            "--requests",
            "400",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    lock_file = out.with_name(hidden_name(out, "lock"))
    deadline = time.monotonic() + 60
    while not lock_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lock_file.exists(), "the first sweep never took its lock"
    b = _cli(*base, "--policies", "mtp1", "--concurrency", "1", "--requests", "8")
    c = _cli(*base, "--policies", "ar", "--concurrency", "2", "--requests", "8", "--force")
    assert a.poll() is None, "the first sweep ended before the others tried: make it longer"
    _one_line_refusal(b.returncode, b.stderr)
    _one_line_refusal(c.returncode, c.stderr)
    _, a_err = a.communicate(timeout=300)
    assert a.returncode == 0, a_err
    table = pd.read_parquet(out)
    assert sorted(set(table["policy"])) == ["ar", "mtp1", "zos"] and len(table) == 9
    assert not lock_file.exists()
    assert not list(tmp_path.glob(".*tmp")), "a temporary file was left behind"


def test_a_255_byte_name_is_written_and_a_longer_one_refused_first(files, tmp_path):  # noqa: F811
    name = "r" * (255 - len(".parquet")) + ".parquet"
    rc, _, err = check(
        [
            "replay",
            str(files["trace"]),
            "--requests",
            "4",
            "--concurrency",
            "1",
            "--allow-unsteady",
            "--out",
            str(tmp_path / name),
        ]
    )
    assert rc == 0, err
    assert (tmp_path / name).stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no temp or lock left
    rc, _, err = check(["replay", str(files["trace"]), "--out", str(tmp_path / ("x" + name))])
    assert rc == 2 and "file name is 256 bytes" in err


@pytest.mark.slow
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_outputs_honour_the_umask(files, tmp_path, umask, mode):  # noqa: F811
    out = tmp_path / "r.csv"
    code = (
        f"import os, sys; os.umask({umask}); from specsim.cli import main; "
        f"sys.exit(main(['replay', {str(files['trace'])!r}, '--requests', '4', "
        f"'--allow-unsteady', '--out', {str(out)!r}]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_mode & 0o777 == mode


@pytest.mark.parametrize(
    "argv",
    [
        ["traces", "synth", "--out", "{dir}/t.csv"],
        ["traces", "synth", "--out", "{dir}/t"],
        ["replay", "{trace}", "--out", "{dir}/r.txt"],
        ["plot", "{trace}", "--kind", "calibration", "--out", "{dir}/p.jpg"],
    ],
)
def test_the_format_is_the_name_s_or_a_refusal(files, argv):  # noqa: F811
    argv = [a.format(trace=files["trace"], dir=files["dir"]) for a in argv]
    rc, _, err = check(argv)
    assert rc == 2 and "must end in" in err
    assert not Path(argv[argv.index("--out") + 1]).exists()


def test_synth_checks_its_output_before_the_synthesis(tmp_path):
    t0 = time.perf_counter()
    rc, _, err = check(
        ["traces", "synth", "--out", str(tmp_path / "no" / "t.parquet"), "--requests", "100000"]
    )
    assert rc == 2 and "does not exist" in err
    assert time.perf_counter() - t0 < 10  # refused at once, not after 100k requests


def test_stdout_to_a_full_disk_is_one_line_and_a_nonzero_exit(files):  # noqa: F811
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "specsim.cli",
                "replay",
                str(files["trace"]),
                "--requests",
                "4",
                "--allow-unsteady",
                "--json",
            ],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
    _one_line_refusal(proc.returncode, proc.stderr)
    assert "standard output" in proc.stderr and "--out" in proc.stderr


@pytest.mark.slow
def test_closed_stdout_is_refused_and_closed_stderr_keeps_the_exit_code(files):  # noqa: F811
    args = [
        sys.executable,
        "-m",
        "specsim.cli",
        "replay",
        str(files["trace"]),
        "--requests",
        "4",
        "--allow-unsteady",
    ]
    no_out = subprocess.run(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        preexec_fn=lambda: os.close(1),
    )
    _one_line_refusal(no_out.returncode, no_out.stderr)
    ok = subprocess.run(args, stdout=subprocess.PIPE, env=ENV, preexec_fn=lambda: os.close(2))
    assert ok.returncode == 0 and b"Successful requests" in ok.stdout
    bad = subprocess.run(
        [*args, "--rate", "-1"], stdout=subprocess.PIPE, env=ENV, preexec_fn=lambda: os.close(2)
    )
    assert bad.returncode == 2


# ---- impossible numbers are refused, never printed


@pytest.mark.parametrize(
    "extra, msg",
    [
        (["--rate", "5e-324"], "--rate must be"),
        (["--rate", "5", "--duration", "1e-300"], "--duration must be"),
        (["--rate", "0.001", "--duration", "1"], "no request completed"),
    ],
)
def test_runs_that_would_print_impossible_numbers_are_refused(files, extra, msg):  # noqa: F811
    rc, out, err = check(["replay", str(files["trace"]), *extra, "--json"])
    assert rc == 2 and msg in err and out == ""


def test_a_profile_whose_clock_would_overflow_is_refused(files, tmp_path):  # noqa: F811
    prof = tmp_path / "huge.csv"
    prof.write_text("batch_tokens,step_ms\n1,1e308\n64,1e308\n")
    rc, _, err = check(["replay", str(files["trace"]), "--profile", str(prof), "--json"])
    assert rc == 2 and "step_ms must be milliseconds" in err


# ---- plug-ins: one validation boundary for whatever they return

RETURNS = st.one_of(
    st.lists(st.integers(min_value=-(2**80), max_value=2**80), min_size=0, max_size=5),
    st.lists(st.text(max_size=3), max_size=4),
    st.lists(st.fractions(), max_size=4),
    st.lists(st.decimals(allow_nan=True), max_size=4),
    st.lists(st.complex_numbers(allow_nan=True), max_size=4),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4),
    st.lists(st.booleans(), max_size=4),
    st.sampled_from(
        [
            "None",
            "'abc'",
            "{}",
            "object()",
            "np.ma.masked_all(inp.n_requests)",
            "np.ma.array(np.zeros(inp.n_requests, int), mask=False)",
            "np.zeros((inp.n_requests, 2), int)",
        ]
    ),
)


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("plugins")


@settings(**FAST)
@given(value=RETURNS)
def test_any_plugin_return_value_is_used_or_refused_in_one_line(files, plugin_dir, value):  # noqa: F811
    if isinstance(value, str):
        expr = value
    else:
        expr = f"_fit([{', '.join(_literal(v) for v in value)}], inp.n_requests)"
    name = f"plug_{abs(hash(repr(value))) % 10**12}"
    (plugin_dir / f"{name}.py").write_text(
        textwrap.dedent(f"""
        from decimal import Decimal
        from fractions import Fraction
        import numpy as np
        nan, inf = float('nan'), float('inf')

        def _fit(vals, n):
            return (vals * (n // max(len(vals), 1) + 1))[:n] if vals else [0] * n

        def schedule(inp):
            return {expr}
    """)
    )
    sys.path.insert(0, str(plugin_dir))
    try:
        rc, out, err = check(
            [
                "replay",
                str(files["trace"]),
                "--policy",
                f"{name}:schedule",
                "--requests",
                "6",
                "--allow-unsteady",
                "--json",
            ]
        )
    finally:
        sys.path.remove(str(plugin_dir))
    assert rc in (0, 2), err
    if rc == 2:
        assert err.strip().count("\n") == 0 and name in err, err


def _literal(v: object) -> str:
    from decimal import Decimal
    from fractions import Fraction

    if isinstance(v, Fraction):
        return f"Fraction({v.numerator}, {v.denominator})"
    if isinstance(v, Decimal):
        return f"Decimal({str(v)!r})"
    if isinstance(v, float | complex) and not np.isfinite(v):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(str(v), f"complex({v!r})")
    return repr(v)


@pytest.mark.slow
@pytest.mark.parametrize(
    "body, words",
    [
        ("def schedule(inp):\n    import sys; sys.exit(3)", "sys.exit(3)"),
        (
            "from specsim.policies.base import Policy\nimport numpy as np\n"
            # RuntimeError: ValueError is solo's documented "not for these rows" (a fallback)
            "def _solo(*a, **k):\n    raise RuntimeError('solo broke')\n"
            "def policy():\n    return Policy(name='p', solo=_solo, solo_rows=True,\n"
            "        schedule=lambda inp: np.zeros(inp.n_requests, np.int64))",
            "solo broke",
        ),
        ("import sys\nsys.exit(4)\ndef schedule(inp):\n    return []", "sys.exit"),
    ],
    ids=["exits", "solo-raises", "exits-on-import"],
)
def test_plugins_that_exit_or_raise_anywhere_are_one_line(files, tmp_path, body, words):  # noqa: F811
    (tmp_path / "evil_plugin.py").write_text(body + "\n")
    attr = "policy" if "def policy" in body else "schedule"
    env = {**ENV, "PYTHONPATH": str(tmp_path)}
    # ``solo`` is only called by the lone-request walk, which applies to a 1-D profile without
    # engine terms (specsim.sim.serving: walk_ok). The built default (llama-3-8b-h100) has
    # engine terms, so the walk never runs there: the measured table profile keeps it in play.
    profile = ["--profile", "vllm-v4-flash-tp4-b300"]
    for argv in (
        [
            "replay",
            str(files["trace"]),
            "--policy",
            f"evil_plugin:{attr}",
            "--requests",
            "4",
            "--allow-unsteady",
            *profile,
        ],
        [
            "sweep",
            str(files["trace"]),
            "--policies",
            f"evil_plugin:{attr}",
            "--concurrency",
            "1",
            "--requests",
            "4",
            "--allow-unsteady",
            "--workers",
            "2",
            "--out",
            str(tmp_path / "s.parquet"),
            *profile,
        ],
    ):
        proc = _cli(*argv, env=env)
        _one_line_refusal(proc.returncode, proc.stderr)
        assert words in proc.stderr, proc.stderr


# ---- missing optional packages


@pytest.mark.slow
@pytest.mark.parametrize(
    "blocked, argv, extra",
    [
        (
            "distributed",
            [
                "sweep",
                "{trace}",
                "--policies",
                "mtp1",
                "--concurrency",
                "1",
                "--requests",
                "4",
                "--allow-unsteady",
                "--dask",
                "tcp://127.0.0.1:1",
                "--out",
                "{dir}/d.parquet",
            ],
            "specsim[dask]",
        ),
        ("torch", ["record", "--prompts", "gsm8k[:1]", "--out", "{dir}/r.parquet"], "torch"),
    ],
)
def test_a_missing_optional_package_names_the_install(files, blocked, argv, extra):  # noqa: F811
    argv = [a.format(trace=files["trace"], dir=files["dir"]) for a in argv]
    code = (
        f"import sys; sys.modules[{blocked!r}] = None; from specsim.cli import main; "
        f"sys.exit(main({argv!r}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    _one_line_refusal(proc.returncode, proc.stderr)
    assert extra in proc.stderr


# ---- bounded expansion, hostile tables, configs, profiles, arrivals


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--concurrency", "1,2,...,1e9"),
        ("--rates", "1,1.0000000001,...,2"),
        ("--concurrency", "1e30"),
        ("--concurrency", "1,2,4,...,1e300"),
    ],
)
def test_huge_load_lists_are_refused_before_they_are_built(files, flag, value):  # noqa: F811
    t0 = time.perf_counter()
    rc, _, err = check(
        [
            "sweep",
            str(files["trace"]),
            "--policies",
            "mtp1",
            flag,
            value,
            "--out",
            str(files["dir"] / "big.parquet"),
        ]
    )
    assert rc == 2 and time.perf_counter() - t0 < 5, err


TABLES = {
    "empty": pd.DataFrame(
        {
            c: pd.Series(dtype="float64")
            for c in ("load", "throughput_per_gpu_tok_s", "per_user_tps_mean")
        }
    ).assign(
        policy=pd.Series(dtype=object),
        trace=pd.Series(dtype=object),
        throughput_tok_s=pd.Series(dtype="float64"),
    ),
    "no-trace": pd.DataFrame(
        {
            "policy": ["mtp1"],
            "load": [1.0],
            "throughput_tok_s": [1.0],
            "throughput_per_gpu_tok_s": [1.0],
            "per_user_tps_mean": [1.0],
        }
    ),
    "null-policy": pd.DataFrame(
        {
            "policy": [None],
            "trace": ["t"],
            "load": [1.0],
            "throughput_tok_s": [1.0],
            "throughput_per_gpu_tok_s": [1.0],
            "per_user_tps_mean": [1.0],
        }
    ),
    "string-speeds": pd.DataFrame(
        {
            "policy": ["mtp1"],
            "trace": ["t"],
            "load": [1.0],
            "throughput_tok_s": [1.0],
            "throughput_per_gpu_tok_s": [1.0],
            "per_user_tps_mean": ["fast"],
        }
    ),
}


@pytest.mark.parametrize("name", list(TABLES))
@pytest.mark.parametrize("kind", ["pareto", "load", "sla"])
def test_plot_refuses_tables_it_cannot_draw(tmp_path, name, kind):
    src = tmp_path / f"{name}.parquet"
    TABLES[name].to_parquet(src)
    rc, _, err = check(
        ["plot", str(src), "--kind", kind, "--sla", "40", "--out", str(tmp_path / "p.png")]
    )
    assert rc == 2 and err.count("\n") == 1
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("sla", ["0", "-5", "40,0"])
def test_plot_refuses_sla_targets_that_are_not_speeds(files, sla):  # noqa: F811
    rc, _, err = check(
        [
            "plot",
            str(files["trace"]),
            "--kind",
            "sla",
            "--sla",
            sla,
            "--out",
            str(files["dir"] / "s.png"),
        ]
    )
    assert rc == 2 and "above 0" in err


def test_a_sweep_whose_parts_name_is_a_file_or_whose_table_lost_its_keys(files, tmp_path):  # noqa: F811
    out = tmp_path / "s.parquet"
    out.with_name("s.parquet.parts").write_text("not a folder")
    argv = [
        "sweep",
        str(files["trace"]),
        "--policies",
        "mtp1",
        "--concurrency",
        "1",
        "--requests",
        "4",
        "--allow-unsteady",
        "--out",
        str(out),
    ]
    rc, _, err = check(argv)
    assert rc == 2 and "is a file" in err
    out.with_name("s.parquet.parts").unlink()
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"policy": ["mtp1"]}).replace_schema_metadata({b"specsim.sweep": b"1"})
    pq.write_table(table, out)
    rc, _, err = check(argv)
    assert rc == 2 and "no cell_key" in err


REPORT_VALUES = st.one_of(
    st.text(max_size=5),
    st.floats(allow_nan=True),
    st.booleans(),
    st.lists(st.one_of(st.text(max_size=3), st.integers()), max_size=3),
    st.integers(min_value=-5, max_value=5),
)


@settings(**FAST)
@given(
    key=st.sampled_from(["concurrency", "seeds", "requests", "sched_scales", "seed"]),
    value=REPORT_VALUES,
)
@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_report_configs_with_values_of_the_wrong_kind_are_one_line(tmp_path_factory, key, value):
    import json

    root = tmp_path_factory.mktemp("reports")
    folder = root / "z"
    folder.mkdir()
    trace = ROOT / "specsim" / "data" / "traces" / "synthetic-chat.parquet"
    cfg = {
        "kind": "zos",
        "title": "z",
        "trace": str(trace),
        "profile": "v4-flash-8xh20",
        "sched_scales": [1.0],
        "concurrency": [1],
        "requests": 8,
        "seeds": 1,
        "seed": 0,
    }
    cfg[key] = value
    lines = [
        f"{k} = {json.dumps(v)}"
        for k, v in cfg.items()
        if not (isinstance(v, float) and not np.isfinite(v))
    ]
    (folder / "config.toml").write_text("\n".join(lines) + "\n")
    rc, _, err = check(["report", "z", "--root", str(root), "--workers", "1"])
    assert rc in (0, 2), err
    if rc == 2:
        assert err.count("\n") == 1, err


def test_a_report_config_that_is_not_utf8_is_one_line(tmp_path):
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "config.toml").write_bytes(b'kind = "zos"\ntitle = "\xff\xfe"\n')
    rc, _, err = check(["report", "z", "--root", str(tmp_path)])
    assert rc == 2 and "not UTF-8" in err


@pytest.mark.parametrize(
    "csv, msg",
    [
        ("context_tokens,batch_tokens,step_ms\n64,1,2\n64,1,3\n64,8,4\n", "twice"),
        ("context_tokens,batch_tokens,step_ms\nnan,1,2\nnan,8,4\n", "non-negative"),
        ("batch_tokens,step_ms\n1,0\n8,4\n", "step_ms must be"),
    ],
)
def test_profiles_with_duplicates_or_nan_contexts_are_refused(files, tmp_path, csv, msg):  # noqa: F811
    prof = tmp_path / "p.csv"
    prof.write_text(csv)
    rc, _, err = check(["replay", str(files["trace"]), "--profile", str(prof)])
    assert rc == 2 and msg in err


def test_negative_arrival_times_are_refused(files, tmp_path):  # noqa: F811
    arr = tmp_path / "a.csv"
    arr.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n-1,10,5\n")
    rc, _, err = check(["replay", str(files["trace"]), "--arrivals", str(arr)])
    assert rc == 2 and "negative" in err


@pytest.mark.parametrize(
    "env, value",
    [
        ("SPECSIM_MAX_CELLS", "0"),
        ("SPECSIM_MAX_CELLS", "abc"),
        ("SPECSIM_MAX_REQUESTS", "0"),
        ("SPECSIM_MAX_REQUESTS", "abc"),
    ],
)
def test_limits_set_to_nonsense_are_refused(files, monkeypatch, env, value):  # noqa: F811
    monkeypatch.setenv(env, value)
    rc, _, err = check(
        [
            "sweep",
            str(files["trace"]),
            "--policies",
            "mtp1",
            "--concurrency",
            "1",
            "--requests",
            "4",
            "--out",
            str(files["dir"] / "lim.parquet"),
            "--force",
        ]
    )
    assert rc == 2 and env in err


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_calibration_of_a_long_trace_fits_in_bounded_memory():
    """STS scores its temperature grid a few at a time: the (grid, rows) block of a long trace
    is never built (it was gigabytes for a 1M-position trace)."""
    import tracemalloc

    from specsim.policies.calibrate import DEFAULT_GRID, fit_sts

    rng = np.random.default_rng(0)
    rows = 200_000
    conf = rng.uniform(0.05, 0.95, size=(rows, 7))
    acc = rng.integers(0, 8, size=rows)
    tracemalloc.start()
    fit_sts(conf, acc)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    full_block = DEFAULT_GRID.shape[0] * rows * 8
    assert peak < full_block / 2, (peak, full_block)

"""Cost-profile surfaces fail loudly and never write nonsense (``profile import|export|show``,
``--profile FILE.csv``): each class a tester found, through the real CLI. A refusal is exit 2,
one line naming the problem, no traceback, and nothing left in the output folder.

1. a falling step table: extrapolated flat past its end (never a negative step), replays;
   a loader refuses non-positive costs;
2. inputs that crashed the importers (inf, 1e400, sizes past int64, malformed bench JSON,
   infinite concurrency) are one line; string sizes beside a ``region`` column are read right;
3. ``profile export`` refuses sizes past int64, an unwritable folder, 0 tokens per request and
   absurd contexts, and writes only finite numbers;
4. silent nonsense refused: steps outside 1 us .. 1 hour, a name with a control character,
   JSON ``true`` as a number, a concurrency of 2.7, ``--out`` equal to an input;
5. newcomer traps: the GPU count assumed is said, a lone verify table needs ``--draft-free``,
   swapped vLLM tables are refused naming the swap.
"""

from __future__ import annotations

import errno
import json
import math
import pathlib
import warnings

import numpy as np
import pytest

from specsim.cli import main
from specsim.sim.cost.profiles import get_profile

VERIFY = "tokens,us\n1,5000\n8,5400\n64,7900\n"
DRAFT = "requests,us\n1,880\n8,1300\n"


@pytest.fixture
def io_dirs(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    return tmp_path / "in", tmp_path / "out"


def put(folder, name: str, text: str):  # type: ignore[no-untyped-def]
    p = folder / name
    p.write_text(text)
    return p


def refused(capsys, argv: list[str], out_dir=None, *words: str) -> str:  # type: ignore[no-untyped-def]
    """Run the CLI; assert exit 2, one error line holding ``words``, no traceback, and (with
    ``out_dir``) nothing written there, not even a hidden temporary or lock file."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's one-line refusal of a bad flag value
        rc = exc.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1 and ": error: " in lines[0], err
    assert "Traceback" not in err and "internal error" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    if out_dir is not None:
        assert sorted(p.name for p in out_dir.iterdir()) == []
    return lines[0]


def imp(fmt: str, files, out, *extra: str) -> list[str]:  # type: ignore[no-untyped-def]
    return ["profile", "import", fmt, *map(str, files), "--out", str(out), *extra]


# ---- 1. a falling table


def test_a_falling_table_is_extrapolated_flat_and_replays(io_dirs, capsys):
    """Past its last measured size a step never gets cheaper than that size (a forward over
    more tokens does not take less time): a falling last segment is held flat, so a table
    imported with --no-monotonic replays instead of crashing on a negative step."""
    from specsim.sim.simulate import replay
    from specsim.sim.toy import iid_trace

    src, out = io_dirs
    v = put(src, "v.csv", "tokens,ms\n1,5.0\n2,4.0\n4,3.0\n")
    d = put(src, "d.csv", "requests,ms\n1,0.5\n8,0.9\n")
    assert main(imp("vllm-adaptive", [v, d], out / "p.csv", "--no-monotonic", "--gpus", "1")) == 0
    prof = get_profile(str(out / "p.csv"))
    assert prof.step_time(4) == pytest.approx(3e-3)
    assert prof.step_time(10**6) == pytest.approx(3e-3)  # held flat, not 3 - 0.5 ms a token
    tr = iid_trace(16, 16, gamma=7, alpha=0.7, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        steps = replay(tr, "static:3", concurrency=8, requests=16, profile=prof).steps
    assert steps["batch_tokens"].max() > 4 and (steps["duration_s"] > 0).all()


@pytest.mark.parametrize("cost", ["0", "-1", "nan", "inf"])
def test_a_hand_written_profile_with_a_non_positive_cost_is_refused(io_dirs, capsys, cost):
    src, _ = io_dirs
    p = put(src, "p.csv", f"batch_tokens,step_ms\n1,5\n8,{cost}\n")
    refused(capsys, ["profile", "show", p], None, "step_ms must be milliseconds in [0.001,")


# ---- 2. inputs that crashed the importers


@pytest.mark.parametrize(
    "fmt, name, text, words",
    [
        ("table", "t.csv", "tokens,ms\n1,5\n8,inf\n", ["[0.001, 3,600,000]", "inf"]),
        ("table", "t.csv", "tokens,ms\n1,5\n8,1e400\n", ["[0.001, 3,600,000]"]),
        ("table", "t.csv", "tokens,ms\n1,5\n99999999999999999999999,6\n", ["whole number"]),
        ("table", "t.json", '[{"tokens": 1, "ms": 5}, {"tokens": 8, "ms": 1e400}]', ["inf"]),
        ("trtllm", "c.json", '{"token_counts": [1, 8], "step_time_ms": [5, 1e400]}', ["inf"]),
        (
            "trtllm",
            "c.json",
            '{"token_counts": [1, 99999999999999999999999], "step_time_ms": [5, 6]}',
            ["token_counts", "whole number"],
        ),
        (
            "trtllm",
            "c.json",
            '{"token_counts": [1, 8], "step_time_ms": [5, 6], "fixed_overhead_ms": Infinity}',
            ["fixed_overhead_ms"],
        ),  # fmt: skip
        (
            "sglang",
            "s.json",
            '{"sample_batch_tokens": [1, 8], "sample_steps_per_sec": [200, 0]}',
            ["sample_steps_per_sec", "inf"],
        ),  # fmt: skip
        (
            "sglang",
            "s.json",
            '{"m_probes": [1, 1e30], "theta_seconds": [0.005, 0.006]}',
            ["m_probes", "whole number"],
        ),  # fmt: skip
    ],
)
def test_values_that_crashed_an_importer_are_one_line(io_dirs, capsys, fmt, name, text, words):
    src, out = io_dirs
    f = put(src, name, text)
    refused(capsys, imp(fmt, [f], out / "p.csv"), out, *words)


def _bench(src, name: str, obj) -> pathlib.Path:  # type: ignore[no-untyped-def]
    return put(src, name, obj if isinstance(obj, str) else json.dumps(obj))


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"summary": [], "config": {"concurrency": 8}}, ["must be JSON objects"]),
        ({"summary": {"itl_ms_p50": 9.0}, "config": None}, ["must be JSON objects"]),
        ('{"max_concurrency": Infinity, "median_itl_ms": 9.0}', ["concurrency", "inf"]),
        ({"max_concurrency": 1e30, "median_itl_ms": 9.0}, ["whole number"]),
        ({"max_concurrency": 2.7, "median_itl_ms": 9.0}, ["concurrency", "2.7", "whole number"]),
        ({"max_concurrency": True, "median_itl_ms": 9.0}, ["True", "not a number"]),
        ({"max_concurrency": 8, "median_itl_ms": True}, ["not a number"]),
        ({"max_concurrency": 8, "median_itl_ms": 1e308}, ["median ITL", "3,600,000"]),
    ],
)
def test_bench_files_that_crashed_or_lied_are_refused(io_dirs, capsys, bad, words):
    src, out = io_dirs
    ok = _bench(src, "c1.json", {"max_concurrency": 1, "median_itl_ms": 8.0})
    refused(capsys, imp("bench", [ok, _bench(src, "bad.json", bad)], out / "p.csv"), out, *words)


def test_string_sizes_beside_a_region_column_are_read_as_numbers(io_dirs, capsys):
    src, out = io_dirs
    rows = [("1", 5000, "cudagraph"), ("8", 5400, "cudagraph"), ("2048", 90000, "eager")]
    v = put(src, "v.json", json.dumps([{"tokens": t, "us": u, "region": r} for t, u, r in rows]))
    d = put(src, "d.csv", DRAFT)
    assert main(imp("vllm-adaptive", [v, d], out / "p.csv", "--gpus", "4")) == 0
    prof = get_profile(str(out / "p.csv"))
    assert prof.capture_max_tokens == 8 and prof.b_max == 2048 and prof.gpus == 4


# ---- 3. profile export


EXPORT_OUT = {"vllm-adaptive": "tables", "trtllm": "c.json", "sglang": "s.json", "table": "t.csv"}
PER_REQUEST = ("vllm-adaptive", "table")  # trtllm and sglang split the step by batch size instead
EXPORT_CASES = [
    (fmt, extra, words)
    for extra, words, fmts in [
        (["--tokens", "1,99999999999999999999"], ["--tokens", "whole number"], EXPORT_OUT),
        (["--context", "1e308"], ["--context", "100,000,000"], EXPORT_OUT),
        (["--tokens-per-request", "0"], ["--tokens-per-request", "from 1"], PER_REQUEST),
        (["--tokens-per-request", "nan"], ["--tokens-per-request"], PER_REQUEST),
        (["--capture-max-tokens", "10000000000000"], ["--capture-max-tokens"], ("vllm-adaptive",)),
        # a legal context whose whole step would pass an hour: the written numbers are checked
        (["--context", "1e8", "--tokens", "1,1000000"], ["3,600,000", "lower --context"],
         ("vllm-adaptive",)),
    ]
    for fmt in fmts
]  # fmt: skip


@pytest.mark.parametrize("fmt, extra, words", EXPORT_CASES)
def test_export_refuses_inputs_that_made_nan_inf_or_crashed(io_dirs, capsys, fmt, extra, words):
    _, out = io_dirs
    argv = ["profile", "export", "v4-pro-16xh20", "--format", fmt, "--out", out / EXPORT_OUT[fmt]]
    refused(capsys, [*argv, *extra], out, *words)


def test_export_into_a_folder_it_cannot_create_is_one_line(io_dirs, capsys, monkeypatch):
    _, out = io_dirs
    real = pathlib.Path.mkdir

    def denied(self, *a, **k):  # type: ignore[no-untyped-def]
        if self.name == "tables":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "mkdir", denied)
    argv = ["profile", "export", "v4-pro-16xh20", "--out", out / "tables"]
    refused(capsys, argv, out, "cannot create folder", "Permission denied")


def test_export_into_a_read_only_folder_is_one_line(io_dirs, capsys, monkeypatch):
    import os

    _, out = io_dirs
    monkeypatch.setattr(os, "access", lambda p, mode: pathlib.Path(p) != out)
    argv = ["profile", "export", "v4-pro-16xh20", "--format", "trtllm", "--out", out / "c.json"]
    refused(capsys, argv, out, "not writable")


def _all_numbers(obj):  # type: ignore[no-untyped-def]
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _all_numbers(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in _all_numbers(v)]
    return [obj] if isinstance(obj, int | float) else []


def test_every_number_an_export_writes_is_finite_and_reads_back(io_dirs, capsys):
    _, out = io_dirs
    base = ["profile", "export", "v4-pro-16xh20", "--context", "4096"]
    assert main([*base, "--format", "trtllm", "--out", str(out / "c.json")]) == 0
    assert main([*base, "--format", "sglang", "--out", str(out / "s.json")]) == 0
    assert main([*base, "--format", "table", "--out", str(out / "t.csv")]) == 0
    assert main([*base, "--out", str(out / "v")]) == 0
    for name in ("c.json", "s.json"):
        nums = _all_numbers(json.loads((out / name).read_text()))
        assert nums and all(math.isfinite(x) and x >= 0 for x in nums)
    for f in (out / "t.csv", out / "v" / "verify_cost.csv", out / "v" / "draft_cost.csv"):
        body = [ln for ln in f.read_text().splitlines()[2:]]
        vals = [float(x) for ln in body for x in ln.split(",") if x not in ("cudagraph", "eager")]
        assert vals and all(math.isfinite(x) and x > 0 for x in vals)
    for fmt, f in (("trtllm", "c.json"), ("sglang", "s.json"), ("table", "t.csv")):
        assert main(imp(fmt, [out / f], out / f"back-{fmt}.csv", "--gpus", "16")) == 0


# ---- 4. silent nonsense


@pytest.mark.parametrize("ms", ["1e308", "5e-324", "0.0001", "3600001"])
def test_step_costs_outside_one_microsecond_to_an_hour_are_refused(io_dirs, capsys, ms):
    src, out = io_dirs
    t = put(src, "t.csv", f"tokens,ms\n1,5\n8,{ms}\n")
    refused(capsys, imp("table", [t], out / "p.csv"), out, "[0.001, 3,600,000]", "units")
    p = put(src, "p.csv", f"batch_tokens,step_ms\n1,5\n8,{ms}\n")  # the same rule by hand
    refused(capsys, ["profile", "show", p], None, "[0.001, 3,600,000]")


@pytest.mark.parametrize("name", ["a\nb", "a\rb", "tab\there", "nul\x00", "ls\u2028x"])
def test_a_name_with_a_control_character_is_refused(io_dirs, capsys, name):
    src, out = io_dirs
    t = put(src, "t.csv", "tokens,ms\n1,5\n8,6\n")
    refused(capsys, imp("table", [t], out / "p.csv", "--name", name), out, "control character")


def test_a_file_name_with_a_line_break_never_reaches_the_header(io_dirs, capsys):
    src, out = io_dirs
    t = put(src, "t\nx.csv", "tokens,ms\n1,5\n8,6\n")
    refused(capsys, imp("table", [t], out / "p.csv", "--name", "ok"), out, "control character")


@pytest.mark.parametrize(
    "fmt, name, text",
    [
        ("vllm-adaptive", "v.json", '{"1": 5000, "8": true}'),
        ("table", "t.json", '[{"tokens": 1, "ms": 5}, {"tokens": 8, "ms": true}]'),
        ("table", "t.csv", "tokens,ms\n1,True\n8,False\n"),
        ("trtllm", "c.json", '{"token_counts": [1, 8], "step_time_ms": [5, true]}'),
        ("trtllm", "c.json", '{"token_counts": [1, true], "step_time_ms": [5, 6]}'),
        ("sglang", "s.json", '{"m_probes": [1, 8], "theta_seconds": [0.005, [0.006]]}'),
    ],
)
def test_booleans_and_lists_are_not_numbers(io_dirs, capsys, fmt, name, text):
    src, out = io_dirs
    files = [put(src, name, text)]
    if fmt == "vllm-adaptive":
        files.append(put(src, "d.csv", DRAFT))
    refused(capsys, imp(fmt, files, out / "p.csv"), out, "is not a number")


@pytest.mark.parametrize("text", ["tokens,ms\n1,5\n2.5,6\n", "tokens,ms\n0,5\n8,6\n"])
def test_sizes_must_be_whole_numbers_from_one(io_dirs, capsys, text):
    src, out = io_dirs
    refused(capsys, imp("table", [put(src, "t.csv", text)], out / "p.csv"), out, "whole number")


@pytest.mark.parametrize(
    "header", ["# gpus: 2.7", "# max_running: inf", "# kv_tokens: 1e400", "# gpus: true"]
)
def test_a_hand_written_profile_header_count_must_be_whole(io_dirs, capsys, header):
    src, _ = io_dirs
    p = put(src, "p.csv", f"{header}\nbatch_tokens,step_ms\n1,5\n8,6\n")
    refused(capsys, ["profile", "show", p], None, "header")


def test_out_equal_to_an_input_is_refused_even_with_force(io_dirs, capsys):
    src, _ = io_dirs
    t = put(src, "t.csv", "batch_tokens,step_ms\n1,5\n8,6\n")
    refused(capsys, imp("table", [t], t, "--force"), None, "is also an input", "--force")
    assert t.read_text() == "batch_tokens,step_ms\n1,5\n8,6\n"
    link = src / "link.csv"
    link.symlink_to(t)
    refused(capsys, imp("table", [t], link, "--force"), None, "is also an input")
    assert t.read_text() == "batch_tokens,step_ms\n1,5\n8,6\n"


# ---- 5. newcomer traps


def test_the_gpu_count_assumed_is_said_and_can_be_set(io_dirs, capsys):
    src, out = io_dirs
    v, d = put(src, "v.csv", VERIFY), put(src, "d.csv", DRAFT)
    assert main(imp("vllm-adaptive", [v, d], out / "one.csv")) == 0
    err = capsys.readouterr().err
    assert "note: no --gpus given" in err and "--gpus 4" in err
    assert get_profile(str(out / "one.csv")).gpus == 1
    assert main(imp("vllm-adaptive", [v, d], out / "tp4.csv", "--gpus", "4")) == 0
    assert "note" not in capsys.readouterr().err
    assert get_profile(str(out / "tp4.csv")).gpus == 4
    refused(capsys, imp("vllm-adaptive", [v, d], out / "x.csv", "--gpus", "2.5"), None, "2.5")


def test_a_lone_verify_table_needs_draft_free(io_dirs, capsys):
    src, out = io_dirs
    v, d = put(src, "v.csv", VERIFY), put(src, "d.csv", DRAFT)
    refused(capsys, imp("vllm-adaptive", [v], out / "p.csv"), out, "--draft-free")
    refused(capsys, imp("vllm-adaptive", [v, d], out / "p.csv", "--draft-free"), out, "not both")
    assert main(imp("vllm-adaptive", [v], out / "p.csv", "--draft-free", "--gpus", "1")) == 0
    prof = get_profile(str(out / "p.csv"))
    assert prof.draft_ms(8, 7) == 0.0 and "drafting free" in prof.meta["source"]


def test_swapped_vllm_tables_are_refused_naming_the_swap(io_dirs, capsys):
    src, out = io_dirs
    v = put(src, "v.csv", "size,us\n1,5000\n8,5400\n64,7900\n")
    d = put(src, "d.csv", "size,us\n1,880\n8,1300\n")
    refused(capsys, imp("vllm-adaptive", [d, v], out / "p.csv"), out, "look swapped")
    v, d = put(src, "v2.csv", VERIFY), put(src, "d2.csv", DRAFT)  # the headers say it too
    refused(capsys, imp("vllm-adaptive", [d, v], out / "p.csv"), out, "verify table", "first")


def test_published_tables_still_import_and_agree_with_the_builtin(io_dirs, capsys):
    from importlib import resources

    _, out = io_dirs
    folder = resources.files("specsim") / "data" / "published" / "vllm-adaptive-verification"
    files = [folder / "verify_cost.csv", folder / "draft_cost.csv"]
    assert main(imp("vllm-adaptive", files, out / "p.csv", "--gpus", "4")) == 0
    mine, builtin = get_profile(str(out / "p.csv")), get_profile("vllm-v4-flash-tp4-b300")
    b = np.arange(1, 9000, 17)
    np.testing.assert_allclose(mine.step_time(b), builtin.step_time(b), rtol=1e-5)

"""Every kind of bad trace file: exit code 2 and ONE line naming the file, request and problem.

Bad files are written with pyarrow directly (write_trace would refuse them), then checked through
the real CLI (`specsim traces validate`, and `specsim traces info`), and once in a subprocess to
prove no traceback escapes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specsim.cli import main

GAMMA = 3
META = {"specsim.trace_version": "1", "block_size": str(GAMMA), "source": "recorded"}


def good_columns() -> dict[str, list]:
    """Request 7 has positions 0..2, request 9 positions 0..1; gamma = 3."""
    return {
        "request_id": [7, 7, 7, 9, 9],
        "position": [0, 1, 2, 0, 1],
        "prompt_len": [10, 10, 10, 4, 4],
        "output_len": [3, 3, 3, 2, 2],
        "draft_tokens": [[1, 2, 3]] * 5,
        "confidence": [[0.9, 0.5, 0.25]] * 5,
        "accept_len": [1, 0, 3, 2, 0],
    }


TYPES = {
    "request_id": pa.int64(),
    "position": pa.int32(),
    "prompt_len": pa.int32(),
    "output_len": pa.int32(),
    "draft_tokens": pa.list_(pa.int32()),
    "confidence": pa.list_(pa.float32()),
    "accept_len": pa.int16(),
    "accept_prob": pa.list_(pa.float32()),
}


def _array(name: str, values: list) -> pa.Array:
    """The spec's type where the values fit it; otherwise what pyarrow infers (a mistyped file)."""
    try:
        return pa.array(values, type=TYPES.get(name))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array(values)


def write_raw(path, cols: dict[str, list], meta: dict[str, str] | None = None) -> None:
    arrays = {k: _array(k, v) for k, v in cols.items()}
    table = pa.table(arrays).replace_schema_metadata(META if meta is None else meta)
    pq.write_table(table, path)


def edit(**changes: Callable[[dict], None]) -> Callable[[], dict]:
    def build() -> dict:
        cols = good_columns()
        for fn in changes.values():
            fn(cols)
        return cols

    return build


def _set(col: str, row: int, value) -> Callable[[dict], None]:
    def fn(cols: dict) -> None:
        cols[col] = list(cols[col])
        cols[col][row] = value

    return fn


def _drop(col: str) -> Callable[[dict], None]:
    return lambda cols: cols.pop(col)


def _replace(col: str, values) -> Callable[[dict], None]:
    def fn(cols: dict) -> None:
        cols[col] = values

    return fn


# (case id, columns builder, metadata or None for the good one, substrings the message needs)
BAD = [
    ("missing-column", edit(a=_drop("accept_len")), None, ["missing required column 'accept_len'"]),
    (
        "conf-not-float-list",
        edit(a=_replace("confidence", [["a", "b", "c"]] * 5)),
        None,
        ["column 'confidence' has type list<", "string>", "list of float32"],
    ),
    (
        "conf-scalar",
        edit(a=_replace("confidence", [0.5] * 5)),
        None,
        ["column 'confidence' has type double"],
    ),
    (
        "list-length",
        edit(a=_set("confidence", 4, [0.5, 0.5])),
        None,
        ["request 9 position 1", "confidence has 2 entries", "gamma is 3"],
    ),
    (
        "draft-length",
        edit(a=_set("draft_tokens", 1, [1, 2, 3, 4])),
        None,
        ["request 7 position 1", "draft_tokens has 4 entries"],
    ),
    (
        "conf-nan",
        edit(a=_set("confidence", 3, [0.5, float("nan"), 0.5])),
        None,
        ["request 9 position 0", "confidence[1] = nan", "outside [0, 1]"],
    ),
    (
        "conf-above-one",
        edit(a=_set("confidence", 2, [0.5, 0.5, 1.5])),
        None,
        ["request 7 position 2", "confidence[2] = 1.5"],
    ),
    (
        "conf-negative",
        edit(a=_set("confidence", 0, [-0.25, 0.5, 0.5])),
        None,
        ["request 7 position 0", "confidence[0] = -0.25"],
    ),
    (
        "accept-prob-range",
        edit(a=_replace("accept_prob", [[1.0, 1.0, 1.0]] * 4 + [[1.0, 2.0, 1.0]])),
        None,
        ["request 9 position 1", "accept_prob[1] = 2.0"],
    ),
    (
        "accept-len-high",
        edit(a=_set("accept_len", 1, 4)),
        None,
        ["request 7 position 1", "accept_len = 4 is outside [0, gamma=3]"],
    ),
    (
        "accept-len-negative",
        edit(a=_set("accept_len", 4, -1)),
        None,
        ["request 9 position 1", "accept_len = -1"],
    ),
    (
        "position-gap",
        edit(a=_set("position", 2, 3)),
        None,
        ["request 7:", "position 2 is missing", "contiguous 0..output_len-1"],
    ),
    (
        "position-duplicate",
        edit(a=_set("position", 1, 0)),
        None,
        ["request 7:", "position 0 appears twice"],
    ),
    (
        "position-negative",
        edit(a=_set("position", 3, -1)),
        None,
        ["request 9:", "position -1 is negative"],
    ),
    (
        "output-len-mismatch",
        edit(a=_replace("output_len", [4, 4, 4, 2, 2])),
        None,
        ["request 7:", "output_len is 4 but the file has 3 positions"],
    ),
    (
        "prompt-len-inconsistent",
        edit(a=_set("prompt_len", 4, 5)),
        None,
        ["request 9:", "prompt_len differs between its rows"],
    ),
    (
        "output-len-inconsistent",
        edit(a=_set("output_len", 0, 2)),
        None,
        ["request 7:", "output_len differs between its rows"],
    ),
    (
        "string-id",
        edit(a=_replace("request_id", ["x", "x", "x", "y", "y"]), b=_set("accept_len", 3, 9)),
        None,
        ["request 'y' position 0", "accept_len = 9"],
    ),
    (
        "no-version",
        edit(),
        {"block_size": "3"},
        ["no 'specsim.trace_version' key", "write_trace"],
    ),
    (
        "unknown-version",
        edit(),
        {**META, "specsim.trace_version": "2"},
        ["unknown trace version '2'", "upgrade specsim"],
    ),
    (
        "block-size-meta",
        edit(),
        {**META, "block_size": "4"},
        ["request 7 position 0", "confidence has 3 entries but the block size gamma is 4"],
    ),
    ("bad-source", edit(), {**META, "source": "made-up"}, ["source='made-up'"]),
    ("bad-temperature", edit(), {**META, "temperature": "hot"}, ["temperature='hot'"]),
]


def check_one_line_error(capsys, argv: list[str], needles: list[str], path) -> None:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert err.startswith("specsim: error: ") and err.endswith("\n")
    assert err.count("\n") == 1, err
    assert str(path) in err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.mark.parametrize(("case", "build", "meta", "needles"), BAD, ids=[b[0] for b in BAD])
def test_bad_file_gives_one_line_and_exit_2(tmp_path, capsys, case, build, meta, needles):
    path = tmp_path / f"{case}.parquet"
    write_raw(path, build(), meta)
    check_one_line_error(capsys, ["traces", "validate", str(path)], needles, path)
    check_one_line_error(capsys, ["traces", "info", str(path)], needles, path)


def test_the_good_file_passes(tmp_path, capsys):
    path = tmp_path / "good.parquet"
    write_raw(path, good_columns())
    assert main(["traces", "validate", str(path)]) == 0
    assert capsys.readouterr().out == "ok: 2 requests, 5 rows\n"


def test_not_parquet_and_missing_file(tmp_path, capsys):
    text = tmp_path / "notes.parquet"
    text.write_text("request_id,position\n1,0\n")
    check_one_line_error(
        capsys, ["traces", "validate", str(text)], ["not a readable Parquet file"], text
    )
    missing = tmp_path / "nope.parquet"
    check_one_line_error(capsys, ["traces", "validate", str(missing)], ["does not exist"], missing)
    check_one_line_error(
        capsys, ["traces", "validate", str(tmp_path)], ["is a directory"], tmp_path
    )


def test_subprocess_prints_one_line_and_no_traceback(tmp_path):
    path = tmp_path / "gap.parquet"
    write_raw(path, edit(a=_set("position", 2, 3))())
    res = subprocess.run(
        [sys.executable, "-m", "specsim.cli", "traces", "validate", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert res.returncode == 2
    assert res.stdout == ""
    assert "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1
    assert f"{path}: request 7: position 2 is missing" in res.stderr

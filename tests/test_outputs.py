"""specsim/outputs.py: checked before the work, atomic, locked, and never a lost result."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specsim.errors import SpecsimError
from specsim.outputs import atomic, check_out, jsonable, lock, write_table

FRAME = pd.DataFrame({"policy": ["mtp1", "zos"], "throughput_tok_s": [1.5, 2.5]})


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".json"])
def test_format_follows_the_name(tmp_path, suffix):
    out = write_table(FRAME, tmp_path / f"t{suffix}")
    back = {
        ".parquet": pd.read_parquet, ".csv": pd.read_csv,
        ".json": lambda p: pd.read_json(p, orient="records"),
    }[suffix](out)  # fmt: skip
    pd.testing.assert_frame_equal(back, FRAME)
    assert [p.name for p in tmp_path.iterdir()] == [f"t{suffix}"]  # no temporary left behind


def test_check_out_refuses_before_any_work(tmp_path):
    (tmp_path / "old.csv").write_text("x\n")
    cases = [
        (tmp_path / "old.csv", "already exists; pass --force"),
        (tmp_path, "is a directory"),
        (tmp_path / "nope" / "x.csv", "does not exist"),
        (tmp_path / "x.xlsx", ".parquet, .csv or .json"),
    ]
    for path, needle in cases:
        with pytest.raises(SpecsimError, match=needle):
            check_out(path)
    assert check_out(tmp_path / "old.csv", force=True) == tmp_path / "old.csv"


def test_atomic_leaves_the_old_file_when_the_write_fails(tmp_path):
    out = tmp_path / "t.csv"
    out.write_text("old\n")
    with pytest.raises(RuntimeError), atomic(out) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert out.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["t.csv"]


def test_a_failed_write_keeps_the_result_and_says_where():
    with pytest.raises(SpecsimError) as exc:
        write_table(FRAME, Path("/proc/specsim-cannot-write-here.parquet"))
    msg = str(exc.value)
    assert "could not write" in msg and "kept in" in msg
    kept = Path(msg.rsplit("kept in ", 1)[1])
    pd.testing.assert_frame_equal(pd.read_parquet(kept), FRAME)
    kept.unlink()


def _hold(path: str, ready, release) -> None:
    with lock(path):
        ready.set()
        release.wait(30)


def test_a_second_writer_is_refused(tmp_path):
    out = str(tmp_path / "sweep.parquet")
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(out, ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.raises(SpecsimError, match="being written by another specsim run"):
            with lock(out):
                pass
    finally:
        release.set()
        holder.join(30)
    with lock(out):  # free again once the first writer is done
        pass


def test_jsonable_is_standard_json():
    data = {"a": np.float64(1.5), "b": float("nan"), "c": [np.int64(3), math.inf], "d": (1, 2)}
    text = json.dumps(jsonable(data), allow_nan=False)
    assert json.loads(text) == {"a": 1.5, "b": None, "c": [3, None], "d": [1, 2]}

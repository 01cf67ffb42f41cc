"""Reading and writing trace files: round trips, ordering, overwrite refusal, atomic writes."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specsim.errors import SpecsimError, TraceError
from specsim.trace import TRACE_VERSION, Trace
from specsim.trace.io import load_meta, read_trace, trace_to_frame, validate_file, write_trace
from specsim.trace.synth import PROFILES, synth_trace

ARRAYS = ("request_ids", "prompt_len", "output_len", "offsets", "conf", "accept_len")
OPTIONAL = ("draft_tokens", "accept_prob", "category", "arrival_s")


def assert_same_trace(a: Trace, b: Trace) -> None:
    """Bit-identical arrays (values, dtypes and float bits) and the same metadata."""
    for name in ARRAYS + OPTIONAL:
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        assert x.dtype == y.dtype, name
        assert x.shape == y.shape, name
        if x.dtype.kind == "f":
            assert np.array_equal(x.view(f"u{x.itemsize}"), y.view(f"u{y.itemsize}")), name
        else:
            assert np.array_equal(x, y), name
    assert a.meta == b.meta


def small_trace(**kw) -> Trace:
    return synth_trace(n_requests=5, accept_profile=PROFILES["chat"], seed=4, **kw)


def test_round_trip_is_bit_identical(tmp_path):
    trace = small_trace(category="chat")
    path = write_trace(trace, tmp_path / "t.parquet")
    back = read_trace(path)
    assert_same_trace(trace, back)
    assert back.path == str(path)
    # The stored types are the spec's.
    schema = pq.read_schema(path)
    assert schema.field("position").type == pa.int32()
    assert schema.field("accept_len").type == pa.int16()
    assert schema.field("confidence").type == pa.list_(pa.float32())
    assert schema.field("draft_tokens").type == pa.list_(pa.int32())
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "ZSTD"
    # Writing what was read gives the same bytes again.
    again = write_trace(back, tmp_path / "u.parquet")
    assert Path(again).read_bytes() == Path(path).read_bytes()


def test_rows_come_back_by_first_appearance_then_position(tmp_path):
    trace = small_trace()
    frame = trace_to_frame(trace)
    shuffled = frame.sample(frac=1.0, random_state=np.random.RandomState(0))
    first_seen = list(dict.fromkeys(shuffled["request_id"]))
    path = write_trace(shuffled, tmp_path / "s.parquet", trace.meta)
    back = read_trace(path)
    assert list(back.request_ids) == first_seen
    expected = (
        frame.set_index("request_id").loc[first_seen].reset_index()  # grouped, positions 0..
    )
    got = trace_to_frame(back)
    assert got["request_id"].tolist() == expected["request_id"].tolist()
    assert got["position"].tolist() == expected["position"].tolist()
    assert np.array_equal(np.stack(got["confidence"]), np.stack(expected["confidence"]))
    assert got["accept_len"].tolist() == expected["accept_len"].tolist()


def test_frame_with_wide_types_and_optional_columns(tmp_path):
    frame = pd.DataFrame(
        {
            "request_id": ["b", "b", "a"],
            "position": [1, 0, 0],  # int64 in pandas
            "prompt_len": [3, 3, 8],
            "output_len": [2, 2, 1],
            "draft_tokens": [[1, 2], [3, 4], [5, 6]],
            "confidence": [[0.25, 1.0], [0.0, 0.5], [0.75, 0.125]],  # float64 lists
            "accept_len": [2, 0, 1],
            "category": ["chat", "chat", "code"],
            "accept_prob": [[1.0, 0.5], [0.25, 0.0], [1.0, 1.0]],
            "arrival_s": [0.5, 0.5, 1.25],
        }
    )
    path = write_trace(frame, tmp_path / "f.parquet", {"source": "recorded", "k": {"a": 1}})
    t = read_trace(path)
    assert list(t.request_ids) == ["b", "a"]
    assert t.offsets.tolist() == [0, 2, 3]
    assert t.conf.dtype == np.float32
    assert t.conf.tolist() == [[0.0, 0.5], [0.25, 1.0], [0.75, 0.125]]
    assert t.accept_len.tolist() == [0, 2, 1]
    assert t.category.tolist() == ["chat", "code"]
    assert t.arrival_s.tolist() == [0.5, 1.25]
    assert t.accept_prob.tolist() == [[0.25, 0.0], [1.0, 0.5], [1.0, 1.0]]
    meta = load_meta(path)
    assert meta == t.meta
    assert meta["specsim.trace_version"] == TRACE_VERSION
    assert meta["block_size"] == "2"
    assert meta["k"] == '{"a": 1}'  # non-string metadata is stored as JSON


def test_overwrite_refused_without_force(tmp_path):
    path = write_trace(small_trace(), tmp_path / "t.parquet")
    before = path.read_bytes()
    with pytest.raises(SpecsimError, match="already exists; pass --force"):
        write_trace(small_trace(category="x"), path)
    assert path.read_bytes() == before
    write_trace(small_trace(category="x"), path, force=True)
    assert read_trace(path).category is not None


def test_invalid_data_is_refused_before_anything_is_written(tmp_path):
    frame = trace_to_frame(small_trace())
    frame.loc[3, "accept_len"] = 99
    with pytest.raises(SpecsimError, match="accept_len = 99"):
        write_trace(frame, tmp_path / "bad.parquet")
    assert list(tmp_path.iterdir()) == []


def test_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    """A write that dies after bytes hit the disk leaves neither the target nor the temp file."""
    real = pq.write_table

    def write_then_fail(table, where, **kw):
        real(table, where, **kw)  # the temporary file is complete on disk ...
        raise OSError(28, "No space left on device")  # ... then the disk "fills"

    monkeypatch.setattr(pq, "write_table", write_then_fail)
    with pytest.raises(SpecsimError, match="could not write .*No space left"):
        write_trace(small_trace(), tmp_path / "t.parquet")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_file_size_limit_kills_write_cleanly(tmp_path):
    """A real failure (RLIMIT_FSIZE): exit 2, one line, no file, no temp, old file untouched."""
    script = textwrap.dedent(
        """
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
        from specsim.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    out = tmp_path / "big.parquet"
    args = ["traces", "synth", "--out", str(out), "--requests", "100", "--seed", "1"]
    args += ["--concentration", "3"]  # skip the AUROC search: the write is what is tested
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    res = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=env
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith(f"specsim: error: could not write {out}")
    assert list(tmp_path.iterdir()) == []
    # With --force over an existing file, the old file survives the failed write intact.
    old = write_trace(synth_trace(n_requests=1, accept_profile=[0.5], seed=0), out)
    before = old.read_bytes()
    res = subprocess.run(
        [sys.executable, "-c", script, *args, "--force"], capture_output=True, text=True, env=env
    )
    assert res.returncode == 2, res.stderr
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.parquet"]


def test_list_columns_flatten_to_contiguous_arrays(tmp_path):
    """List columns come back as C-contiguous (rows, gamma) arrays."""
    trace = synth_trace(n_requests=80, accept_profile=PROFILES["math"], seed=2)
    t = read_trace(write_trace(trace, tmp_path / "m.parquet"))
    assert t.conf.shape == (trace.n_rows, 7) and t.conf.flags.c_contiguous
    assert t.draft_tokens.shape == (trace.n_rows, 7)


@st.composite
def valid_frames(draw):
    """A random valid trace as a shuffled DataFrame, plus its block size."""
    gamma = draw(st.integers(1, 5))
    n_req = draw(st.integers(1, 4))
    string_ids = draw(st.booleans())
    ids = draw(
        st.lists(
            st.text("abcxyz", min_size=1, max_size=4)
            if string_ids
            else st.integers(-(2**40), 2**40),
            min_size=n_req,
            max_size=n_req,
            unique=True,
        )
    )
    unit = st.floats(0.0, 1.0, width=32)
    with_cat, with_prob, with_arrival = draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
    rows = []
    for rid in ids:
        out_len = draw(st.integers(1, 6))
        prompt = draw(st.integers(0, 5000))
        cat = draw(st.sampled_from(["chat", "code", "math"]))
        arrival = draw(st.floats(0.0, 1e6))
        for pos in range(out_len):
            row = {
                "request_id": rid,
                "position": pos,
                "prompt_len": prompt,
                "output_len": out_len,
                "draft_tokens": draw(
                    st.lists(st.integers(0, 2**31 - 1), min_size=gamma, max_size=gamma)
                ),
                "confidence": draw(st.lists(unit, min_size=gamma, max_size=gamma)),
                "accept_len": draw(st.integers(0, gamma)),
            }
            if with_cat:
                row["category"] = cat
            if with_prob:
                row["accept_prob"] = draw(st.lists(unit, min_size=gamma, max_size=gamma))
            if with_arrival:
                row["arrival_s"] = arrival
            rows.append(row)
    perm = draw(st.permutations(range(len(rows))))
    return pd.DataFrame([rows[i] for i in perm]), gamma


@given(valid_frames())
def test_any_valid_trace_round_trips_and_validates(case):
    frame, gamma = case
    with tempfile.TemporaryDirectory() as d:
        path = write_trace(frame, Path(d) / "h.parquet", {"source": "recorded"})
        trace = validate_file(path)
        assert trace.block_size == gamma
        assert trace.n_rows == len(frame)
        # Every input row is found, unchanged, at offsets[request] + position.
        index = {rid: i for i, rid in enumerate(trace.request_ids.tolist())}
        for row in frame.itertuples(index=False):
            r = trace.offsets[index[row.request_id]] + row.position
            assert trace.conf[r].tolist() == np.float32(row.confidence).tolist()
            assert trace.draft_tokens[r].tolist() == list(row.draft_tokens)
            assert int(trace.accept_len[r]) == row.accept_len
        # Re-writing the trace read gives a trace identical bit for bit.
        again = read_trace(write_trace(trace, Path(d) / "again.parquet"))
        assert_same_trace(trace, again)


def test_multi_row_group_file_with_dictionary_category(tmp_path):
    """Files written by other tools: several row groups, a pandas categorical column."""
    trace = small_trace(category="code")
    frame = trace_to_frame(trace)
    frame["category"] = frame["category"].astype("category")
    table = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(
        {**trace.meta}
    )
    path = tmp_path / "other.parquet"
    pq.write_table(table, path, row_group_size=7)
    assert pq.ParquetFile(path).metadata.num_row_groups > 1
    back = read_trace(path)
    assert back.category.tolist() == ["code"] * trace.n_requests
    assert np.array_equal(back.conf, trace.conf)
    assert np.array_equal(back.offsets, trace.offsets)


def test_shipped_trace_names_resolve_from_any_folder(tmp_path, monkeypatch):
    """A pip-installed specsim runs the README's ``traces/chat.parquet`` without the checkout."""
    from specsim.trace.io import resolve_trace, shipped_traces

    monkeypatch.chdir(tmp_path)
    shipped = shipped_traces()
    assert {"chat", "code", "math", "synthetic-chat"} <= set(shipped)
    for name in ("chat", "chat.parquet", "traces/chat.parquet"):
        assert resolve_trace(name) == shipped["chat"]
    trace = read_trace("traces/synthetic-chat.parquet")
    assert trace.n_requests > 0
    with pytest.raises(TraceError, match="does not exist; give a .parquet path"):
        resolve_trace("elsewhere/chat.parquet")  # a real path is never redirected
    (tmp_path / "traces").mkdir()
    write_trace(trace, tmp_path / "traces" / "chat.parquet")
    assert resolve_trace("traces/chat.parquet").resolve() == tmp_path / "traces" / "chat.parquet"

"""The shipped target re-encoded in another weight type: the same model, another encoding."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from specsim.errors import SpecsimError  # noqa: E402
from specsim.record.models import smollm2_gguf  # noqa: E402
from specsim.record.requant import requantized  # noqa: E402


@pytest.fixture(scope="module")
def shipped():
    try:
        return smollm2_gguf()
    except SpecsimError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def src(shipped):
    return gguf.GGUFReader(shipped)  # read once: a GGUF reader takes seconds


@pytest.fixture(scope="module")
def made(shipped, tmp_path_factory):
    """Each type made once for the module (a re-encoding takes seconds)."""
    folder = tmp_path_factory.mktemp("targets")
    return lambda qtype: requantized(shipped, qtype, folder)


@pytest.mark.slow  # fast suite under 5 min: 15 s (CI runs it)
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_0-pure"])
def test_requantized_keeps_every_tensor_and_key(src, made, qtype):
    dst = gguf.GGUFReader(made(qtype))
    assert [t.name for t in dst.tensors] == [t.name for t in src.tensors]
    new = gguf.GGMLQuantizationType[qtype.removesuffix("-pure")]
    redo = {gguf.GGMLQuantizationType.Q4_1}
    if qtype.endswith("-pure"):  # the (tied) token embedding too
        redo.add(gguf.GGMLQuantizationType.Q8_0)
    for a, b in zip(src.tensors, dst.tensors, strict=True):
        assert b.shape.tolist() == a.shape.tolist()
        if a.tensor_type in redo:
            assert b.tensor_type == new
        else:  # norms (F32) and the Q8_0 embedding: byte for byte
            assert b.tensor_type == a.tensor_type
            assert np.array_equal(np.asarray(b.data), np.asarray(a.data))
    keys = {f.name for f in src.fields.values()} - {"general.file_type"}
    for key in keys:
        if key.startswith("GGUF."):
            continue
        assert dst.fields[key].contents() == src.fields[key].contents(), key
    ftype = dst.fields["general.file_type"].contents()
    assert ftype == {"Q8_0": 7, "Q4_0": 2, "Q4_0-pure": 2}[qtype]


@pytest.mark.slow
@pytest.mark.parametrize("qtype, tol", [("Q8_0", 0.01), ("Q4_0", 0.2)])
def test_requantized_weights_stay_close(src, made, qtype, tol):
    """Q8_0 of 4-bit values moves them by well under 1% of their spread; Q4_0 (a second
    4-bit rounding) by a fraction of one step, never by more than the weights' scale."""
    dst = gguf.GGUFReader(made(qtype))
    old = gguf.GGMLQuantizationType.Q4_1
    a = next(t for t in src.tensors if t.tensor_type == old)
    b = next(t for t in dst.tensors if t.name == a.name)
    wa = gguf.quants.dequantize(np.asarray(a.data), old)
    wb = gguf.quants.dequantize(np.asarray(b.data), b.tensor_type)
    rel = np.abs(wb - wa).mean() / np.abs(wa).mean()
    assert rel < tol
    assert rel > 0 or qtype == "Q8_0"


def test_requantized_is_made_once_and_refuses_unknown_types(shipped, made, tmp_path):
    assert requantized(shipped, "Q4_1", tmp_path) == shipped  # the shipped type: no copy
    first = made("Q4_0")
    stamp = first.stat().st_mtime_ns
    assert made("Q4_0") == first
    assert first.stat().st_mtime_ns == stamp
    assert not list(first.parent.glob("*.tmp"))
    with pytest.raises(SpecsimError, match="Q4_1, Q8_0, Q4_0, Q4_0-pure"):
        requantized(shipped, "Q2_K", tmp_path)

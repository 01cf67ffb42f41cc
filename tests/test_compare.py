"""The comparison rule every regenerated-vs-committed test uses (tests/compare.py): it holds
when the last digits differ and fails when the data differs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from compare import assert_arrays_close, assert_frames_close, json_diff, meta_diff

NESTED = {
    "seed": 5,
    "concentration": 2.123751501554855,
    "profile": [0.78, 0.55, {"k": 3, "rate": [1e-3, 2.5]}],
    "name": "chat",
    "calibrated": True,
    "nothing": None,
}


def _perturbed(v, rel):
    """The same structure with every float moved by a relative ``rel``."""
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return v * (1 + rel)
    if isinstance(v, list):
        return [_perturbed(x, rel) for x in v]
    return {k: _perturbed(x, rel) for k, x in v.items()}


def test_last_digit_differences_are_the_same_data():
    # the case of issue #31: one number's last digit, inside a JSON object
    a = json.dumps(NESTED)
    b = a.replace("2.123751501554855", "2.1237515015548545")
    assert a != b and meta_diff(a, b) is None
    assert json_diff(NESTED, _perturbed(NESTED, 3e-16)) is None


@pytest.mark.parametrize(
    "change, where",
    [
        (lambda d: d.update(concentration=2.2), "$.concentration"),
        (lambda d: d["profile"][2]["rate"].__setitem__(0, 1.1e-3), "$.profile[2].rate[0]"),
        (lambda d: d["profile"][2].update(k=4), "$.profile[2].k"),
        (lambda d: d.update(name="code"), "$.name"),
        (lambda d: d.update(calibrated=1), "$.calibrated"),
        (lambda d: d["profile"].append(0.1), "$.profile: length"),
        (lambda d: d.pop("nothing"), "$: keys"),
        (lambda d: d.update(nothing=0), "$.nothing"),
    ],
)
def test_real_differences_are_found_and_located(change, where):
    other = json.loads(json.dumps(NESTED))
    change(other)
    diff = meta_diff(json.dumps(NESTED), json.dumps(other))
    assert diff is not None and diff.startswith(where), diff


def test_text_that_is_not_json_compares_exactly():
    assert meta_diff("dspark:abc", "dspark:abc") is None
    assert meta_diff("dspark:abc", "dspark:abd") is not None


def test_arrays_and_frames():
    x = np.linspace(0, 1, 50)
    assert_arrays_close(x, x * (1 + 1e-15))
    with pytest.raises(AssertionError):
        assert_arrays_close(x, x * (1 + 1e-6))
    with pytest.raises(AssertionError):  # integers are exact
        assert_arrays_close(np.arange(5), np.arange(5) + np.array([0, 0, 1, 0, 0]))
    nan = np.array([1.0, np.nan])
    assert_arrays_close(nan, nan.copy())
    f = pd.DataFrame({"n": [1, 2], "t": [0.1, 0.3], "p": ["a", "b"]})
    g = f.assign(t=f["t"] * (1 + 2e-16))
    assert_frames_close(g, f)
    for bad in (
        f.assign(t=[0.1, 0.31]),
        f.assign(n=[1, 3]),
        f.assign(p=["a", "c"]),
        f[["t", "n", "p"]],
    ):
        with pytest.raises(AssertionError):
            assert_frames_close(bad, f)

"""Comparing a regenerated artefact with a committed one.

A file made on another machine (another CPU, BLAS, numpy build or SIMD path: numpy's exp/log
take an AVX-512 path where the CPU has one) can differ from a fresh run in the last digit of a
float while the data is the same. So the rule for every test that compares a regenerated
artefact (trace, golden table, report table, profile) with a committed one:

- integers, booleans, strings and the structure (keys, lengths, dtypes kinds) compare EXACTLY;
- floats compare to a relative tolerance (``RTOL``, far above last-digit noise and far below
  any real change of the data); NaN equals NaN.

Where bit-identity is the point (the same code path in the same process: a resume against a
fresh run, a write-read round trip, the same seed twice), tests compare exactly and say so.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

RTOL = 1e-9  # last-digit float noise is ~1e-16; a changed model moves numbers by far more
ATOL = 1e-12  # for values that are 0 in one file and a rounding residue in the other


def same_number(x: float, y: float, rtol: float = RTOL, atol: float = ATOL) -> bool:
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if math.isinf(x) or math.isinf(y):
        return x == y
    return abs(x - y) <= atol + rtol * max(abs(x), abs(y))


def json_diff(x: Any, y: Any, rtol: float = RTOL, path: str = "$") -> str | None:
    """Where two JSON values differ (a path and both values), or None where they are the same:
    objects key by key, lists item by item, numbers to ``rtol``, everything else exactly.
    ``True`` is not the number 1 here (JSON tells them apart)."""
    if isinstance(x, bool) or isinstance(y, bool):
        return None if (type(x) is type(y) and x == y) else f"{path}: {x!r} != {y!r}"
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        if isinstance(x, int) and isinstance(y, int):
            return None if x == y else f"{path}: {x} != {y}"
        return None if same_number(float(x), float(y), rtol) else f"{path}: {x!r} != {y!r}"
    if isinstance(x, dict) and isinstance(y, dict):
        if x.keys() != y.keys():
            return f"{path}: keys {sorted(x)} != {sorted(y)}"
        for k in x:
            d = json_diff(x[k], y[k], rtol, f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y):
            return f"{path}: length {len(x)} != {len(y)}"
        for i, (a, b) in enumerate(zip(x, y, strict=True)):
            d = json_diff(a, b, rtol, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if (type(x) is type(y) and x == y) else f"{path}: {x!r} != {y!r}"


def meta_diff(x: str, y: str, rtol: float = RTOL) -> str | None:
    """Two metadata strings: equal text, or equal as JSON values (see ``json_diff``)."""
    if x == y:
        return None
    try:
        vx, vy = json.loads(x), json.loads(y)
    except ValueError:
        return f"{x!r} != {y!r} (not JSON, so compared as text)"
    return json_diff(vx, vy, rtol)


def assert_arrays_close(a: np.ndarray, b: np.ndarray, name: str = "", rtol: float = RTOL) -> None:
    """Same shape and dtype kind; floats to ``rtol`` (NaN == NaN), the rest exactly."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{name}: shape {a.shape} != {b.shape}"
    assert a.dtype.kind == b.dtype.kind, f"{name}: dtype {a.dtype} != {b.dtype}"
    if a.dtype.kind in "fc":
        np.testing.assert_allclose(a, b, rtol=rtol, atol=ATOL, equal_nan=True, err_msg=name)
    else:
        np.testing.assert_array_equal(a, b, err_msg=name)


def assert_frames_close(have: pd.DataFrame, want: pd.DataFrame, obj: str = "", rtol: float = RTOL):
    """Same columns in the same order, same dtypes, same index; float columns to ``rtol``,
    every other column exactly."""
    assert list(have.columns) == list(want.columns), f"{obj}: columns differ"
    assert len(have) == len(want), f"{obj}: {len(have)} rows != {len(want)}"
    for col in want.columns:
        x, y = have[col], want[col]
        assert x.dtype == y.dtype, f"{obj}/{col}: dtype {x.dtype} != {y.dtype}"
        if pd.api.types.is_float_dtype(y.dtype):
            assert_arrays_close(x.to_numpy(), y.to_numpy(), f"{obj}/{col}", rtol)
        else:
            pd.testing.assert_series_equal(
                x.reset_index(drop=True), y.reset_index(drop=True), check_exact=True,
                obj=f"{obj}/{col}",
            )  # fmt: skip

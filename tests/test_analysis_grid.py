"""Sweep grids: list parsing, cell order, seeds (common random numbers), keys."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specsim.analysis.grid import Cell, file_digest, make_grid, parse_numbers
from specsim.errors import SpecsimError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,2,4", [1, 2, 4]),
        ("1,2,4,...,64", [1, 2, 4, 8, 16, 32, 64]),
        ("1,2,4,...,100", [1, 2, 4, 8, 16, 32, 64, 100]),  # the end is always included
        ("10,20,...,50", [10, 20, 30, 40, 50]),
        ("1,2,...,5", [1, 2, 3, 4, 5]),  # two numbers: arithmetic
        ("0.5, 1.5, ..., 3.5", [0.5, 1.5, 2.5, 3.5]),
        ("1,3,9,...,81,100", [1, 3, 9, 27, 81, 100]),
    ],
)
def test_parse_numbers(text, expected):
    assert parse_numbers(text) == [float(x) for x in expected]


@pytest.mark.parametrize("text", ["", "1,a", "...,4", "1,...,4", "4,2,...,1", "1,2,...", "inf"])
def test_parse_numbers_rejects_with_one_line(text):
    with pytest.raises(SpecsimError) as exc:
        parse_numbers(text, "--concurrency")
    assert "\n" not in str(exc.value)


def _grid(**kw):
    args = dict(
        traces=["a.parquet", "b.parquet"],
        policies=["mtp1", "hw-aware", "zos"],
        loads=[1, 4, 16],
        seeds=2,
    )
    args.update(kw)
    return make_grid(args.pop("traces"), args.pop("policies"), args.pop("loads"), **args)


def test_grid_is_the_full_product_in_a_fixed_order():
    cells = _grid()
    assert len(cells) == 2 * 3 * 3 * 2
    assert len({c.key for c in cells}) == len(cells)
    first = [(c.trace, c.policy, c.load, c.replicate) for c in cells[:7]]
    assert first == [
        ("a.parquet", "mtp1", 1.0, 0),
        ("a.parquet", "mtp1", 1.0, 1),
        ("a.parquet", "mtp1", 4.0, 0),
        ("a.parquet", "mtp1", 4.0, 1),
        ("a.parquet", "mtp1", 16.0, 0),
        ("a.parquet", "mtp1", 16.0, 1),
        ("a.parquet", "hw-aware", 1.0, 0),
    ]
    assert _grid() == cells  # same arguments, same cells


def test_seed_shared_across_policies_and_distinct_across_everything_else():
    cells = _grid()
    by = {}
    for c in cells:
        by.setdefault((c.trace, c.load, c.replicate), set()).add(c.seed)
    assert all(len(s) == 1 for s in by.values()), "policies at one load must share the seed"
    assert len({next(iter(s)) for s in by.values()}) == len(by), "other coordinates must differ"
    # the base seed moves every cell
    other = _grid(base_seed=1)
    assert all(a.seed != b.seed for a, b in zip(cells, other, strict=True))


def test_seed_does_not_depend_on_the_rest_of_the_grid():
    """A cell's seed is a function of the cell alone: adding loads or policies changes nothing."""
    small = {c.key: c.seed for c in _grid(loads=[4], policies=["zos"])}
    big = {c.key: c.seed for c in _grid(loads=[1, 4, 16, 64], policies=["mtp1", "zos"])}
    assert small.items() <= big.items()


def test_concurrency_4_and_4_0_are_the_same_cell():
    a = _grid(loads=[4])[0]
    b = replace(a, load=4.0)
    assert a.key == b.key and a.seed == b.seed


def test_trace_content_is_in_the_key_and_drives_the_seed():
    c = _grid()[0]
    d = replace(c, trace_digest="0123456789abcdef")
    e = replace(c, trace_digest="fedcba9876543210")
    assert len({c.key, d.key, e.key}) == 3
    assert d.seed != e.seed
    moved = replace(d, trace="elsewhere/copy.parquet")
    assert moved.key != d.key and moved.seed == d.seed  # same content, same dice


def test_replay_kwargs_of_each_load_kind():
    c = _grid(loads=[8])[0]
    kw = c.replay_kwargs()
    assert kw["concurrency"] == 8 and isinstance(kw["concurrency"], int) and "rate" not in kw
    assert kw["seed"] == c.seed and kw["profile"] == c.profile
    r = make_grid(["a.parquet"], ["zos"], [2.5], load_kind="rate", options={"cv": 2.0})[0]
    kw = r.replay_kwargs()
    assert kw["rate"] == 2.5 and "concurrency" not in kw and kw["cv"] == 2.0
    assert r.knobs()["cv"] == 2.0 and r.knobs()["rate"] == 2.5


@pytest.mark.parametrize(
    "kw",
    [
        {"traces": []},
        {"policies": []},
        {"loads": []},
        {"loads": [0]},
        {"loads": [1.5]},  # concurrency must be whole
        {"loads": [2, 2]},
        {"seeds": 0},
        {"load_kind": "qps"},
    ],
)
def test_bad_grids_are_one_line_errors(kw):
    with pytest.raises(SpecsimError) as exc:
        _grid(**kw)
    assert "\n" not in str(exc.value)


def test_file_digest_changes_with_content(tmp_path):
    p = tmp_path / "t.parquet"
    p.write_bytes(b"abc")
    d1 = file_digest(p)
    p.write_bytes(b"abd")
    assert file_digest(p) != d1 and len(d1) == 16


def test_cell_is_hashable_and_frozen():
    c = _grid()[0]
    assert isinstance(c, Cell)
    with pytest.raises(AttributeError):
        c.load = 3  # type: ignore[misc]

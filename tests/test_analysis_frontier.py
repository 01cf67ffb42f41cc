"""Pareto frontier and SLA throughput on hand-computed cases, and the palette's promises."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from specsim.analysis.frontier import (
    curves,
    pareto_front,
    speed_at_throughput,
    throughput_at,
    throughput_at_sla,
)
from specsim.analysis.palette import policy_style
from specsim.errors import SpecsimError
from specsim.policies import POLICIES


def test_pareto_front_drops_dominated_points():
    x = np.array([10.0, 20.0, 30.0, 15.0, 25.0])
    y = np.array([900.0, 600.0, 100.0, 500.0, 650.0])
    # (15, 500) is beaten by (20, 600); (20, 600) by (25, 650)
    assert pareto_front(x, y).tolist() == [0, 4, 2]


def test_throughput_at_interpolates_between_bracketing_loads():
    x = np.array([10.0, 20.0, 40.0])  # per-user tok/s at high, mid, low load
    y = np.array([1000.0, 600.0, 200.0])  # tok/s
    assert throughput_at(x, y, 30.0) == pytest.approx(400.0)  # halfway from 600 to 200
    assert throughput_at(x, y, 20.0) == pytest.approx(600.0)
    assert throughput_at(x, y, 5.0) == 1000.0  # looser than every point: best swept
    assert math.isnan(throughput_at(x, y, 41.0))  # faster than any swept load: out of reach
    assert speed_at_throughput(x, y, 400.0) == pytest.approx(30.0)
    assert math.isnan(speed_at_throughput(x, y, 1001.0))


def _table():
    rows = []
    for pol, scale in (("mtp1", 1.0), ("zos", 1.5)):
        for load, (sp, tp) in zip([1, 4, 16], [(40, 200), (20, 600), (10, 1000)], strict=True):
            for rep, jitter in ((0, -1.0), (1, 1.0)):
                rows.append(
                    dict(
                        trace="t",
                        policy=pol,
                        load=float(load),
                        replicate=rep,
                        seed=rep,
                        per_user_tps_mean=sp * scale + jitter,
                        throughput_tok_s=tp * scale + 10 * jitter,
                    )
                )
    return pd.DataFrame(rows)


def test_curves_average_the_seed_replicates():
    c = curves(_table())
    assert len(c) == 6 and (c["n_seeds"] == 2).all()
    z = c[(c["policy"] == "zos") & (c["load"] == 4)].iloc[0]
    assert z["per_user_tps_mean"] == 30.0 and z["throughput_tok_s"] == 900.0


def test_throughput_at_sla_and_gain_over_baseline():
    sla = throughput_at_sla(_table(), [30.0, 45.0], baseline="mtp1")
    got = sla.set_index(["policy", "sla_tps"])
    # mtp1: frontier (10,1000) (20,600) (40,200): at 30 -> 400; 45 is out of reach
    assert got.loc[("mtp1", 30.0), "throughput_per_gpu_tok_s"] == pytest.approx(400.0)
    assert math.isnan(got.loc[("mtp1", 45.0), "throughput_per_gpu_tok_s"])
    # zos = 1.5x both axes: (15,1500) (30,900) (60,300): at 30 -> 900, at 45 -> 600
    assert got.loc[("zos", 30.0), "throughput_per_gpu_tok_s"] == pytest.approx(900.0)
    assert got.loc[("zos", 45.0), "throughput_per_gpu_tok_s"] == pytest.approx(600.0)
    assert got.loc[("zos", 30.0), "gain_pct"] == pytest.approx(125.0)
    assert math.isnan(got.loc[("zos", 45.0), "gain_pct"])
    assert got.loc[("mtp1", 30.0), "gain_pct"] == pytest.approx(0.0)


def test_unknown_baseline_is_a_one_line_error():
    with pytest.raises(SpecsimError, match="baseline policy 'nope'"):
        throughput_at_sla(_table(), [30.0], baseline="nope")


def test_every_builtin_policy_has_its_own_look():
    import specsim.policies  # noqa: F401  (registers the built-ins)

    names = ["ar", "mtp1", "static:3", "full", "threshold:0.5", "cum-threshold:0.3"]
    names += ["hw-aware", "hw-aware-global", "zos", "goodput", "oracle"]
    assert {n.split(":")[0] for n in names} <= set(POLICIES.names()) | {"static", "threshold"}
    looks = [policy_style(n) for n in names]
    assert len({(s.color, s.marker, s.linestyle) for s in looks}) == len(names)
    for s in looks:
        assert re.fullmatch(r"#[0-9A-Fa-f]{6}", s.color)
    assert policy_style("zos") == policy_style("zos")  # a pure function of the name
    # one family, several arguments: different looks
    assert policy_style("static:2") != policy_style("static:4")


def test_the_looks_do_not_depend_on_what_else_is_plotted():
    before = [policy_style(p) for p in ("zos", "mtp1")]
    policy_style("my.module:custom")
    assert [policy_style(p) for p in ("zos", "mtp1")] == before


def test_throughput_per_gpu_divides_by_the_profiles_gpus():
    t = _table().assign(gpus=8)
    c = curves(t)
    z = c[(c["policy"] == "zos") & (c["load"] == 4)].iloc[0]
    assert z["throughput_per_gpu_tok_s"] == pytest.approx(900.0 / 8)
    sla = throughput_at_sla(t, [30.0], baseline="mtp1").set_index("policy")
    assert sla.loc["zos", "throughput_per_gpu_tok_s"] == pytest.approx(900.0 / 8)
    assert sla.loc["zos", "gain_pct"] == pytest.approx(125.0)  # a ratio: the same per GPU


def test_speed_at_a_nan_throughput_is_nan():
    from specsim.analysis.frontier import speed_at_throughput

    x, y = np.array([10.0, 20.0, 40.0]), np.array([1000.0, 600.0, 200.0])
    assert math.isnan(speed_at_throughput(x, y, float("nan")))
    assert speed_at_throughput(x, y, 600.0) == pytest.approx(20.0)

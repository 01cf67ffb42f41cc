"""The engine section of schedulers-under-load: each engine rule against the best lossless
built-in at every SLA point, on hand-made throughputs whose answers are known."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from specsim.analysis.frontier import Y
from specsim.analysis.reports.sul_engines import deploy_lines, engine_ratios, engine_summary

NAN = math.nan
# (trace, SLA, policy) -> throughput per GPU at the SLA; NaN = cannot reach it
POINTS = {
    ("chat", 20.0): {"zos": 100.0, "mtp1": 80.0, "oracle": 500.0, "vllm-adaptive": 99.0,
                     "llama-dspark:0.3": 50.0},
    ("chat", 80.0): {"zos": 40.0, "mtp1": NAN, "oracle": 90.0, "vllm-adaptive": NAN,
                     "llama-dspark:0.3": 40.0},
    ("chat", 200.0): {"zos": NAN, "mtp1": NAN, "oracle": 10.0, "vllm-adaptive": NAN,
                      "llama-dspark:0.3": NAN},
    ("synthetic-chat", 20.0): {"zos": 200.0, "mtp1": 250.0, "oracle": 900.0,
                               "vllm-adaptive": 250.0, "llama-dspark:0.3": 200.0},
}  # fmt: skip
GROUPS = {"recorded": ["chat"], "synthetic": ["synthetic-chat"]}
ENGINES = ["vllm-adaptive", "llama-dspark:0.3"]


@pytest.fixture()
def sla() -> pd.DataFrame:
    rows = [
        {"trace": t, "sla_tps": s, "policy": p, Y: v}
        for (t, s), pols in POINTS.items()
        for p, v in pols.items()
    ]
    return pd.DataFrame(rows)


def test_ratio_is_to_the_best_lossless_reference_and_zero_where_it_cannot_reach(sla):
    r = engine_ratios(sla, ENGINES, ["zos", "mtp1"], GROUPS).set_index(["trace", "sla_tps", "rule"])
    assert r.loc[("chat", 20.0, "vllm-adaptive"), "ratio"] == pytest.approx(0.99)
    assert r.loc[("chat", 20.0, "vllm-adaptive"), "best reference"] == "zos"
    assert r.loc[("chat", 80.0, "vllm-adaptive"), "ratio"] == 0.0  # zos reaches 80, it cannot
    assert r.loc[("chat", 80.0, "llama-dspark:0.3"), "ratio"] == 1.0
    assert r.loc[("synthetic-chat", 20.0, "llama-dspark:0.3"), "ratio"] == pytest.approx(0.8)
    assert r.loc[("synthetic-chat", 20.0, "vllm-adaptive"), "best reference"] == "mtp1"
    # a point no reference reaches is dropped (oracle, never a reference, reaches it)
    assert ("chat", 200.0, "vllm-adaptive") not in r.index
    assert set(r["group"]) == {"recorded", "synthetic"}


def test_summary_counts_points_within_2pct_and_unreachable(sla):
    s = engine_summary(engine_ratios(sla, ENGINES, ["zos", "mtp1"], GROUPS))
    s = s.set_index(["group", "rule"])
    rec = s.loc[("recorded", "vllm-adaptive")]
    assert rec["points"] == 2 and rec["SLA points it cannot reach"] == 1
    assert rec["share within 2%"] == 0.5 and rec["worst / best"] == 0.0
    assert rec["median / best"] == pytest.approx(0.495)
    assert s.loc[("recorded", "llama-dspark:0.3"), "median / best"] == pytest.approx(0.75)


def test_deploy_lines_name_the_best_rule_per_group_and_where_each_holds(sla):
    ratios = engine_ratios(sla, ENGINES, ["zos", "mtp1"], GROUPS)
    text = "\n".join(deploy_lines(engine_summary(ratios), ratios, [20.0, 80.0]))
    assert "- recorded traces: `llama-dspark:0.3` (median 0.750" in text
    assert "- synthetic traces: `vllm-adaptive` (median 1.000" in text
    # vllm-adaptive is within 2% at every trace at SLA 20 (0.99 and 1.0), not at 80
    assert "`vllm-adaptive`: within 2% of the best at every trace for SLA 20 tok/s/user" in text
    # llama-dspark: 0.5 and 0.8 at SLA 20; at 80 the one trace with a reference point gives 1.0
    assert "`llama-dspark:0.3`: within 2% of the best at every trace for SLA 80 tok/s" in text
    one = engine_ratios(sla[sla["sla_tps"] == 20.0], ENGINES, ["zos", "mtp1"], GROUPS)
    assert "`llama-dspark:0.3`: not within 2%" in "\n".join(
        deploy_lines(engine_summary(one), one, [20.0])
    )


def test_auto_is_shown_beside_the_engine_rules_but_not_ranked_among_them(sla):
    with_auto = pd.concat(
        [sla, pd.DataFrame([{"trace": "chat", "sla_tps": 20.0, "policy": "auto", Y: 100.0}])]
    )
    ratios = engine_ratios(with_auto[with_auto["trace"] == "chat"], [*ENGINES, "auto"],
                           ["zos", "mtp1"], GROUPS)  # fmt: skip
    text = "\n".join(deploy_lines(engine_summary(ratios), ratios, [20.0, 80.0]))
    assert "- recorded traces: `llama-dspark:0.3`" in text  # auto's 1.0 does not take the lead
    assert "(specsim's `auto`: median" in text

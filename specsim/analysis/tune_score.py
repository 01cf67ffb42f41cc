"""What ``tune`` scores a setting by: the SLA it must meet and the objective's number (split from
:mod:`specsim.analysis.tune`, which picks the best setting with them)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specsim.errors import SpecsimError


# ------------------------------------------------------------------ the SLA and the score
@dataclass(frozen=True)
class Sla:
    """Every ``slo`` latency's ``quantile`` percentile at most its bound (ms), and the mean
    per-user speed at least ``tps``; nothing given: every row meets it."""

    slo_ms: tuple[tuple[str, float], ...] = ()
    tps: float | None = None
    quantile: int = 90

    @classmethod
    def from_config(cls, cfg: Any) -> Sla:
        from specsim.sim.metrics import parse_slo

        slo = parse_slo(cfg.slo) or {}
        if cfg.sla_tps is not None and not (math.isfinite(cfg.sla_tps) and cfg.sla_tps > 0):
            raise SpecsimError(f"--sla-tps must be a positive number, got {cfg.sla_tps}")
        return cls(tuple(slo.items()), cfg.sla_tps, int(cfg.sla_quantile))

    def misses(self, s: dict[str, Any]) -> list[str]:
        """What a summary misses, in words (empty: it meets the SLA)."""
        out = []
        for key, bound in self.slo_ms:
            v = s.get(f"{key}_ms_p{self.quantile}")
            if v is None or not math.isfinite(v) or v > bound:
                out.append(f"P{self.quantile} {key.upper()} {_num(v, '.1f')} ms > {bound:g}")
        if self.tps is not None:
            v = s.get("per_user_tps_mean")
            if v is None or not math.isfinite(v) or v < self.tps:
                out.append(f"mean per-user speed {_num(v, '.1f')} tok/s < {self.tps:g}")
        return out

    def describe(self) -> str:
        parts = [f"P{self.quantile} {k.upper()} <= {v:g} ms" for k, v in self.slo_ms]
        if self.tps is not None:
            parts.append(f"mean per-user speed >= {self.tps:g} tok/s")
        return " and ".join(parts) if parts else "no SLA given (every setting qualifies)"


def _num(v: Any, spec: str) -> str:
    return "n/a" if v is None or not math.isfinite(float(v)) else f"{v:{spec}}"


def throughput(s: dict[str, Any], closed: bool) -> float:
    """Steady-state output tok/s of a closed loop (warm-up and drain excluded), whole-run
    output tok/s otherwise (and where the closed loop had no steady window)."""
    steady = s.get("steady_throughput_tok_s")
    if closed and steady is not None and math.isfinite(steady):
        return float(steady)
    return float(s["throughput_tok_s"])


def objective_value(s: dict[str, Any], objective: str, closed: bool, q: int) -> float:
    """The objective's number for one summary (its unit in :func:`describe_objective`)."""
    if objective == "throughput":
        return throughput(s, closed)
    if objective == "goodput":
        v = s.get("goodput_req_s")
        return float("nan") if v is None else float(v)
    return float(s[f"{objective}_ms_p{q}"])


def maximize(objective: str) -> bool:
    return objective in ("throughput", "goodput")


def describe_objective(objective: str, closed: bool, q: int) -> str:
    return {
        "throughput": "steady-state output throughput (tok/s), higher is better"
        if closed
        else "output throughput (tok/s), higher is better",
        "goodput": "goodput (requests/s meeting every --slo), higher is better",
        "tpot": f"P{q} TPOT (ms), lower is better",
        "ttft": f"P{q} TTFT (ms), lower is better",
    }[objective]


# ------------------------------------------------------------------ running the grid

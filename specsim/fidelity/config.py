"""What a fidelity grid is run with: ``ValidationConfig`` (every knob, each default written
once: it feeds ``specsim validate``'s flags and is saved in ``config.json``), the grid's cells
and one real run's spec."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specsim.errors import SpecsimError
from specsim.options import option

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Cell:
    """One grid cell: closed loop at ``concurrency`` or open loop at ``rate_frac`` of the
    simulated capacity (found per policy from the simulator's closed loop at the largest C)."""

    policy: str
    concurrency: int | None = None
    rate_frac: float | None = None
    drafter: str = ""

    @property
    def load(self) -> str:
        if self.concurrency is not None:
            return f"C={self.concurrency}"
        return f"rate={self.rate_frac:g}x"


@dataclass(frozen=True)
class RunSpec:
    """One real run (picklable: it crosses to a worker process)."""

    cell: Cell
    repeat: int
    jobs: int
    rate: float | None  # req/s (open loop)
    seed: int
    clock: str
    layout: str
    prefill_budget: int
    kv_tokens: int
    cost: Any  # CostModel the policy sees (the clock's profile)
    prompt_ids: list[list[int]]  # per trace request
    prompt_len: np.ndarray
    output_len: np.ndarray
    probe_ref: tuple[float, ...] = ()  # probe ms at profiling time (PROBE_POINTS)
    draft_phase: str = "draft"  # the speed reference's drafter probe (clock ref)


def parse_grid(
    policies: str | tuple[str, ...], concurrency: str | tuple[int, ...], rates: Any = ""
) -> list[Cell]:
    """Cells of the grid: every policy at every closed-loop C and every open-loop rate."""
    pols = _items(policies)
    try:
        conc = [int(c) for c in _items(concurrency)]
    except ValueError:
        raise SpecsimError(
            f"--concurrency must be integers like 1,2,4,8, got {concurrency!r}"
        ) from None
    try:
        fr = [float(r) for r in _items(rates)]
    except ValueError:
        raise SpecsimError(f"--rates must be fractions like 0.3,0.6,0.9, got {rates!r}") from None
    if not pols or not conc or min(conc) < 1:
        raise SpecsimError("give at least one policy and positive concurrency levels")
    if any(not (0 < f < 2) for f in fr):
        raise SpecsimError(f"--rates are fractions of the simulated capacity in (0, 2): {rates!r}")
    from specsim.policies.base import get_policy

    for p in pols:
        pol = get_policy(p)  # a typo fails now, in one line, not after the profile
        if pol.needs & {"accept_len"}:
            raise SpecsimError(f"policy {p!r} reads the future (an oracle); a real engine cannot")
    cells = [Cell(p, concurrency=c) for p in pols for c in conc]
    return cells + [Cell(p, rate_frac=f) for p in pols for f in fr]


def _items(x: Any) -> list[str]:
    if isinstance(x, str):
        return [s.strip() for s in x.split(",") if s.strip()]
    return [str(s) for s in x]


def max_concurrency(cells: list[Cell]) -> int:
    return max((c.concurrency for c in cells if c.concurrency is not None), default=8)


def cell_jobs(c: Cell, requests: int | None, trace: Any) -> int:
    """Jobs a cell runs: ``requests`` or the trace's, and at least C (a closed loop)."""
    n = requests or trace.n_requests
    return max(n, c.concurrency or 0)


@dataclass(frozen=True)
class ValidationConfig:
    """Every knob of a fidelity grid (``specsim validate``; saved in its ``config.json``)."""

    # -- what is compared
    trace: Path = option(
        None,
        "greedy trace of --prompts with the drafter (recorded here if missing); several "
        "drafters need {drafter} in the name",
        type=Path,
        required=True,
    )
    prompts: tuple[str, ...] = option(
        (),
        "the prompts the trace is (to be) recorded on, e.g. humaneval[:8]",
        nargs="+",
        required=True,
    )
    drafters: tuple[str, ...] = option(
        ("dspark",),
        "drafters to validate: dspark, a DSpark checkpoint folder, ngram[:N] (several need "
        "{drafter} in --trace)",
    )
    policies: tuple[str, ...] = option(("ar", "mtp1", "full", "hw-aware"), "policies")
    concurrency: tuple[int, ...] = option((1, 2, 4, 8), "closed-loop levels", type=int)
    rates: tuple[float, ...] = option(
        (),
        "open-loop Poisson cells at these fractions of each policy's simulated capacity "
        "(closed loop at the largest C), e.g. 0.3,0.6,0.9 (default: none)",
        type=float,
    )
    open_drafters: tuple[str, ...] | None = option(
        None,
        "drafters that get the open-loop cells (default: the first drafter)",
        type=str,
        sequence=True,
    )
    requests: int | None = option(
        None, "jobs per cell (default: the trace's requests; a closed loop runs at least C)",
        type=int,
    )  # fmt: skip
    max_new_tokens: int = option(64, "new tokens per prompt when recording the trace")
    # -- the engine and its profile
    target: str = option("smollm2", "target model", cli=False)
    device: str = option("cpu", "torch device", cli=False)
    layout: str = option("flat", "verification batch layout", cli=False)
    clock: str = option("cpu", "the engine's clock", cli=False)
    seed: int = option(0, "seed", cli=False)
    profile: str | None = option(
        None, "use this SPS profile instead of measuring the engine's own", type=str
    )
    contexts: tuple[int, ...] = option((64, 256, 512), "profile contexts", type=int)
    profile_repeats: int = option(5, "timed repeats per profile point")
    profile_batches: tuple[int, ...] | None = option(
        None, "profile token batches", type=int, sequence=True, cli=False
    )
    shared_table: bool = option(
        True,
        "time the target's step table once, with the passes of every drafter's profile "
        "pooled, and reuse it in each (the forward does not depend on the drafter; more passes "
        "narrow a large point's scatter between profiles: studies/README.md); "
        "--no-shared-table times one table per drafter",
    )
    prefill_budget: int = option(256, "prompt tokens admitted per step (both sides)")
    # -- repeats and how runs are timed
    repeats: int = option(1, "real runs per closed-loop cell, for a spread")
    open_repeats: int | None = option(
        None, "real runs per open-loop cell (default: --repeats)", type=int
    )
    workers: int = option(
        1,
        "real runs at a time, each in its own process on its own core (more only with "
        "--clock ref; on the 2-core VM two workers' runs came out ~17% slower on the ref "
        "clock than the profile, unseen by the probes: docs/fidelity.md, so a report uses 1)",
    )
    ref_every: float = option(
        1.0,
        "--clock ref: engine CPU seconds between re-timings of the speed probes (this VM's "
        "speed moves within seconds: docs/fidelity.md; the probes cost ~20% more wall time)",
    )
    ref_window: int = option(1, "--clock ref: the speed factor is the median of this many probes")
    ref_probe: str = option(
        "cold",
        "--clock ref: time each probe once, right after the engine's work (cold: follows this "
        "VM better at half the probes' cost, studies/README.md) or after a warm-up call (warm)",
        choices=("cold", "warm"),
    )
    ref_large: int = option(
        64,
        "--clock ref: tokens of a second, large target probe towards whose speed larger "
        "forwards are timed (0: one 4-token probe for every forward)",
    )
    ref_mid: int = option(
        0, "--clock ref: tokens of a third probe between the small and the large one (0: none)"
    )
    ref_large_every: int = option(
        4, "--clock ref: re-time the large probe at every N-th calibration only"
    )
    hog_check: bool = option(
        False,
        "first run one cell quiet, beside CPU hogs and beside memory hogs (one per core), to "
        "measure how far each clock moves (hog.csv)",
    )
    # -- output
    grid_label: str = option(
        "tuning",
        "the 'grid' column of fidelity.csv: 'tuning' for cells the method was tuned on, "
        "'held-out' for a grid run once after the method was frozen",
    )
    out: Path = option(Path("reports/fidelity"), "report folder", type=Path)
    force: bool = option(False, "overwrite the report in --out")

    def __post_init__(self) -> None:
        for name in ("repeats", "profile_repeats", "ref_window", "ref_large_every"):
            if getattr(self, name) < 1:
                raise SpecsimError(f"--{name.replace('_', '-')} must be at least 1")
        if self.open_repeats is not None and self.open_repeats < 1:
            raise SpecsimError(f"--open-repeats must be at least 1, got {self.open_repeats}")
        if not self.ref_every > 0:
            raise SpecsimError(f"--ref-every must be positive seconds, got {self.ref_every}")
        if self.grid_label not in ("tuning", "held-out"):
            raise SpecsimError(f"--grid-label is 'tuning' or 'held-out', got {self.grid_label!r}")
        if self.ref_large < 0 or 0 < self.ref_large <= 4:
            raise SpecsimError(
                "--ref-large must be 0 (off) or more tokens than the small probe's 4, e.g. 64; "
                f"got {self.ref_large}"
            )
        if self.ref_mid and not (4 < self.ref_mid < self.ref_large):
            raise SpecsimError(
                "--ref-mid must be 0 (off) or between the small probe's 4 tokens and "
                f"--ref-large ({self.ref_large}), e.g. 16; got {self.ref_mid}"
            )
        if not 1 <= self.workers <= (os.cpu_count() or 1):
            raise SpecsimError(
                f"--workers must be between 1 and this machine's {os.cpu_count()} cores, got "
                f"{self.workers}"
            )
        if self.workers > 1 and self.clock != "ref":
            raise SpecsimError(
                f"--workers {self.workers} needs --clock ref: on the {self.clock} clock each "
                "run would time its neighbour too; pass --clock ref or --workers 1"
            )
        if not self.drafters:
            raise SpecsimError("give at least one drafter")
        if len(self.drafters) > 1 and "{drafter}" not in str(self.trace):
            raise SpecsimError(
                "several --drafters need one trace each: put {drafter} in --trace, e.g. "
                "reports/fidelity/trace-{drafter}.parquet"
            )
        bad = [d for d in (self.open_drafters or ()) if d not in self.drafters]
        if bad:
            raise SpecsimError(f"--open-drafters {bad[0]!r} is not one of --drafters")

    @property
    def cells(self) -> list[Cell]:
        return parse_grid(self.policies, self.concurrency, self.rates)

    def trace_for(self, drafter: str) -> Path:
        return Path(str(self.trace).replace("{drafter}", drafter.replace(":", "")))

    def with_(self, **changes: Any) -> ValidationConfig:
        return replace(self, **changes)

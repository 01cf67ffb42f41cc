"""What ``specsim validate --engine llama-server`` runs with: ``LlamaValidationConfig`` (its
flags and ``config.json``) and the speculative settings it compares (``SpecSetting``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError
from specsim.options import option

SPEC_HELP = "none or ngram:M (ngram-simple, draft size M)"
DSPARK_LATER = (
    "draft-dspark settings are not in this grid yet: the drafts at every output position need "
    "the torch drafter, which lives in specsim.record (docs/llama-cpp.md, 'Not yet'); use none "
    "or ngram:M"
)


@dataclass(frozen=True)
class SpecSetting:
    """One speculative setting of llama-server: ``none`` or ``ngram:M`` (``ngram-simple``)."""

    kind: str  # none | ngram
    n_max: int = 0

    @classmethod
    def parse(cls, text: str) -> SpecSetting:
        parts = text.strip().split(":")
        kind = parts[0]
        try:
            if kind == "none" and len(parts) == 1:
                return cls("none")
            if kind == "ngram" and len(parts) == 2:
                return cls("ngram", int(parts[1]))
            if kind == "dspark":
                raise SpecsimError(DSPARK_LATER)
        except ValueError:
            pass
        raise SpecsimError(f"unknown speculative setting {text!r}; use {SPEC_HELP}")

    @property
    def name(self) -> str:
        return "none" if self.kind == "none" else f"ngram:{self.n_max}"

    @property
    def slug(self) -> str:
        """The name as a file-name part."""
        return self.name.replace(":", "-")

    @property
    def policy(self) -> str:
        """The simulator's policy that verifies what the server verifies (llama_trace)."""
        from specsim.serve.llama_trace import VERIFY_AS_SERVER

        return "ar" if self.kind == "none" else VERIFY_AS_SERVER


@dataclass(frozen=True)
class LlamaValidationConfig:
    """Every knob of the llama-server fidelity grid (saved in its ``config.json``)."""

    # -- what is compared
    prompts: tuple[str, ...] = option(("mt-bench",), "the grid's prompts", nargs="+")
    calib_prompts: str = option(
        "chat-train[0:160]", "the calibration runs' prompts (never the grid's)"
    )
    specs: tuple[str, ...] = option(("none", "ngram:3", "ngram:7"), SPEC_HELP)
    ngram_n: int = option(2, "lookup n-gram size of the ngram:M settings")
    concurrency: tuple[int, ...] = option(
        (1, 2, 3, 4, 6, 8, 12, 16), "closed-loop levels", type=int
    )
    rates: tuple[float, ...] = option((1.0, 2.0), "open-loop Poisson rates, requests/s", type=float)
    temperatures: tuple[float, ...] = option((0.0, 1.0), "sampling temperatures", type=float)
    repeats: int = option(2, "real runs of every cell")
    min_requests: int = option(12, "requests of a closed-loop cell: 3C, and at least this")
    open_requests: int = option(40, "requests of an open-loop cell")
    max_tokens: int = option(
        160, "output lengths: each prompt's greedy length to EOS, at most this (>= 16)"
    )
    # -- calibration (the profile): other prompts, other concurrencies
    calib_concurrency: tuple[int, ...] = option((5, 10, 20), "calibration closed loops", type=int)
    calib_requests: float = option(2.0, "calibration requests per run, times C")
    profile: Path | None = option(
        None, "a profile folder from an earlier run (profile-t*.csv) instead of calibrating",
        type=Path,
    )  # fmt: skip
    # -- the server
    threads: int = option(1, "llama-server -t (1 measured best on the 2-core VM: docs)")
    parallel: int = option(20, "llama-server -np (slots; the simulator's max_running)")
    ctx_per_slot: int = option(1024, "context per slot (-c = parallel x this)")
    seed: int = option(0, "seed of job order, arrivals and the server's sampling")
    # -- output
    out: Path = option(Path("reports/llama-cpp"), "report folder", type=Path)
    force: bool = option(False, "overwrite the report in --out")
    rescore: bool = option(
        False, "score the runs already measured in --out again, no server (the same flags; "
        "the README then says it was rescored)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        settings = self.settings  # parses every spec
        if any(s.kind == "ngram" and s.n_max < self.ngram_n for s in settings):
            raise SpecsimError(
                f"ngram:M with M < --ngram-n {self.ngram_n} never drafts (llama.cpp drops a "
                "continuation shorter than its lookup n-gram); lower --ngram-n"
            )
        for name in ("repeats", "min_requests", "open_requests", "threads", "parallel"):
            if getattr(self, name) < 1:
                raise SpecsimError(f"--{name.replace('_', '-')} must be at least 1")
        if self.max_tokens < 16:
            raise SpecsimError(f"--max-tokens must be at least 16, got {self.max_tokens}")
        conc = (*self.concurrency, *self.calib_concurrency)
        if not conc or min(conc) < 1 or max(conc) > self.parallel:
            raise SpecsimError(
                f"concurrency levels must be in [1, --parallel {self.parallel}], got {conc}"
            )
        if any(not (math.isfinite(r) and r > 0) for r in self.rates):
            raise SpecsimError(f"--rates must be positive requests/s, got {self.rates}")
        if any(t < 0 for t in self.temperatures):
            raise SpecsimError("--temperatures must be >= 0")
        if not self.calib_requests >= 1:
            raise SpecsimError("--calib-requests must be at least 1 (times C)")

    @property
    def settings(self) -> list[SpecSetting]:
        return [SpecSetting.parse(s) for s in self.specs]

    def cell_requests(self, concurrency: int | None) -> int:
        if concurrency is None:
            return self.open_requests
        return max(3 * concurrency, self.min_requests)

    def with_(self, **changes: Any) -> LlamaValidationConfig:
        return replace(self, **changes)

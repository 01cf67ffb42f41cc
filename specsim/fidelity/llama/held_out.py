"""The held-out llama-server grid of issue #48, fixed as data before it is run (once, after the
serving model is frozen) so that nothing in it can be chosen after seeing a result.

What it holds out, against the tuning grid (``reports/llama-cpp/config.json``: prompts
``mt-bench[0:40]``, C = 1, 2, 4, 8, Poisson 0.7 req/s, outputs <= 64 tokens) and the profile's
calibration runs (``chat-train[0:32]`` at C = 3, 6, 12):

- prompts no run of the method saw: MT-Bench 40-51 (the tuning grid took 0-39), GSM8K and
  HumanEval 100-111 (the DSpark parity check took each set's first 8; drafter v3 trained on the
  ``*-train`` sets only);
- closed loops at C = 5, 10, 16 (in neither the grid's nor the calibration's levels; 16 = the
  servers' ``-np``), Poisson arrivals at two rates, outputs up to 256 tokens, T = 0 and 1;
- settings ``none``, ``ngram-simple`` at draft sizes 3 and 7, and ``draft-dspark`` with
  drafter v3 (``specsim/data/drafters/dspark-v3-b179c9523d0e``; its GGUF is made by
  ``export_deepspec`` + ``convert_to_gguf``, docs/llama-cpp-dspark.md, and shipped as
  ``reports/llama-cpp-dspark/draft.gguf``) at ``--spec-draft-n-max`` 7 (its block size) and 4,
  and at 7 with the confidence cut ``--spec-draft-p-min 0.5``.

The method itself is the tuning grid's, unchanged: the same calibration prompts and
concurrencies, the same servers (``-np 16``, ``-t 1``, ``--threads-batch 1``), every cell
repeated until the 95% interval of its median is within 3% (:mod:`specsim.fidelity.repeats`).

The rates: the tuning grid's servers gave 45-77 tok/s at C = 8 (``none``) and 40-60 (n-gram);
with outputs of ~200 tokens that is a capacity near 0.25-0.35 requests/s, so 0.1 and 0.2 req/s
are a light and a heavy open loop for every setting.

``draft-dspark`` is not yet a setting ``specsim validate`` parses (its traces need the torch
drafter: docs/llama-cpp.md, "Not yet"); :func:`command` leaves those settings out, and says
so, until :class:`~specsim.fidelity.llama.config.SpecSetting` accepts them.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from specsim.errors import SpecsimError

# The definition. Keys are LlamaValidationConfig fields (flags: "--" + key with "-" for "_"),
# except "dspark" (the drafter and its GGUF, for the draft-dspark settings).
HELD_OUT: dict[str, Any] = {
    "grid_label": "held-out",
    "prompts": ("mt-bench[40:52]", "gsm8k[100:112]", "humaneval[100:112]"),
    "calib_prompts": "chat-train[0:32]",  # the method's: the tuning grid's calibration
    "calib_concurrency": (3, 6, 12),
    "calib_requests": 1.5,
    "specs": ("none", "ngram:3", "ngram:7", "dspark:7", "dspark:4", "dspark:7:0.5"),
    "ngram_n": 2,
    "concurrency": (5, 10, 16),
    "rates": (0.1, 0.2),
    "temperatures": (0.0, 1.0),
    "max_tokens": 256,
    "min_requests": 10,
    "open_requests": 14,
    "parallel": 16,
    "threads": 1,
    "threads_batch": 1,
    "target_ci": 0.03,
    "min_repeats": 3,
    "max_repeats": 12,
    "warmup": 1,
    "out": "reports/llama-cpp-held-out",
    "dspark": {
        "drafter": "dspark-v3-b179c9523d0e",
        "gguf": "reports/llama-cpp-dspark/draft.gguf",
        "block_size": 7,
    },
}

# the tuning grid and calibration the held-out grid must not overlap (reports/llama-cpp)
TUNING: dict[str, Any] = {
    "prompts": ("mt-bench[0:40]",),
    "calib_prompts": "chat-train[0:32]",
    "concurrency": (1, 2, 4, 8),
    "calib_concurrency": (3, 6, 12),
    "rates": (0.7,),
}


def is_dspark(spec: str) -> bool:
    return spec.strip().split(":")[0] == "dspark"


def runnable_specs(defn: Mapping[str, Any] = HELD_OUT) -> tuple[list[str], list[str]]:
    """The definition's settings ``specsim validate`` parses today, and those it refuses (the
    draft-dspark ones until their trace builder exists), each list in the definition's order."""
    from specsim.fidelity.llama.config import SpecSetting

    ok, later = [], []
    for s in defn["specs"]:
        try:
            SpecSetting.parse(s)
            ok.append(s)
        except SpecsimError:
            if not is_dspark(s):
                raise
            later.append(s)
    return ok, later


def config_kwargs(defn: Mapping[str, Any] = HELD_OUT, specs: list[str] | None = None) -> dict:
    """The definition as ``LlamaValidationConfig`` keyword arguments (``specs``: these settings
    instead of the definition's)."""
    from pathlib import Path

    kw = {k: v for k, v in defn.items() if k != "dspark"}
    if specs is not None:
        kw["specs"] = tuple(specs)
    kw["out"] = Path(kw["out"])
    return kw


def argv(defn: Mapping[str, Any] = HELD_OUT, specs: list[str] | None = None) -> list[str]:
    """The ``specsim`` arguments that run the definition (``--force`` not included: the
    folder is new, and a second run of a held-out grid is not a held-out grid)."""
    kw = config_kwargs(defn, specs)
    out = ["validate", "--engine", "llama-server"]
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        if k == "threads":
            flag = "--server-threads"  # --threads is the torch engine's (specsim validate)
        if k == "prompts":
            out += [flag, *map(str, v)]
        elif isinstance(v, tuple):
            out += [flag, ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)]
        else:
            out += [flag, f"{v:g}" if isinstance(v, float) else str(v)]
    return out


def command(defn: Mapping[str, Any] = HELD_OUT) -> str:
    """The shell command that runs the held-out grid with every setting validate parses now;
    a trailing comment names the settings left out until draft-dspark is supported."""
    ok, later = runnable_specs(defn)
    line = "specsim " + " ".join(shlex.quote(a) for a in argv(defn, ok))
    if later:
        line += f"  # not yet runnable: {', '.join(later)} (draft-dspark traces)"
    return line


def estimate_minutes(
    defn: Mapping[str, Any] = HELD_OUT,
    tok_s: Mapping[str, float] | None = None,
    mean_output: float = 200.0,
    repeats: int | None = None,
) -> float:
    """A planning estimate (not a measurement) of the grid's real-run minutes: every cell run
    ``warmup + repeats`` times (default: ``min_repeats``, the fastest the rule allows), a closed
    loop taking its tokens over the setting's throughput, an open loop its requests over the
    rate plus one request's service (on this CPU one request alone runs near the batched
    throughput: 68 tok/s at C = 1 and at C = 8 for ``none``). ``tok_s``: throughput per
    setting kind (default: the tuning grid's, reports/llama-cpp: ~65 tok/s plain, ~50 n-gram;
    draft-dspark assumed 45). The inputs, traces and calibration phases come on top."""
    rate_of = {"none": 65.0, "ngram": 50.0, "dspark": 45.0, **(tok_s or {})}
    from specsim.fidelity.llama.config import LlamaValidationConfig

    cfg = LlamaValidationConfig(**config_kwargs(defn, runnable_specs(defn)[0]))
    n_runs = defn["warmup"] + (repeats or defn["min_repeats"])
    total = 0.0
    for s in defn["specs"]:
        speed = rate_of[s.split(":")[0]]
        for _t in defn["temperatures"]:
            for c in defn["concurrency"]:
                total += cfg.cell_requests(c) * mean_output / speed
            for r in defn["rates"]:
                total += cfg.cell_requests(None) / r + mean_output / speed
    return total * n_runs / 60.0


def overlaps(defn: Mapping[str, Any] = HELD_OUT, tuning: Mapping[str, Any] = TUNING) -> list[str]:
    """What the held-out grid shares with the tuning grid or the calibration (empty: nothing):
    closed-loop levels, rates and prompt indices per bundled set."""
    from specsim.prompts import load_many

    out = []
    seen_c = {*tuning["concurrency"], *tuning["calib_concurrency"]}
    out += [f"C={c}" for c in defn["concurrency"] if c in seen_c]
    out += [f"rate={r:g}" for r in defn["rates"] if r in set(tuning["rates"])]
    mine = {p.text for p in load_many(list(defn["prompts"]))}
    theirs = {p.text for p in load_many([*tuning["prompts"], tuning["calib_prompts"]])}
    shared = mine & theirs
    if shared:
        out.append(f"{len(shared)} prompts")
    return out

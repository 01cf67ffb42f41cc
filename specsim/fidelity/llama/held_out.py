"""The held-out llama-server grid of issue #48, fixed as data before it is run (once, after the
serving model is frozen) so that nothing in it can be chosen after seeing a result.

What it holds out, against the tuning grid (``reports/llama-cpp/config.json``: prompts
``mt-bench[0:40]``, C = 1, 2, 4, 8, Poisson 0.7 req/s) and the profile's calibration runs
(``chat-train[0:32]`` at C = 3, 6, 12):

- prompts no run of the method saw: MT-Bench 40-51 (the tuning grid took 0-39), GSM8K and
  HumanEval 100-111 (the DSpark parity check took each set's first 8; drafter v3 trained on the
  ``*-train`` sets only);
- a closed loop at C = 5 (in neither the grid's nor the calibration's levels) and Poisson
  arrivals at 0.25 req/s, T = 0 and 1;
- settings ``none``, ``ngram-simple`` at draft sizes 3 and 7, and ``draft-dspark`` with
  drafter v3 (``specsim/data/drafters/dspark-v3-b179c9523d0e``; its GGUF is made by
  ``export_deepspec`` + ``convert_to_gguf``, docs/llama-cpp-dspark.md, once into the user's
  cache, :mod:`specsim.record.draft_gguf`: the conversion reports/llama-cpp-dspark checked) at
  ``--spec-draft-n-max`` 7 (its block size) and 4 (llama.cpp then decodes blocks of 4, not
  the first 4 of a block of 7: :func:`specsim.record.dspark_export.with_block`), and at 7
  with the confidence cut ``--spec-draft-p-min 0.5``: settings the tuning grid never had.

The method is the tuning grid's with the serving model's frozen terms (docs/llama-cpp.md, "The
serving model's terms"): the same calibration prompts and concurrencies (every setting
calibrated, draft-dspark's steps rebuilt with the torch drafter), the same servers (``-np 16``,
``-t 1``, ``--threads-batch 1``), every cell repeated until the 95% interval of its median is
within 3% (:mod:`specsim.fidelity.repeats`), at most 5 kept runs.

Sized for the issue's 75 minutes (:func:`estimate_minutes`). The first definition (4 Dec 2026:
C = 5, 10, 16, Poisson 0.1 and 0.2 req/s, outputs up to 256 tokens, up to 12 repeats) was cut
before any run of it when its estimate came to 477 minutes at the fewest repeats: one closed
and one open load, outputs up to 64 tokens (the tuning grid's cap), at most 5 kept runs, one
calibration request per C. draft-dspark on this CPU runs at 15-30 tok/s (the drafter's forward
costs more than a decode step: reports/llama-cpp-dspark), so 0.25 req/s of ~60-token outputs
is about 60% of its capacity and a light load for the others.

The draft-dspark settings' traces come from the torch drafter over the plain server's outputs
(:mod:`specsim.record.llama_dspark_trace`), so the grid needs torch for them.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from specsim.errors import SpecsimError

# The definition. Keys are LlamaValidationConfig fields (flags: "--" + key with "-" for "_"),
# except "dspark": the draft-dspark settings' drafter (--dspark-drafter) and its block size.
HELD_OUT: dict[str, Any] = {
    "grid_label": "held-out",
    "prompts": ("mt-bench[40:52]", "gsm8k[100:112]", "humaneval[100:112]"),
    "calib_prompts": "chat-train[0:32]",  # the method's: the tuning grid's calibration
    "calib_concurrency": (3, 6, 12),
    "calib_requests": 1.0,
    "specs": ("none", "ngram:3", "ngram:7", "dspark:7", "dspark:4", "dspark:7:0.5"),
    "ngram_n": 2,
    "concurrency": (5,),
    "rates": (0.25,),
    "temperatures": (0.0, 1.0),
    "max_tokens": 64,
    "min_requests": 10,
    "open_requests": 8,
    "parallel": 16,
    "threads": 1,
    "threads_batch": 1,
    "target_ci": 0.03,
    "min_repeats": 3,
    "max_repeats": 5,
    "warmup": 1,
    "out": "reports/llama-cpp-held-out",
    "dspark": {
        "drafter": "dspark-v3-b179c9523d0e",  # its GGUF: <cache>/drafts/, made by the run
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


def runnable_specs(defn: Mapping[str, Any] = HELD_OUT) -> list[str]:
    """The definition's settings in its order, each parsed as ``specsim validate`` parses it
    (a setting it refuses raises its one-line error here, not hours into a run); a dspark
    setting's block must fit the definition's drafter's."""
    from specsim.fidelity.llama.config import SpecSetting

    block = defn.get("dspark", {}).get("block_size")
    for s in defn["specs"]:
        setting = SpecSetting.parse(s)
        if setting.kind == "dspark" and block is not None and setting.n_max > block:
            raise SpecsimError(f"held-out setting {s}: a block longer than the drafter's {block}")
    return list(defn["specs"])


def config_kwargs(defn: Mapping[str, Any] = HELD_OUT, specs: list[str] | None = None) -> dict:
    """The definition as ``LlamaValidationConfig`` keyword arguments (``specs``: these settings
    instead of the definition's; the ``dspark`` block's drafter as ``dspark_drafter``)."""
    from pathlib import Path

    kw = {k: v for k, v in defn.items() if k != "dspark"}
    if "dspark" in defn:
        kw["dspark_drafter"] = defn["dspark"]["drafter"]
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
    """The shell command that runs the held-out grid, every setting of the definition."""
    return "specsim " + " ".join(shlex.quote(a) for a in argv(defn, runnable_specs(defn)))


def estimate_minutes(
    defn: Mapping[str, Any] = HELD_OUT,
    tok_s: Mapping[str, float] | None = None,
    mean_output: float | None = None,
    repeats: int | None = None,
) -> float:
    """A planning estimate (not a measurement) of the grid's minutes of server work: the
    inputs (each prompt's greedy length, then its output at every temperature), every setting's
    calibration runs, and every cell run ``warmup + repeats`` times (default: ``min_repeats``,
    the fewest the rule allows; ``max_repeats`` gives the most). A closed loop takes its tokens
    over the setting's throughput, an open loop its requests over the rate plus one request's
    service. ``tok_s``: throughput per setting kind (default: the tuning grid's, ~65 tok/s
    plain and ~50 n-gram, reports/llama-cpp; 25 for draft-dspark, whose server ran 15-30 tok/s
    at C = 1-8 here, its drafter's forward costing more than a decode step). ``mean_output``:
    tokens per request (default: 95% of ``max_tokens``: most prompts' answers reach the cap).
    With ``calib_schedule`` ``rounds`` the calibration runs once a round; with the server's
    own traces, each setting's recording runs (``trace_draws`` per temperature) count too.
    Loading the drafter for the traces and the calibration rebuild (about a minute) comes on
    top."""
    import math

    rate_of = {"none": 65.0, "ngram": 50.0, "dspark": 25.0, **(tok_s or {})}
    from specsim.fidelity.llama.config import LlamaValidationConfig
    from specsim.prompts import load_many

    cfg = LlamaValidationConfig(**config_kwargs(defn, runnable_specs(defn)))
    out = 0.95 * defn["max_tokens"] if mean_output is None else mean_output
    n_runs = defn["warmup"] + (repeats or defn["min_repeats"])
    n_prompts = len(load_many(list(defn["prompts"])))
    total = n_prompts * out * (1 + len(defn["temperatures"])) / rate_of["none"]
    calib = sum(math.ceil(defn["calib_requests"] * c) for c in defn["calib_concurrency"])
    if defn.get("calib_schedule") == "rounds":  # a pass after every round, none before
        calib *= n_runs
    recorded = {"ngram": defn.get("ngram_trace") == "server",
                "dspark": defn.get("dspark_trace") == "server"}  # fmt: skip
    for s in defn["specs"]:
        speed = rate_of[s.split(":")[0]]
        if recorded.get(s.split(":")[0]):  # its trace's recording runs (--trace-draws each)
            draws = defn.get("trace_draws", 1)
            total += draws * len(defn["temperatures"]) * n_prompts * out / speed
        for _t in defn["temperatures"]:
            total += calib * out / speed
            cells = sum(cfg.cell_requests(c) * out / speed for c in defn["concurrency"])
            cells += sum(cfg.cell_requests(None) / r + out / speed for r in defn["rates"])
            total += cells * n_runs
    return total / 60.0


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


# Issue 66's held-out grid (fidelity v4, reports/llama-cpp-v4/PLAN.md step 3), fixed here before
# it runs: copy-edit prompts no run saw (the tuning runs took 0-31, their calibration 32-47), a
# closed loop at C = 3 and Poisson arrivals at 0.5 req/s (no earlier grid ran either: v3 C = 1,
# 2, 4, 8 and 5, rates 0.7 and 0.25; v4's tuning C = 1, 4, rate 1.5), T = 0 and 1, the
# tuning runs' settings, servers and calibration (C = 2, 6 on copy-edit[32:48]), the terms and
# clock the committed rules froze; every cell repeated until the 95% interval of its median is
# within 5%, 3-6 kept runs. At 0.5 req/s of ~94-token answers most requests are alone on the
# server, where speculation wins on this target (step 1e: ngram:3 +36% at C = 1).
HELD_OUT_V4: dict[str, Any] = {
    "grid_label": "held-out",
    "prompts": ("copy-edit[48:80]",),
    "calib_prompts": "copy-edit[32:48]",
    "calib_concurrency": (2, 6),
    "calib_requests": 2.0,
    "specs": ("none", "ngram:3", "ngram:7", "dspark:7", "dspark:7:0.3"),
    "ngram_n": 2,
    "concurrency": (3,),
    "rates": (0.5,),
    "temperatures": (0.0, 1.0),
    "max_tokens": 96,
    "min_requests": 8,
    "open_requests": 12,
    "parallel": 8,
    "threads": 2,
    "threads_batch": 2,
    "target_type": "Q4_0-pure",
    "dspark_trace": "server",
    "ngram_trace": "server",
    "terms": ("drafter_request",),
    "step_clock": "server",  # tuning-3 (PLAN.md step 2c: chosen after its result, said so)
    "target_ci": 0.05,
    "min_repeats": 3,
    "max_repeats": 6,
    "warmup": 1,
    "out": "reports/llama-cpp-v4/held-out",
    "dspark": {"drafter": "dspark-v3-b179c9523d0e", "block_size": 7},
}

# every earlier grid and calibration of this method (v3: reports/llama-cpp, its held-out grid;
# v4: the tuning runs), which the v4 held-out grid must not overlap
EARLIER_V4: dict[str, Any] = {
    "prompts": ("mt-bench[0:52]", "gsm8k[100:112]", "humaneval[100:112]", "copy-edit[0:32]"),
    "calib_prompts": "copy-edit[32:48]",
    "concurrency": (1, 2, 4, 5, 8),
    "calib_concurrency": (1, 2, 6),
    "rates": (0.25, 0.7, 1.5),
}

# the v4 servers' throughput per setting kind at one request in flight (tuning-3, tok/s): the
# planning estimate's speeds for HELD_OUT_V4
TOK_S_V4 = {"none": 180.0, "ngram": 190.0, "dspark": 70.0}

# The second v4 held-out grid (reports/llama-cpp-v4/PLAN.md step 6), fixed here before it
# runs: the copy-edit templates over sources no run saw (copy-edit-2), a closed loop at C = 7
# and Poisson arrivals at 0.4 req/s (in no earlier grid or calibration: EARLIER_V5), the
# tuning runs' settings and servers, and the model step 5's rule kept: the step priced pass by
# pass (`passes`), calibration at C = 1, 2, 6 on copy-edit[32:48]; 3-5 kept runs a cell (at
# C = 7 a run costs more than at C = 3: 51 minutes at the most repeats, plus the recording).
HELD_OUT_V5: dict[str, Any] = {
    **HELD_OUT_V4,
    "prompts": ("copy-edit-2[0:32]",),
    "calib_concurrency": (1, 2, 6),
    "concurrency": (7,),
    "rates": (0.4,),
    "terms": ("drafter_request", "passes"),
    "max_repeats": 5,
    "out": "reports/llama-cpp-v4/held-out-2",
}

# every earlier grid and calibration of this method, the first v4 held-out grid included (v3's
# calibration loads 3, 6, 12 too)
EARLIER_V5: dict[str, Any] = {
    "prompts": (*EARLIER_V4["prompts"], "copy-edit[48:80]"),
    "calib_prompts": "copy-edit[32:48]",
    "concurrency": (1, 2, 3, 4, 5, 8),
    "calib_concurrency": (1, 2, 3, 6, 12),
    "rates": (0.25, 0.5, 0.7, 1.5),
}

# The third v4 held-out grid (reports/llama-cpp-v4/PLAN.md step 8), fixed here before it runs:
# the copy-edit templates over sources no run saw (copy-edit-3: GSM8K test questions and
# HumanEval stubs 120-159), a closed loop at C = 6 (a calibration load, in no grid) and Poisson
# arrivals at 1.0 req/s (in no grid or calibration: EARLIER_V6), the tuning runs' settings and
# servers, and the model step 7's rule kept: each pass priced by the table (`passes`) plus a
# cost per pass after the first (`pass_extra`), requests in the lowest free slots, calibration
# at C = 1, 2, 6 on copy-edit[32:48]; 3-5 kept runs a cell.
HELD_OUT_V6: dict[str, Any] = {
    **HELD_OUT_V5,
    "prompts": ("copy-edit-3[0:32]",),
    "concurrency": (6,),
    "rates": (1.0,),
    "terms": ("drafter_request", "passes", "pass_extra"),
    "out": "reports/llama-cpp-v4/held-out-3",
}

# every earlier grid and calibration of this method, the second v4 held-out grid included
EARLIER_V6: dict[str, Any] = {
    **EARLIER_V5,
    "prompts": (*EARLIER_V5["prompts"], "copy-edit-2[0:32]"),
    "concurrency": (*EARLIER_V5["concurrency"], 7),
    "rates": (*EARLIER_V5["rates"], 0.4),
}

# The fourth v4 held-out grid (reports/llama-cpp-v4/PLAN.md step 10), fixed here before it runs:
# the copy-edit templates over sources no run saw (copy-edit-4: the next GSM8K test questions
# and HumanEval stubs 80-99), a closed loop at C = 5 (every level the 8 slots allow has run in
# some grid; 5 only in the v3 grid, on other prompts with another drafter and server build,
# never in v4 or its calibration) and Poisson arrivals at 0.8 req/s (in no grid or
# calibration: EARLIER_V7), the tuning runs' settings and servers, and the model step 9's rule
# kept: each pass priced by the table without a context term (`no_context`) plus `pass_extra`,
# requests in the lowest free slots, calibration at C = 1, 2, 6 on copy-edit[32:48]; 3-5 kept
# runs a cell.
HELD_OUT_V7: dict[str, Any] = {
    **HELD_OUT_V6,
    "prompts": ("copy-edit-4[0:32]",),
    "concurrency": (5,),
    "rates": (0.8,),
    "terms": ("drafter_request", "passes", "pass_extra", "no_context"),
    "out": "reports/llama-cpp-v4/held-out-4",
}

# every earlier grid and calibration of this method, the third v4 held-out grid included
EARLIER_V7: dict[str, Any] = {
    **EARLIER_V6,
    "prompts": (*EARLIER_V6["prompts"], "copy-edit-3[0:32]"),
    "concurrency": (*EARLIER_V6["concurrency"], 6),
    "rates": (*EARLIER_V6["rates"], 1.0),
}

# The fifth v4 held-out grid (reports/llama-cpp-v4/PLAN.md step 13), fixed here before it runs:
# the copy-edit templates over the last sources no run saw (copy-edit-5: the next GSM8K test
# questions and HumanEval stubs 112-119 and 160-163, 24 prompts), a closed loop at C = 8 (every
# slot busy; in v4 never a grid's or a calibration's load, only the v3 grid's, on other prompts
# with another drafter and server build) and Poisson arrivals at 1.2 req/s (in no grid or
# calibration: EARLIER_V8), the tuning runs' settings and servers, and the model step 12's rule
# kept: each pass priced by the table with its context term plus `pass_extra`, each request in
# a seeded random free slot (the median over 5 layouts), calibration at C = 1, 2, 6 on
# copy-edit[32:48]; 3-5 kept runs a cell.
HELD_OUT_V8: dict[str, Any] = {
    **HELD_OUT_V7,
    "prompts": ("copy-edit-5[0:24]",),
    "concurrency": (8,),
    "rates": (1.2,),
    "terms": ("drafter_request", "passes", "pass_extra"),
    "slot_rule": "random",
    "out": "reports/llama-cpp-v4/held-out-5",
}

# every earlier grid and calibration of this method, the fourth v4 held-out grid and the fifth
# tuning run included
EARLIER_V8: dict[str, Any] = {
    **EARLIER_V7,
    "prompts": (*EARLIER_V7["prompts"], "copy-edit-4[0:32]"),
    "rates": (*EARLIER_V7["rates"], 0.8),  # (C = 5 is there: the v3 grid's)
}

# The sixth v4 held-out grid (reports/llama-cpp-v4/PLAN.md step 16), fixed here before it runs:
# the copy-edit templates over sources no run saw (copy-edit-6: the next GSM8K test questions
# and, every HumanEval stub having run, 12 function stubs from Python's standard library), a
# closed loop at C = 2 (a calibration load on other prompts, never a v4 grid's; the v3 grid's
# on chat prompts) and Poisson arrivals at 0.6 req/s (in no grid or calibration: EARLIER_V9),
# the tuning runs' settings and servers, and the model step 15's rule kept: each pass priced by
# the table with its context term plus `pass_extra`, the server's own slot rule with its
# history, and every run of a cell its own draw of jobs (the simulator's cell the median over
# the same draws); calibration at C = 1, 2, 6 on copy-edit[32:48]; 3-5 kept runs a cell.
HELD_OUT_V9: dict[str, Any] = {
    **HELD_OUT_V8,
    "prompts": ("copy-edit-6[0:24]",),
    "concurrency": (2,),
    "rates": (0.6,),
    "slot_rule": "llama-server-history",
    "arrival_seeds": "per-run",
    "out": "reports/llama-cpp-v4/held-out-6",
}

# every earlier grid and calibration of this method, the fifth v4 held-out grid and the sixth
# tuning run (copy-edit[0:32] at C = 4 and 1.5 req/s, as the other tuning runs) included
EARLIER_V9: dict[str, Any] = {
    **EARLIER_V8,
    "prompts": (*EARLIER_V8["prompts"], "copy-edit-5[0:24]"),
    "rates": (*EARLIER_V8["rates"], 1.2),  # (C = 8 is there: the v3 grid's)
}

# The seventh v4 held-out grid (reports/llama-cpp-v4/PLAN.md step 19), fixed here before it
# runs: the copy-edit templates over sources no run saw (copy-edit-7: the next GSM8K test
# questions and 12 function stubs from standard-library modules copy-edit-6 did not use), a
# closed loop at C = 3 (the first v4 grid's, on other prompts under step 4's model; every level
# the 8 slots allow has run somewhere) and Poisson arrivals at 0.9 req/s (in no grid or
# calibration: EARLIER_V10), the tuning runs' settings and servers, and the model step 18's
# rule kept: a table per kind of server with its context term plus `pass_extra`, each request
# in a seeded random free slot (the median over 5 layouts), every run of a cell its own draw
# of jobs; calibration at C = 1, 2, 6 on copy-edit[32:48]; 3-5 kept runs a cell.
HELD_OUT_V10: dict[str, Any] = {
    **HELD_OUT_V9,
    "prompts": ("copy-edit-7[0:24]",),
    "concurrency": (3,),
    "rates": (0.9,),
    "terms": ("drafter_request", "passes", "pass_extra", "by_kind"),
    "slot_rule": "random",
    "out": "reports/llama-cpp-v4/held-out-7",
}

# every earlier grid and calibration of this method, the sixth v4 held-out grid included
EARLIER_V10: dict[str, Any] = {
    **EARLIER_V9,
    "prompts": (*EARLIER_V9["prompts"], "copy-edit-6[0:24]"),
    "rates": (*EARLIER_V9["rates"], 0.6),  # (C = 2 is there: the v3 grid's, a calibration load)
}

# The eighth v4 held-out grid (reports/llama-cpp-v4/PLAN.md step 20), fixed here before it
# runs: copy-edit-8 (the next GSM8K test questions and stubs from 12 standard-library modules
# no part used), a closed loop at C = 5 (only the fourth v4 held-out grid's, on other prompts
# under step 9's model) and Poisson arrivals at 1.1 req/s (in no grid or calibration:
# EARLIER_V11), the seventh grid's settings, servers and model (step 18's rule), and the
# machine's drift measured as it runs: a probe of 4 requests of the plain server at C = 1
# after the calibration and after every round (--drift-probe, drift.py).
HELD_OUT_V11: dict[str, Any] = {
    **HELD_OUT_V10,
    "prompts": ("copy-edit-8[0:24]",),
    "concurrency": (5,),
    "rates": (1.1,),
    "drift_probe": 4,
    "out": "reports/llama-cpp-v4/held-out-8",
}

# every earlier grid and calibration of this method, the seventh v4 held-out grid included
EARLIER_V11: dict[str, Any] = {
    **EARLIER_V10,
    "prompts": (*EARLIER_V10["prompts"], "copy-edit-7[0:24]"),
    "rates": (*EARLIER_V10["rates"], 0.9),  # (C = 3 is there: the first v4 grid's)
}

# The ninth v4 held-out grid (reports/llama-cpp-v4/PLAN.md step 21), fixed here before it
# runs: copy-edit-9 (the next GSM8K test questions and stubs from 12 standard-library modules
# no part used), a closed loop at C = 7 (only the second v4 held-out grid's, on other prompts
# under step 4's model) and Poisson arrivals at 1.3 req/s (in no grid or calibration:
# EARLIER_V12), held-out-8's settings, servers, model and probe, and the calibration taken to
# the runs: one pass of every setting's calibration loads (1 x C requests each) after every
# round, none before (--calib-schedule rounds, rounds.py).
HELD_OUT_V12: dict[str, Any] = {
    **HELD_OUT_V11,
    "prompts": ("copy-edit-9[0:24]",),
    "concurrency": (7,),
    "rates": (1.3,),
    "calib_requests": 1.0,
    "calib_schedule": "rounds",
    "out": "reports/llama-cpp-v4/held-out-9",
}

# every earlier grid and calibration of this method, the eighth v4 held-out grid included
EARLIER_V12: dict[str, Any] = {
    **EARLIER_V11,
    "prompts": (*EARLIER_V11["prompts"], "copy-edit-8[0:24]"),
    "rates": (*EARLIER_V11["rates"], 1.1),  # (C = 5 is there: the fourth held-out grid's)
}

# The tenth v4 held-out grid (reports/llama-cpp-v4/PLAN.md step 22), fixed here before it
# runs: copy-edit-10 (the next GSM8K test questions and stubs from 12 standard-library modules
# no part used), a closed loop at C = 8 (only the fifth v4 held-out grid's, on other prompts
# under step 15's model: every slot busy) and Poisson arrivals at 1.4 req/s (in no grid or
# calibration: EARLIER_V13), held-out-9's settings, servers, model, probe and calibration in
# passes between the rounds, unchanged: a second reading of step 21's method.
HELD_OUT_V13: dict[str, Any] = {
    **HELD_OUT_V12,
    "prompts": ("copy-edit-10[0:24]",),
    "concurrency": (8,),
    "rates": (1.4,),
    "out": "reports/llama-cpp-v4/held-out-10",
}

# every earlier grid and calibration of this method, the ninth v4 held-out grid included
EARLIER_V13: dict[str, Any] = {
    **EARLIER_V12,
    "prompts": (*EARLIER_V12["prompts"], "copy-edit-9[0:24]"),
    "rates": (*EARLIER_V12["rates"], 1.3),  # (C = 7 is there: the second held-out grid's)
}

# The eleventh v4 held-out grid (reports/llama-cpp-v4/PLAN.md step 23), fixed here before it
# runs: copy-edit-11 (the next GSM8K test questions and stubs from 12 standard-library modules
# no part used), a closed loop at C = 6 (only the third held-out grid's, on other prompts under
# step 7's model; a calibration load on other prompts) and Poisson arrivals at 1.25 req/s (in
# no grid or calibration: EARLIER_V14), held-out-10's method but each trace recorded 5 times,
# one draw per kept run (--trace-draws 5).
HELD_OUT_V14: dict[str, Any] = {
    **HELD_OUT_V13,
    "prompts": ("copy-edit-11[0:24]",),
    "concurrency": (6,),
    "rates": (1.25,),
    "trace_draws": 5,
    "out": "reports/llama-cpp-v4/held-out-11",
}

# every earlier grid and calibration of this method, the tenth v4 held-out grid included
EARLIER_V14: dict[str, Any] = {
    **EARLIER_V13,
    "prompts": (*EARLIER_V13["prompts"], "copy-edit-10[0:24]"),
    "rates": (*EARLIER_V13["rates"], 1.4),  # (C = 8 is there: the fifth held-out grid's)
}

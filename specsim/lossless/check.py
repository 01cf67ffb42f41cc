"""The checker: exact, edge-uniform and statistical checks of a pipeline over standard worlds.

What ``specsim check-lossless`` runs, and what the tests run on the catalogue. Results are a tidy
table, one row per (pipeline, world, check), and a verdict per world (:func:`world_verdicts`):

- ``exact``: the enumerated law of the first m tokens vs the target's, every breakpoint of the
  verifier found and integrated (:mod:`uniforms`): lossless iff TV <= 1e-9. When the integral
  cannot be proven the row says so (``status`` "unproven") and the world is only tested.
- ``edge``: every block with uniforms at 0.0 and 1 - 2^-53: no token the target gives
  probability 0 may come out (real generators produce u = 0.0; measure zero, so the exact law
  cannot see it).
- ``statistical``: a group-sequential G-test (:func:`stats.sequential_test`) of sampled blocks
  against the exact target law; the family-wise false-alarm rate of the run is <= 1e-6. Worlds
  the exact check did not prove get the samples that detect TV 1e-3 with 99% power; proven
  worlds get a cross-check of :data:`CROSS_CHECK` samples.

A world's verdict is "proven (exact)", "consistent (statistical, floor TV X)" or "LOSSY".
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from specsim.lossless.oracle import (
    Batch,
    alone,
    multi_output_law,
    output_law,
    policy_scheduler,
)
from specsim.lossless.pipeline import Pipeline
from specsim.lossless.sampling import BlockSampler
from specsim.lossless.stats import alpha_per_look, effective_df, planned_n, sequential_test
from specsim.lossless.toy import ToyLM, appendix_a_toy, random_toy, stationary_toy
from specsim.lossless.uniforms import NotPiecewiseConstant, edge_uniform_outputs
from specsim.policies.base import Policy
from specsim.progress import Progress
from specsim.rng import stream

DEFAULT_SAMPLES = None  # per world: planned for TV 1e-3 (unproven worlds) or CROSS_CHECK
CROSS_CHECK = 1_000_000  # samples of the statistical cross-check of a world proven exactly
N_CAP = 60_000_000  # at most this many samples per world and look plan (time: ~30 s a world)
COLUMNS = [
    "pipeline", "world", "check", "status", "tv", "p_value", "detectable_tv", "n", "lossless",
    "detail",
]  # fmt: skip


@dataclass(frozen=True, eq=False)
class World:
    """A finite world to check in: a toy LM, block size, output length, batch and cost curve."""

    name: str
    toy: ToyLM
    gamma: int
    m: int
    batch: Batch


def jagged_batch(rng: np.random.Generator, n_others: int, gamma: int) -> Batch:
    """Batch-mates with random confidence rows (0s and 1s included) and a jagged SPS table."""
    others = rng.random((n_others, gamma))
    others[rng.random(others.shape) < 0.15] = 0.0
    b_max = (n_others + 1) * (gamma + 1)
    steps = rng.uniform(0.3, 1.0, b_max + 2)  # arbitrary, non-monotone: padding buckets etc.
    sps = np.where(rng.random(b_max + 2) < 0.5, steps, np.minimum.accumulate(steps))
    lagged = rng.random((n_others + 1, gamma))
    return Batch(
        others=others,
        sps=sps,
        index=int(rng.integers(n_others + 1)),
        lagged=lagged,
        accept_rate=rng.random(gamma),
    )


def standard_worlds(seed: int = 0) -> list[World]:
    """The worlds every pipeline is checked in: the paper's Appendix A and random tables with
    zeros, near-one masses and ties, alone and in jagged batches."""
    rng = stream(seed, "lossless/worlds")
    return [
        World("appendix-A", appendix_a_toy(), 2, 2, alone(2, sps=[np.nan, 1.0, 0.5, 0.45])),
        World("V3-g2-alone", random_toy(seed * 7 + 1, 3), 2, 3, alone(2)),
        World("V3-g2-batch3-jagged", random_toy(seed * 7 + 2, 3), 2, 3, jagged_batch(rng, 2, 2)),
        World("V4-g3-batch2-jagged", random_toy(seed * 7 + 3, 4), 3, 2, jagged_batch(rng, 1, 3)),
        World(
            "V2-g3-ties-batch4",
            random_toy(seed * 7 + 4, 2, ties=0.5),
            3,
            3,
            jagged_batch(rng, 3, 3),
        ),
        World("V5-g2-batch2-jagged", random_toy(seed * 7 + 7, 5), 2, 2, jagged_batch(rng, 1, 2)),
    ]


def multi_worlds(seed: int = 0) -> list[World]:
    """Multi-draft worlds: first-token laws with full draft support, k = 2 or 3 candidates.

    The fixed one (p = (0.5, 0.4, 0.1), q = (0.1, 0.3, 0.6), k = 2) is where both multi-draft
    mutants are far from p (TV 0.15); random tables can hide them (some give TV 0 exactly).
    """
    fixed = stationary_toy([0.5, 0.4, 0.1], [0.1, 0.3, 0.6], lambda s, k, x: 0.5, "fixed")
    return [
        World("multi-fixed-V3-k2", fixed, 2, 1, alone(2)),
        World("multi-V3-k2", random_toy(seed * 7 + 5, 3, zeros=0.0, near_one=0.0), 2, 1,
              alone(2)),
        World("multi-V4-k3", random_toy(seed * 7 + 6, 4, zeros=0.0, near_one=0.0), 3, 1,
              alone(3)),
    ]  # fmt: skip


def stat_worlds(seed: int = 0) -> list[World]:
    """The worlds the statistical checks sample in: all standard worlds (block laws of 8 to 256
    cells after the empty prompt)."""
    return standard_worlds(seed)


def _row(pipe, world, check, lossless, tv=np.nan, p=np.nan, det=np.nan, n=0, detail="",
         status=None):  # fmt: skip
    if status is None:
        status = {"exact": "proven", "edge": "passed", "statistical": "consistent"}[check]
    return dict(
        pipeline=pipe.name, world=world.name, check=check,
        status=status if lossless else "LOSSY", tv=float(tv), p_value=float(p),
        detectable_tv=float(det), n=int(n), lossless=bool(lossless), detail=detail,
    )  # fmt: skip


def _scheduler(pipe: Pipeline):
    s = pipe.scheduler
    return policy_scheduler(s) if (not callable(s) or isinstance(s, Policy)) else s


def exact_check(pipe: Pipeline, world: World) -> dict:
    """The enumerated law vs the target's (multi-draft: the first token's law vs p)."""
    try:
        if pipe.multi is not None:
            p, q = world.toy.p(()), world.toy.q(())
            law = multi_output_law(pipe.multi, p, q, world.gamma, pipe.without_replacement)
            tv = 0.5 * float(np.abs(law - p).sum())
            worst = int(np.argmax(np.abs(law - p)))
            detail = f"token {worst}: {law[worst]:.6g} vs target {p[worst]:.6g}"
            return _row(pipe, world, "exact", tv <= 1e-9, tv=tv, detail=detail)
        res = output_law(
            world.toy, world.m, world.gamma, _scheduler(pipe), rule=pipe.rule,
            batch=world.batch, drafter=pipe.drafter, greedy=pipe.greedy, extra=pipe.extra,
        )  # fmt: skip
    except NotPiecewiseConstant as exc:
        return _row(pipe, world, "exact", True, detail=f"cannot prove: {exc}", status="unproven")
    seq, got, want = res.worst()
    first = np.array2string(res.marginal(0), precision=6, separator=", ")
    detail = f"worst {seq}: {got:.9g} vs target {want:.9g}; first-token law {first}"
    return _row(pipe, world, "exact", res.lossless, tv=res.tv, detail=detail)


def edge_check(pipe: Pipeline, world: World) -> dict:
    """Extreme uniforms (0.0 and 1 - 2^-53) on every block after the empty prompt, every l:
    no emitted token may have target probability 0."""
    toy, gamma = world.toy, world.gamma
    bad = []
    for x in itertools.product(range(toy.vocab), repeat=gamma):
        qs = [toy.q(x[:k]) for k in range(gamma)]
        if any(qs[k][x[k]] <= 0 for k in range(gamma)):
            continue
        ps = np.stack([toy.p(x[:k]) for k in range(gamma + 1)])
        xa = np.asarray(x, dtype=np.int64)
        for length in range(gamma + 1):
            n, tok = edge_uniform_outputs(pipe.rule, ps, np.stack(qs), xa, length)
            for ni, ti in zip(n, tok, strict=True):
                emitted = (*x[:ni], int(ti))
                zero = [j for j, t in enumerate(emitted) if ps[j, t] <= 0]
                if zero:
                    bad.append(f"drafts {x}, l={length}: emitted {emitted}, p=0 at {zero[0] + 1}")
    detail = bad[0] if bad else "no zero-probability token at u, v in {0, 1-2^-53}"
    return _row(pipe, world, "edge", not bad, n=len(bad), detail=detail)


def statistical_check(
    pipe: Pipeline, world: World, n: int | None, seed: int, alpha_look: float | None = None
) -> dict:
    """Sequential G-test of sampled blocks against the target law (see :mod:`stats`).

    ``n``: planned samples (None: enough to detect TV 1e-3 with 99% power, capped at N_CAP).
    ``alpha_look``: false-alarm rate of each look (default: the run's budget for one check).
    """
    alpha = alpha_per_look(1) if alpha_look is None else alpha_look
    sampler = BlockSampler(world, pipe, seed)
    if n is None:
        n = min(N_CAP, max(CROSS_CHECK, planned_n(effective_df(sampler.probs, N_CAP), alpha)))
    seq = sequential_test(sampler.counts, sampler.probs, n, alpha)
    g = seq.last
    detail = (f"G={g.statistic:.1f}, df={g.df}, observed TV {g.observed_tv:.2e}, "
              f"{seq.looks} look(s), floor TV {seq.floor_tv:.1e}")  # fmt: skip
    if g.zero_hits:
        detail = f"{g.zero_hits} samples on zero-probability outputs (look {seq.looks})"
    return _row(
        pipe, world, "statistical", seq.passed, tv=g.observed_tv, p=g.p_value,
        det=seq.floor_tv, n=seq.n, detail=detail,
    )  # fmt: skip


def check_pipeline(
    pipe: Pipeline,
    seed: int = 0,
    samples: int | None = DEFAULT_SAMPLES,
    checks: tuple[str, ...] = ("exact", "edge", "statistical"),
    stop_at_first_failure: bool = False,
    progress: bool | None = None,
    model: ToyLM | None = None,
) -> pd.DataFrame:
    """Run the checks of ``pipe`` over the standard worlds; one tidy row per check.

    ``samples``: planned samples per statistical check; None plans them per world (TV 1e-3 at
    99% power where the exact check did not prove the world, a cross-check where it did).
    ``model``: a user's toy LM replacing the random tables of every world.
    """
    worlds = multi_worlds(seed) if pipe.multi is not None else standard_worlds(seed)
    if model is not None:
        worlds = [replace(w, name=f"{w.name}[{model.name}]", toy=model) for w in worlds]
    jobs: list[tuple[str, World]] = []
    if pipe.uniforms:
        jobs += [("exact", w) for w in worlds if "exact" in checks]
        if pipe.multi is None:
            jobs += [("edge", w) for w in worlds if "edge" in checks]
    stat_jobs = [w for w in worlds if "statistical" in checks]
    jobs += [("statistical", w) for w in stat_jobs]
    alpha = alpha_per_look(len(stat_jobs))
    rows: list[dict] = []
    with Progress(len(jobs), f"check {pipe.name}", enabled=progress) as bar:
        for kind, world in jobs:
            if kind == "exact":
                rows.append(exact_check(pipe, world))
            elif kind == "edge":
                rows.append(edge_check(pipe, world))
            else:
                n = samples
                if n is None and _proven(rows, world.name):
                    n = CROSS_CHECK
                rows.append(statistical_check(pipe, world, n, seed, alpha))
            bar.update()
            if stop_at_first_failure and not rows[-1]["lossless"]:
                break
    return pd.DataFrame(rows, columns=COLUMNS)


def _proven(rows: list[dict], world: str) -> bool:
    return any(r["world"] == world and r["check"] == "exact" and r["status"] == "proven"
               for r in rows)  # fmt: skip


def world_verdicts(df: pd.DataFrame) -> pd.DataFrame:
    """One verdict per world: "LOSSY (check)", "proven (exact)", "consistent (statistical,
    floor TV X)" or "not checked", with the detail that supports it."""
    out = []
    for world, part in df.groupby("world", sort=False):
        lossy = part[~part["lossless"]]
        exact = part[(part["check"] == "exact") & (part["status"] == "proven")]
        stat = part[(part["check"] == "statistical") & part["lossless"]]
        if len(lossy):
            r = lossy.iloc[0]
            verdict, detail = f"LOSSY ({r['check']})", r["detail"]
        elif len(exact):
            verdict, detail = "proven (exact)", f"TV {exact.iloc[0]['tv']:.1e}"
        elif len(stat):
            floor = stat["detectable_tv"].max()
            verdict = f"consistent (statistical, floor TV {floor:.1e})"
            unproven = part[part["status"] == "unproven"]
            detail = unproven.iloc[0]["detail"] if len(unproven) else "no exact check ran"
        else:
            verdict, detail = "not checked", ""
        floor = stat["detectable_tv"].max() if len(stat) else np.nan
        out.append({"world": world, "verdict": verdict, "floor_tv": floor, "detail": detail})
    return pd.DataFrame(out, columns=["world", "verdict", "floor_tv", "detail"])


def summary(df: pd.DataFrame) -> tuple[str, bool]:
    """The run's one-line verdict and whether it found evidence of loss."""
    v = world_verdicts(df)
    lossy = v["verdict"].str.startswith("LOSSY")
    proven = int((v["verdict"] == "proven (exact)").sum())
    tested = int(v["verdict"].str.startswith("consistent").sum())
    unchecked = int((v["verdict"] == "not checked").sum())
    if lossy.any():
        return (f"LOSSY in {int(lossy.sum())} of {len(v)} worlds ({len(df)} checks, family-wise "
                "false-alarm rate <= 1e-6)", True)  # fmt: skip
    floors = v.loc[v["verdict"].str.startswith("consistent"), "floor_tv"]
    text = f"no evidence of loss: {proven} of {len(v)} worlds proven exactly, {tested} only tested"
    if tested:
        text += f" statistically (floor TV {floors.max():.1e} at 99% power)"
    if unchecked:
        text += f", {unchecked} not checked"
    return text + "; exit 0 means no evidence of loss, a proof only for the proven worlds", False

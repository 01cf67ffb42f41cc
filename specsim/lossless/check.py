"""The checker: exact, edge-uniform and statistical checks of a pipeline over standard worlds.

What ``specsim check-lossless`` runs, and what the tests run on the catalogue. Results are a tidy
table, one row per (pipeline, world, check), each saying in ``law`` what it covers, and a
verdict per world (:mod:`specsim.lossless.verdicts`):

- ``exact``: the enumerated law of two whole blocks (2(gamma+1) tokens, bonus included) after
  one prefix of each length 0..8, and of every block a generation can start (up to position
  8 + gamma + 1 for a pipeline that reads engine state; :mod:`specsim.lossless.window`), vs the
  target's; every breakpoint of the verifier found and
  integrated (:mod:`uniforms`): lossless iff TV <= 1e-9. It stops at the first law that is not.
  When the integral cannot be proven the row says so (``status`` "unproven").
- ``edge``: blocks with uniforms at 0.0 and 1 - 2^-53: no token the target gives probability 0
  may come out (real generators produce u = 0.0; measure zero, so the exact law cannot see it).
- ``statistical``: a group-sequential G-test (:func:`stats.sequential_test`) of sampled blocks,
  every block of runs from the empty prompt starting up to position 8 + gamma + 1
  (:mod:`sampling`), against the target law in each block's context; the family-wise
  false-alarm rate of the run is <= 1e-6.
  Worlds the exact check did not prove get the samples that detect TV 1e-3 with 99% power;
  proven worlds, whose proof covers every block the sampler draws, a cross-check of
  :data:`CROSS_CHECK` samples.

A world found LOSSY is not checked further, and once any world is, no statistical plan runs: the
run's verdict is known (``stop_when_lossy``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from specsim.lossless.blocks import KernelBank
from specsim.lossless.oracle import multi_output_law, policy_scheduler
from specsim.lossless.pipeline import Pipeline
from specsim.lossless.sampling import BlockSampler, horizon
from specsim.lossless.state import BlockState, bind, key_of
from specsim.lossless.stats import alpha_per_look, effective_df, planned_n, sequential_test
from specsim.lossless.toy import ToyLM
from specsim.lossless.uniforms import CannotProve, edge_uniform_outputs
from specsim.lossless.verdicts import summary, world_verdicts
from specsim.lossless.window import BLOCKS, WindowLaw, reachable, window_law
from specsim.lossless.worlds import (
    World,
    jagged_batch,
    multi_worlds,
    standard_worlds,
    stat_worlds,
    world_prefixes,
)
from specsim.policies.base import Policy
from specsim.progress import Progress

DEFAULT_SAMPLES = None  # per world: planned for TV 1e-3 (unproven worlds) or CROSS_CHECK
CROSS_CHECK = 1_000_000  # samples of the statistical cross-check of a world proven exactly
N_CAP = 60_000_000  # at most this many samples per world and look plan
COLUMNS = [
    "pipeline", "world", "check", "status", "tv", "p_value", "detectable_tv", "n", "lossless",
    "law", "detail",
]  # fmt: skip

__all__ = [
    "COLUMNS", "CROSS_CHECK", "DEFAULT_SAMPLES", "N_CAP", "World", "check_pipeline", "edge_check",
    "exact_check", "jagged_batch", "multi_worlds", "stat_worlds", "standard_worlds",
    "statistical_check", "summary", "world_verdicts",
]  # fmt: skip


def _row(pipe, world, check, lossless, tv=np.nan, p=np.nan, det=np.nan, n=0, detail="",
         status=None, law=""):  # fmt: skip
    if status is None:
        status = {"exact": "proven", "edge": "passed", "statistical": "consistent"}[check]
    return dict(
        pipeline=pipe.name, world=world.name, check=check,
        status=status if lossless else "LOSSY", tv=float(tv), p_value=float(p),
        detectable_tv=float(det), n=int(n), lossless=bool(lossless), law=law, detail=detail,
    )  # fmt: skip


def _scheduler(pipe: Pipeline):
    s = pipe.scheduler
    return policy_scheduler(s) if (not callable(s) or isinstance(s, Policy)) else s


def bank_of(pipe: Pipeline, world: World) -> KernelBank:
    """The block kernels of ``pipe`` in ``world`` (shared by the exact and edge checks)."""
    return KernelBank(world.toy, world.gamma, _scheduler(pipe), pipe.rule, world.batch,
                      pipe.drafter, pipe.extra)  # fmt: skip


def _policy_name(pipe: Pipeline) -> str:
    s = pipe.scheduler
    if isinstance(s, str):
        return s
    return getattr(s, "name", getattr(s, "__name__", "policy"))


def _lossy_detail(res: WindowLaw, where: str) -> str:
    seq, got, want = res.worst()
    first = np.array2string(res.marginal(0), precision=6, separator=", ")
    return f"{where}: worst {seq}: {got:.9g} vs target {want:.9g}; first-token law {first}"


def _where(prefix, state: BlockState | None = None) -> str:
    if state is None:
        return "2 blocks after " + (f"prefix {tuple(prefix)}" if prefix else "the empty prompt")
    prev = "" if state.previous is None else f", after l={state.previous[0]} n={state.previous[1]}"
    return f"block at position {state.position} (step {state.step}{prev}, last tokens {prefix})"


def exact_check(pipe: Pipeline, world: World) -> dict:
    """The enumerated law vs the target's: two blocks after every prefix of
    :func:`world_prefixes`, and one block at every state a generation reaches (multi-draft:
    the first token's law vs p). Stops at the first law that differs."""
    try:
        if pipe.multi is not None:
            p, q = world.toy.p(()), world.toy.q(())
            law = multi_output_law(pipe.multi, p, q, world.gamma, pipe.without_replacement)
            tv = 0.5 * float(np.abs(law - p).sum())
            worst = int(np.argmax(np.abs(law - p)))
            detail = f"token {worst}: {law[worst]:.6g} vs target {p[worst]:.6g}"
            return _row(pipe, world, "exact", tv <= 1e-9, tv=tv, detail=detail,
                        law=f"the first token, {world.gamma} candidates")  # fmt: skip
        bank = bank_of(pipe, world)
        prefixes = world_prefixes(world)
        width = BLOCKS * (world.gamma + 1)
        tvs = []
        first = window_law(bank, prefixes[0], pipe.greedy)
        if not first.lossless:
            return _row(pipe, world, "exact", False, tv=first.tv,
                        detail=_lossy_detail(first, _where(prefixes[0])),
                        law=f"{BLOCKS} blocks ({width} tokens) after the empty prompt")  # fmt: skip
        tvs.append(first.tv)
        toy = world.toy
        last = horizon(toy, world.gamma)
        states = reachable(bank, last) if toy.context is not None else [((), BlockState())]
        done = set()
        for y, st in states:
            k = bank.key(y, st)
            if k in done:
                continue
            done.add(k)
            res = window_law(bank, y, pipe.greedy, blocks=1, state=st)
            if not res.lossless:
                return _row(pipe, world, "exact", False, tv=res.tv,
                            detail=_lossy_detail(res, _where(y, st)),
                            law="one block at every state of a generation")  # fmt: skip
            tvs.append(res.tv)
        for s in prefixes[1:]:
            res = window_law(bank, s, pipe.greedy)
            if not res.lossless:
                return _row(pipe, world, "exact", False, tv=res.tv,
                            detail=_lossy_detail(res, _where(s)),
                            law=f"{BLOCKS} blocks ({width} tokens) after prefix {s}")  # fmt: skip
            tvs.append(res.tv)
    except CannotProve as exc:
        return _row(pipe, world, "exact", True, detail=f"cannot prove: {exc}", status="unproven",
                    law="nothing proven")  # fmt: skip
    where = (
        f"every block state up to position {horizon(toy, world.gamma)}"
        if toy.context is not None and not bank.stateless
        else ("every block context" if toy.context is not None else "the first block")
    )
    law = (f"{_policy_name(pipe)}: {BLOCKS} blocks = {width} tokens (bonus incl.) after "
           f"{len(prefixes)} prefixes of {min(map(len, prefixes))}-{max(map(len, prefixes))} "
           f"tokens; one block at {where} ({len(done)})")  # fmt: skip
    detail = f"max TV {max(tvs):.1e} over {len(tvs)} laws; {bank.integrated:,} blocks integrated"
    return _row(pipe, world, "exact", True, tv=max(tvs), detail=detail, law=law)


def _edge_states(world: World) -> list[tuple[tuple, BlockState]]:
    """Blocks after every exact prefix (as the prompt) and after each one-token extension of
    it (the second block of a request): every context, at several positions."""
    out = []
    for s in world_prefixes(world):
        out.append((s, BlockState(len(s))))
        for t in range(world.toy.vocab):
            out.append(((*s, t), BlockState(len(s)).after(0, 0)))
    return out


def edge_check(pipe: Pipeline, world: World) -> dict:
    """Extreme uniforms (0.0 and 1 - 2^-53) on every block of :func:`_edge_states`, every
    draft with q > 0 and every l: no emitted token may have target probability 0."""
    bank, gamma = bank_of(pipe, world), world.gamma
    bad, seen = [], set()
    for y, st in _edge_states(world):
        rkey = key_of(bank.rule_key, st)
        if (bank.tables_key(y), rkey) in seen:
            continue
        seen.add((bank.tables_key(y), rkey))
        tab = bank.block_tables(y)
        rule = bind(pipe.rule, rkey)
        for d in range(tab.drafts.shape[0]):
            x, ps, qs = tab.drafts[d], tab.ps[d], tab.qs[d]
            if any(qs[k, x[k]] <= 0 for k in range(gamma)):
                continue
            for length in range(gamma + 1):
                n, tok = edge_uniform_outputs(rule, ps, qs, x, length)
                for ni, ti in zip(n, tok, strict=True):
                    emitted = (*x[:ni].tolist(), int(ti))
                    zero = [j for j, t in enumerate(emitted) if ps[j, t] <= 0]
                    if zero:
                        bad.append(f"after {y}, drafts {tuple(x.tolist())}, l={length}: "
                                   f"emitted {emitted}, p=0 at {zero[0] + 1}")  # fmt: skip
    detail = bad[0] if bad else "no zero-probability token at u, v in {0, 1-2^-53}"
    law = f"blocks in every context after {len(world_prefixes(world))} prefixes"
    return _row(pipe, world, "edge", not bad, n=len(bad), detail=detail, law=law)


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
    law = f"{sampler.law}, {len(sampler.strata)} context(s), {n:,} planned"
    return _row(
        pipe, world, "statistical", seq.passed, tv=g.observed_tv, p=g.p_value,
        det=seq.floor_tv, n=seq.n, detail=detail, law=law,
    )  # fmt: skip


def _skipped(pipe: Pipeline, world: World, check: str, why: str) -> dict:
    return _row(pipe, world, check, True, status="skipped", detail=f"not run: {why}")


def check_pipeline(
    pipe: Pipeline,
    seed: int = 0,
    samples: int | None = DEFAULT_SAMPLES,
    checks: tuple[str, ...] = ("exact", "edge", "statistical"),
    stop_at_first_failure: bool = False,
    progress: bool | None = None,
    model: ToyLM | None = None,
    stop_when_lossy: bool = True,
) -> pd.DataFrame:
    """Run the checks of ``pipe`` over the standard worlds; one tidy row per check.

    ``samples``: planned samples per statistical check; None plans them per world (TV 1e-3 at
    99% power where the exact check did not prove the world, a cross-check where it did).
    ``model``: a user's toy LM replacing the random tables of every world.
    ``stop_when_lossy``: a world found LOSSY gets no further check, and once one is, no
    statistical check runs (rows "skipped"): the verdict is known. ``stop_at_first_failure``:
    return at the first LOSSY row.
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
            lossy = [r["world"] for r in rows if not r["lossless"]]
            if stop_when_lossy and world.name in lossy:
                rows.append(_skipped(pipe, world, kind, "this world is already LOSSY"))
            elif stop_when_lossy and lossy and kind == "statistical":
                rows.append(_skipped(pipe, world, kind, f"the run is already LOSSY ({lossy[0]})"))
            elif kind == "exact":
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
    """The world's exact check proved every law the sampler draws (each block at every state
    it reaches: :func:`exact_check` covers the sampler's horizon by construction)."""
    return any(r["world"] == world and r["check"] == "exact" and r["status"] == "proven"
               for r in rows)  # fmt: skip

"""The engine step's parts that are not about batching, written once.

A run builds one step object (:class:`specsim.sim.serving.StepV2`, a subclass of :class:`Step`
through :class:`specsim.sim.batching.Batching`) and its SimPy loop calls the step's phases in
order: arrivals, the walk, DRAFT, SCHEDULE, BATCH, COST, ACCOUNT. The object
holds the run's constants and what the phases hand each other (the running batch ``S``, the
decoders' rows, lengths and emissions) in slots: a phase reads them about as fast as a local,
and a step allocates nothing beyond its numpy arrays (the speed claim of
benchmarks/bench_replay.py is the per-step cost).

The rules here:

- arrivals: every open-loop arrival with time <= t joins the FIFO queue of the step that starts
  at t (so an arrival at exactly a step boundary joins that step: the same-time rule);
- the policy's decision: each decoder's current trace row (and, for a lagged policy, its row
  of two decode steps earlier) gathered, a StepInput holding only what the policy reads
  (``Policy.needs``), the lengths it returns checked;
- the replay rule: request r at position n verifying l_r drafts emits
  e = min(l_r, accept_len[n]) + 1 tokens, capped at output_len - n; n += e;
- drafting k tokens for R requests costs ``draft_ms(R, k)`` (a full block: the engine's terms;
  :class:`specsim.sim.cost.price.StepPrice`, which prices the whole step);
- the online acceptance estimate (for policies that read ``accept_rate``): per draft position
  k, the share of verified position-k drafts (reached: all earlier ones accepted) that were
  accepted, with a prior of ``PRIOR_RATE`` worth ``PRIOR_WEIGHT`` observations;
- the verification history (``accept_hist``, :mod:`specsim.sim.history`);
- finished requests leave at the step's end, and the step is logged (a row of
  ``STEP_COLUMNS``, or the running sums of a lean run);
- ZOS: the decision for step t+1 runs on the CPU during step t; the next step waits only for
  a scheduler that outlasts its step.
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import simpy

from specsim.policies.base import checked_lengths, step_input
from specsim.sim.cost.steptime import row_table
from specsim.sim.jobs import H1, H2, JOB, NF, OUT, STEPS

if TYPE_CHECKING:
    from collections.abc import Generator

PRIOR_RATE = 0.5  # the online acceptance estimate's prior
PRIOR_WEIGHT = 2.0


def exact_delay(now: float, t: float) -> float | None:
    """A delay d with now + d == t in floating point, or None.

    SimPy adds the delay to the clock; t - now can miss t by an ulp, and when the rounding of
    now + d ties, some t are not reachable in one addition at all (the step-by-step path
    reached them by several). Neighbours of t - now are tried; None: no single hop exists.
    """
    d = t - now
    for _ in range(4):
        got = now + d
        if got == t:
            return d
        d = math.nextafter(d, math.inf if got < t else 0.0)
    return None


def _scheduler(env: simpy.Environment, seconds: float) -> Generator[simpy.Event, object, None]:
    """ZOS: the next step's decision, running on the CPU while this step runs."""
    yield env.timeout(seconds)


class Step:
    """One run's engine step: its constants, the state one step hands the next, and the phases
    that are not about batching (see the module docstring). ``eng`` is the
    :class:`specsim.sim.serving.Engine` whose counters, logs and jobs the step advances."""

    __slots__ = (
        # the run's constants
        "eng", "jobs", "queue", "cost", "gamma", "conf_all", "acc_all", "tab", "conf_dtype",
        "schedule_fn", "pol_name", "rng", "zos", "need_lag", "need_rate", "need_acc",
        "need_hist", "need_surv", "need_lag_surv", "need_known", "need_draft", "track_lag",
        "lean_input", "open_loop", "arrivals", "n_arr_total", "record", "progress", "sink", "sums",
        "closed_c", "steplog", "step_price", "engine_terms", "p_tok", "lut", "n_lut", "tree_extra",
        "tree_tokens", "draft_seconds",
        # what one step hands the next
        "S", "zos_proc",
        # when this step starts, and how long it waited for its ZOS decision
        "now", "wait",
        # this step's values, set by its phases in order
        "n_run", "n_dec", "n_first", "n_queued", "pos", "rows", "h2", "lag_rows", "rate",
        "pol_fn", "conf", "acc", "lens", "a_ok", "emit", "upd", "n_ver", "n_acc", "emitted",
        "prefill_tokens", "b_tokens", "n_fin", "ones",
    )  # fmt: skip

    def __init__(self, eng) -> None:  # noqa: ANN001 - the Engine
        """The run's constants, read once."""
        cost, pol, needs = eng.cost, eng.policy, eng.needs
        self.eng, self.jobs, self.queue, self.cost = eng, eng.jobs, eng.queue, cost
        self.gamma = eng.gamma
        self.conf_all, self.acc_all = eng.conf, eng.accept_len
        self.need_lag = "lagged_conf" in needs
        self.need_rate = "accept_rate" in needs
        self.need_acc = "accept_len" in needs
        self.need_hist = "accept_hist" in needs
        self.need_surv = "survival" in needs
        self.need_lag_surv = self.need_lag and "lagged_survival" in needs
        self.need_known = "lag_known" in needs
        self.need_draft = "draft_time" in needs
        # a policy that reads none of the lagged rows, accept_len, the history, draft_time:
        # its StepInput is built from the fields it can read (the rest are their defaults)
        self.lean_input = not (
            self.need_lag or self.need_acc or self.need_hist or self.need_known
            or self.need_draft
        )  # fmt: skip
        self.track_lag = self.need_lag  # keep H1/H2, the lagged rows, current
        # survivals of every trace row, once: a step gathers its rows instead of a cumprod
        surv = self.need_surv or self.need_lag_surv
        self.tab = row_table(eng.conf, eng.accept_len) if surv else None
        self.conf_dtype = eng.conf.dtype
        self.schedule_fn, self.pol_name, self.rng = pol.schedule, pol.name, eng.policy_rng
        self.zos = bool(pol.zos)
        wl = eng.wl
        self.open_loop = wl.open_loop
        self.arrivals = wl.arrival_s
        self.n_arr_total = wl.arrival_s.shape[0] if wl.open_loop else 0
        self.record, self.progress, self.sink = eng.record_tokens, eng.progress, eng.sink
        self.sums, self.closed_c, self.steplog = eng.sums, eng.closed_c, eng.log
        self.step_price = price = eng.price  # what a step costs: specsim.sim.cost.price
        self.draft_seconds = price.draft_s
        # measured-engine terms (specsim.sim.cost.model): 0 in generated profiles
        self.engine_terms = price.engine_terms
        self.tree_extra = price.tree_extra  # a tree's unaccepted branches
        self.tree_tokens = 0
        self.p_tok = cost.prefill_token_ms * 1e-3
        self.lut = price.lut
        self.n_lut = price.n_lut
        # The running batch: one (NF, R) int64 array, columns in admission order, so one take
        # of column indices compacts every field at once. Prefilling requests sit at the end.
        self.S = np.zeros((NF, 0), np.int64)
        # ones to slice: an array + array add and a dot are cheaper than a scalar's broadcast
        # and a reduce over the rows (integers: the same sums)
        self.ones = np.ones(min(int(eng.limits.max_running), 1 << 16), np.int64)
        self.zos_proc = None
        self.now = self.wait = 0.0
        self.n_run = self.n_dec = self.n_first = self.n_queued = self.n_fin = 0
        self.n_ver = self.n_acc = self.emitted = self.prefill_tokens = self.b_tokens = 0
        self.pos = self.rows = self.h2 = self.lag_rows = self.rate = self.pol_fn = None
        self.conf = self.acc = self.lens = self.a_ok = self.emit = self.upd = None

    # ------------------------------------------------------------------ time

    def start(self, env: simpy.Environment) -> Generator[simpy.Event, object, bool]:
        """Up to the start of the next engine step, which sets ``now`` and ``wait``; False
        when the run is over.

        Arrivals join the queue (admitted in BATCH); an idle engine sleeps
        until the next arrival; under ZOS the step waits for the decision that ran during the
        previous one (``wait``: what it outlasted that step by); a walk takes the steps it can
        up to the next event without an event each (``walk``), and the loop starts again.
        (The usual case, a step that starts at once, is :meth:`StepV2.ready`'s, a plain call.)"""
        while True:
            now = env.now
            self.arrive(now)
            if not self.S.shape[1] and not self.queue:  # nothing runs, nothing waits
                delay = self.idle_delay(now)
                if delay is None:
                    return False
                yield env.timeout(delay)
                continue
            wait = 0.0
            zp = self.zos_proc
            if self.zos and zp is not None and not zp.processed:
                yield zp
                wait = env.now - now
                now = env.now
            walked = self.walk(now, wait)
            if walked is None:
                self.now, self.wait = now, wait
                return True
            yield from self.hop(env, now, walked)

    def arrive(self, now: float) -> None:
        """Open-loop arrivals up to ``now`` join the queue (the same-time rule: <= now)."""
        if self.open_loop:
            eng = self.eng
            k = eng.n_arrived
            if k < self.n_arr_total and self.arrivals[k] <= now:
                upto = int(np.searchsorted(self.arrivals, now, side="right"))
                self.queue.extend(range(k, upto))
                eng.n_arrived = upto

    def idle_delay(self, now: float) -> float | None:
        """Nothing runs and nothing waits: how long the engine sleeps until the next arrival,
        or None when none is left (the run is over). The next step has no scheduler run to
        overlap with (ZOS), so it starts at once."""
        self.zos_proc = None
        k = self.eng.n_arrived if self.open_loop else 0
        if k < self.n_arr_total:
            return float(self.arrivals[k]) - now
        return None

    def walk(self, now: float, wait: float) -> tuple | None:
        """The steps that can be walked from ``now`` without an event each, as (durations,
        end), or None (the serving model's walk: :mod:`specsim.sim.walks`)."""
        return None

    def hop(
        self, env: simpy.Environment, now: float, walked: tuple
    ) -> Generator[simpy.Event, object, None]:
        """Move the clock over a walk's steps (``walked``: their durations and end): one event
        to the end when one addition lands on it exactly, else one per step, so the clock is
        the step-by-step path's to the bit."""
        durs, end = walked
        hop = exact_delay(now, end)
        if hop is not None:
            yield env.timeout(hop)
        else:
            for d in durs:
                yield env.timeout(d)
        self.zos_proc = None  # the walk's last scheduler decision finished in its step

    def run_ahead(self, env: simpy.Environment, duration: float) -> None:
        """ZOS: the decision for the next step runs on the CPU during this one. A scheduler
        shorter than the step ends first (now + sched <= now + duration, rounding is monotone)
        and the next step never waits for it: only a longer one needs its process (and an
        equal one only costs a zero wait), so only those get one."""
        zos_s = self.cost.sched_s(self.n_run)
        self.zos_proc = env.process(_scheduler(env, zos_s)) if zos_s >= duration else None

    # ------------------------------------------------------------------ the policy

    def accept_rate(self) -> np.ndarray:
        """The online acceptance estimate per draft position (prior ``PRIOR_RATE``)."""
        eng = self.eng
        t = eng.trials[1:].astype(np.float64)
        return (eng.succ[1:] + PRIOR_RATE * PRIOR_WEIGHT) / (t + PRIOR_WEIGHT)

    def lagged(self) -> None:
        """Each decoder's lagged row (two decode steps back: what a decision made during the
        previous step can know), or its current row while it is too new to have one."""
        h2 = self.S[H2, : self.n_dec]
        self.h2 = h2
        self.lag_rows = np.where(h2 >= 0, h2, self.rows)

    def draft_time(self, n: int) -> partial:
        """``k -> seconds`` of drafting k tokens for ``n`` requests (a policy prices drafts)."""
        return partial(self.draft_seconds, n)

    def decide(self, drafted: int | None) -> np.ndarray:
        """The policy's lengths for the decoders' current rows (``self.rows``), checked.

        One gather of [survival | conf | accept_len] per row when the policy reads survivals
        (else conf and accept_len apart: ``take`` gathers rows faster than a fancy index); the
        StepInput holds only what it reads. Keeps the rows' confidences and acceptance
        (``conf``, ``acc``) for the replay and the history.
        """
        gamma, rows, tab = self.gamma, self.rows, self.tab
        surv = lag = lag_surv = None
        if tab is not None:
            g = tab.take(rows, axis=0)
            conf = g[:, gamma : 2 * gamma].astype(self.conf_dtype)
            acc = g[:, 2 * gamma].astype(np.int64)
            if self.need_surv:
                surv = g[:, :gamma]
        else:
            conf = self.conf_all.take(rows, axis=0)
            acc = self.acc_all[rows]
        self.conf, self.acc = conf, acc
        if self.lean_input:  # the same StepInput, without passing the fields left at None
            inp = step_input(
                conf=conf, step_time=self.pol_fn, accept_rate=self.rate, survival=surv,
                rng=self.rng, drafted=drafted,
            )  # fmt: skip
            return checked_lengths(self.schedule_fn(inp), inp, self.pol_name)
        if self.need_lag:
            if self.need_lag_surv:
                g = tab.take(self.lag_rows, axis=0)
                lag = g[:, gamma : 2 * gamma].astype(self.conf_dtype)
                lag_surv = g[:, :gamma]
            else:
                lag = self.conf_all.take(self.lag_rows, axis=0)
        hist = self.need_hist
        eng = self.eng
        inp = step_input(
            conf=conf,
            step_time=self.pol_fn,
            lagged_conf=lag,
            accept_rate=self.rate,
            accept_len=acc if self.need_acc else None,
            survival=surv,
            lagged_survival=lag_surv,
            rng=self.rng,
            accept_hist=eng.hist if hist else None,
            request_class=eng.row_class[rows] if hist else None,
            drafted=drafted,
            lag_known=self.h2 >= 0 if self.need_known else None,
            draft_time=self.draft_time(self.n_dec) if self.need_draft else None,
        )
        return checked_lengths(self.schedule_fn(inp), inp, self.pol_name)

    def replay(self, lens: np.ndarray, acc: np.ndarray) -> None:
        """The replay rule: each decoder accepts min(l, accept_len) of its drafts and emits
        one more token (the target's), capped at what is left of its output."""
        n = self.n_dec
        ones = self.ones[:n]
        if ones.shape[0] < n:  # (more decoders than any run holds but a huge max_running's)
            ones = np.ones(n, np.int64)
        a_ok = np.minimum(lens, acc)
        self.emit = emit = np.minimum(a_ok + ones, self.S[OUT, :n] - self.pos)
        self.lens, self.a_ok = lens, a_ok
        # tally(), inline (a call less a step)
        self.upd = upd = np.array((emit, lens, a_ok, emit), dtype=np.int64)
        self.emitted, self.n_ver, self.n_acc, _ = upd.dot(ones).tolist()

    def tally(self) -> None:
        """The decoders' advance (rows N, VER, ACC and KV) and the step's sums of it (as
        :meth:`replay` has them; again after a preemption shortened the decoders' arrays)."""
        emit = self.emit
        self.upd = upd = np.array((emit, self.lens, self.a_ok, emit), dtype=np.int64)
        sums = np.add.reduce(upd, axis=1).tolist()
        self.emitted, self.n_ver, self.n_acc = sums[0], sums[1], sums[2]

    # ------------------------------------------------------------------ the step's end

    def learn(self, drafted: bool) -> None:
        """After the decoders moved on (ACCOUNT): the estimates learn from the step (the
        history only from drafts that were made) and the lagged rows move on."""
        S, n_dec, lens, a_ok = self.S, self.n_dec, self.lens, self.a_ok
        if self.need_rate:
            eng, m = self.eng, self.gamma + 1
            reach = np.minimum(a_ok + 1, lens)
            eng.trials += np.bincount(reach, minlength=m)[::-1].cumsum()[::-1]
            eng.succ += np.bincount(a_ok, minlength=m)[::-1].cumsum()[::-1]
        if self.need_hist and drafted:
            self.eng._hist_add(self.rows, self.conf, lens, a_ok)
        if self.track_lag:  # only a lagged policy (or a plan) reads them
            S[H2, :n_dec] = S[H1, :n_dec]
            S[H1, :n_dec] = self.rows if drafted else -1  # no confidences when not drafted

    def record_step(self, end: float) -> None:
        """The per-token log: each decoder's emitted tokens, then the first token of each of
        the ``n_first`` requests whose prefill ended (the columns after the decoders)."""
        n_dec, n_first = self.n_dec, self.n_first
        n = n_dec + n_first
        if not n:
            return
        eng = self.eng
        eng.tok_job.append(self.S[JOB, :n].copy())
        ones = np.ones(n_first, np.int64)
        eng.tok_cnt.append(np.concatenate((self.emit, ones)) if n_dec else ones)
        eng.tok_time.append(end)
        eng.tok_len.append(n)

    def leave(self, end: float, done: np.ndarray) -> np.ndarray:
        """The finished requests (``done``, ``n_fin`` of them) leave at the step's end: their
        times and counters go back to the jobs (``STEPS``: a request takes part in every step
        from its first decode step on), a closed loop spawns their successors. Returns their
        columns (the caller frees their KV)."""
        S, n_fin = self.S, self.n_fin
        eng, jobs = self.eng, self.jobs
        # (take of the columns' indices: a fraction of a boolean index's time on (NF, R))
        fin = S.take(done.nonzero()[0], axis=1)
        fj = fin[JOB]
        jobs.finish[fj] = end
        if eng.slot_rule is not None:  # the server's slots' last use (specsim.sim.slots)
            eng.slot_rule.release(jobs.server_slot[fj], end)
        fin[STEPS] = eng.n_steps + 1 - fin[STEPS]
        jobs.cols[:, fj] = fin  # the counters, read back by Engine._raw
        if self.sink is not None:
            self.sink.finished(jobs, fj)
        self.S = S.take((~done).nonzero()[0], axis=1)
        eng.n_done += n_fin
        if self.progress is not None:
            self.progress.update(n_fin)
        if not self.open_loop:
            for _ in range(n_fin):
                eng._spawn(end)
        return fin

    def log(self, duration: float, end: float) -> None:
        """The step's row of the step log (``STEP_COLUMNS`` order), or, in a lean run, the
        running sums (whose steady window starts at the closed loop's C-th completion)."""
        eng, sums, now, wait = self.eng, self.sums, self.now, self.wait
        eng.n_steps += 1
        if sums is None:
            self.steplog.extend(
                (
                    now, duration, self.b_tokens, self.n_run, self.n_dec, self.n_first,
                    self.n_queued, self.prefill_tokens, self.n_ver, self.n_acc, self.emitted,
                    wait, self.n_fin,
                )
            )  # fmt: skip
        else:
            sums.step(
                now, duration + wait, self.n_run + self.n_queued, self.n_dec, self.n_first,
                self.n_ver, self.n_acc, self.emitted, self.b_tokens,
            )  # fmt: skip
            if self.closed_c is not None and sums.t0 is None and eng.n_done >= self.closed_c:
                sums.t0 = sums.before(end)

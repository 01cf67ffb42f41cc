"""The SimPy serving engine: continuous batching of speculative decoding over a replayed trace.

One SimPy process runs the engine loop; under ZOS a second, short-lived process models the
scheduler running ahead on the CPU in each step it outlasts. All per-step work is vectorised
numpy over the running batch (arrays of trace offsets, positions, outputs), so a step costs the
same few dozen numpy calls whether 1 or 500 requests run. With one request in flight (or up to
``_ROWWISE_MAX_R`` under a rowwise policy) the steps up to the next event are walked in plain
Python without an event each (``Engine._solo_stretch``, ``Engine._rowwise_stretch``), with the
same clock, bit for bit.

One engine iteration (a "step"):

1. Admission (at the step's start time t): every open-loop arrival with time <= t joins the FIFO
   queue (so an arrival at exactly a step boundary joins the step that starts there: the
   same-time rule, tested); then queued requests are admitted, head first, while a running slot
   is free (``max_running``), the request's KV reservation (prompt_len + output_len + gamma
   tokens) fits in ``kv_tokens`` and its prompt fits in what is left of the step's
   ``prefill_budget`` (prompt tokens per step, like vLLM's max_num_batched_tokens; the first
   request of a step is admitted whatever its prompt). A request that does not fit blocks the
   queue (FIFO, no skipping). There is no preemption: an admitted request keeps its slot and
   reservation.
2. Prefill: requests admitted at this step add their prompt tokens to the step's token batch
   (chunked-prefill style). The prefill forward yields the first output token: trace position 0,
   verified with l = 0 (one token; no drafts exist yet, the drafter needs the prompt's features).
3. Decode, for the requests already prefilled: draft (``draft_ms(R, gamma)``), schedule (the
   policy returns l_r from the confidences of each request's current trace row), verify (one
   target step over B = sum(1 + l_r) + prefill tokens, ``step_time(B)``). Replay rule: request r
   at position n emits e = min(l_r, accept_len[n]) + 1 tokens, capped at output_len - n;
   n += e. All tokens of a step are emitted at the step's end.
4. Scheduler time. Serial (``policy.zos`` False): base + per-request * R is added to the step.
   ZOS: the decision for step t+1 is computed during step t by its own process; the engine
   waits for it only if it outlasts step t (the excess is logged as ``sched_wait_s``). The
   policy then sees ``lagged_conf``: each request's confidence row of two decode steps earlier
   (its current row if it is too new to have one). The first step after the engine was idle has
   nothing to overlap with and starts at once.

Online acceptance estimate (for policies that need ``accept_rate``): per draft position k, the
share of verified position-k drafts (reached: all earlier ones accepted) that were accepted,
with a prior of 0.5 worth ``PRIOR_WEIGHT`` observations.

Verification history (for policies that need ``accept_hist``): counts of reached and accepted
drafts by request class (the trace's category), position and confidence bin
(``HIST_BINS`` equal bins of [0, 1]), from steps that ENDED before the decision was made: under
ZOS, whose decision for step t runs during step t-1, the outcomes of step t-1 are withheld too.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from dataclasses import dataclass

import numpy as np
import simpy

from specsim.errors import SpecsimError
from specsim.policies.base import (
    Policy,
    TableStepTime,
    checked_lengths,
    step_input,
)
from specsim.rng import stream
from specsim.sim.admission import fits, reservation
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.steptime import row_table
from specsim.sim.cost.steptime import shifted as _shifted
from specsim.sim.cost.steptime import step2d as _step2d
from specsim.sim.history import History
from specsim.sim.jobs import ACC as _ACC
from specsim.sim.jobs import BASE as _BASE
from specsim.sim.jobs import H1 as _H1
from specsim.sim.jobs import H2 as _H2
from specsim.sim.jobs import JOB as _JOB
from specsim.sim.jobs import NF as _NF
from specsim.sim.jobs import OUT as _OUT
from specsim.sim.jobs import PROMPT as _PROMPT
from specsim.sim.jobs import RES as _RES
from specsim.sim.jobs import STEPS as _STEPS
from specsim.sim.jobs import VER as _VER
from specsim.sim.jobs import Jobs as _Jobs
from specsim.sim.jobs import N as _N
from specsim.sim.serving import ServingV2
from specsim.sim.steplog import STEP_COLUMNS, RawLog
from specsim.sim.steplog import RunningSums as _Sums
from specsim.sim.walks import _ROWWISE_MAX_R, Walks
from specsim.sim.workload import Workload
from specsim.trace.model import Trace

PRIOR_RATE = 0.5
PRIOR_WEIGHT = 2.0


@dataclass(frozen=True)
class EngineLimits:
    """Capacity of the simulated server, and which serving model runs it."""

    max_running: int
    kv_tokens: int
    prefill_budget: int = 1 << 62  # v1: prompt tokens admitted per step (the first always goes)
    serving: str = "v1"  # "v2": specsim.sim.serving (replay's default)
    kv: str = "paged"  # v2: "paged" or "reserve"
    kv_block: int = 16  # v2 paged: tokens per block
    max_batched_tokens: int = 8192  # v2: tokens a step may hold


class Engine(Walks, History, ServingV2):
    """Replays ``trace`` under ``workload`` with ``policy`` on ``cost``. Call :meth:`run`."""

    def __init__(
        self,
        trace: Trace,
        policy: Policy,
        cost: CostModel,
        workload: Workload,
        limits: EngineLimits,
        *,
        record_tokens: bool = True,
        record_steps: bool = True,
        progress=None,
        env: simpy.Environment | None = None,
        seed: int = 0,
        sink=None,  # noqa: ANN001 - specsim.sim.streaming.RequestSink
    ) -> None:
        self.trace = trace
        self.policy = policy
        # the policy's own seeded stream (StepInput.rng): a random policy draws from it only
        self.policy_rng = stream(seed, "policy")
        self.cost = cost
        self.wl = workload
        self.limits = limits
        self.env = env if env is not None else simpy.Environment()
        self.record_tokens = record_tokens
        self.record_steps = record_steps
        self.progress = progress
        # streaming results: finished jobs go to the sink as they finish, and the run's RawLog
        # holds no per-job arrays (the sink's summary has what the summary reads of them)
        self.sink = sink
        self.gamma = trace.block_size
        self._draft_lut: list[float] | None = None  # set with the cost terms in the run
        self.conf = trace.conf
        self.accept_len = trace.accept_len.astype(np.int64)
        self.offsets = trace.offsets.astype(np.int64)
        self.needs = policy.needs
        self._check_capacity()

    # ------------------------------------------------------------------ setup

    def _check_capacity(self) -> None:
        if self.limits.max_running < 1:
            raise SpecsimError(f"--max-running must be >= 1, got {self.limits.max_running}")
        res = reservation(self.wl.prompt_len, self.wl.output_len, self.gamma)
        worst = int(res.max()) if res.size else 0
        lim = self.limits
        if lim.serving == "v2":  # whole blocks (paged, or a reservation in blocks)
            worst = -(-worst // lim.kv_block) * lim.kv_block
            if lim.kv_block < 1 or lim.max_batched_tokens < 1:
                raise SpecsimError("--kv-block and --max-batched-tokens must be positive")
        if worst > self.limits.kv_tokens:
            raise SpecsimError(
                f"a request needs {worst} KV tokens but --kv-tokens is {self.limits.kv_tokens}; "
                "raise --kv-tokens"
            )

    # ------------------------------------------------------------------ run

    def run(self) -> RawLog:
        env = self.env
        # a streamed closed loop reuses finished jobs' slots (no per-token log names them), so
        # it holds the jobs in flight, not one column per request of the run
        recycle = self.sink is not None and not self.record_tokens and not self.wl.open_loop
        hint = self.wl.n_jobs_hint()
        if recycle:
            hint = min(hint, 4 * max(int(self.wl.concurrency), 1) + self.sink.flush_rows)
        self.jobs = _Jobs(hint, self.offsets, self.gamma)
        self.jobs.recycle = recycle
        self.queue: deque[int] = deque()
        # The step log, columnar: one flat float64 buffer holding a row of len(STEP_COLUMNS)
        # values per step (8 bytes a value, no Python objects: 104 bytes a step, where a list
        # of tuples took ~400). Without record_steps only what the summary reads is kept
        # (_Sums: 16 bytes a step).
        self.log = array("d")
        self.sums = None if self.record_steps else _Sums()
        self.closed_c = self.wl.concurrency if self.wl.kind == "closed" else None
        self.n_steps = 0
        self.tok_job: list[np.ndarray] = []
        self.tok_cnt: list[np.ndarray] = []
        self.tok_time: list[float] = []
        self.tok_len: list[int] = []
        self.trials = np.zeros(self.gamma + 1, dtype=np.int64)
        self.succ = np.zeros(self.gamma + 1, dtype=np.int64)
        if "accept_hist" in self.needs:
            self._init_hist()
        self.max_b = 0
        self.n_done = 0
        wl = self.wl
        if wl.open_loop:
            self.jobs.add_many(wl.trace_idx, wl.arrival_s, wl.prompt_len, wl.output_len)
            self.n_arrived = 0
        else:
            self.n_started = 0
            first = wl.concurrency if wl.max_jobs is None else min(wl.concurrency, wl.max_jobs)
            for _ in range(first):
                self._spawn(0.0)
        v2 = self.limits.serving == "v2"
        proc = env.process(self._loop_v2(env) if v2 else self._loop(env))
        env.run(until=proc)
        return self._raw()

    def _spawn(self, now: float) -> None:
        """Closed loop: the next job arrives now (if the bounds allow)."""
        wl = self.wl
        if wl.max_jobs is not None and self.n_started >= wl.max_jobs:
            return
        if wl.duration is not None and now > wl.duration:
            return
        t, p, o = wl.job(self.n_started)
        self.n_started += 1
        self.queue.append(self.jobs.add(t, now, p, o))

    def _set_draft_terms(self, cost: CostModel, gamma: int) -> None:
        """The drafting cost of a full block as the steps read it: base, per request and per
        request-block in seconds, or a measured draft curve at every R up to max_running."""
        self.d_base = cost.draft_base_ms * 1e-3
        self.d_req = cost.draft_per_request_ms * 1e-3
        self.d_tok = cost.draft_per_token_ms * 1e-3 * gamma
        self._draft_lut = None
        if cost.draft_curve:
            n_max = min(int(cost.max_running), 1 << 16)
            self._draft_lut = (cost.draft_ms(np.arange(n_max + 1), gamma) * 1e-3).tolist()

    def _zos_sched(self, env: simpy.Environment, seconds: float):
        yield env.timeout(seconds)

    def _log_step(self, row: tuple) -> None:
        """Append one step's row (``STEP_COLUMNS`` order) to the columnar log."""
        self.n_steps += 1
        self.log.extend(row)

    @staticmethod
    def _exact_delay(now: float, t: float) -> float | None:
        """A delay d with now + d == t in floating point, or None.

        SimPy adds the delay to the clock; t - now can miss t by an ulp, and when the rounding
        of now + d ties, some t are not reachable in one addition at all (the step-by-step path
        reached them by several). Neighbours of t - now are tried; None: no single hop exists.
        """
        d = t - now
        for _ in range(4):
            got = now + d
            if got == t:
                return d
            d = math.nextafter(d, math.inf if got < t else 0.0)
        return None

    def _draft_s(self, n: int) -> float:
        """Seconds of drafting for ``n`` decoding requests, before the context term."""
        lut = self._draft_lut
        if lut is None:
            return self.d_base + (self.d_req + self.d_tok) * n
        if n < len(lut):
            return lut[n]
        return float(self.cost.draft_ms(n, self.gamma)) * 1e-3

    def _loop(self, env: simpy.Environment):
        jobs = self.jobs
        cost = self.cost
        gamma = self.gamma
        conf_all = self.conf
        acc_all = self.accept_len
        lut = cost.lut_seconds(None)
        # Python floats for the walks, which index it per step; they never batch more than
        # _ROWWISE_MAX_R x (1 + gamma) tokens (beyond, they ask the cost model: same numbers)
        self.lut = lut[: (_ROWWISE_MAX_R + 1) * (gamma + 1) + 1].tolist()
        n_lut = lut.shape[0]
        step_fn = cost.step_time_fn(None)
        if not cost.is_2d:  # policies may read runs of batch sizes as table slices
            step_fn = TableStepTime(step_fn, lut)
        self._set_draft_terms(cost, gamma)
        d_base, d_req, d_tok = self.d_base, self.d_req, self.d_tok
        draft_lut = self._draft_lut
        # measured-engine terms (specsim.sim.cost.model): 0 in generated profiles
        engine_terms = cost.has_engine_terms
        step2d = _step2d(cost) if cost.is_2d and not engine_terms else None
        if step2d is not None and not step2d.ok:
            step2d = None
        ctx = None  # a 2-D profile's context, set by each step that decodes (as step_fn is)
        p_tok = cost.prefill_token_ms * 1e-3
        zos = bool(self.policy.zos)
        schedule = self.policy.schedule
        need_lag = "lagged_conf" in self.needs
        need_rate = "accept_rate" in self.needs
        need_acc = "accept_len" in self.needs
        need_hist = "accept_hist" in self.needs
        need_surv = "survival" in self.needs
        need_lag_surv = need_lag and "lagged_survival" in self.needs
        need_known = "lag_known" in self.needs
        need_draft = "draft_time" in self.needs
        # survivals of every trace row, once: a step gathers its rows instead of a cumprod
        tab = row_table(conf_all, acc_all) if need_surv or need_lag_surv else None
        conf_dtype = conf_all.dtype
        # the solo walk needs a step time that does not move with the context (1-D profile)
        solo = self.policy.solo is not None and not cost.is_2d and not engine_terms
        rowwise = solo and self.policy.rowwise and not zos
        open_loop = self.wl.open_loop
        arrivals = self.wl.arrival_s
        n_arr_total = arrivals.shape[0] if open_loop else 0
        kv_cap = self.limits.kv_tokens
        max_run = self.limits.max_running
        # The running batch: one (FIELDS, R) int64 array, columns in admission order, so one
        # fancy index compacts every field at once. Prefilling requests sit at the end.
        S = np.zeros((_NF, 0), np.int64)
        kv_used = 0
        zos_proc = None
        queue = self.queue
        record = self.record_tokens
        progress = self.progress
        sink = self.sink
        log_step = self._log_step
        sums = self.sums
        closed_c = self.closed_c
        while True:
            now = env.now
            # -- arrivals up to now join the queue (same-time rule: t_arrival <= now)
            if open_loop and self.n_arrived < n_arr_total and arrivals[self.n_arrived] <= now:
                upto = int(np.searchsorted(arrivals, now, side="right"))
                queue.extend(range(self.n_arrived, upto))
                self.n_arrived = upto
            # -- admission, FIFO, no skipping
            n_new = 0
            if queue and S.shape[1] < max_run:
                adm = []
                room = max_run - S.shape[1]
                budget = self.limits.prefill_budget
                while queue and room:
                    j = queue[0]
                    p = int(jobs.prompt[j])
                    res = reservation(p, int(jobs.out[j]), gamma)
                    if not fits(kv_used, res, kv_cap, bool(adm), p, budget):
                        break
                    queue.popleft()
                    kv_used += res
                    budget -= p
                    adm.append(j)
                    room -= 1
                if adm:
                    a = np.asarray(adm, dtype=np.int64)
                    n_new = a.shape[0]
                    jobs.admitted[a] = now
                    block = jobs.cols[:, a]
                    block[_STEPS] = self.n_steps + 1  # first decode step index (after prefill)
                    S = np.concatenate((S, block), axis=1)
                    if sums is not None:  # the steady window ends at the last admission
                        sums.t1 = sums.before(now)
            n_run = S.shape[1]
            n_queued = len(queue)
            if n_run == 0:
                zos_proc = None
                if queue:  # cannot happen: _check_capacity guarantees a lone request fits
                    raise SpecsimError("internal: queue blocked with an empty engine")
                if open_loop and self.n_arrived < n_arr_total:
                    yield env.timeout(float(arrivals[self.n_arrived]) - now)
                    continue
                return
            # -- ZOS: wait for the scheduler process that ran during the previous step
            wait = 0.0
            if zos and zos_proc is not None and not zos_proc.processed:
                yield zos_proc
                wait = env.now - now
                now = env.now
            n_dec = n_run - n_new
            # -- one request and nothing to admit: walk its steps up to the next event
            if solo and n_new == 0 and (n_run == 1 or (rowwise and n_run <= _ROWWISE_MAX_R)):
                if n_run == 1:
                    durs, end = self._solo_stretch(S, now, wait, n_queued, step_fn)
                else:
                    durs, end = self._rowwise_stretch(S, now, wait, n_queued, step_fn)
                if durs:
                    hop = self._exact_delay(now, end)
                    if hop is not None:  # one event to the next one that matters
                        yield env.timeout(hop)
                    else:  # no single hop lands on the same clock: one event per step
                        for d in durs:
                            yield env.timeout(d)
                    zos_proc = None  # the walk's last scheduler decision finished in its step
                    continue
            prefill_tokens = int(S[_PROMPT, n_dec:].sum()) if n_new else 0
            # -- decode part: schedule and replay
            if n_dec:
                pos = S[_N, :n_dec]
                rows = S[_BASE, :n_dec] + pos
                surv = None
                if tab is not None:  # one gather: [survival | conf | accept_len]
                    g = tab.take(rows, axis=0)
                    conf = g[:, gamma : 2 * gamma].astype(conf_dtype)
                    acc = g[:, 2 * gamma].astype(np.int64)
                    if need_surv:
                        surv = g[:, :gamma]
                else:
                    conf = conf_all[rows]
                    acc = acc_all[rows]
                if cost.is_2d:
                    # np.mean's own arithmetic (a float64 sum, then / count) without its
                    # Python wrappers: the same context to the bit
                    ctx = float(np.add.reduce(S[_PROMPT] + S[_N], dtype=np.float64) / n_run)
                    step_fn = step2d.fn(ctx) if step2d is not None else cost.step_time_fn(ctx)
                if not n_new:
                    pol_fn = step_fn
                elif p_tok:
                    pol_fn = cost.policy_step_fn(step_fn, prefill_tokens)
                else:
                    pol_fn = _shifted(step_fn, prefill_tokens)
                lag = lag_surv = None
                if need_lag or need_known:
                    h2 = S[_H2, :n_dec]
                    lag_rows = np.where(h2 >= 0, h2, rows)
                if need_lag:
                    if need_lag_surv:
                        g = tab.take(lag_rows, axis=0)
                        lag = g[:, gamma : 2 * gamma].astype(conf_dtype)
                        lag_surv = g[:, :gamma]
                    else:
                        lag = conf_all[lag_rows]
                rate = None
                if need_rate:
                    t = self.trials[1:].astype(np.float64)
                    rate = (self.succ[1:] + PRIOR_RATE * PRIOR_WEIGHT) / (t + PRIOR_WEIGHT)
                inp = step_input(
                    conf=conf,
                    step_time=pol_fn,
                    lagged_conf=lag,
                    accept_rate=rate,
                    accept_len=acc if need_acc else None,
                    survival=surv,
                    lagged_survival=lag_surv,
                    rng=self.policy_rng,
                    accept_hist=self.hist if need_hist else None,
                    request_class=self.row_class[rows] if need_hist else None,
                    lag_known=h2 >= 0 if need_known else None,
                    draft_time=self._draft_time_fn(n_dec) if need_draft else None,
                )
                lens = checked_lengths(schedule(inp), inp, self.policy.name)
                a_ok = np.minimum(lens, acc)
                emit = np.minimum(a_ok + 1, S[_OUT, :n_dec] - pos)
                upd = np.array((emit, lens, a_ok), dtype=np.int64)  # rows _N, _VER, _ACC
                emitted, n_ver, n_acc = np.add.reduce(upd, axis=1).tolist()
                if need_rate:
                    reach = np.minimum(a_ok + 1, lens)
                    self.trials += np.bincount(reach, minlength=gamma + 1)[::-1].cumsum()[::-1]
                    self.succ += np.bincount(a_ok, minlength=gamma + 1)[::-1].cumsum()[::-1]
                if need_hist:
                    self._hist_add(rows, conf, lens, a_ok)
                if draft_lut is None:
                    draft_s = d_base + (d_req + d_tok) * n_dec
                else:
                    draft_s = self._draft_s(n_dec)
                if engine_terms:  # the drafter's context: up to the anchor (prompt + n - 1)
                    draft_s += cost.draft_context_s(S[_PROMPT, :n_dec] + pos - 1)
                sched_s = 0.0 if zos else cost.sched_s(n_dec)
            else:
                n_ver = n_acc = 0
                draft_s = sched_s = 0.0
            batch = n_dec + n_ver + prefill_tokens
            if batch > self.max_b:
                self.max_b = batch
            if engine_terms:
                verify_s = cost.verify_s(n_dec + n_ver, prefill_tokens, n_run, step_fn, n_ver)
            elif step2d is not None:
                verify_s = step2d(batch, ctx)
            elif cost.is_2d:
                verify_s = float(step_fn(batch))
            elif batch < n_lut:
                verify_s = float(lut[batch])
            else:
                verify_s = float(cost.step_time(batch))
            duration = draft_s + sched_s + verify_s
            if zos:
                # The decision for the next step runs on the CPU during this one. A scheduler
                # shorter than the step ends first (now + sched <= now + duration, rounding is
                # monotone) and the next step never waits for it: only a longer one needs its
                # process (and an equal one only costs a zero wait), so only those get one.
                zos_s = cost.sched_s(n_run)
                zos_proc = env.process(self._zos_sched(env, zos_s)) if zos_s >= duration else None
            yield env.timeout(duration)
            end = env.now
            # -- advance
            if n_dec:
                S[_N : _ACC + 1, :n_dec] += upd
                if need_lag:
                    S[_H2, :n_dec] = S[_H1, :n_dec]
                    S[_H1, :n_dec] = rows
            else:
                emitted = 0
            if n_new:
                S[_N, n_dec:] = 1
                jobs.first[S[_JOB, n_dec:]] = end
                emitted += n_new
            if record:
                self.tok_job.append(S[_JOB].copy())
                self.tok_cnt.append(
                    np.concatenate((emit, np.ones(n_new, np.int64)))
                    if n_dec
                    else np.ones(n_run, np.int64)
                )
                self.tok_time.append(end)
                self.tok_len.append(n_run)
            done = S[_N] >= S[_OUT]
            n_fin = int(np.count_nonzero(done))  # (cheaper than done.any())
            if n_fin:
                fin = S[:, done]
                fj = fin[_JOB]
                jobs.finish[fj] = end
                # a running request takes part in every step from its first decode step on
                fin[_STEPS] = self.n_steps + 1 - fin[_STEPS]
                jobs.cols[:, fj] = fin  # the counters, read back by _raw
                if sink is not None:
                    sink.finished(jobs, fj)
                kv_used -= int(fin[_RES].sum())
                S = S[:, ~done]
                self.n_done += n_fin
                if progress is not None:
                    progress.update(n_fin)
                if not open_loop:
                    for _ in range(n_fin):
                        self._spawn(end)
            if sums is None:
                log_step(
                    (
                        now,
                        duration,
                        batch,
                        n_run,
                        n_dec,
                        n_new,
                        n_queued,
                        prefill_tokens,
                        n_ver,
                        n_acc,
                        emitted,
                        wait,
                        n_fin,
                    )
                )
            else:
                self.n_steps += 1
                sums.step(
                    now, duration + wait, n_run + n_queued, n_dec, n_new, n_ver, n_acc, emitted,
                    batch,
                )  # fmt: skip
                # the steady window starts at the C-th completion
                if closed_c is not None and sums.t0 is None and self.n_done >= closed_c:
                    sums.t0 = sums.before(end)

    # ------------------------------------------------------------------ output

    def _raw(self) -> RawLog:
        j = self.jobs
        n = j.n
        running = np.isnan(j.finish[:n]) & ~np.isnan(j.admitted[:n])
        if np.any(running):  # cannot happen: the loop drains every admitted job
            raise SpecsimError("internal: a request was left running")
        if self.sink is not None:  # streamed: the sink has the finished jobs, keep none here
            self.sink.close(j)
            n = 0
        if self.record_tokens and self.tok_job:
            tj = np.concatenate(self.tok_job)
            tc = np.concatenate(self.tok_cnt)
            tt = np.repeat(np.asarray(self.tok_time), np.asarray(self.tok_len))
        else:
            tj = tc = tt = None
        if self.sums is None:
            log = np.frombuffer(self.log, dtype=np.float64).reshape(-1, len(STEP_COLUMNS)).copy()
            sums = None
        else:
            log, sums = None, self.sums.freeze()
        return RawLog(
            job_trace=j.trace[:n].copy(),
            arrival_s=j.arrival[:n].copy(),
            admitted_s=j.admitted[:n].copy(),
            first_token_s=j.first[:n].copy(),
            finish_s=j.finish[:n].copy(),
            prompt_len=j.prompt[:n].copy(),
            output_len=j.out[:n].copy(),
            emitted=j.result(_OUT)[:n],
            steps=j.result(_STEPS)[:n],
            verified=j.result(_VER)[:n],
            accepted=j.result(_ACC)[:n],
            step_log=log,
            token_job=tj,
            token_time=tt,
            token_count=tc,
            sim_time_s=float(self.env.now),
            max_batch_tokens=int(self.max_b),
            step_sums=sums,
            preemptions=int(getattr(self, "preemptions", 0)),
            recomputed_tokens=int(getattr(self, "recomputed", 0)),
            stall_s=j.stall[:n].copy(),
        )

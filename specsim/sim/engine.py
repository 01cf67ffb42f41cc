"""The SimPy serving engine: continuous batching of speculative decoding over a replayed trace.

One SimPy process runs the engine loop of the serving model the limits name: v2 (the default,
:mod:`specsim.sim.serving`: chunked prefill under a token budget, paged KV) or v1 (below). Each
loop reads as the speculative step does: arrivals, the walk, DRAFT, SCHEDULE, BATCH, COST,
ACCOUNT, each a method of the run's step object (:mod:`specsim.sim.step` has the parts both
models share, written once). Under ZOS a second, short-lived process models the scheduler
running ahead on the CPU in each step it outlasts. All per-step work is vectorised numpy over
the running batch (arrays of trace offsets, positions, outputs), so a step costs the same few
dozen numpy calls whether 1 or 500 requests run. With one request in flight (or, v1, up to
``_ROWWISE_MAX_R`` under a rowwise policy) the steps up to the next event are walked in plain
Python without an event each (:mod:`specsim.sim.walks`), with the same clock, bit for bit.

Serving model v1, one engine iteration (a "step") at time t:

1. Admission: every open-loop arrival with time <= t joins the FIFO queue (the same-time rule,
   tested); then queued requests are admitted, head first, while a running slot is free
   (``max_running``), the request's KV reservation (prompt_len + output_len + gamma tokens)
   fits in ``kv_tokens`` and its prompt fits in what is left of the step's ``prefill_budget``
   (prompt tokens per step, like vLLM's max_num_batched_tokens; the first request of a step is
   admitted whatever its prompt). A request that does not fit blocks the queue (FIFO, no
   skipping). There is no preemption: an admitted request keeps its slot and reservation.
2. Prefill: requests admitted at this step add their prompt tokens to the step's token batch
   (chunked-prefill style). The prefill forward yields the first output token: trace position
   0, verified with l = 0 (one token; no drafts exist yet, the drafter needs the prompt's
   features).
3. Decode, for the requests already prefilled: draft (``draft_ms(R, gamma)``), schedule (the
   policy returns l_r from the confidences of each request's current trace row), verify (one
   target step over B = sum(1 + l_r) + prefill tokens, ``step_time(B)``). Replay rule: request
   r at position n emits e = min(l_r, accept_len[n]) + 1 tokens, capped at output_len - n;
   n += e. All tokens of a step are emitted at the step's end.
4. Scheduler time. Serial (``policy.zos`` False): base + per-request * R is added to the step.
   ZOS: the decision for step t+1 is computed during step t by its own process; the engine
   waits for it only if it outlasts step t (the excess is logged as ``sched_wait_s``). The
   policy then sees ``lagged_conf``: each request's confidence row of two decode steps earlier
   (its current row if it is too new to have one). The first step after the engine was idle
   has nothing to overlap with and starts at once.

The online acceptance estimate (``accept_rate``) and the verification history
(``accept_hist``) are :mod:`specsim.sim.step`'s and :mod:`specsim.sim.history`'s.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import simpy

from specsim.errors import SpecsimError
from specsim.policies.base import Policy, TableStepTime
from specsim.rng import stream
from specsim.sim.admission import fits, reservation
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.steptime import shifted, step2d
from specsim.sim.history import History
from specsim.sim.jobs import ACC, BASE, JOB, OUT, PROMPT, RES, STEPS, VER, N
from specsim.sim.jobs import Jobs as _Jobs
from specsim.sim.serving import ServingV2
from specsim.sim.step import Step
from specsim.sim.steplog import STEP_COLUMNS, RawLog
from specsim.sim.steplog import RunningSums as _Sums
from specsim.sim.walks import _ROWWISE_MAX_R, Walks
from specsim.sim.workload import Workload
from specsim.trace.model import Trace

if TYPE_CHECKING:
    from collections.abc import Generator


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
                f"a request needs {worst} KV tokens but the KV cache holds "
                f"{self.limits.kv_tokens} (--kv-tokens if given, else the profile's kv_tokens): "
                "give a larger --kv-tokens, or a profile of a deployment with more KV room"
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

    def _draft_s(self, n: int) -> float:
        """Seconds of drafting for ``n`` decoding requests, before the context term."""
        lut = self._draft_lut
        if lut is None:
            return self.d_base + (self.d_req + self.d_tok) * n
        if n < len(lut):
            return lut[n]
        return float(self.cost.draft_ms(n, self.gamma)) * 1e-3

    def _draft_seconds(self, n: int, k: int) -> float:
        """Seconds of drafting ``k`` tokens for ``n`` requests, before the context term: the
        one rule a step's cost, a walk and a policy's ``draft_time`` all read (a full block
        from the engine's terms, fewer tokens from the cost model's curve)."""
        if k <= 0:
            return 0.0
        return self._draft_s(n) if k >= self.gamma else float(self.cost.draft_ms(n, k)) * 1e-3

    def _loop(self, env: simpy.Environment) -> Generator[simpy.Event, object, None]:
        """Serving model v1's SimPy process (the module docstring): one timeout per step, the
        step's phases in order; the drafter always drafts the whole block."""
        st = StepV1(self)
        zos = st.zos
        while (yield from st.start(env)):  # arrivals, BATCH (admissions), idle, ZOS wait, walks
            st.schedule()  # SCHEDULE: the policy's lengths and the replay rule
            duration = st.price()  # COST: draft + sched + verify
            if zos:
                st.run_ahead(env, duration)  # the next step's decision, during this one
            yield env.timeout(duration)
            st.account(env.now, duration)  # ACCOUNT: advance, record, finish, log

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
            emitted=j.result(OUT)[:n],
            steps=j.result(STEPS)[:n],
            verified=j.result(VER)[:n],
            accepted=j.result(ACC)[:n],
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


class StepV1(Step):
    """Serving model v1's step (see the module docstring): the phases :meth:`Engine._loop`
    calls in order; the shared ones are :class:`specsim.sim.step.Step`'s."""

    __slots__ = (
        "step_fn", "step2d", "ctx", "is2d", "solo", "rowwise", "kv_cap", "max_run",
        "prefill_budget", "kv_used", "n_new",
    )  # fmt: skip

    def __init__(self, eng) -> None:  # noqa: ANN001 - the Engine
        super().__init__(eng, tracks_kv=False)
        cost, pol, gamma = self.cost, eng.policy, self.gamma
        lut = self.lut
        # Python floats for the walks, which index it per step; they never batch more than
        # _ROWWISE_MAX_R x (1 + gamma) tokens (beyond, they ask the cost model: same numbers)
        eng.lut = lut[: (_ROWWISE_MAX_R + 1) * (gamma + 1) + 1].tolist()
        self.is2d = cost.is_2d
        step_fn = cost.step_time_fn(None)
        if not self.is2d:  # policies may read runs of batch sizes as table slices
            step_fn = TableStepTime(step_fn, lut)
        self.step_fn = step_fn  # a 2-D profile's: set by each step that decodes, as ctx is
        self.ctx = None
        s2d = step2d(cost) if self.is2d and not self.engine_terms else None
        self.step2d = s2d if s2d is not None and s2d.ok else None
        # the walks need a step time that does not move with the context (1-D profile)
        self.solo = pol.solo is not None and not self.is2d and not self.engine_terms
        self.rowwise = self.solo and pol.rowwise and not self.zos
        lim = eng.limits
        self.kv_cap = lim.kv_tokens
        self.max_run = lim.max_running
        self.prefill_budget = lim.prefill_budget
        self.kv_used = 0
        self.n_new = 0

    def admit_at_start(self, now: float) -> None:
        """BATCH (v1: at the step's start): queued requests are admitted head first while a
        slot is free, the reservation fits and the prompt fits the step's prefill budget (the
        first always goes); one that does not fit blocks the queue. The admitted prefill in
        this step, after the running requests (which decode)."""
        queue, S = self.queue, self.S
        n_new = 0
        if queue and S.shape[1] < self.max_run:
            jobs, gamma, kv_cap, kv_used = self.jobs, self.gamma, self.kv_cap, self.kv_used
            adm = []
            room = self.max_run - S.shape[1]
            budget = self.prefill_budget
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
            self.kv_used = kv_used
            if adm:
                a = np.asarray(adm, dtype=np.int64)
                n_new = a.shape[0]
                jobs.admitted[a] = now
                block = jobs.cols[:, a]
                block[STEPS] = self.eng.n_steps + 1  # first decode step index (after prefill)
                self.S = S = np.concatenate((S, block), axis=1)
                if self.sums is not None:  # the steady window ends at the last admission
                    self.sums.t1 = self.sums.before(now)
        n_run = S.shape[1]
        self.n_run, self.n_new, self.n_first, self.n_dec = n_run, n_new, n_new, n_run - n_new
        self.n_queued = len(queue)
        if not n_run and queue:  # cannot happen: _check_capacity guarantees a lone one fits
            raise SpecsimError("internal: queue blocked with an empty engine")

    def walk(self, now: float, wait: float) -> tuple | None:
        """Nothing admitted and one request running (or a few, under a rowwise policy): its
        steps up to the next event, walked without SimPy (:mod:`specsim.sim.walks`). None
        when no step could be walked."""
        n_run = self.n_run
        if not self.solo or self.n_new:
            return None
        if n_run == 1:
            walked = self.eng._solo_stretch(self.S, now, wait, self.n_queued, self.step_fn)
        elif self.rowwise and n_run <= _ROWWISE_MAX_R:
            walked = self.eng._rowwise_stretch(self.S, now, wait, self.n_queued, self.step_fn)
        else:
            return None
        return walked if walked[0] else None

    def schedule(self) -> None:
        """SCHEDULE: the decoders' lengths from the policy (which sees the step's prefill in
        its step time) and what the replay rule makes of them."""
        S, n_dec, n_new = self.S, self.n_dec, self.n_new
        prefill = int(S[PROMPT, n_dec:].sum()) if n_new else 0
        self.prefill_tokens = prefill
        if not n_dec:
            self.n_ver = self.n_acc = self.emitted = 0
            return
        pos = S[N, :n_dec]
        rows = S[BASE, :n_dec] + pos
        self.pos, self.rows = pos, rows
        cost = self.cost
        if self.is2d:
            # np.mean's own arithmetic (a float64 sum, then / count) without its Python
            # wrappers: the same context to the bit
            ctx = float(np.add.reduce(S[PROMPT] + S[N], dtype=np.float64) / self.n_run)
            s2d = self.step2d
            self.step_fn = s2d.fn(ctx) if s2d is not None else cost.step_time_fn(ctx)
            self.ctx = ctx
        step_fn = self.step_fn
        if not n_new:
            self.pol_fn = step_fn
        elif self.p_tok:
            self.pol_fn = cost.policy_step_fn(step_fn, prefill)
        else:
            self.pol_fn = shifted(step_fn, prefill)
        if self.need_lag or self.need_known:
            self.lagged()
        self.rate = self.accept_rate() if self.need_rate else None
        lens = self.decide(None)
        self.replay(lens, self.acc)

    def price(self) -> float:
        """COST: drafting a full block for the decoders (and the drafter's context, measured
        engines), the serial scheduler (not under ZOS) and the target step over every token."""
        n_dec, cost = self.n_dec, self.cost
        if n_dec:
            draft_s = self.draft_seconds(n_dec, self.gamma)
            if self.engine_terms:  # the drafter's context: up to the anchor (prompt + n - 1)
                draft_s += cost.draft_context_s(self.S[PROMPT, :n_dec] + self.pos - 1)
            sched_s = 0.0 if self.zos else cost.sched_s(n_dec)
        else:
            draft_s = sched_s = 0.0
        n_ver, prefill = self.n_ver, self.prefill_tokens
        batch = self.count_batch(prefill)
        if self.engine_terms:
            verify_s = cost.verify_s(n_dec + n_ver, prefill, self.n_run, self.step_fn, n_ver)
        elif self.step2d is not None:
            verify_s = self.step2d(batch, self.ctx)
        elif self.is2d:
            verify_s = float(self.step_fn(batch))
        elif batch < self.n_lut:
            verify_s = float(self.lut[batch])
        else:
            verify_s = float(cost.step_time(batch))
        return draft_s + sched_s + verify_s

    def account(self, end: float, duration: float) -> None:
        """ACCOUNT: the decoders advance, the admitted requests' prefill emits their first
        token, the tokens are recorded, finished requests leave (freeing their reservation),
        and the step is logged."""
        n_dec, n_new = self.n_dec, self.n_new
        if n_dec:
            self.advance(True)
        if n_new:
            S = self.S
            S[N, n_dec:] = 1
            self.jobs.first[S[JOB, n_dec:]] = end
            self.emitted += n_new
        if self.record:
            self.record_step(end)
        fin = self.leave(end)
        if fin is not None:
            self.kv_used -= int(fin[RES].sum())
        self.log(duration, end)

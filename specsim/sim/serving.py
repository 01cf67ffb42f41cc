"""The serving model (serving model v2): the engine step as vLLM V1 and SGLang run it.

:class:`Engine` replays a trace under a workload and a policy on a cost profile: one SimPy
process runs the loop below, one timeout per step, the step's phases the methods of
:class:`StepV2` (:mod:`specsim.sim.step` has the parts that are not about batching,
:mod:`specsim.sim.batching` the prompt chunks, KV blocks and admissions). Under ZOS a second,
short-lived process models the scheduler running ahead on the CPU in each step it outlasts.
All per-step work is vectorised numpy over the running batch, so a step costs the same few
dozen numpy calls whether 1 or 500 requests run; a lone decoding request's steps up to the next
event are walked in plain Python (:mod:`specsim.sim.walks`), with the same clock, bit for bit.
Serving model v1 (whole prompts, a clairvoyant KV reservation, a full draft every step) was
retired; it runs at commit 77e1490.

One step, at time t:

1. Arrivals up to t join the FIFO queue (an arrival at exactly t joins this step).
2. Decode first. The running requests whose prefill is done (``decoders``) each verify
   ``1 + l_r`` tokens. What the drafter must produce is decided BEFORE it runs
   (``Policy.draft_len`` / ``Policy.plan``): no draft at all (``ar``, or a policy whose plan is
   0 for the step: the drafter is skipped, as engines switch speculation off under load), k
   tokens (``mtp1``: a one-token drafter; ``goodput``'s k), or the block; then the policy picks
   l_r (at most what was drafted). Drafting costs ``draft_ms(R, k)`` of what was drafted.
3. Prompt chunks fill the rest of the step's token budget (``max_batched_tokens``): the
   requests already prefilling, oldest first, then new admissions from the queue (FIFO, no
   skipping) while a slot, budget and KV are left. No prompt bypasses the budget: a long one is
   prefilled over several steps, and every decoder keeps its place in every step (so no
   decoding request waits longer than one step of a full budget). A request's prefill ends in
   the step that processes its last prompt token, which emits its first token.
4. KV (``kv="paged"``, the default): blocks of ``kv_block`` tokens, allocated as tokens are
   written: a decoder needs room for its cache plus the ``1 + l_r`` tokens it verifies, a
   prefiller for its cache plus its chunk. When the running requests need more blocks than
   exist, the most recently admitted is preempted (vLLM V1's recompute): its blocks are freed,
   it returns to the head of the queue, and on readmission it prefills its prompt and the
   tokens it already emitted again before it decodes on; its stall shows in ``itl_ms_max``.
   New admissions need blocks for their first chunk (they never preempt). ``kv="reserve"``
   reserves prompt + whole output + gamma at admission instead (in whole blocks), which never
   preempts.
5. The step's price (:meth:`specsim.sim.cost.price.StepPrice.seconds`, the one function that
   prices a step, the non-anticipating bound's included): drafting (above) + the drafter's
   prefill of the prompt tokens in the step (``draft_prefill_us_per_token``, when the policy
   drafts at all) + the scheduler (only for a policy that decides, and not under ZOS) + the
   target step over every token in it (the table) + the KV it reads (``kv_read_us_per_ktoken``
   per cached token of every sequence in the step: the decoders' contexts and the prefillers'
   prefixes) + ``emit_per_token_ms`` per decode token emitted (a server that samples verified
   rows only up to the first rejection and streams each token: llama-server).
6. The replay rule: request r at position n emits e = min(l_r, accept_len[n]) + 1 tokens,
   capped at output_len - n; n += e, all at the step's end.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import simpy

from specsim.errors import SpecsimError
from specsim.policies.base import Policy, StepInput, TableStepTime, step_input
from specsim.rng import stream
from specsim.sim.admission import reservation
from specsim.sim.batching import Batching
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.price import StepPrice, passes_table
from specsim.sim.history import History
from specsim.sim.jobs import ACC, BASE, JOB, KV, OUT, PRE, PROMPT, PTGT, RES, STEPS, VER, N
from specsim.sim.jobs import Jobs as _Jobs
from specsim.sim.steplog import STEP_COLUMNS, RawLog
from specsim.sim.steplog import RunningSums as _Sums
from specsim.sim.ubatch import decoder_passes
from specsim.sim.walks import Walks
from specsim.sim.workload import Workload
from specsim.trace.model import Trace

if TYPE_CHECKING:
    from collections.abc import Generator

# walk a lone request's steps without an event each (tests turn it off to compare)
WALK = True


@dataclass(frozen=True)
class EngineLimits:
    """Capacity of the simulated server."""

    max_running: int
    kv_tokens: int
    kv: str = "paged"  # "paged" or "reserve"
    kv_block: int = 16  # paged: tokens per block
    max_batched_tokens: int = 8192  # tokens a step may hold


class Engine(Walks, History):
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
        slots=None,  # noqa: ANN001 - a specsim.sim.slots.LlamaSlots
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
        self.price = StepPrice(cost, self.gamma)  # what a step costs (the walks read it too)
        self.conf = trace.conf
        self.accept_len = trace.accept_len.astype(np.int64)
        self.offsets = trace.offsets.astype(np.int64)
        self.needs = policy.needs
        # llama-server's slot choice (specsim.sim.slots) where the profile prices a step by
        # the slots it runs in; else the lowest free slots
        use = slots is not None and cost.passes_by_slot
        self.slot_rule = slots.attach(trace.n_requests, limits.max_running) if use else None
        self._check_capacity()

    # ------------------------------------------------------------------ setup

    def _check_capacity(self) -> None:
        lim = self.limits
        if lim.max_running < 1:
            raise SpecsimError(f"--max-running must be >= 1, got {lim.max_running}")
        if lim.kv_block < 1 or lim.max_batched_tokens < 1:
            raise SpecsimError("--kv-block and --max-batched-tokens must be positive")
        res = reservation(self.wl.prompt_len, self.wl.output_len, self.gamma)
        worst = int(res.max()) if res.size else 0
        worst = -(-worst // lim.kv_block) * lim.kv_block  # whole blocks
        if worst > lim.kv_tokens:
            raise SpecsimError(
                f"a request needs {worst} KV tokens but the KV cache holds "
                f"{lim.kv_tokens} (--kv-tokens if given, else the profile's kv_tokens): "
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
        proc = env.process(self._loop(env))
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

    def _loop(self, env: simpy.Environment) -> Generator[simpy.Event, object, None]:
        """The engine's SimPy process: one timeout per step, the step's phases in order."""
        st = StepV2(self)
        zos = st.zos
        # START: arrivals; a step starts now (ready), or after an idle or ZOS wait or a walk
        while st.ready(env.now) or (yield from st.start(env)):
            st.view()  # the step as the policy sees it: decoders, prefill, KV read, rows
            st.draft()  # DRAFT: how many tokens the drafter produces (fixed k, plan, block)
            st.schedule()  # SCHEDULE: StepInput -> the policy's lengths -> the replay rule
            st.batch()  # BATCH: prompt chunks, KV room (or preemption), admissions
            duration = st.price()  # COST: draft + sched + verify + kv + emit
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


class StepV2(Batching):
    """The serving model's step (see the module docstring): the phases the loop calls in
    order; the shared ones are :class:`specsim.sim.step.Step`'s, BATCH is
    :class:`specsim.sim.batching.Batching`'s."""

    __slots__ = (
        "base_fn", "is2d", "kv_coef", "uses_drafter", "decides", "fixed_k", "plan", "walk_ok",
        "k_draft", "ctx", "dense", "lags", "learns", "table", "sched_on", "attn_on",
    )  # fmt: skip

    def __init__(self, eng) -> None:  # noqa: ANN001 - the Engine
        super().__init__(eng)
        cost, pol = self.cost, eng.policy
        self.base_fn = cost.step_time_fn(None)
        self.is2d = cost.is_2d
        self.kv_coef = self.step_price.kv_coef  # seconds per cached token read
        self.uses_drafter = pol.draft_len != 0  # (then the drafter prefills every prompt)
        self.decides = bool(pol.decides)
        self.fixed_k = pol.draft_len
        self.plan = pol.plan if self.fixed_k is None else None
        self.track_lag = self.need_lag or self.plan is not None  # a plan reads lagged rows
        eng.lut_list = self.lut[: 4 * (self.gamma + 1) + 1].tolist()  # the walk's, as floats
        self.walk_ok = (WALK and not self.is2d and not self.engine_terms and not self.p_tok
                        and not self.step_price.attn_coef)  # fmt: skip
        self.k_draft = 0
        self.ctx = None
        # what a step does or skips, decided once
        self.dense = not self.is2d and not self.p_tok  # the policy reads the table, shifted
        self.lags = self.track_lag or self.need_known  # the decoders' lagged rows are read
        self.learns = self.need_rate or self.need_hist or self.track_lag  # learn() runs
        # the table COST reads (a 2-D profile's: at the step's context, in price)
        self.table = self.base_fn if self.engine_terms else self.step_price.table_s
        self.sched_on = self.decides and not self.zos  # the scheduler is in the step
        self.attn_on = bool(self.step_price.attn_coef)

    def ready(self, now: float) -> bool:
        """START's usual case without a generator: arrivals up to ``now`` joined, something
        runs, no ZOS decision is pending and no walk applies, so the step starts at ``now``
        (True). False: :meth:`start` decides (an idle or ZOS wait, a walk, or the end)."""
        if self.open_loop:
            self.arrive(now)
        n = self.S.shape[1]
        if not n and not self.queue:
            return False
        if self.zos_proc is not None and not self.zos_proc.processed:
            return False
        if n == 1 and self.walk_ok and not self.n_pref and not self.queue:
            return False
        self.now, self.wait = now, 0.0
        return True

    def walk(self, now: float, wait: float) -> tuple | None:
        """One request decoding, nothing prefilling or queued: its steps up to the next
        event, walked without SimPy (:meth:`specsim.sim.walks.Walks._solo_walk_v2`). None
        when no step could be walked."""
        S = self.S
        if not self.walk_ok or S.shape[1] != 1 or self.n_pref or self.queue:
            return None
        walked = self.eng._solo_walk_v2(S, now, wait, 0, self.lut, self.kv_coef)
        if not walked[0]:
            return None
        self.kv_all = int(S[KV, 0])  # the walk advanced the request's cache
        return walked

    def view(self) -> None:
        """The step as the policy is told of it before it runs: the decoders (the running
        requests whose prefill is done; the prefillers follow them in ``S``) and their rows,
        and the step time it will see: the table shifted by the prefill the step is expected
        to carry plus the KV it reads (every decoder's cache and anchor, every prefix)."""
        S, n_pref = self.S, self.n_pref
        n_run = S.shape[1]
        self.n_dec = n_dec = n_run - n_pref
        pend_total = pre_ctx = 0
        if n_pref:
            self.pend = pend = S[PTGT, n_dec:] - S[PRE, n_dec:]
            pend_total = int(np.add.reduce(pend))
            pre_ctx = int(np.add.reduce(S[KV, n_dec:]))
        self.pend_total, self.pre_ctx = pend_total, pre_ctx
        if not n_dec:  # nothing decodes: no draft, no decision
            self.ctx_dec = self.n_ver = self.n_acc = self.emitted = self.k_draft = 0
            self.ctx = None
            return
        self.ctx_dec = ctx_dec = self.kv_all - pre_ctx + n_dec
        p_est = 0  # the prefill this step is expected to carry
        queue = self.queue
        if n_pref or queue:
            p_est = pend_total + (self.queued_prompt(n_run) if queue else 0)
            p_est = min(max(self.budget_tokens - n_dec, 0), p_est)
        kv_est = self.kv_coef * (ctx_dec + pre_ctx)
        self.pos = pos = S[N, :n_dec]
        self.rows = S[BASE, :n_dec] + pos
        if self.dense:  # the dense table, shifted by the prefill
            self.pol_fn = TableStepTime(self.base_fn, self.lut, p_est, kv_est)
        else:
            cost, ctx = self.cost, None
            if self.is2d:
                ctx = float(np.add.reduce(S[PROMPT, :n_dec] + pos, dtype=np.float64) / n_dec)
            self.ctx = ctx
            step_fn = cost.step_time_fn(ctx) if self.is2d else self.base_fn
            self.pol_fn = _plus(cost.policy_step_fn(step_fn, p_est), kv_est)
        self.rate = self.accept_rate() if self.need_rate else None
        if self.lags:
            self.lagged()

    def draft(self) -> None:
        """DRAFT: how many tokens the drafter produces this step, decided BEFORE it runs: the
        policy's fixed k (``draft_len``: 0 for ``ar``, 1 for ``mtp1``), its ``plan`` from what
        is known before the draft (0 skips the drafter for the step, as engines switch
        speculation off under load), or the whole block."""
        if not self.n_dec:
            return
        gamma = self.gamma
        if self.fixed_k is not None:
            self.k_draft = min(int(self.fixed_k), gamma)
        elif self.plan is not None:
            k = self.plan(self.plan_input())
            self.k_draft = gamma if k is None else max(0, min(int(k), gamma))
        else:
            self.k_draft = gamma

    def plan_input(self) -> StepInput:
        """What a plan knows before the draft: the LAGGED rows (their survivals, for a policy
        that reads them), which requests have one, the history and the step's cost."""
        lag_rows, tab, eng, hist = self.lag_rows, self.tab, self.eng, self.need_hist
        return step_input(
            conf=self.conf_all.take(lag_rows, axis=0),
            step_time=self.pol_fn,
            accept_rate=self.rate,
            survival=tab[lag_rows][:, : self.gamma] if tab is not None else None,
            accept_hist=eng.hist if hist else None,
            request_class=eng.row_class[self.rows] if hist else None,
            lag_known=self.h2 >= 0,
            draft_time=self.draft_time(self.n_dec),
        )

    def schedule(self) -> None:
        """SCHEDULE: the policy picks each decoder's l_r, at most what was drafted (nothing
        drafted: l_r = 0, the decoder verifies its one token), then the replay rule."""
        n_dec = self.n_dec
        if not n_dec:
            return
        k = self.k_draft
        if k == 0:
            self.conf = None
            self.replay(np.zeros(n_dec, dtype=np.int64), self.acc_all[self.rows])
            return
        gamma = self.gamma
        lens = self.decide(k if k < gamma else None)
        if k < gamma:
            lens = np.minimum(lens, k)
        self.replay(lens, self.acc)

    def price(self) -> float:
        """COST: the step's seconds (:meth:`specsim.sim.cost.price.StepPrice.seconds`):
        drafting what was drafted (and the drafter's context, measured engines), the drafter's
        prefill of the step's prompt tokens, the scheduler (a policy that decides, not under
        ZOS), the target step over every token, the KV it reads (or attention's compute) and
        the server's sampling and streaming of each emitted decode token."""
        n_dec, k = self.n_dec, self.k_draft
        dctx, qk, table = 0.0, None, self.table
        if self.engine_terms and n_dec and k:  # the drafter's context: up to each anchor
            S = self.S
            dctx = self.cost.draft_context_s(S[PROMPT, :n_dec] + S[N, :n_dec] - 1)
        if self.is2d:
            table = self.cost.step_time_fn(self.ctx)
        if self.attn_on and n_dec:  # every decoder's query tokens x its context
            S, lens = self.S, self.lens
            ones = lens is None or len(lens) != n_dec
            q = np.ones(n_dec, np.int64) if ones else 1 + lens
            qk = float(np.dot(q, S[PROMPT, :n_dec] + S[N, :n_dec]))
        prefill = self.prefill_tokens
        if self.slotted and n_dec:  # the table at each pass the engine cuts the step into
            cut = decoder_passes(self.jobs.server_slot[self.S[JOB, :n_dec]], self.lens)
            table = passes_table(table, cut, self.cost.pass_extra_ms * 1e-3)
        return float(
            self.step_price.seconds(
                table, requests=self.n_run, decode=n_dec, drafts=self.n_ver, drafted=k,
                draft_context=dctx, tree=self.tree_tokens, prefill=prefill,
                draft_prefill=prefill if self.uses_drafter else 0,
                sched=self.cost.sched_s(n_dec) if n_dec and self.sched_on else 0.0,
                kv=self.ctx_dec + self.pre_ctx, qk=qk, emitted=self.emitted,
            )
        )  # fmt: skip

    def account(self, end: float, duration: float) -> None:
        """ACCOUNT: the decoders and prefillers advance, the tokens are recorded, finished
        requests leave (freeing their KV), and the step is logged."""
        S, n_dec = self.S, self.n_dec
        if n_dec:
            S[N : KV + 1, :n_dec] += self.upd  # the adjacent rows N, VER, ACC, KV in one add
            self.kv_all += self.emitted  # the decoders' (prefills' first tokens: below)
            if self.learns:  # the estimates and the lagged rows
                self.learn(self.k_draft > 0)
        self.n_first = self.prefill(end) if self.n_pref else 0
        if self.record:
            self.record_step(end)
        done = S[N] >= S[OUT]
        self.n_fin = n_fin = int(np.count_nonzero(done))  # (cheaper than done.any())
        if n_fin:
            fin = self.leave(end, done)
            self.kv_all -= sum(fin[KV].tolist())  # (a few ints: no reduce)
            if not self.paged:
                blk = self.blk
                self.kv_used -= int(np.add.reduce(-(-fin[RES] // blk) * blk))
        self.log(duration, end)


class _Plus:
    """``fn(B) + offset``: a step-time function plus the seconds every step of this one pays."""

    __slots__ = ("fn", "offset")

    def __init__(self, fn, offset: float) -> None:  # noqa: ANN001
        self.fn, self.offset = fn, offset

    def __call__(self, batch):  # noqa: ANN001, ANN204
        return self.fn(batch) + self.offset


def _plus(fn, offset: float):  # noqa: ANN001, ANN202
    return fn if not offset else _Plus(fn, offset)

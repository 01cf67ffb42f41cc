"""Serving model v2: the engine step as vLLM V1 and SGLang run it (the default).

One step, at time t:

1. Arrivals up to t join the FIFO queue (the same-time rule of v1).
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
   keeps v1's clairvoyant reservation (prompt + whole output + gamma at admission, here in
   whole blocks), which never preempts.
5. The step costs drafting (above) + the drafter's prefill of the prompt tokens in the step
   (``draft_prefill_us_per_token``, when the policy drafts at all) + the scheduler (only for a
   policy that decides, and not under ZOS) + the target step over every token in it (the
   table) + the KV it reads (``kv_read_us_per_ktoken`` per cached token of every sequence in
   the step: the decoders' contexts and the prefillers' prefixes) + ``emit_per_token_ms`` per
   decode token emitted (a server that samples verified rows only up to the first rejection
   and streams each token: llama-server).

ZOS, the replay rule, the acceptance estimate and the verification history are v1's
(:mod:`specsim.sim.step`, shared); the prompt chunks, KV blocks and admissions are
:mod:`specsim.sim.batching`'s. :class:`ServingV2` is a mixin of
:class:`specsim.sim.engine.Engine`: one SimPy timeout per step, its phases the methods of
:class:`StepV2`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import simpy

from specsim.policies.base import StepInput, TableStepTime, step_input
from specsim.sim.batching import Batching
from specsim.sim.jobs import BASE, JOB, KV, PRE, PROMPT, PTGT, RES, STEPS, N

if TYPE_CHECKING:
    from collections.abc import Generator

# walk a lone request's steps without an event each (tests turn it off to compare)
WALK = True


class ServingV2:
    """The v2 loop of :class:`specsim.sim.engine.Engine` (a mixin; see the module docstring)."""

    def _loop_v2(self, env: simpy.Environment) -> Generator[simpy.Event, object, None]:
        """The engine's SimPy process: one timeout per step, the step's phases in order."""
        st = StepV2(self)
        zos = st.zos
        while (yield from st.start(env)):  # arrivals, idle, ZOS wait, walks: a step starts
            st.view()  # the step as the policy sees it: decoders, prefill, KV read, rows
            st.draft()  # DRAFT: how many tokens the drafter produces (fixed k, plan, block)
            st.schedule()  # SCHEDULE: StepInput -> the policy's lengths -> the replay rule
            st.batch()  # BATCH: prompt chunks, KV room (or preemption), admissions
            duration = st.price()  # COST: draft + sched + verify + kv + emit
            if zos:
                st.run_ahead(env, duration)  # the next step's decision, during this one
            yield env.timeout(duration)
            st.account(env.now, duration)  # ACCOUNT: advance, record, finish, log


class StepV2(Batching):
    """Serving model v2's step (see the module docstring): the phases the loop calls in
    order; the shared ones are :class:`specsim.sim.step.Step`'s, BATCH is
    :class:`specsim.sim.batching.Batching`'s."""

    __slots__ = (
        "base_fn", "is2d", "kv_coef", "attn_coef", "emit_coef", "dpre", "decides", "fixed_k",
        "plan", "walk_ok", "k_draft", "ctx",
    )  # fmt: skip

    def __init__(self, eng) -> None:  # noqa: ANN001 - the Engine
        super().__init__(eng)
        cost, pol = self.cost, eng.policy
        self.base_fn = cost.step_time_fn(None)
        self.is2d = cost.is_2d
        self.kv_coef = cost.kv_read_us_per_ktoken * 1e-9  # seconds per cached token read
        self.attn_coef = cost.attn_us_per_qk_ktoken * 1e-9  # s per query x context token
        self.emit_coef = cost.emit_per_token_ms * 1e-3  # seconds per emitted decode token
        uses_drafter = pol.draft_len != 0
        self.dpre = cost.draft_prefill_us_per_token * 1e-6 if uses_drafter else 0.0
        self.decides = bool(pol.decides)
        self.fixed_k = pol.draft_len
        self.plan = pol.plan if self.fixed_k is None else None
        self.track_lag = self.need_lag or self.plan is not None  # a plan reads lagged rows
        eng.lut_list = self.lut[: 4 * (self.gamma + 1) + 1].tolist()  # the walk's, as floats
        self.walk_ok = (WALK and not self.is2d and not self.engine_terms and not self.p_tok
                        and not self.attn_coef)  # fmt: skip
        self.k_draft = 0
        self.ctx = None

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
        n_dec = n_run - n_pref
        self.n_dec = n_dec
        pend_total = pre_ctx = 0
        if n_pref:
            pend = S[PTGT, n_dec:] - S[PRE, n_dec:]
            pend_total = int(np.add.reduce(pend))
            pre_ctx = int(np.add.reduce(S[KV, n_dec:]))
            self.pend = pend
        self.pend_total, self.pre_ctx = pend_total, pre_ctx
        ctx_dec = self.kv_all - pre_ctx + n_dec if n_dec else 0
        self.ctx_dec = ctx_dec
        self.n_ver = self.n_acc = self.emitted = self.k_draft = 0
        self.ctx = None
        if not n_dec:
            return
        p_est = 0  # the prefill this step is expected to carry
        if n_pref or self.queue:
            p_est = pend_total + (self.queued_prompt(n_run) if self.queue else 0)
            p_est = min(max(self.budget_tokens - n_dec, 0), p_est)
        kv_est = self.kv_coef * (ctx_dec + pre_ctx)
        pos = S[N, :n_dec]
        self.pos, self.rows = pos, S[BASE, :n_dec] + pos
        if self.is2d:
            self.ctx = float(np.add.reduce(S[PROMPT, :n_dec] + pos, dtype=np.float64) / n_dec)
        if not self.is2d and not self.p_tok:  # the dense table, shifted by the prefill
            self.pol_fn = TableStepTime(self.base_fn, self.lut, p_est, kv_est)
        else:
            cost = self.cost
            step_fn = cost.step_time_fn(self.ctx) if self.is2d else self.base_fn
            self.pol_fn = _plus(cost.policy_step_fn(step_fn, p_est), kv_est)
        self.rate = self.accept_rate() if self.need_rate else None
        if self.track_lag or self.need_known:
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
            conf=self.conf_all[lag_rows],
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
        """COST: the step's seconds: drafting what was drafted (and the drafter's context,
        measured engines), the drafter's prefill of the step's prompt tokens, the scheduler
        (a policy that decides, not under ZOS), the target step over every token, the KV it
        reads and the server's sampling and streaming of each emitted decode token."""
        n_dec, k, cost = self.n_dec, self.k_draft, self.cost
        draft_s = 0.0
        if n_dec and k:
            draft_s = self.draft_seconds(n_dec, k)
            if self.engine_terms:
                S = self.S
                draft_s += cost.draft_context_s(S[PROMPT, :n_dec] + S[N, :n_dec] - 1)
        sched_s = cost.sched_s(n_dec) if (n_dec and self.decides and not self.zos) else 0.0
        batch, prefill, n_ver = self.b_tokens, self.prefill_tokens, self.n_ver
        if self.engine_terms:
            fn = cost.step_time_fn(self.ctx) if self.is2d else self.base_fn
            verify_s = cost.verify_s(n_dec + n_ver + self.tree_tokens, prefill, self.n_run, fn,
                                     n_ver)  # fmt: skip
        elif self.is2d:
            verify_s = float(cost.step_time(batch, self.ctx))
        elif batch < self.n_lut:
            verify_s = float(self.lut[batch])
        else:
            verify_s = float(cost.step_time(batch))
        kv_coef = self.kv_coef
        kv_s = kv_coef * (self.ctx_dec + self.pre_ctx) if kv_coef else 0.0
        if self.attn_coef and n_dec:  # attention takes the longer of its read and its compute
            kv_s = max(kv_s, self.attn_s(n_dec))
        duration = draft_s + self.dpre * prefill + sched_s + verify_s + kv_s
        if self.emit_coef and n_dec:  # the server's sampling and streaming, per emitted token
            duration += self.emit_coef * self.emitted
        return duration

    def attn_s(self, n_dec: int) -> float:
        """Decode attention's compute: every decoder's query tokens (1 + its verified drafts)
        times its context, at ``attn_us_per_qk_ktoken``."""
        S = self.S
        ctx = S[PROMPT, :n_dec] + S[N, :n_dec]
        lens = self.lens
        q = 1 + lens if lens is not None and len(lens) == n_dec else np.ones(n_dec, np.int64)
        return self.attn_coef * float(np.dot(q, ctx))

    def account(self, end: float, duration: float) -> None:
        """ACCOUNT: the decoders and prefillers advance, the tokens are recorded, finished
        requests leave (freeing their KV), and the step is logged."""
        if self.n_dec:
            self.advance(self.k_draft > 0)
            self.kv_all += self.emitted  # the decoders' (prefills' first tokens: below)
        self.n_first = self.prefill(end) if self.n_pref else 0
        if self.record:
            self.record_step(end)
        fin = self.leave(end)
        if fin is not None:
            self.kv_all -= int(np.add.reduce(fin[KV]))
            if not self.paged:
                blk = self.blk
                self.kv_used -= int(np.add.reduce(-(-fin[RES] // blk) * blk))
        self.log(duration, end)

    def prefill(self, end: float) -> int:
        """The prefillers advance by their chunks; those whose prefill ended (the first ones:
        chunks go oldest first) emit their first token and decode from the next step (a
        resumed one keeps its first-token time; its stall is the gap). Returns how many."""
        S, n_dec, n_pref, chunk = self.S, self.n_dec, self.n_pref, self.chunk
        S[PRE, n_dec:] += chunk
        S[KV, n_dec:] += chunk
        self.kv_all += self.prefill_tokens
        if self.all_fit:
            n_first = n_pref
        else:
            done = (S[PRE, n_dec:] >= S[PTGT, n_dec:]) & (chunk > 0)
            n_first = int(np.count_nonzero(done))
        if not n_first:
            return 0
        eng, jobs = self.eng, self.jobs
        sl = slice(n_dec, n_dec + n_first)
        jj = S[JOB, sl]
        if eng.preemptions:  # a resumed request keeps its first-token time
            first = np.isnan(jobs.first[jj])
            jobs.first[jj[first]] = end
            resumed = jj[~first]
            if resumed.size:  # a preempted request's gap, end to end
                gap = end - jobs.preempted_at[resumed]
                jobs.stall[resumed] = np.maximum(jobs.stall[resumed], gap)
        else:
            jobs.first[jj] = end
        S[N, sl] += 1
        S[STEPS, sl] = eng.n_steps + 1 - S[STEPS, sl]
        self.n_pref = n_pref - n_first
        self.emitted += n_first
        return n_first


class _Plus:
    """``fn(B) + offset``: a step-time function plus the seconds every step of this one pays."""

    __slots__ = ("fn", "offset")

    def __init__(self, fn, offset: float) -> None:  # noqa: ANN001
        self.fn, self.offset = fn, offset

    def __call__(self, batch):  # noqa: ANN001, ANN204
        return self.fn(batch) + self.offset


def _plus(fn, offset: float):  # noqa: ANN001, ANN202
    return fn if not offset else _Plus(fn, offset)

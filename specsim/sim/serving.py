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

ZOS, the acceptance estimate and the verification history are v1's (:mod:`specsim.sim.engine`).
A mixin of :class:`specsim.sim.engine.Engine`; one SimPy timeout per step.
"""

from __future__ import annotations

import numpy as np
import simpy

from specsim.errors import SpecsimError
from specsim.policies.base import TableStepTime, checked_lengths, step_input
from specsim.sim.cost.steptime import row_table
from specsim.sim.jobs import ACC, BASE, H1, H2, JOB, KV, OUT, PRE, PROMPT, PTGT, RES, STEPS, VER, N

PRIOR_RATE = 0.5  # the online acceptance estimate's prior (as v1's engine)
PRIOR_WEIGHT = 2.0
# walk a lone request's steps without an event each (tests turn it off to compare)
WALK = True
# a measured profile (its source says "measured") is refused past this multiple of its range
MEASURED_RANGE = 2


_EMPTY = np.zeros(0, dtype=np.int64)
if (VER, ACC, KV) != (N + 1, N + 2, N + 3):  # one in-place add advances the four rows
    raise ImportError("specsim.sim.jobs: N, VER, ACC and KV must be adjacent rows")


def _ceil_div(a: np.ndarray, b: int) -> np.ndarray:
    return -(-a // b)


class ServingV2:
    """The v2 step of :class:`specsim.sim.engine.Engine` (a mixin; see the module docstring)."""

    def _loop_v2(self, env: simpy.Environment):  # noqa: C901, PLR0912, PLR0915 - one step
        jobs, cost, gamma = self.jobs, self.cost, self.gamma
        lim = self.limits
        pol = self.policy
        conf_all, acc_all = self.conf, self.accept_len
        lut = cost.lut_seconds(None)
        n_lut = lut.shape[0]
        base_fn = cost.step_time_fn(None)
        is2d = cost.is_2d
        engine_terms = cost.has_engine_terms
        kv_coef = cost.kv_read_us_per_ktoken * 1e-9  # seconds per cached token read
        emit_coef = cost.emit_per_token_ms * 1e-3  # seconds per emitted decode token
        uses_drafter = pol.draft_len != 0
        dpre = cost.draft_prefill_us_per_token * 1e-6 if uses_drafter else 0.0
        p_tok = cost.prefill_token_ms * 1e-3
        zos = bool(pol.zos)
        decides = bool(pol.decides)
        schedule = pol.schedule
        needs = self.needs
        need_lag = "lagged_conf" in needs
        need_rate = "accept_rate" in needs
        need_acc = "accept_len" in needs
        need_hist = "accept_hist" in needs
        need_surv = "survival" in needs
        need_lag_surv = need_lag and "lagged_survival" in needs
        need_known = "lag_known" in needs
        need_draft = "draft_time" in needs
        tab = row_table(conf_all, acc_all) if need_surv or need_lag_surv else None
        conf_dtype = conf_all.dtype
        fixed_k = pol.draft_len
        plan = pol.plan if fixed_k is None else None
        track_lag = need_lag or plan is not None  # keep H1/H2, the lagged rows, current
        paged = lim.kv == "paged"
        blk = int(lim.kv_block)
        total_blocks = int(lim.kv_tokens) // blk
        kv_cap = int(lim.kv_tokens)
        budget_tokens = int(lim.max_batched_tokens)
        max_run = int(lim.max_running)
        measured = str(cost.meta.get("source", "")).startswith("measured")
        b_limit = MEASURED_RANGE * cost.b_max if measured else None
        open_loop = self.wl.open_loop
        arrivals = self.wl.arrival_s
        n_arr_total = arrivals.shape[0] if open_loop else 0
        queue = self.queue
        record = self.record_tokens
        progress = self.progress
        sink = self.sink
        sums = self.sums
        closed_c = self.closed_c
        NF = jobs.cols.shape[0]  # noqa: N806
        S = np.zeros((NF, 0), np.int64)
        self._set_draft_terms(cost, gamma)
        log_step = self._log_step
        self.lut_list = lut[: 4 * (gamma + 1) + 1].tolist()  # the walk's step times, as floats
        walk_ok = WALK and not is2d and not engine_terms and not p_tok
        kv_used = 0  # reserve mode: tokens reserved
        kv_all = 0  # the tokens cached by every running request: the sum of S[KV], kept current
        zos_proc = None
        self.preemptions = 0
        self.recomputed = 0
        n_pref = 0  # running requests still prefilling (the last n_pref columns of S)
        while True:
            now = env.now
            if open_loop and self.n_arrived < n_arr_total and arrivals[self.n_arrived] <= now:
                upto = int(np.searchsorted(arrivals, now, side="right"))
                queue.extend(range(self.n_arrived, upto))
                self.n_arrived = upto
            n_run = S.shape[1]
            if n_run == 0 and not queue:
                zos_proc = None
                if open_loop and self.n_arrived < n_arr_total:
                    yield env.timeout(float(arrivals[self.n_arrived]) - now)
                    continue
                return
            wait = 0.0
            if zos and zos_proc is not None and not zos_proc.processed:
                yield zos_proc
                wait = env.now - now
                now = env.now
            # -- one request decoding, nothing to admit: walk its steps up to the next event
            if walk_ok and n_run == 1 and not n_pref and not queue:
                durs, end_t = self._solo_walk_v2(S, now, wait, 0, lut, kv_coef)
                if durs:
                    kv_all = int(S[KV, 0])  # the walk advanced the request's cache
                    hop = self._exact_delay(now, end_t)
                    if hop is not None:
                        yield env.timeout(hop)
                    else:
                        for d in durs:
                            yield env.timeout(d)
                    zos_proc = None
                    continue
            # decoders first, prefillers after them (FIFO chunks keep that order)
            n_dec = n_run - n_pref
            pend = None
            pend_total = pre_ctx = 0
            if n_pref:
                pend = S[PTGT, n_dec:] - S[PRE, n_dec:]
                pend_total = int(np.add.reduce(pend))
                pre_ctx = int(np.add.reduce(S[KV, n_dec:]))
            # the prefill this step is expected to carry (the policy's view of the step)
            p_est = 0
            if n_pref or queue:
                p_est = pend_total + (self._queued_prompt(n_run) if queue else 0)
                p_est = min(max(budget_tokens - n_dec, 0), p_est)
            # the decoders' cached tokens plus the anchor each writes: the KV the step reads
            ctx_dec = kv_all - pre_ctx + n_dec if n_dec else 0
            kv_est = kv_coef * (ctx_dec + pre_ctx)
            lens = emit = a_ok = rows = None
            n_ver = n_acc = emitted = 0
            k_draft = 0
            ctx = None
            if n_dec:
                pos = S[N, :n_dec]
                rows = S[BASE, :n_dec] + pos
                if is2d:
                    ctx = float(np.add.reduce(S[PROMPT, :n_dec] + pos, dtype=np.float64) / n_dec)
                if not is2d and not p_tok:  # the dense table, shifted by the prefill
                    pol_fn = TableStepTime(base_fn, lut, p_est, kv_est)
                else:
                    step_fn = cost.step_time_fn(ctx) if is2d else base_fn
                    pol_fn = _plus(cost.policy_step_fn(step_fn, p_est), kv_est)
                rate = None
                if need_rate:
                    t = self.trials[1:].astype(np.float64)
                    rate = (self.succ[1:] + PRIOR_RATE * PRIOR_WEIGHT) / (t + PRIOR_WEIGHT)
                lag = lag_surv = None
                if need_lag or plan is not None or need_known:
                    h2 = S[H2, :n_dec]
                    lag_rows = np.where(h2 >= 0, h2, rows)
                if fixed_k is not None:
                    k_draft = min(int(fixed_k), gamma)
                elif plan is not None:
                    known = h2 >= 0
                    pinp = step_input(
                        conf=conf_all[lag_rows],
                        step_time=pol_fn,
                        accept_rate=rate,
                        survival=tab[lag_rows][:, :gamma] if tab is not None else None,
                        accept_hist=self.hist if need_hist else None,
                        request_class=self.row_class[rows] if need_hist else None,
                        lag_known=known,
                        draft_time=self._draft_time_fn(n_dec),
                    )
                    k = plan(pinp)
                    k_draft = gamma if k is None else max(0, min(int(k), gamma))
                else:
                    k_draft = gamma
                if k_draft == 0:
                    lens = np.zeros(n_dec, dtype=np.int64)
                    acc = acc_all[rows]
                else:
                    surv = None
                    if tab is not None:
                        g = tab.take(rows, axis=0)  # one gather: [survival | conf | accept_len]
                        conf = g[:, gamma : 2 * gamma].astype(conf_dtype)
                        acc = g[:, 2 * gamma].astype(np.int64)
                        if need_surv:
                            surv = g[:, :gamma]
                    else:
                        conf = conf_all[rows]
                        acc = acc_all[rows]
                    if need_lag:
                        if need_lag_surv:
                            g = tab.take(lag_rows, axis=0)
                            lag = g[:, gamma : 2 * gamma].astype(conf_dtype)
                            lag_surv = g[:, :gamma]
                        else:
                            lag = conf_all[lag_rows]
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
                        drafted=k_draft if k_draft < gamma else None,
                        lag_known=h2 >= 0 if need_known else None,
                        draft_time=self._draft_time_fn(n_dec) if need_draft else None,
                    )
                    lens = checked_lengths(schedule(inp), inp, pol.name)
                    if k_draft < gamma:
                        lens = np.minimum(lens, k_draft)
                a_ok = np.minimum(lens, acc)
                emit = np.minimum(a_ok + 1, S[OUT, :n_dec] - pos)
            if n_dec:
                upd = np.array((emit, lens, a_ok, emit), dtype=np.int64)  # rows N, VER, ACC, KV
                emitted, n_ver, n_acc, _ = np.add.reduce(upd, axis=1).tolist()
            # -- prompt chunks for the requests already prefilling, oldest first
            left = max(budget_tokens - n_dec - n_ver, 0)
            chunk_sum = 0
            if n_pref:
                before = np.cumsum(pend) - pend
                chunk = np.clip(left - before, 0, pend)
                chunk_sum = int(np.add.reduce(chunk))
                left -= chunk_sum
            else:
                chunk = _EMPTY
            # every prefill in the step ends in it (the usual case: prompts within the budget)
            all_fit = chunk_sum == pend_total
            # -- paged KV: room for every running request's tokens this step, or preempt
            if paged and n_run:
                # ceil(x / blk) <= (x + blk - 1) / blk: most steps of a roomy cache stop here
                upper = (ctx_dec + n_ver + pre_ctx + chunk_sum) // blk + n_run
                need = upper if upper <= total_blocks else self._blocks_needed(
                    S, n_dec, lens, chunk, blk
                )  # fmt: skip
                preempted = False
                while need > total_blocks and S.shape[1] > 1:
                    preempted = True
                    was_pref = S.shape[1] > n_dec
                    S, n_dec, lens, a_ok, emit, chunk = self._preempt_last(
                        S, n_dec, lens, a_ok, emit, chunk, now
                    )
                    n_pref -= was_pref
                    need = self._blocks_needed(S, n_dec, lens, chunk, blk)
                if need > total_blocks:  # cannot happen: _check_capacity fits one request
                    raise SpecsimError("internal: a lone request does not fit the KV cache")
                free_blocks = total_blocks - need
                if preempted:
                    kv_all = int(np.add.reduce(S[KV]))
                    if rows is not None and rows.shape[0] > n_dec:  # decoders were preempted
                        rows = rows[:n_dec]
                        upd = np.array((emit, lens, a_ok, emit), dtype=np.int64)
                        emitted, n_ver, n_acc, _ = np.add.reduce(upd, axis=1).tolist()
                        ctx_dec = int(np.add.reduce(S[KV, :n_dec])) + n_dec if n_dec else 0
                    pre_ctx = int(np.add.reduce(S[KV, n_dec:])) if n_pref else 0
            else:
                free_blocks = total_blocks  # nothing running (reserve mode: unused)
            # -- admissions from the queue with what is left of the budget
            if queue and S.shape[1] < max_run and left > 0:
                adm: list[int] = []
                adm_chunk: list[int] = []
                while queue and S.shape[1] + len(adm) < max_run and left > 0:
                    j = queue[0]
                    ptgt = int(jobs.cols[PTGT, j])
                    c = min(ptgt, left)
                    if paged:
                        b = -(-c // blk)
                        if b > free_blocks:
                            break
                        free_blocks -= b
                    else:  # the reservation, in whole blocks (a paged cache reserving)
                        res = -(-int(jobs.cols[RES, j]) // blk) * blk
                        if kv_used + res > kv_cap:
                            break
                        kv_used += res
                    queue.popleft()
                    adm.append(j)
                    adm_chunk.append(c)
                    left -= c
                    if c < ptgt:
                        all_fit = False
                if adm:
                    a = np.asarray(adm, dtype=np.int64)
                    fresh = a[np.isnan(jobs.admitted[a])]
                    if fresh.size:
                        jobs.admitted[fresh] = now
                        if sums is not None:  # the steady window ends at the last admission
                            sums.t1 = sums.before(now)
                    # STEPS holds the decode steps done so far until the prefill ends (0, or
                    # a preempted request's count), then the index its decoding started at
                    S = np.concatenate((S, jobs.cols[:, a]), axis=1)
                    chunk = np.concatenate((chunk, np.asarray(adm_chunk, dtype=np.int64)))
                    n_pref += len(adm)  # their KV is 0 (admitted afresh or recomputed)
            n_run = S.shape[1]
            n_queued = len(queue)
            prefill_tokens = int(np.add.reduce(chunk)) if n_pref else 0
            batch = n_dec + n_ver + prefill_tokens
            if batch > self.max_b:
                self.max_b = batch
            # the tokens the table prices (prompt tokens have their own cost when measured)
            tabled = batch - prefill_tokens if p_tok else batch
            if b_limit is not None and tabled > b_limit:
                raise SpecsimError(
                    f"profile {cost.name!r} is measured up to {cost.b_max} tokens a step and this "
                    f"run needs {tabled} (more than {MEASURED_RANGE}x its range): measure a "
                    "profile that covers it (specsim profile) or lower the load"
                )
            # -- the step's cost
            draft_s = 0.0
            if n_dec and k_draft:
                draft_s = self._draft_s(n_dec) if k_draft == gamma else (
                    float(cost.draft_ms(n_dec, k_draft)) * 1e-3
                )  # fmt: skip
                if engine_terms:
                    draft_s += cost.draft_context_s(S[PROMPT, :n_dec] + S[N, :n_dec] - 1)
            sched_s = cost.sched_s(n_dec) if (n_dec and decides and not zos) else 0.0
            if engine_terms:
                fn = cost.step_time_fn(ctx) if is2d else base_fn
                verify_s = cost.verify_s(n_dec + n_ver, prefill_tokens, n_run, fn, n_ver)
            elif is2d:
                verify_s = float(cost.step_time(batch, ctx))
            elif batch < n_lut:
                verify_s = float(lut[batch])
            else:
                verify_s = float(cost.step_time(batch))
            kv_s = kv_coef * (ctx_dec + pre_ctx) if kv_coef else 0.0
            duration = draft_s + dpre * prefill_tokens + sched_s + verify_s + kv_s
            if emit_coef and n_dec:  # the server's sampling and streaming, per emitted token
                duration += emit_coef * emitted
            if zos:
                zos_s = cost.sched_s(n_run)
                zos_proc = env.process(self._zos_sched(env, zos_s)) if zos_s >= duration else None
            yield env.timeout(duration)
            end = env.now
            # -- advance the decoders
            if n_dec:
                S[N : KV + 1, :n_dec] += upd  # N, VER, ACC and KV in one add
                kv_all += emitted  # the decoders' (prefills' first tokens are added below)
                if need_rate:
                    reach = np.minimum(a_ok + 1, lens)
                    self.trials += np.bincount(reach, minlength=gamma + 1)[::-1].cumsum()[::-1]
                    self.succ += np.bincount(a_ok, minlength=gamma + 1)[::-1].cumsum()[::-1]
                if need_hist and k_draft:
                    self._hist_add(rows, conf_all[rows], lens, a_ok)
                if track_lag:  # only a lagged policy or a plan reads them
                    S[H2, :n_dec] = S[H1, :n_dec]
                    S[H1, :n_dec] = rows if k_draft else -1  # no confidences when not drafted
            # -- advance the prefillers; those done emit their (first) token
            # (chunks go oldest first, so those done are the first n_first prefillers)
            n_first = 0
            if n_pref:
                S[PRE, n_dec:] += chunk
                S[KV, n_dec:] += chunk
                kv_all += prefill_tokens
                if all_fit:
                    n_first = n_pref
                else:
                    done_pf = (S[PRE, n_dec:] >= S[PTGT, n_dec:]) & (chunk > 0)
                    n_first = int(np.count_nonzero(done_pf))
                if n_first:
                    sl = slice(n_dec, n_dec + n_first)
                    jj = S[JOB, sl]
                    if self.preemptions:  # a resumed request keeps its first-token time
                        first = np.isnan(jobs.first[jj])
                        jobs.first[jj[first]] = end
                        resumed = jj[~first]
                        if resumed.size:  # a preempted request's gap, end to end
                            gap = end - jobs.preempted_at[resumed]
                            jobs.stall[resumed] = np.maximum(jobs.stall[resumed], gap)
                    else:
                        jobs.first[jj] = end
                    S[N, sl] += 1
                    S[STEPS, sl] = self.n_steps + 1 - S[STEPS, sl]
                    n_pref -= n_first
                    emitted += n_first
            if record:
                parts_j = [S[JOB, :n_dec]] if n_dec else []
                parts_c = [emit] if n_dec else []
                if n_first:
                    parts_j.append(S[JOB, n_dec : n_dec + n_first])
                    parts_c.append(np.ones(n_first, np.int64))
                if parts_j:
                    self.tok_job.append(np.concatenate(parts_j))
                    self.tok_cnt.append(np.concatenate(parts_c))
                    self.tok_time.append(end)
                    self.tok_len.append(int(sum(p.shape[0] for p in parts_j)))
            # -- finished requests leave
            done = S[N] >= S[OUT]
            n_fin = int(np.count_nonzero(done))  # (cheaper than done.any())
            if n_fin:
                fin = S[:, done]
                kv_all -= int(np.add.reduce(fin[KV]))
                fj = fin[JOB]
                jobs.finish[fj] = end
                fin[STEPS] = self.n_steps + 1 - fin[STEPS]
                jobs.cols[:, fj] = fin
                if sink is not None:
                    sink.finished(jobs, fj)
                if not paged:
                    kv_used -= int(np.add.reduce(-(-fin[RES] // blk) * blk))
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
                        now, duration, batch, n_run, n_dec, n_first, n_queued, prefill_tokens,
                        n_ver, n_acc, emitted, wait, n_fin,
                    )
                )  # fmt: skip
            else:
                self.n_steps += 1
                sums.step(
                    now, duration + wait, n_run + n_queued, n_dec, n_first, n_ver, n_acc,
                    emitted, batch,
                )  # fmt: skip
                if closed_c is not None and sums.t0 is None and self.n_done >= closed_c:
                    sums.t0 = sums.before(end)

    # ------------------------------------------------------------------ helpers
    def _draft_time_fn(self, n_dec: int):  # noqa: ANN202
        """``k -> seconds`` of drafting k tokens for ``n_dec`` requests (a plan prices it)."""
        gamma, cost = self.gamma, self.cost

        def draft_time(k: int) -> float:
            if k <= 0:
                return 0.0
            return self._draft_s(n_dec) if k >= gamma else float(cost.draft_ms(n_dec, k)) * 1e-3

        return draft_time

    def _queued_prompt(self, n_run: int) -> int:
        """Prompt tokens waiting at the head of the queue, up to the free slots (the policy's
        estimate of the prefill a step will carry)."""
        q = self.queue
        if not q:
            return 0
        room = max(self.limits.max_running - n_run, 0)
        tgt = self.jobs.cols[PTGT]
        total = 0
        for i, j in enumerate(q):
            if i >= room or total >= self.limits.max_batched_tokens:
                break
            total += int(tgt[j])
        return total

    @staticmethod
    def _blocks_needed(S, n_dec, lens, chunk, blk) -> int:  # noqa: ANN001, N803
        """KV blocks the running requests need during this step."""
        need = 0
        if n_dec:
            need += int(_ceil_div(S[KV, :n_dec] + 1 + lens, blk).sum())
        if S.shape[1] > n_dec:
            need += int(_ceil_div(S[KV, n_dec:] + chunk, blk).sum())
        return need

    def _preempt_last(self, S, n_dec, lens, a_ok, emit, chunk, now):  # noqa: ANN001, N803
        """Preempt the most recently admitted running request (the last column): free its
        blocks, put it back at the head of the queue to be recomputed (prompt and the tokens
        it emitted) on readmission."""
        col = S[:, -1].copy()
        j = int(col[JOB])
        lost = int(col[KV])
        if S.shape[1] <= n_dec:  # a decoder: keep the count of decode steps it took
            col[STEPS] = self.n_steps - col[STEPS]
        self.preemptions += 1
        self.recomputed += lost
        col[PTGT] = col[PROMPT] + col[N] if col[N] > 0 else col[PROMPT]
        col[PRE] = 0
        col[KV] = 0
        col[H1] = col[H2] = -1
        self.jobs.cols[:, j] = col
        self.jobs.preempted_at[j] = now
        self.queue.appendleft(j)
        S = S[:, :-1]
        if S.shape[1] < n_dec:  # the preempted one was decoding
            n_dec -= 1
            lens, a_ok, emit = lens[:n_dec], a_ok[:n_dec], emit[:n_dec]
        else:
            chunk = chunk[:-1]
        return S, n_dec, lens, a_ok, emit, chunk


class _Plus:
    """``fn(B) + offset``: a step-time function plus the seconds every step of this one pays."""

    __slots__ = ("fn", "offset")

    def __init__(self, fn, offset: float) -> None:  # noqa: ANN001
        self.fn, self.offset = fn, offset

    def __call__(self, batch):  # noqa: ANN001, ANN204
        return self.fn(batch) + self.offset


def _plus(fn, offset: float):  # noqa: ANN001, ANN202
    return fn if not offset else _Plus(fn, offset)

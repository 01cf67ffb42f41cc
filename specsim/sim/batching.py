"""The serving model's BATCH phase: what joins the decoders in a step's token batch.

After the decoders (whose ``1 + l_r`` tokens come first), prompt chunks fill the rest of the
step's token budget (``max_batched_tokens``): the requests already prefilling, oldest first,
then new admissions from the queue (FIFO, no skipping) while a slot, budget and KV are left.
KV (``kv="paged"``): blocks of ``kv_block`` tokens, allocated as tokens are written; when the
running requests need more blocks than exist, the most recently admitted is preempted (vLLM
V1's recompute) and goes back to the head of the queue. New admissions need blocks for their
first chunk (they never preempt). ``kv="reserve"``: a clairvoyant reservation (prompt + whole
output + gamma at admission), in whole blocks. :mod:`specsim.sim.serving` has the whole step.
"""

from __future__ import annotations

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost.model import CostModel
from specsim.sim.jobs import H1, H2, JOB, KV, PRE, PROMPT, PTGT, RES, STEPS, N
from specsim.sim.step import Step

_EMPTY = np.zeros(0, dtype=np.int64)
# a measured profile (its source says "measured") is refused past this multiple of its range
MEASURED_RANGE = 2


def _ceil_div(a: np.ndarray, b: int) -> np.ndarray:
    return -(-a // b)


def _batch_limit(cost: CostModel) -> int | None:
    """The most tokens a step may price from ``cost``: a measured profile is not stretched
    past ``MEASURED_RANGE`` times what was measured (None: no limit)."""
    measured = str(cost.meta.get("source", "")).startswith("measured")
    return MEASURED_RANGE * cost.b_max if measured else None


class Batching(Step):
    """The step's running batch beyond the decoders: prefills, KV blocks, admissions.

    ``S`` holds the decoders first, then the ``n_pref`` requests still prefilling (oldest
    first); ``kv_all`` is the sum of ``S[KV]`` (the tokens cached by every running request),
    kept current; ``kv_used`` the tokens reserved (reserve mode)."""

    __slots__ = (
        "paged", "blk", "total_blocks", "kv_cap", "budget_tokens", "max_run", "b_limit",
        "kv_used", "kv_all", "n_pref", "pend", "pend_total", "pre_ctx", "ctx_dec", "chunk",
        "chunk_sum", "left", "all_fit", "free_blocks", "slotted",
    )  # fmt: skip

    def __init__(self, eng) -> None:  # noqa: ANN001 - the Engine
        super().__init__(eng)
        lim = eng.limits
        self.paged = lim.kv == "paged"
        self.blk = int(lim.kv_block)
        self.kv_cap = int(lim.kv_tokens)
        self.total_blocks = self.kv_cap // self.blk
        self.budget_tokens = int(lim.max_batched_tokens)
        self.max_run = int(lim.max_running)
        # each admitted request takes an engine slot where the profile prices the passes a
        # step is cut into by slot (place; specsim.sim.ubatch)
        self.slotted = self.step_price.by_slot
        self.b_limit = _batch_limit(self.cost)
        self.kv_used = self.kv_all = self.n_pref = self.pend_total = self.pre_ctx = 0
        self.ctx_dec = self.chunk_sum = self.left = self.free_blocks = 0
        self.pend, self.chunk, self.all_fit = None, _EMPTY, True
        eng.preemptions = 0
        eng.recomputed = 0

    def batch(self) -> None:
        """BATCH: the prefillers' chunks (oldest first, from the budget the decoders leave),
        room in the KV cache for every running request's tokens of this step (or preemption),
        then admissions with what is left; the step's token batch (each decoder's anchor and
        drafts, a tree's other branches, the prompt tokens), checked against what a measured
        profile covers."""
        n_dec, n_ver, n_run = self.n_dec, self.n_ver, self.S.shape[1]
        left = self.budget_tokens - n_dec - n_ver
        if left < 0:
            left = 0
        chunk_sum = 0
        if self.n_pref:
            pend = self.pend
            before = np.cumsum(pend) - pend
            chunk = np.clip(left - before, 0, pend)
            chunk_sum = int(np.add.reduce(chunk))
            left -= chunk_sum
        else:
            chunk = _EMPTY
        self.chunk, self.chunk_sum, self.left = chunk, chunk_sum, left
        # every prefill in the step ends in it (the usual case: prompts within the budget)
        self.all_fit = chunk_sum == self.pend_total
        if self.paged and n_run:
            # ceil(x / blk) <= (x + blk - 1) / blk: most steps of a roomy cache stop here
            need = (self.ctx_dec + n_ver + self.pre_ctx + chunk_sum) // self.blk + n_run
            if need > self.total_blocks:
                self.make_room(self.now)  # the exact count, or preemption
            else:
                self.free_blocks = self.total_blocks - need
        else:
            self.free_blocks = self.total_blocks  # nothing running (reserve mode: unused)
        queue = self.queue
        if queue and self.S.shape[1] < self.max_run and self.left > 0:
            self.admit(self.now)
        self.n_run = self.S.shape[1]
        self.n_queued = len(queue)
        self.prefill_tokens = prefill = self.chunk_sum  # (kept current by admit and preempt)
        n_dec, n_ver, tree = self.n_dec, self.n_ver, self.tree_extra  # (after any preemption)
        self.tree_tokens = tree * int(np.count_nonzero(self.lens)) if tree and n_ver else 0
        self.b_tokens = batch = n_dec + n_ver + self.tree_tokens + prefill
        eng = self.eng
        if batch > eng.max_b:
            eng.max_b = batch  # the run's largest is reported
        if self.b_limit is not None:
            # the tokens the table prices (prompt tokens have their own cost when measured)
            tabled = batch - prefill if self.p_tok else batch
            if tabled > self.b_limit:
                cost = self.cost
                raise SpecsimError(
                    f"profile {cost.name!r} is measured up to {cost.b_max} tokens a step and "
                    f"this run needs {tabled} (more than {MEASURED_RANGE}x its range): measure "
                    "a profile that covers it (specsim profile) or lower the load"
                )

    def make_room(self, now: float) -> None:
        """Paged KV, when the quick upper bound does not fit: blocks for every running
        request's tokens this step (a decoder's cache plus the ``1 + l_r`` it verifies, a
        prefiller's plus its chunk); while they do not fit, the most recently admitted is
        preempted. ``free_blocks``: what admissions get."""
        total = self.total_blocks
        n_dec0 = self.n_dec
        need = self.blocks_needed()
        preempted = False
        while need > total and self.S.shape[1] > 1:
            preempted = True
            self.preempt_last(now)
            need = self.blocks_needed()
        if need > total:  # cannot happen: _check_capacity fits one request
            raise SpecsimError("internal: a lone request does not fit the KV cache")
        self.free_blocks = total - need
        if preempted:
            S, n_dec = self.S, self.n_dec
            self.kv_all = int(np.add.reduce(S[KV]))
            if n_dec < n_dec0:  # decoders were preempted
                self.rows = self.rows[:n_dec]
                if self.conf is not None:
                    self.conf = self.conf[:n_dec]
                self.tally()
                self.ctx_dec = int(np.add.reduce(S[KV, :n_dec])) + n_dec if n_dec else 0
            self.pre_ctx = int(np.add.reduce(S[KV, n_dec:])) if self.n_pref else 0

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
            S[N, sl] += 1
            S[STEPS, sl] = eng.n_steps + 1 - S[STEPS, sl]
        else:  # no request was preempted: each prefill is a first one (N and STEPS were 0)
            jobs.first[jj] = end
            S[N, sl] = 1
            S[STEPS, sl] = eng.n_steps + 1
        self.n_pref = n_pref - n_first
        self.emitted += n_first
        return n_first

    def blocks_needed(self) -> int:
        """KV blocks the running requests need during this step."""
        S, n_dec, blk = self.S, self.n_dec, self.blk
        need = 0
        if n_dec:
            need += int(_ceil_div(S[KV, :n_dec] + 1 + self.lens, blk).sum())
        if S.shape[1] > n_dec:
            need += int(_ceil_div(S[KV, n_dec:] + self.chunk, blk).sum())
        return need

    def preempt_last(self, now: float) -> None:
        """Preempt the most recently admitted running request (the last column): free its
        blocks, put it back at the head of the queue to be recomputed (prompt and the tokens
        it emitted) on readmission."""
        eng, S, n_dec = self.eng, self.S, self.n_dec
        col = S[:, -1].copy()
        j = int(col[JOB])
        lost = int(col[KV])
        if S.shape[1] <= n_dec:  # a decoder: keep the count of decode steps it took
            col[STEPS] = eng.n_steps - col[STEPS]
        eng.preemptions += 1
        eng.recomputed += lost
        col[PTGT] = col[PROMPT] + col[N] if col[N] > 0 else col[PROMPT]
        col[PRE] = 0
        col[KV] = 0
        col[H1] = col[H2] = -1
        self.jobs.cols[:, j] = col
        self.jobs.preempted_at[j] = now
        self.queue.appendleft(j)
        self.S = S = S[:, :-1]
        if S.shape[1] < n_dec:  # the preempted one was decoding
            n_dec -= 1
            self.n_dec = n_dec
            self.lens, self.a_ok, self.emit = self.lens[:n_dec], self.a_ok[:n_dec], (
                self.emit[:n_dec]
            )  # fmt: skip
        else:
            self.chunk_sum -= int(self.chunk[-1])
            self.chunk = self.chunk[:-1]
            self.n_pref -= 1

    def admit(self, now: float) -> None:
        """Admissions from the queue, head first (FIFO, no skipping), while a slot, budget and
        KV are left: paged, blocks for the first chunk (an admission never preempts); reserve,
        the whole reservation in blocks. The admitted prefill after the running requests;
        their KV is 0 (admitted afresh, or a preempted one to be recomputed)."""
        queue, jobs, S = self.queue, self.jobs, self.S
        paged, blk, max_run = self.paged, self.blk, self.max_run
        left, free_blocks, kv_used = self.left, self.free_blocks, self.kv_used
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
                if kv_used + res > self.kv_cap:
                    break
                kv_used += res
            queue.popleft()
            adm.append(j)
            adm_chunk.append(c)
            left -= c
            if c < ptgt:
                self.all_fit = False
        self.chunk_sum += self.left - left  # the admitted chunks
        self.left, self.free_blocks, self.kv_used = left, free_blocks, kv_used
        if not adm:
            return
        a = np.asarray(adm, dtype=np.int64)
        # only a preemption puts an admitted request back in the queue: until one happened,
        # every admission is a first one
        fresh = a[np.isnan(jobs.admitted[a])] if self.eng.preemptions else a
        if fresh.size:
            jobs.admitted[fresh] = now
            if self.sums is not None:  # the steady window ends at the last admission
                self.sums.t1 = self.sums.before(now)
        # STEPS holds the decode steps done so far until the prefill ends (0, or a preempted
        # request's count), then the index its decoding started at
        if self.slotted:
            self.place(a)
        self.S = np.concatenate((S, jobs.cols.take(a, axis=1)), axis=1)
        new = np.asarray(adm_chunk, dtype=np.int64)
        self.chunk = np.concatenate((self.chunk, new)) if self.n_pref else new
        self.n_pref += len(adm)

    def place(self, admitted: np.ndarray) -> None:
        """The engine slots (llama-server's ``-np``) the ``admitted`` requests take, in turn:
        the run's slot rule where it has one (:mod:`specsim.sim.slots`: llama-server's choice
        from the prompts' tokens, or a seeded random free slot), else the lowest free ones, so
        the requests in flight sit in consecutive slots as far as their comings and goings
        allow. Which slots run together sets how many passes a step costs
        (:mod:`specsim.sim.ubatch`). The packed layout suits a fresh server that ran one
        setting at a time; a server with a grid's history scatters its requests, which random
        free slots price better (reports/llama-cpp-v4/PLAN.md, steps 4 and 12)."""
        slot = self.jobs.server_slot
        rule = self.eng.slot_rule
        if rule is None:
            free = np.setdiff1d(np.arange(self.max_run), slot[self.S[JOB]])
            slot[admitted] = free[: admitted.shape[0]]
            return
        busy = np.zeros(self.max_run, dtype=bool)
        busy[slot[self.S[JOB]]] = True
        trace = self.jobs.trace
        for j in admitted.tolist():
            s = rule.choose(busy, int(trace[j]))
            slot[j] = s
            busy[s] = True

    def queued_prompt(self, n_run: int) -> int:
        """Prompt tokens waiting at the head of the queue, up to the free slots (the policy's
        estimate of the prefill a step will carry)."""
        q = self.queue
        if not q:
            return 0
        room = max(self.max_run - n_run, 0)
        tgt = self.jobs.cols[PTGT]
        total = 0
        for i, j in enumerate(q):
            if i >= room or total >= self.budget_tokens:
                break
            total += int(tgt[j])
        return total

"""The engine's walk: a lone decoding request's steps up to the next event taken in plain
Python, without a SimPy event or a numpy call each, when nothing prefills, nothing can be
admitted and the request cannot finish in between (:meth:`Walks._solo_walk_v2`).

Every time is the same sum of the same floats as the step-by-step path, so results are
bit-identical (tests/test_serving_v2.py). A mixin of :class:`specsim.sim.serving.Engine`: the
walk reads and advances the engine's state in place (its running batch ``S``, clock, logs).
(Serving model v1's walks of several requests under a rowwise policy were retired with it; they
run at commit 77e1490.)
"""

from __future__ import annotations

import numpy as np

from specsim.policies.base import StepInput, TableStepTime, check_lengths, lengths_ok
from specsim.sim.jobs import ACC, BASE, H1, H2, JOB, KV, OUT, VER, N

# Rows of a lone request's trace decided at once by the walk (a longer walk resumes).
_SOLO_ROWS = 512


class Walks:
    """The walk of :class:`specsim.sim.serving.Engine` (a mixin; see the module docstring)."""

    def _checked_solo(self, lens: np.ndarray, n: int) -> list[int]:
        """A solo walk's lengths for n rows, checked like every step's (then as Python ints)."""
        gamma = int(self.conf.shape[1])
        if not lengths_ok(lens, n, gamma):
            inp = StepInput(conf=np.zeros((n, gamma)), step_time=lambda b: b)
            lens = check_lengths(np.asarray(lens), inp, self.policy.name)
        return lens.tolist()

    def _solo_walk_v2(self, S, now: float, wait: float, n_queued: int, lut, kv_coef: float):  # noqa: ANN001, N803
        """Steps of a lone decoding request up to the next event, walked without SimPy: nothing
        prefills, nothing can be admitted, so each step's length is the policy's ``solo``
        decision for one trace row.
        The KV the step reads grows with the position (the context at trace row r is the
        prompt plus r's position), so a policy sees each row's own step times: ``solo`` gets a
        step time of one row per confidence row (``Policy.solo_rows``), or, for a policy whose
        decision reads a LAGGED row under a profile with a KV term, no walk at all. The same
        floats in the same order as the step path: bit-identical results (tests)."""
        pol = self.policy
        if pol.solo is None or (pol.solo_lagged and kv_coef) or (kv_coef and not pol.solo_rows):
            return [], now
        b, pos, out = int(S[BASE, 0]), int(S[N, 0]), int(S[OUT, 0])
        kv0 = int(S[KV, 0]) - pos  # KV at position p is kv0 + p (prompt - 1, or a re-prefill's)
        h1, h2 = int(S[H1, 0]), int(S[H2, 0])
        lagged = pol.solo_lagged
        hi = min(b + out, b + pos + _SOLO_ROWS)
        lo = b + pos
        if lagged:
            lo = min(x for x in (lo, h1, h2) if x >= 0)
        offsets = None
        if kv_coef:  # each row's KV read: kv_coef * (KV + the anchor) at that row's position
            p_rows = np.arange(lo, hi, dtype=np.int64) - b
            offsets = [kv_coef * float(kv0 + p + 1) for p in p_rows.tolist()]
            step_fn = _RowTimes(lut, np.asarray(offsets))
        else:
            step_fn = TableStepTime(self.cost.step_time_fn(None), lut)
        try:
            lens = pol.solo(self.conf[lo:hi], self.accept_len[lo:hi], step_fn)
        except ValueError:
            return [], now
        lens = self._checked_solo(lens, hi - lo)
        acc = self.accept_len[lo:hi].tolist()
        cost = self.cost
        lutl = self.lut_list
        n_lut = len(lutl)
        gamma = self.gamma
        zos = bool(pol.zos)
        fixed_k = pol.draft_len
        k_full = gamma if fixed_k is None else min(int(fixed_k), gamma)
        draft_full = self.price.draft_s(1, k_full)
        sched_s = cost.sched_s(1) if (pol.decides and not zos) else 0.0
        zos_s = cost.sched_s(1) if zos else 0.0
        plan_skips = pol.plan is not None and fixed_k is None  # zos: a lagged budget 0 skips
        next_arrival = np.inf
        if self.wl.open_loop and self.n_arrived < self.wl.arrival_s.shape[0]:
            next_arrival = float(self.wl.arrival_s[self.n_arrived])
        record_tokens = self.record_tokens
        durs: list[float] = []
        ends: list[float] = []
        emits: list[int] = []
        t = now
        wait0 = wait
        ver = n_acc = 0
        max_b = self.max_b
        log = self.log if self.sums is None else None
        pos0 = pos
        while True:
            r = b + pos
            if r >= hi:
                break
            known = lagged and h2 >= 0
            ln = lens[(h2 if known else r) - lo]
            drafted = not (plan_skips and known and ln == 0)
            if not drafted:
                ln = 0
            a = ln if ln < acc[r - lo] else acc[r - lo]
            e = a + 1 if a + 1 < out - pos else out - pos
            if pos + e >= out:
                break  # the request's last step: the ordinary path finishes it
            batch = 1 + ln
            verify_s = lutl[batch] if batch < n_lut else float(cost.step_time(batch))
            kv_s = kv_coef * (kv0 + pos + 1) if kv_coef else 0.0
            # StepPrice.seconds' sum for a lone decoder (no prefill, engine terms, attention)
            d = (draft_full if drafted else 0.0) + sched_s + verify_s + kv_s
            if zos_s > d:
                break  # the overlapped scheduler would outlast the step: step by step
            end = t + d
            if end <= t:
                break
            if log is not None:
                log.extend((t, d, batch, 1, 1, 0, n_queued, 0, ln, a, e, wait, 0))
            wait = 0.0
            durs.append(d)
            if batch > max_b:
                max_b = batch
            ver += ln
            n_acc += a
            pos += e
            h2, h1 = h1, (r if drafted else -1)
            t = end
            if record_tokens:
                ends.append(end)
                emits.append(e)
            if end >= next_arrival:
                break
        if not durs:
            return durs, now
        k = len(durs)
        self.n_steps += k
        if self.sums is not None:
            self.sums.walk(durs, wait0, 1 + n_queued, 1, ver, n_acc, pos - pos0, k + ver)
        self.max_b = max_b
        S[N, 0] = pos
        S[VER, 0] += ver
        S[ACC, 0] += n_acc
        S[KV, 0] += pos - pos0
        S[H1, 0], S[H2, 0] = h1, h2
        if record_tokens:
            self.tok_job.append(np.full(k, S[JOB, 0], np.int64))
            self.tok_cnt.append(np.asarray(emits, np.int64))
            self.tok_time.extend(ends)
            self.tok_len.extend([1] * k)
        return durs, t


class _RowTimes:
    """A step time of one row per confidence row: ``f(B)[i] = table[B] + offsets[i]`` (shape
    (m, len(B))), for ``Policy.solo`` of a lone request whose steps read a growing KV."""

    __slots__ = ("table", "offsets")

    def __init__(self, table: np.ndarray, offsets: np.ndarray) -> None:
        self.table, self.offsets = table, offsets

    def __call__(self, batch):  # noqa: ANN001, ANN204
        return np.asarray(self.table).take(np.asarray(batch)) + self.offsets[:, None]

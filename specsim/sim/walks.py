"""The engine's walks: steps up to the next event taken in plain Python, without a SimPy event
or a numpy call each, when nothing can be admitted and no request can finish in between.

- one request in flight (any policy with a ``solo`` form): :meth:`Walks._solo_stretch`;
- up to ``_ROWWISE_MAX_R`` requests under a policy whose decision for a request reads that
  request's row only (``Policy.rowwise``): :meth:`Walks._rowwise_stretch`.

Every time is the same sum of the same floats as the step-by-step path, so results are
bit-identical (tests/test_sim_golden.py). A mixin of :class:`specsim.sim.engine.Engine`: the
walks read and advance the engine's state in place (its running batch ``S``, clock, logs).
"""

from __future__ import annotations

import math

import numpy as np

from specsim.policies.base import StepInput, TableStepTime, check_lengths, lengths_ok
from specsim.sim.jobs import ACC, BASE, H1, H2, JOB, KV, OUT, VER, N
from specsim.sim.jobs import ACC as _ACC
from specsim.sim.jobs import BASE as _BASE
from specsim.sim.jobs import H1 as _H1
from specsim.sim.jobs import H2 as _H2
from specsim.sim.jobs import JOB as _JOB
from specsim.sim.jobs import OUT as _OUT
from specsim.sim.jobs import VER as _VER
from specsim.sim.jobs import N as _N

# Rows of a lone request's trace decided at once by the solo walk (a longer walk resumes).
_SOLO_ROWS = 512
# The walk of several requests under a rowwise policy: rows decided at once per request, and
# the most requests it takes (beyond, a numpy step is cheaper than a Python walk).
_ROWWISE_ROWS = 64
_ROWWISE_MAX_R = 32


class Walks:
    """The walks of :class:`specsim.sim.engine.Engine` (a mixin; see the module docstring)."""

    def _checked_solo(self, lens: np.ndarray, n: int) -> list[int]:
        """A solo walk's lengths for n rows, checked like every step's (then as Python ints)."""
        gamma = int(self.conf.shape[1])
        if not lengths_ok(lens, n, gamma):
            inp = StepInput(conf=np.zeros((n, gamma)), step_time=lambda b: b)
            lens = check_lengths(np.asarray(lens), inp, self.policy.name)
        return lens.tolist()

    def _solo_stretch(self, S: np.ndarray, now: float, wait: float, n_queued: int, step_fn):
        """Steps of a lone running request up to the next event, walked without SimPy.

        With one request in flight and nothing to admit, no admission, arrival or completion
        can happen until the request finishes (or, open loop, the next arrival is due), so the
        steps in between are a deterministic walk: each step's length comes from the policy's
        ``solo`` decision of one trace row, computed for every row at once. The walk stops
        before the request's last step and before the step an arrival joins, which go through
        the ordinary step (completion, spawning, ZOS process). Every time is the same sum of
        the same floats as the step-by-step path, so results are bit-identical (golden test).

        Returns the walked steps' durations (empty when no step could be walked) and the end
        time of the last one.
        """
        b, pos, out = int(S[_BASE, 0]), int(S[_N, 0]), int(S[_OUT, 0])
        h1, h2 = int(S[_H1, 0]), int(S[_H2, 0])
        lagged = self.policy.solo_lagged
        hi = min(b + out, b + pos + _SOLO_ROWS)  # rows decided now; a longer walk resumes
        lo = b + pos
        if lagged:
            lo = min(x for x in (lo, h1, h2) if x >= 0)
        try:
            lens = self.policy.solo(self.conf[lo:hi], self.accept_len[lo:hi], step_fn)
        except ValueError:
            return [], now
        lens = self._checked_solo(lens, hi - lo)
        acc = self.accept_len[lo:hi].tolist()
        cost = self.cost
        lut = self.lut
        n_lut = len(lut)
        zos = bool(self.policy.zos)
        draft_s = self._draft_s(1)
        sched_s = 0.0 if zos else cost.sched_s(1)
        d0 = draft_s + sched_s
        zos_s = cost.sched_s(1) if zos else 0.0
        next_arrival = math.inf
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
            ln = lens[(h2 if (lagged and h2 >= 0) else r) - lo]
            a = ln if ln < acc[r - lo] else acc[r - lo]
            e = a + 1 if a + 1 < out - pos else out - pos
            if pos + e >= out:
                break  # the request's last step: the ordinary path finishes it
            batch = 1 + ln
            verify_s = lut[batch] if batch < n_lut else float(cost.step_time(batch))
            d = d0 + verify_s
            if zos_s > d:
                break  # the overlapped scheduler would outlast the step: step by step
            end = t + d
            if end <= t:
                break  # a step too short to move the clock: step by step (_Sums.walk)
            if log is not None:
                log.extend((t, d, batch, 1, 1, 0, n_queued, 0, ln, a, e, wait, 0))
            wait = 0.0
            durs.append(d)
            if batch > max_b:
                max_b = batch
            ver += ln
            n_acc += a
            pos += e
            h2, h1 = h1, r
            t = end
            if record_tokens:
                ends.append(end)
                emits.append(e)
            if end >= next_arrival:
                break  # the next step starts with an arrival
        if not durs:
            return durs, now
        k = len(durs)
        self.n_steps += k
        if self.sums is not None:
            self.sums.walk(durs, wait0, 1 + n_queued, 1, ver, n_acc, pos - pos0, k + ver)
        self.max_b = max_b
        S[_N, 0] = pos
        S[_VER, 0] += ver
        S[_ACC, 0] += n_acc
        S[_H1, 0], S[_H2, 0] = h1, h2
        if record_tokens:
            k = len(ends)
            self.tok_job.append(np.full(k, S[_JOB, 0], np.int64))
            self.tok_cnt.append(np.asarray(emits, np.int64))
            self.tok_time.extend(ends)
            self.tok_len.extend([1] * k)
        return durs, t

    def _rowwise_stretch(self, S: np.ndarray, now: float, wait: float, n_queued: int, step_fn):
        """Steps of R running requests up to the next event, walked without SimPy, for a policy
        whose decision for a request reads that request's row only (``Policy.rowwise``: the
        static lengths, thresholds, the oracle).

        As in ``_solo_stretch``: with nothing to admit, nothing happens until a request finishes
        or an arrival is due, so each request walks its own rows (decided at once by
        ``Policy.solo``) and a step's batch is the sum of the requests' lengths. The walk stops
        before the first step in which a request would finish (or run out of decided rows) and
        before the step an arrival joins. In plain Python this costs well under a microsecond
        per request-step, against a few dozen numpy calls per step: used up to
        ``_ROWWISE_MAX_R`` requests. Same floats in the same order: bit-identical results.
        """
        n = S.shape[1]
        pos = S[_N].tolist()
        out = S[_OUT].tolist()
        span = np.minimum(S[_OUT] - S[_N], _ROWWISE_ROWS)
        first = np.cumsum(span) - span  # where each request's rows start in the flat list
        rows = np.arange(int(span.sum())) + np.repeat(S[_BASE] + S[_N] - first, span)
        try:
            lens = self.policy.solo(self.conf[rows], self.accept_len[rows], step_fn)
        except ValueError:
            return [], now
        lens = self._checked_solo(lens, rows.shape[0])
        acc = self.accept_len[rows].tolist()
        # index of each request's current row in the flat lists, and the end of its rows
        at = first.tolist()
        stop = (first + span).tolist()
        cost = self.cost
        lut = self.lut
        n_lut = len(lut)
        d0 = self._draft_s(n) + cost.sched_s(n)
        next_arrival = math.inf
        if self.wl.open_loop and self.n_arrived < self.wl.arrival_s.shape[0]:
            next_arrival = float(self.wl.arrival_s[self.n_arrived])
        record_tokens = self.record_tokens
        ver = [0] * n
        acc_n = [0] * n
        durs: list[float] = []
        ends: list[float] = []
        emits: list[int] = []
        t = now
        wait0 = wait
        max_b = self.max_b
        log = self.log if self.sums is None else None
        idx = range(n)
        while True:
            step_l = []
            step_a = []
            step_e = []
            for i in idx:
                k = at[i]
                if k >= stop[i]:
                    break
                ln = lens[k]
                a = ln if ln < acc[k] else acc[k]
                left = out[i] - pos[i]
                if a + 1 >= left:
                    break  # request i would finish: the ordinary path takes this step
                step_l.append(ln)
                step_a.append(a)
                step_e.append(a + 1)
            if len(step_e) < n:
                break
            n_ver = sum(step_l)
            batch = n + n_ver
            verify_s = lut[batch] if batch < n_lut else float(cost.step_time(batch))
            d = d0 + verify_s
            end = t + d
            if end <= t:
                break  # a step too short to move the clock: step by step (_Sums.walk)
            if log is not None:
                row = (t, d, batch, n, n, 0, n_queued, 0, n_ver, sum(step_a), sum(step_e), wait, 0)
                log.extend(row)
            wait = 0.0
            durs.append(d)
            if batch > max_b:
                max_b = batch
            for i in idx:
                e = step_e[i]
                pos[i] += e
                at[i] += e
                ver[i] += step_l[i]
                acc_n[i] += step_a[i]
            t = end
            if record_tokens:
                ends.append(end)
                emits.extend(step_e)
            if end >= next_arrival:
                break  # the next step starts with an arrival
        if not durs:
            return durs, now
        k = len(durs)
        self.n_steps += k
        if self.sums is not None:
            v = sum(ver)
            emitted = sum(pos) - int(S[_N].sum())
            self.sums.walk(durs, wait0, n + n_queued, n, v, sum(acc_n), emitted, n * k + v)
        self.max_b = max_b
        S[_N] = pos
        S[_VER] += ver
        S[_ACC] += acc_n
        if record_tokens:
            k = len(ends)
            self.tok_job.append(np.tile(S[_JOB], k))
            self.tok_cnt.append(np.asarray(emits, np.int64))
            self.tok_time.extend(ends)
            self.tok_len.extend([n] * k)
        return durs, t

    def _solo_walk_v2(self, S, now: float, wait: float, n_queued: int, lut, kv_coef: float):  # noqa: ANN001, N803
        """Steps of a lone decoding request up to the next event, walked without SimPy (the v2
        form of :meth:`specsim.sim.walks.Walks._solo_stretch`): nothing prefills, nothing can be
        admitted, so each step's length is the policy's ``solo`` decision for one trace row.
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
        hi = min(b + out, b + pos + 512)
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
        draft_full = self._draft_seconds(1, k_full)
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

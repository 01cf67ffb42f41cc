"""The simulated engine's per-job arrays, and the rows of the running-batch state array.

Each job has a column of ``NF`` int64 fields (``JOB`` .. ``RES``); the running batch is one
``(NF, R)`` array of such columns in admission order, so one fancy index admits, compacts or
retires every field at once (:class:`specsim.sim.serving.Engine`).
"""

from __future__ import annotations

import numpy as np

from specsim.sim.admission import reservation

# Rows of the running-batch state array.
# STEPS holds the index of the request's first decode step until it finishes.
# RES: the KV tokens the request reserved (prompt + output + gamma).
# N, VER, ACC and KV are adjacent: one in-place add advances them after a step.
# PRE the prompt tokens prefilled so far, PTGT the tokens its prefill must process (the prompt;
# prompt + output so far after a preemption), KV the tokens in its cache.
JOB, BASE, N, VER, ACC, KV, OUT, PROMPT, H1, H2, STEPS, RES, PRE, PTGT = range(14)
NF = 14


class Jobs:
    """Per-job arrays, grown by doubling (closed loop does not know its job count).

    ``cols`` holds each job's column of the running-batch array (fields ``JOB`` .. ``RES``),
    filled when the job is added: admission copies whole columns into the batch with one
    fancy index, and completion writes the finished columns back with another (the result
    fields then hold the final counters; ``STEPS`` the decode steps taken).

    Index j is the job's slot; ``seq[j]`` its number in creation order (the per-request
    table's ``id``; the same as j unless slots are recycled). Streaming results
    (:mod:`specsim.sim.streaming`) set ``recycle``: once a finished job's fields have been
    gathered its slot is ``release``d and the next ``add`` reuses it, so a closed loop's arrays
    stay the size of what is in flight instead of growing with every request.
    """

    FIELDS = (
        ("trace", np.int64, -1),
        ("arrival", np.float64, np.nan),
        ("admitted", np.float64, np.nan),
        ("first", np.float64, np.nan),
        ("finish", np.float64, np.nan),
        ("prompt", np.int64, 0),
        ("out", np.int64, 0),
        ("preempted_at", np.float64, np.nan),  # v2: when the job was last preempted
        ("stall", np.float64, 0.0),  # v2: its longest gap between tokens across a preemption
        ("seq", np.int64, -1),  # the job's number in creation order
        ("server_slot", np.int64, -1),  # the engine slot it runs in (specsim.sim.ubatch)
    )

    def __init__(self, capacity: int, offsets: np.ndarray, gamma: int) -> None:
        self.n = 0
        self.cap = max(16, capacity)
        self.offsets = offsets
        self.gamma = gamma
        for name, dt, fill in self.FIELDS:
            setattr(self, name, np.full(self.cap, fill, dtype=dt))
        self.cols = np.zeros((NF, self.cap), np.int64)
        self.issued = 0  # jobs created so far (the next one's seq)
        self.recycle = False
        self.free: list[int] = []  # released slots, reused last-in first-out

    def _grow(self) -> None:
        self.cap *= 2
        for name, dt, fill in self.FIELDS:
            old = getattr(self, name)
            new = np.full(self.cap, fill, dtype=dt)
            new[: old.shape[0]] = old
            setattr(self, name, new)
        cols = np.zeros((NF, self.cap), np.int64)
        cols[:, : self.cols.shape[1]] = self.cols
        self.cols = cols

    def add(self, trace: int, arrival: float, prompt: int, out: int) -> int:
        if self.free:
            j = self.free.pop()
        else:
            if self.n == self.cap:
                self._grow()
            j = self.n
            self.n += 1
        self.seq[j] = self.issued
        self.issued += 1
        self.trace[j] = trace
        self.arrival[j] = arrival
        self.prompt[j] = prompt
        self.out[j] = out
        col = [0] * NF
        col[JOB], col[BASE], col[OUT], col[PROMPT] = j, int(self.offsets[trace]), out, prompt
        col[H1] = col[H2] = -1
        col[RES] = reservation(prompt, out, self.gamma)
        col[PTGT] = max(prompt, 1)  # a prefill is at least one forward
        self.cols[:, j] = col
        return j

    def add_many(self, trace, arrival, prompt, out) -> None:
        """Bulk add (open loop: all jobs known up front)."""
        m = trace.shape[0]
        while self.n + m > self.cap:
            self._grow()
        s = slice(self.n, self.n + m)
        self.trace[s], self.arrival[s], self.prompt[s], self.out[s] = trace, arrival, prompt, out
        c = self.cols[:, s]
        c[JOB] = np.arange(self.n, self.n + m)
        c[BASE] = self.offsets[trace]
        c[OUT], c[PROMPT] = out, prompt
        c[H1] = c[H2] = -1
        c[RES] = reservation(np.asarray(prompt), np.asarray(out), self.gamma)
        c[PTGT] = np.maximum(np.asarray(prompt), 1)
        self.seq[s] = np.arange(self.issued, self.issued + m)
        self.issued += m
        self.n += m

    def release(self, slots: np.ndarray) -> None:
        """Finished jobs whose fields were gathered: reset their slots for ``add`` to reuse
        (only when ``recycle`` is set; otherwise they keep their results for ``RawLog``)."""
        if not self.recycle or slots.size == 0:
            return
        for name, _, fill in self.FIELDS:
            getattr(self, name)[slots] = fill
        self.cols[:, slots] = 0
        self.free.extend(slots.tolist())

    def result(self, field: int) -> np.ndarray:
        """A finished job's counter (0 for a job that never finished), jobs 0..n-1."""
        done = ~np.isnan(self.finish[: self.n])
        return np.where(done, self.cols[field, : self.n], 0)

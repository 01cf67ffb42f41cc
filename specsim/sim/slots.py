"""Which engine slot a request gets: llama-server's rule, from the prompts' tokens (or,
where the server's history is unknown, a seeded random free slot: :class:`RandomSlots`).

Why it matters: llama-server with one KV stream per slot cuts a step into a forward pass per
run of consecutive slots holding as many tokens each (:mod:`specsim.sim.ubatch`), so where the
requests in flight sit sets what a step costs. The server does not pack them into the lowest
slots. ``get_available_slot`` (tools/server/server-context.cpp, llama.cpp b11434) gives a new
task, among the slots not processing and holding cached tokens, the one whose cache shares the
longest common prefix with the task's prompt, as a fraction of the prompt
(``lcp / len(prompt)``, the first slot in order reaching the highest fraction), when that
fraction is above ``--slot-prompt-similarity`` (default 0.1); otherwise the least recently
used free slot (``t_last_used``, set when a slot releases its task; never used: -1, and among
equal times the last slot in order, the loop's ``<=``). A slot's cache is the prompt it last
ran and that prompt's output; against another chat-templated prompt its common prefix is the
two prompts' (a templated prompt ends in the assistant's header, so none is a prefix of
another).

The simulated server starts empty (every slot unused), or one object is handed to run after
run (``replay(slots=...)``), so it carries the server's history from run to run as a real
server does. The history decides where the free slots are: an empty slot is never chosen by
prefix, so a fresh server at 7 requests in flight on 8 slots keeps its one unused slot free
(one pass a step), where a server whose slots have all run requests moves its free slot about
(a start with every slot holding a prompt was tried and spread the tuning runs' requests over
slots the real server never used: reports/llama-cpp-v4/PLAN.md, step 7b). Which prompts a real
server's slots hold is its history, which no trace has (reports/llama-cpp-v4/PLAN.md, step 7).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specsim.errors import SpecsimError

#: llama-server's default ``--slot-prompt-similarity``
SIMILARITY = 0.1


def common_prefix(prompts: Sequence[Sequence[int]]) -> np.ndarray:
    """``lcp[i, j]``: the tokens prompts ``i`` and ``j`` share from the start."""
    n = len(prompts)
    arrs = [np.asarray(p, dtype=np.int64) for p in prompts]
    lcp = np.zeros((n, n), dtype=np.int64)
    for i in range(n):
        lcp[i, i] = arrs[i].shape[0]
        for j in range(i + 1, n):
            m = min(arrs[i].shape[0], arrs[j].shape[0])
            diff = np.flatnonzero(arrs[i][:m] != arrs[j][:m])
            lcp[i, j] = lcp[j, i] = int(diff[0]) if diff.size else m
    return lcp


class LlamaSlots:
    """llama-server's slot choice over ``n_slots`` slots for prompts indexed like the trace's
    requests (``prompts[i]``: request ``i``'s token ids in the server's chat template)."""

    __slots__ = ("sim", "cached", "t_last", "threshold", "offset", "n_prompts")

    def __init__(
        self,
        n_slots: int,
        prompts: Sequence[Sequence[int]],
        threshold: float = SIMILARITY,
    ) -> None:
        if not len(prompts):
            raise SpecsimError("slots: no prompts given; give one token-id list per trace request")
        lengths = np.array([max(len(p), 1) for p in prompts], dtype=np.float64)
        # sim[i, j]: the fraction of prompt i a slot holding prompt j shares with it
        self.sim = common_prefix(prompts) / lengths[:, None]
        self.cached = np.full(n_slots, -1, dtype=np.int64)  # the prompt each slot last ran
        self.t_last = np.full(n_slots, -1.0)  # when it released it (-1: never used)
        self.threshold = float(threshold)
        self.n_prompts = len(prompts)
        self.offset = 0.0  # a run's clock starts at 0: releases are kept after the last run's

    def attach(self, n_requests: int, max_running: int) -> LlamaSlots:
        """Start a run of a trace of ``n_requests`` on ``max_running`` slots (refused unless
        they are this server's): its clock starts again at 0, so its releases count after
        every earlier one (the server's own clock runs on)."""
        if self.n_prompts != n_requests or self.cached.shape[0] != max_running:
            raise SpecsimError(
                f"slots: {self.n_prompts} prompts on {self.cached.shape[0]} slots for a trace "
                f"of {n_requests} requests on {max_running}; give one token-id list per trace "
                "request and max_running slots"
            )
        self.offset = max(float(self.t_last.max()), 0.0) + 1.0
        return self

    def choose(self, busy: np.ndarray, prompt: int) -> int:
        """The slot a task for ``prompt`` gets, given the slots processing (``busy``, bool),
        which it then holds."""
        free = ~busy
        held = free & (self.cached >= 0)
        slot = -1
        if held.any():
            idx = np.flatnonzero(held)
            sim = self.sim[prompt, self.cached[idx]]
            best = int(np.argmax(sim))  # the first slot in order at the highest fraction
            if sim[best] > self.threshold:
                slot = int(idx[best])
        if slot < 0:  # the least recently used free slot; among equals the last
            idx = np.flatnonzero(free)
            t = self.t_last[idx]
            slot = int(idx[np.flatnonzero(t == t.min())[-1]])
        self.cached[slot] = prompt
        return slot

    def release(self, slots: np.ndarray, now: float) -> None:
        """The tasks in ``slots`` ended at ``now`` (seconds)."""
        self.t_last[slots] = now + self.offset


class RandomSlots:
    """A seeded uniformly random free slot for each new task: a layout model for a server whose
    history the simulator does not know (a grid's server has run every earlier cell, so its
    free slots sit anywhere; the lowest free slots pack the requests in flight into fewer
    passes than it runs: reports/llama-cpp-v4/PLAN.md, steps 10-12). One seed is one layout;
    a score takes the median over several."""

    __slots__ = ("rng", "n_slots")

    def __init__(self, n_slots: int, seed: int) -> None:
        self.n_slots = int(n_slots)
        self.rng = np.random.default_rng(seed)

    def attach(self, n_requests: int, max_running: int) -> RandomSlots:
        """Start a run on ``max_running`` slots (refused unless they are this server's)."""
        if self.n_slots != max_running:
            raise SpecsimError(
                f"slots: {self.n_slots} random slots for a run on {max_running}; give "
                "max_running slots"
            )
        return self

    def choose(self, busy: np.ndarray, prompt: int) -> int:  # noqa: ARG002 - the rule's call
        """A free slot drawn uniformly (``busy``: the slots processing)."""
        return int(self.rng.choice(np.flatnonzero(~busy)))

    def release(self, slots: np.ndarray, now: float) -> None:
        """Nothing to remember: the next draw does not look at the past."""

"""What one engine step costs, written once: :meth:`StepPrice.seconds`.

The serving model's step (:class:`specsim.sim.serving.StepV2`) prices every step it takes with
it, and the non-anticipating bound (:mod:`specsim.analysis.bound`) prices the steps of its
model with it, so the bound's steps cost what the simulator's cost. A step of ``requests``
running requests, ``decode`` of them decoding (one anchor token each) and verifying ``drafts``
drafted tokens between them, costs

    drafting ``drafted`` tokens a decoder (``draft_s``, 0 when nothing is drafted)
      + the drafter's prefill of its prompt tokens (``draft_prefill_us_per_token``)
      + the scheduler (the caller's: 0 for a policy that does not decide, or under ZOS)
      + the target step over decode + drafts + tree + prefill tokens: the table read by
        ``table`` (``B -> seconds`` at the step's context), through ``CostModel.verify_s``
        with a measured engine's terms; where the engine cuts the decoders into several
        forward passes (``passes_by_slot``, llama-server: :mod:`specsim.sim.ubatch`), the table
        at each pass's tokens, summed
      + the KV it reads (``kv_read_us_per_ktoken`` per cached token of every sequence in it),
        or decode attention's compute where that is longer (``attn_us_per_qk_ktoken`` per
        query x context token of the decoders)
      + ``emit_per_token_ms`` per decode token emitted.

Every argument may be a number or a numpy array (the bound prices all its choices at once);
numbers are summed in the order above, which is the order the golden tables were made in.
"""

from __future__ import annotations

import numpy as np

from specsim.sim.cost.model import CostModel


class StepPrice:
    """One run's step price: the cost model's terms as the step reads them, once.

    ``gamma``: the trace's block (a full draft). Drafting a full block for n requests is read
    from per-request terms (or a measured draft curve tabulated up to ``max_running``),
    fewer tokens from the cost model (:meth:`draft_s`).
    """

    __slots__ = (
        "cost", "gamma", "engine_terms", "kv_coef", "attn_coef", "emit_coef", "dpre",
        "tree_extra", "lut", "lut_list", "n_lut", "d_base", "d_req", "d_tok", "draft_lut",
        "n_block", "curved", "by_slot",
    )  # fmt: skip

    def __init__(self, cost: CostModel, gamma: int) -> None:
        self.cost, self.gamma = cost, gamma
        # measured-engine terms (specsim.sim.cost.model): 0 in generated profiles
        self.engine_terms = cost.has_engine_terms
        self.kv_coef = cost.kv_read_us_per_ktoken * 1e-9  # seconds per cached token read
        self.attn_coef = cost.attn_us_per_qk_ktoken * 1e-9  # s per query x context token
        self.emit_coef = cost.emit_per_token_ms * 1e-3  # seconds per emitted decode token
        self.dpre = cost.draft_prefill_us_per_token * 1e-6  # the drafter's prefill, a token
        self.tree_extra = int(cost.tree_tokens_per_request)  # a tree's unaccepted branches
        self.by_slot = bool(cost.passes_by_slot)  # a pass per run of slots (specsim.sim.ubatch)
        self.lut = cost.lut_seconds(None)
        self.lut_list = self.lut.tolist()  # the same floats, read without a numpy scalar
        self.n_lut = self.lut.shape[0]
        self.d_base = cost.draft_base_ms * 1e-3
        self.d_req = cost.draft_per_request_ms * 1e-3
        self.d_tok = cost.draft_per_token_ms * 1e-3 * gamma
        # a full block's seconds for 0..n_max decoding requests, tabulated: from the measured
        # curve(s), or the terms' own sum (the same floats as block_s computes beyond the table)
        self.curved = bool(cost.draft_curve or cost.draft_step_curve)
        if self.curved:
            n_max = min(int(cost.max_running), 1 << 16)
            self.draft_lut = (cost.draft_ms(np.arange(n_max + 1), gamma) * 1e-3).tolist()
        else:
            d0, d1 = self.d_base, self.d_req + self.d_tok
            self.draft_lut = [d0 + d1 * n for n in range(min(int(cost.max_running), 4096) + 1)]
        self.n_block = len(self.draft_lut)

    def block_s(self, n: int) -> float:
        """Seconds of drafting a full block for ``n`` decoding requests (no context term)."""
        if n < self.n_block:
            return self.draft_lut[n]
        if not self.curved:
            return self.d_base + (self.d_req + self.d_tok) * n
        return float(self.cost.draft_ms(n, self.gamma)) * 1e-3

    def draft_s(self, n: int, k: int) -> float:
        """Seconds of drafting ``k`` tokens for ``n`` requests, before the context term: the
        one rule a step's cost, a walk and a policy's ``draft_time`` all read (a full block
        from the terms above, fewer tokens from the cost model's curve)."""
        if k <= 0:
            return 0.0
        return self.block_s(n) if k >= self.gamma else float(self.cost.draft_ms(n, k)) * 1e-3

    def table_s(self, batch: int) -> float:
        """The 1-D table at one token batch (the step's hot path: an index, not a call)."""
        if batch < self.n_lut:
            return self.lut_list[batch]
        return float(self.cost.step_time(batch))

    def seconds(  # type: ignore[no-untyped-def]
        self, table, *, requests, decode, drafts=0, drafted=0, draft_context=0.0, tree=0,
        prefill=0, draft_prefill=0, sched=0.0, kv=0, qk=None, emitted=0,
    ):  # fmt: skip
        """Seconds of one step (the module docstring): ``drafted`` tokens drafted a decoder
        (0: the drafter skipped) plus ``draft_context`` (seconds of the drafter's context,
        measured engines), ``tree`` tokens of a tree's other branches, ``prefill`` prompt
        tokens (``draft_prefill`` of them also prefilled by the drafter), ``sched`` seconds of
        scheduler, ``kv`` cached tokens read, ``qk`` the decoders' query x context tokens
        (None: attention's compute not priced) and ``emitted`` decode tokens emitted. Where
        the engine cuts the decoders into several passes, ``table`` is :func:`passes_table`'s."""
        if decode and drafted:  # a full block for a tabulated count: read, not a call
            d = self.draft_lut[decode] if drafted >= self.gamma and decode < self.n_block else (
                self.draft_s(decode, drafted)
            )  # fmt: skip
            draft = d + draft_context
        else:
            draft = 0.0
        tokens = decode + drafts + tree
        if self.engine_terms:
            verify = self.cost.verify_s(tokens, prefill, requests, table, drafts)
        else:
            verify = table(tokens + prefill)
        kv_s = self.kv_coef * kv if self.kv_coef else 0.0
        if qk is not None and self.attn_coef and decode:  # the longer of its read and compute
            kv_s = np.maximum(kv_s, self.attn_coef * qk)
        duration = draft + self.dpre * draft_prefill + sched + verify + kv_s
        if self.emit_coef and decode:  # the server's sampling and streaming, per emitted token
            duration = duration + self.emit_coef * emitted
        return duration


def passes_table(table, passes: list[int], extra_s: float = 0.0):  # type: ignore[no-untyped-def]
    """``table`` read at each pass's tokens and summed, plus ``extra_s`` for each pass after
    the first, for the decoders' tokens (the verify reads it at them, or at them and the
    step's prompt tokens where the profile has no ``prefill_token_ms``: those then cost what
    they add to the table beyond the decoders')."""
    total = sum(float(table(n)) for n in passes) + extra_s * max(len(passes) - 1, 0)
    mine = sum(passes)
    base = float(table(mine))
    return lambda tokens: total + (float(table(tokens)) - base if tokens != mine else 0.0)

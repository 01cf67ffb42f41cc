"""The cost model: how long a target step, a draft forward and a scheduling decision take.

The target step time is read from an SPS profile (a table of ``batch_tokens -> step_ms``,
optionally also against ``context_tokens``) and interpolated LINEARLY between profiled points, so
a jagged (step-shaped) profile stays jagged: a smooth fit would hide exactly the cliffs a
hardware-aware scheduler exploits. For speed the table is expanded once into a dense lookup
array over every integer B = 0..Bmax; ``step_time`` is then one ``take``. Beyond Bmax the last
two points are extrapolated linearly (and :attr:`CostModel.b_max` lets the engine say so) with a
slope of at least zero: more tokens never make a forward cheaper than the largest one measured,
so a falling last segment (timing noise, or a table imported without its running maximum) is
held flat instead of reaching zero and negative step times; below the first point the first
value is held (a linear fall towards B = 0 could reach zero).

``context_tokens`` (2-D profiles) is the MEAN context length (prompt + generated tokens) of the
requests in the step; the table is interpolated linearly in it too, clamped at its ends.

Engine terms (all 0 in generated profiles, measured by ``specsim validate`` on the real engine,
docs/fidelity.md): a step also pays ``step_overhead_ms`` (the loop's fixed cost),
``verify_per_request_ms`` per request in it (decoding AND prefilling: one attention call per
layer, accepting, streaming), and per decoding request ``draft_per_context_us`` per context token
the drafter attends to (a DSpark drafter reads up to ``draft_context_window`` target features).
With ``prefill_token_ms`` > 0 a prompt token is charged at that cost instead of through the
table (it needs no logits: an engine computes the LM head only where it samples), so the table
covers the verified tokens only. ``accept_per_token_ms`` is the loop's cost per verified token
beyond the forward (the argmax or the rejection sampling over the vocabulary at every verified
row, committing, streaming): on the CPU engine 0.13 ms a token, so a step of 16 requests
verifying 8 tokens each pays ~17 ms of it and one verifying 1 token each ~2 (v5 grid); v5
folded it into the per-request curve measured at 4 tokens a request, which charged ``full``
half and ``ar`` three times what their steps paid.

``emit_per_token_ms`` (serving model v2 only) is charged per decode token a step EMITS
(accepted drafts and the bonus or correction token), not per verified one: llama-server samples
the verified rows one by one and stops at the first draft its sample rejects
(``common_sampler_sample_and_accept_n``), then streams each emitted token, so a rejected draft
costs its logits (in the table) but no sampling or streaming.

``overhead_curve`` ((R, ms) points, measured at R = 1, 2, 4, 8, 16 running requests) replaces
``step_overhead_ms + verify_per_request_ms * R`` when given: on the CPU engine that overhead is
~0 at one or two requests and ~4.5 ms per request from four on (caches: the requests' KV and
features stop fitting), which no straight line fits; the linear form charged 4.4 ms too much at
one request (5% of a step). Linear between points, the first value held below the first point,
the last segment's slope (never negative) beyond the last.

``draft_curve`` ((R, ms) points, the same form) replaces ``draft_base_ms + draft_per_request_ms *
R`` when given (``draft_per_token_ms * R * gamma`` and the context term are still added): a
DSpark drafter on the CPU engine costs more per request at 8 and 16 requests than at 1 to 4
(20, 30, 58, 108, 183 ms at R = 1, 2, 4, 8, 16), and the straight line through those points
charged 13-20% too little in the fidelity grid's C = 4-16 cells.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost.tables import (
    COST_KEYS,
    CURVE_KEYS,
    INTERPOLATIONS,
    MAX_COST,
    MAX_PROFILE_BATCH,
    checked_curve,
    curve_at,
    dense_lookup,
)


@dataclass(frozen=True, eq=False)
class CostModel:
    """Target step, draft and scheduler costs of one deployment (all times in the units named).

    ``batch_tokens`` (n,) ascending; ``step_ms`` (n,) for a 1-D profile or (m, n) against
    ``context_tokens`` (m,) for a 2-D one.
    """

    name: str
    batch_tokens: np.ndarray
    step_ms: np.ndarray
    context_tokens: np.ndarray | None = None
    draft_base_ms: float = 0.0
    draft_per_request_ms: float = 0.0
    draft_per_token_ms: float = 0.0
    sched_base_us: float = 0.0
    sched_us_per_request: float = 0.0
    step_overhead_ms: float = 0.0
    verify_per_request_ms: float = 0.0
    draft_per_context_us: float = 0.0
    draft_context_window: int = 0  # 0: the drafter reads the whole context
    prefill_token_ms: float = 0.0
    accept_per_token_ms: float = 0.0  # the loop's cost per verified token (accept, stream)
    overhead_curve: tuple[tuple[int, float], ...] = ()  # (requests, ms): replaces the linear
    draft_curve: tuple[tuple[int, float], ...] = ()  # (requests, ms): replaces base + per-request
    # (requests, ms) a SEQUENTIAL drafter (EAGLE, MTP) adds per drafted position: a call
    # drafting k tokens pays draft_curve + k x this, so a shorter k is cheaper; () for a
    # drafter that proposes its block in one forward (DSpark) or a table that does not say
    draft_step_curve: tuple[tuple[int, float], ...] = ()
    # serving model v2: the drafter's own prefill of prompt tokens (its KV of the target's
    # features), and the KV a step reads per context token of every sequence in it (the
    # built profiles' table then covers weights and compute only)
    draft_prefill_us_per_token: float = 0.0
    kv_read_us_per_ktoken: float = 0.0
    # serving model v2: decode attention's COMPUTE, us per query token x 1,000 context tokens of
    # a decoding sequence (a verify of k drafts brings k + 1 query tokens); a step's attention
    # takes the longer of its KV read and this (MLA's absorbed path turns compute-bound at long
    # context and many query tokens; GQA stays memory-bound). 0: not priced
    attn_us_per_qk_ktoken: float = 0.0
    # serving model v2: the server's cost per decode token EMITTED (not verified): a server
    # that samples row by row and stops at the first rejected draft (llama-server), and
    # streams every emitted token, pays this per accepted draft and bonus token only
    emit_per_token_ms: float = 0.0
    # serving model v2: what a verified DRAFT token costs beyond another request's decode
    # token in the table (llama-server: +3.4 ms a draft token in the tuning grid's calibration
    # steps, docs/llama-cpp.md); charged per draft token verified, accepted or not
    verify_draft_token_ms: float = 0.0
    # serving model v2, 1: the engine cuts a step into forward passes by slot, each priced by
    # the table at its own tokens: llama-server with one KV stream per slot runs one pass per
    # run of consecutive slots holding as many tokens each (specsim.sim.ubatch), and the
    # simulator places each request in one of ``max_running`` slots. 0: one pass a step
    passes_by_slot: int = 0
    # with passes_by_slot: what each forward pass after a step's first costs beyond the table
    # at its tokens (llama-server: a one-token pass alone ~4.4 ms, inside a step of several
    # 5.0-5.8 ms each, reports/llama-cpp-v4/PLAN.md step 5)
    pass_extra_ms: float = 0.0
    # a tree drafter (EAGLE on SGLang): the tokens a request verifies beyond its drafted path,
    # the tree's other branches (num_draft_tokens - steps), in every step it speculates; 0: a
    # chain. The step holds them (budget and price) though none is ever accepted (serving v2)
    tree_tokens_per_request: int = 0
    # what a step holding prompt tokens pays inside the CUDA-graph capture range beyond a
    # uniform decode step of its size (vLLM runs it in piecewise graphs, attention eager;
    # SGLang and TensorRT-LLM without graphs): the launches its graph mode adds
    mixed_step_ms: float = 0.0
    max_running: int = 256
    kv_tokens: int = 1 << 20
    max_batched_tokens: int = 8192  # tokens a step may hold (vLLM's name)
    gpus: int = 1  # accelerators the step table is for (a node of 8 for an 8-GPU deployment)
    # how the table is read between its points: "linear", or "step" (a batch pays the next
    # profiled size, its CUDA-graph capture size, up to ``capture_max_tokens``; 0: everywhere;
    # ``draft_curve`` is then read the same way, to its last point)
    interpolation: str = "linear"
    capture_max_tokens: int = 0
    meta: dict[str, str] = field(default_factory=dict)
    _lut: np.ndarray = field(init=False, repr=False)
    _slope: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for key in COST_KEYS:
            v = getattr(self, key)
            if not (np.isfinite(v) and 0 <= v <= MAX_COST):
                raise SpecsimError(
                    f"profile {self.name!r}: {key} = {v} must be a finite number in "
                    f"[0, {MAX_COST:g}]; fix the profile header"
                )
        if not 0 <= self.tree_tokens_per_request <= 4096:
            raise SpecsimError(
                f"profile {self.name!r}: tree_tokens_per_request = "
                f"{self.tree_tokens_per_request} must be a whole number in [0, 4096]"
            )
        if self.passes_by_slot not in (0, 1):
            raise SpecsimError(
                f"profile {self.name!r}: passes_by_slot = {self.passes_by_slot} must be 0 (one "
                "pass a step) or 1 (a pass per run of consecutive slots, llama-server)"
            )
        if self.pass_extra_ms and not self.passes_by_slot:
            raise SpecsimError(
                f"profile {self.name!r}: pass_extra_ms prices the passes a step is cut into by "
                "slot; set passes_by_slot = 1 or leave pass_extra_ms out"
            )
        if not 0 <= self.draft_context_window <= 10**9:
            raise SpecsimError(
                f"profile {self.name!r}: draft_context_window = {self.draft_context_window} must "
                "be a whole number >= 0 (0: no window)"
            )
        for key, hi in (("max_running", 10**7), ("kv_tokens", 10**13),
                        ("max_batched_tokens", 10**9), ("gpus", 10**6)):  # fmt: skip
            v = getattr(self, key)
            if not 1 <= v <= hi:
                raise SpecsimError(
                    f"profile {self.name!r}: {key} = {v} must be a whole number in [1, {hi:,}]"
                )
        for key in CURVE_KEYS:
            object.__setattr__(self, key, checked_curve(self.name, key, getattr(self, key)))
        if self.interpolation not in INTERPOLATIONS:
            raise SpecsimError(
                f"profile {self.name!r}: interpolation = {self.interpolation!r}; use one of "
                f"{', '.join(INTERPOLATIONS)}"
            )
        if not 0 <= self.capture_max_tokens <= MAX_PROFILE_BATCH:
            raise SpecsimError(
                f"profile {self.name!r}: capture_max_tokens = {self.capture_max_tokens} must be "
                f"a whole number in [0, {MAX_PROFILE_BATCH:,}] (0: the whole table)"
            )
        b = np.asarray(self.batch_tokens, dtype=np.int64)
        ms = np.atleast_2d(np.asarray(self.step_ms, dtype=np.float64))
        if b.ndim != 1 or b.size < 2:
            raise SpecsimError(f"profile {self.name!r} needs at least 2 batch_tokens points")
        if np.any(np.diff(b) <= 0) or b[0] < 0:
            raise SpecsimError(
                f"profile {self.name!r}: batch_tokens must be distinct, non-negative; sort them"
            )
        if b[-1] > MAX_PROFILE_BATCH:
            raise SpecsimError(
                f"profile {self.name!r}: batch_tokens up to {b[-1]:,} is beyond the "
                f"{MAX_PROFILE_BATCH:,} tokens a step table may cover (larger batches are "
                "extrapolated from the last two points)"
            )
        if ms.shape[1] != b.size or not np.all(np.isfinite(ms)) or np.any(ms <= 0):
            raise SpecsimError(f"profile {self.name!r}: step_ms must be positive numbers")
        if self.context_tokens is not None:
            ctx = np.asarray(self.context_tokens, dtype=np.float64)
            if ctx.shape != (ms.shape[0],) or np.any(np.diff(ctx) <= 0):
                raise SpecsimError(
                    f"profile {self.name!r}: context_tokens must be ascending, one per table row"
                )
        elif ms.shape[0] != 1:
            raise SpecsimError(f"profile {self.name!r}: a 2-D step table needs context_tokens")
        lut = np.stack(
            [dense_lookup(b, row, self.interpolation, self.capture_max_tokens) for row in ms]
        )  # (m, Bmax+1) seconds
        # s per token beyond Bmax: never negative (the module docstring says why)
        slope = np.maximum(ms[:, -1] - ms[:, -2], 0.0) / (b[-1] - b[-2]) / 1000.0
        object.__setattr__(self, "batch_tokens", b)
        object.__setattr__(self, "step_ms", ms if self.context_tokens is not None else ms[0])
        object.__setattr__(self, "_lut", lut)
        object.__setattr__(self, "_slope", slope)

    def kv_read_s(self, context_tokens: float) -> float:
        """Seconds a step spends reading the KV of ``context_tokens`` cached tokens (summed
        over the sequences in the step; v2)."""
        return self.kv_read_us_per_ktoken * 1e-9 * context_tokens

    @property
    def b_max(self) -> int:
        """The largest profiled token batch; beyond it step times are extrapolated."""
        return int(self.batch_tokens[-1])

    def beyond_table(self) -> str:
        """What a step past :attr:`b_max` costs, in words for the warning that says a run went
        there: the last two points' line, or the last point held flat where the table falls
        (or is level) at its end, as ``step_time`` reads it. Why: a warning that says
        "extrapolated linearly" of a table held flat sends the user looking for the wrong
        cause."""
        flat = self._slope <= 0
        if flat.all():
            return "held flat at the last point (the table does not rise at its end)"
        if flat.any():
            return (
                "extrapolated linearly from the last two points (held flat at the contexts "
                "where the table does not rise at its end)"
            )
        return "extrapolated linearly from the last two points"

    def lut_seconds(self, ctx: float | None = None) -> np.ndarray:
        """The dense table: step seconds at every B = 0..b_max (1-D profile, or the smallest
        context of a 2-D one). The engine indexes it directly on its hot path."""
        return self._lut[0]

    @property
    def is_2d(self) -> bool:
        return self.context_tokens is not None

    @property
    def has_engine_terms(self) -> bool:
        """Whether any per-request, per-context or prefill term is set (measured engines)."""
        return bool(
            self.step_overhead_ms
            or self.overhead_curve
            or self.verify_per_request_ms
            or self.draft_per_context_us
            or self.prefill_token_ms
            or self.accept_per_token_ms
            or self.emit_per_token_ms
            or self.verify_draft_token_ms
            or self.passes_by_slot
            or self.pass_extra_ms
            or self.tree_tokens_per_request
            or self.mixed_step_ms
        )

    def policy_step_fn(self, step_fn, prefill_tokens: int):  # type: ignore[no-untyped-def]
        """The ``B -> seconds`` a policy sees in a step that also prefills ``prefill_tokens``
        prompt tokens: the table at B + P, or (``prefill_token_ms`` > 0) the table at B plus
        the prompt tokens' own cost. Shared by the simulator and the real engine."""
        if not prefill_tokens:
            return step_fn
        if self.prefill_token_ms:
            extra = self.prefill_token_ms * 1e-3 * prefill_tokens
            return lambda batch: step_fn(batch) + extra
        return lambda batch: step_fn(np.asarray(batch) + prefill_tokens)

    def draft_context_s(self, contexts: np.ndarray) -> float:
        """Seconds of drafting that grow with context: the sum over decoding requests of the
        context tokens the drafter attends to (capped at ``draft_context_window``)."""
        if not self.draft_per_context_us:
            return 0.0
        c = np.asarray(contexts, dtype=np.int64)
        if self.draft_context_window:
            c = np.minimum(c, self.draft_context_window)
        return self.draft_per_context_us * 1e-6 * float(c.sum())

    def verify_s(  # type: ignore[no-untyped-def]
        self, decode_tokens: int, prefill_tokens: int, n_requests: int, step_fn,
        draft_tokens: int = 0,
    ):  # fmt: skip
        """Seconds of the target step of ``n_requests`` requests verifying ``decode_tokens``
        tokens (``draft_tokens`` of them drafts) and prefilling ``prefill_tokens`` (``step_fn``:
        the table at this context), the engine terms included. Token counts may be arrays
        (the non-anticipating bound prices every choice at once)."""
        if self.prefill_token_ms:
            t = step_fn(decode_tokens) + self.prefill_token_ms * 1e-3 * prefill_tokens
        else:
            t = step_fn(decode_tokens + prefill_tokens)
        ms = self.overhead_ms(n_requests) + self.accept_per_token_ms * decode_tokens
        if prefill_tokens and self.mixed_step_ms:  # a non-uniform batch inside the graphs
            if decode_tokens + prefill_tokens <= (self.capture_max_tokens or MAX_PROFILE_BATCH):
                ms += self.mixed_step_ms
        return t + (ms + self.verify_draft_token_ms * draft_tokens) * 1e-3

    def overhead_ms(self, n_requests):  # type: ignore[no-untyped-def]
        """The engine loop's own ms per step at ``n_requests`` requests (scalar or array):
        ``overhead_curve`` when measured, else ``step_overhead_ms + verify_per_request_ms R``."""
        n = np.asarray(n_requests, dtype=np.float64)
        if not self.overhead_curve:
            out = self.step_overhead_ms + self.verify_per_request_ms * n
        else:
            out = curve_at(self.overhead_curve, n)
        return float(out) if np.ndim(n_requests) == 0 else out

    def _row(self, lut: np.ndarray, slope: float, batch: np.ndarray) -> np.ndarray:
        bmax = lut.shape[0] - 1
        out = lut.take(batch, mode="clip")
        if batch.size and batch.max() > bmax:
            out = np.where(batch > bmax, lut[bmax] + slope * (batch - bmax), out)
        return out

    def step_time(self, batch, ctx: float | None = None):
        """Seconds of one target step over a token batch ``batch`` (scalar or array).

        ``ctx``: mean context tokens per request (2-D profiles only; ignored by 1-D ones;
        a 2-D profile without ``ctx`` uses its smallest context).
        """
        scalar = np.ndim(batch) == 0
        b = np.maximum(np.asarray(batch, dtype=np.int64), 0)
        if not self.is_2d or ctx is None:
            out = self._row(self._lut[0], float(self._slope[0]), b)
        else:
            ctxs = self.context_tokens
            c = float(np.clip(ctx, ctxs[0], ctxs[-1]))
            hi = int(np.searchsorted(ctxs, c, side="left"))
            if hi == 0:
                out = self._row(self._lut[0], float(self._slope[0]), b)
            else:
                w = (c - ctxs[hi - 1]) / (ctxs[hi] - ctxs[hi - 1])
                lo_t = self._row(self._lut[hi - 1], float(self._slope[hi - 1]), b)
                hi_t = self._row(self._lut[hi], float(self._slope[hi]), b)
                out = (1.0 - w) * lo_t + w * hi_t
        return float(out) if scalar else out

    def step_time_fn(self, ctx: float | None = None):
        """``B -> seconds`` at a fixed context: what a policy gets as ``StepInput.step_time``."""
        if not self.is_2d or ctx is None:
            lut, slope = self._lut[0], float(self._slope[0])
            return lambda batch: self._row(lut, slope, np.asarray(batch, dtype=np.int64))
        return lambda batch: self.step_time(np.asarray(batch), ctx)

    def sps(self, batch, ctx: float | None = None):
        """Target steps per second at token batch ``batch``: 1 / step_time."""
        return 1.0 / self.step_time(batch, ctx)

    def draft_ms(self, n_requests, gamma: int):
        """Draft forward for R requests producing a block of ``gamma`` tokens each."""
        r = np.asarray(n_requests, dtype=np.float64)
        if self.draft_curve:  # a step-read table's drafter runs captured graphs too
            fixed = curve_at(self.draft_curve, r, step=self.interpolation == "step")
        else:
            fixed = self.draft_base_ms + self.draft_per_request_ms * r
        if self.draft_step_curve:
            step = self.interpolation == "step"
            fixed = fixed + gamma * curve_at(self.draft_step_curve, r, step=step)
        out = np.where(r > 0, fixed + self.draft_per_token_ms * r * gamma, 0.0)
        return float(out) if np.ndim(n_requests) == 0 else out

    def sched_s(self, n_requests: int) -> float:
        """Seconds of scheduler compute for one decision over R requests."""
        if n_requests <= 0:
            return 0.0
        return (self.sched_base_us + self.sched_us_per_request * n_requests) * 1e-6

    def scalars(self) -> dict[str, float | int]:
        """The non-table parameters, as written in a profile CSV header."""
        return {
            "draft_base_ms": self.draft_base_ms,
            "draft_per_request_ms": self.draft_per_request_ms,
            "draft_per_token_ms": self.draft_per_token_ms,
            "sched_base_us": self.sched_base_us,
            "sched_us_per_request": self.sched_us_per_request,
            "step_overhead_ms": self.step_overhead_ms,
            "verify_per_request_ms": self.verify_per_request_ms,
            "draft_per_context_us": self.draft_per_context_us,
            "draft_context_window": self.draft_context_window,
            "prefill_token_ms": self.prefill_token_ms,
            "accept_per_token_ms": self.accept_per_token_ms,
            "draft_prefill_us_per_token": self.draft_prefill_us_per_token,
            "kv_read_us_per_ktoken": self.kv_read_us_per_ktoken,
            **(
                {"attn_us_per_qk_ktoken": self.attn_us_per_qk_ktoken}
                if self.attn_us_per_qk_ktoken
                else {}
            ),
            **({"emit_per_token_ms": self.emit_per_token_ms} if self.emit_per_token_ms else {}),
            **(
                {"verify_draft_token_ms": self.verify_draft_token_ms}
                if self.verify_draft_token_ms
                else {}
            ),
            **({"mixed_step_ms": self.mixed_step_ms} if self.mixed_step_ms else {}),
            **({"passes_by_slot": self.passes_by_slot} if self.passes_by_slot else {}),
            **({"pass_extra_ms": self.pass_extra_ms} if self.pass_extra_ms else {}),
            **(
                {"tree_tokens_per_request": self.tree_tokens_per_request}
                if self.tree_tokens_per_request
                else {}
            ),
            "max_running": self.max_running,
            "kv_tokens": self.kv_tokens,
            "max_batched_tokens": self.max_batched_tokens,
            "gpus": self.gpus,
            **(
                {"interpolation": self.interpolation, "capture_max_tokens": self.capture_max_tokens}
                if self.interpolation != "linear"
                else {}
            ),
        }


def time_scaled(model: CostModel, factor: float) -> CostModel:
    """``model`` on a machine ``factor`` times slower: every time it holds (the step table,
    each per-step, per-request and per-token cost, the curves' ms) times ``factor``, its limits
    and shape as they are. Why: a profile calibrated at one moment prices runs made at another;
    where a probe measured how much the machine's speed moved in between
    (:mod:`specsim.fidelity.llama.drift`), the runs are simulated at their own speed."""
    if not (np.isfinite(factor) and factor > 0):
        raise SpecsimError(f"a speed factor must be a positive number, got {factor}")
    if factor == 1.0:
        return model
    curves = {k: tuple((r, ms * factor) for r, ms in getattr(model, k)) for k in CURVE_KEYS}
    return replace(
        model,
        name=f"{model.name} x{factor:.3g}",
        step_ms=np.asarray(model.step_ms, dtype=np.float64) * factor,
        **{k: getattr(model, k) * factor for k in COST_KEYS},
        **curves,
    )

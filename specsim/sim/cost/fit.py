"""``profile fit``: a built profile anchored on the operator's own run without speculation.

Why: from public facts alone the no-speculation level of a deployment is what varies most
(every engine, kernel and driver version moves it), while the shape of a step (what a verify of
k + 1 tokens adds, what the drafter costs) follows the operators. So the built profile's free
terms are fitted to a few closed-loop benchmark runs without speculation, and the drafter,
which did not run, is left as built.

The model of a run (``predict_tpot``): in steady state each of the C requests in flight decodes
one token a step, and its prompt is prefilled once over its O output tokens, so a step holds
``B = C (1 + P / O)`` tokens (prompt chunks spread over the decode steps) and reads the KV of C
contexts of ``P + O / 2`` tokens on average. Mean TPOT is then the mean step:

    TPOT(C) = s * G(C) + a + b * C

with ``G`` the built profile's GPU time at that step (its table at B, KV read or attention
compute, sampling), ``a`` the engine's fixed cost a step and ``b`` its cost a request. The rule
(stated, fixed before any fit): least squares on TPOT relative to the measured (each point
weighs the same), s > 0 and a, b >= 0; two runs fit (s, a) with b as built, three or more fit
(s, a, b). Where that explains the runs no better than the refusal below (a base whose fixed
cost a step is above the server's: the torch engine's table anchored on llama-server, whose
first point is twice the server's whole step at 3 in flight), ``a`` may go below zero, with
``b`` as given (a table nearly straight in the requests leaves s, a and b one degree too
many), and the fitted profile subtracts it from its table, every point kept at 5% of the first
or above (a step cost cannot be negative in a profile). Added 6 Dec 2026 after that base was
refused (its first run), before any prediction was made with it.

Refused: fewer than two distinct concurrencies, and runs no profile of this deployment
explains (a residual over ``MAX_RESIDUAL`` on any run, or s outside ``S_RANGE``: the runs
disagree with each other or are not this deployment).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost.baseline import BaselinePoint
from specsim.sim.cost.model import CostModel

MAX_RESIDUAL = 0.25  # a run the fit misses by more than this is not this deployment's
S_RANGE = (0.2, 5.0)  # the built GPU time off by more than 5x: not this deployment


@dataclass(frozen=True)
class Fit:
    """The fitted terms beside what the build said, and each run's residual."""

    scale: float  # the built GPU time's factor (1: as built)
    step_ms: float  # fixed cost a step
    per_request_ms: float  # cost a request in the step
    built_step_ms: float
    built_per_request_ms: float
    points: tuple[BaselinePoint, ...]
    predicted_tpot_ms: tuple[float, ...]
    fitted: tuple[str, ...]  # which terms were fitted ("scale", "step", "per request")

    @property
    def residuals(self) -> np.ndarray:
        meas = np.array([p.mean_tpot_ms for p in self.points])
        return np.array(self.predicted_tpot_ms) / meas - 1.0

    def residual_text(self) -> str:
        r = np.abs(self.residuals)
        return f"median {100 * np.median(r):.1f}%, max {100 * r.max():.1f}% over {r.size} runs"


def gpu_ms(model: CostModel, p: BaselinePoint) -> float:
    """``G(C)``: the profile's GPU time of a steady step of run ``p`` (no engine terms): its
    table at the step's tokens (at the mean context, for a table measured against context),
    or at the decode tokens with the prompt tokens at ``prefill_token_ms`` where the profile
    charges them apart, the KV read or attention compute, and sampling."""
    c = float(p.concurrency)
    prompt = c * p.prompt_tokens / max(p.output_tokens, 1.0)  # prompt tokens a steady step
    per_seq = p.prompt_tokens + p.output_tokens / 2.0
    if model.prefill_token_ms:
        b, extra = c, model.prefill_token_ms * prompt
    else:
        b, extra = min(c + prompt, float(model.max_batched_tokens)), 0.0
    table = float(model.step_time(int(round(b)), per_seq)) * 1000.0
    kv = model.kv_read_us_per_ktoken * c * per_seq / 1e6
    attn = model.attn_us_per_qk_ktoken * c * per_seq / 1e6  # one query token a request
    return table + extra + max(kv, attn) + model.accept_per_token_ms * c


def predict_tpot(
    model: CostModel,
    p: BaselinePoint,
    scale: float = 1.0,
    step_ms: float | None = None,
    per_request_ms: float | None = None,
) -> float:
    """Mean TPOT (ms) of run ``p`` on ``model`` with the given terms (None: the model's)."""
    a = model.step_overhead_ms if step_ms is None else step_ms
    b = model.verify_per_request_ms if per_request_ms is None else per_request_ms
    return scale * gpu_ms(model, p) + a + b * p.concurrency


REFINE = 2  # replays of each run on the fitted profile, each refitting G from the simulator


def _solve(g: np.ndarray, meas: np.ndarray, c: np.ndarray, b0: float, below: bool = False
           ) -> tuple[float, float, float, tuple[str, ...]]:  # fmt: skip
    """The stated least squares: (scale, step, per request, which were fitted); ``below``:
    the step may be negative and the per-request cost stays as given (the module docstring's
    second rule)."""
    from scipy.optimize import lsq_linear

    w = 1.0 / meas  # relative errors
    if len(meas) >= 3 and not below:
        cols, names, target = [g, np.ones_like(g), c], ("scale", "step", "per request"), meas
    else:
        cols, names, target = [g, np.ones_like(g)], ("scale", "step"), meas - b0 * c
    a_mat = np.stack(cols, axis=1) * w[:, None]
    lo = [1e-6, -np.inf if below else 0.0] + [0.0] * (len(cols) - 2)
    sol = lsq_linear(a_mat, target * w, bounds=(lo, [np.inf] * len(cols))).x
    return float(sol[0]), float(sol[1]), float(sol[2]) if len(sol) > 2 else b0, names


def simulated_tpot(model: CostModel, p: BaselinePoint, seed: int = 0) -> float:
    """Mean TPOT (ms) the simulator gives run ``p`` on ``model``: a closed loop of C requests
    of P / O tokens without speculation (what the analytic mean step leaves out: prompt chunks
    bunched into some steps, the CUDA-graph staircase and the eager edge)."""
    from specsim.sim.simulate import replay
    from specsim.trace.synth import synth_trace

    n = max(64, 4 * p.concurrency)
    tr = synth_trace(n_requests=n, accept_profile=[0.5], prompt_len=[round(p.prompt_tokens)] * n,
                     output_len=[max(2, round(p.output_tokens))] * n, concentration=1.0,
                     seed=seed)  # fmt: skip
    res = replay(tr, "ar", concurrency=p.concurrency, requests=n, seed=seed, profile=model,
                 record_steps=False, record_tokens=False)  # fmt: skip
    return float(res.summary["tpot_ms_mean"])


def fit(model: CostModel, points: list[BaselinePoint], refine: int = REFINE) -> Fit:
    """The rule of the module docstring, or a one-line refusal naming the runs. The mean-step
    model gives a first fit; then ``refine`` times each run is replayed on the fitted profile
    and the GPU part the simulator charged replaces ``G`` in the same least squares."""
    if len({p.concurrency for p in points}) < 2:
        raise SpecsimError(
            "profile fit needs runs at two or more concurrencies (e.g. vllm bench serve "
            "--max-concurrency 1 and 32): one run cannot tell a fixed cost from a per-token one"
        )
    try:
        out = _fit(model, points, refine, below=False)
        _check(out)
        return out
    except SpecsimError as first:
        try:
            out = _fit(model, points, refine, below=True)
        except SpecsimError:
            raise first from None
        try:
            _check(out)
        except SpecsimError:
            raise first from None
        return out


def _fit(model: CostModel, points: list[BaselinePoint], refine: int, below: bool) -> Fit:
    meas = np.array([p.mean_tpot_ms for p in points])
    g = np.array([gpu_ms(model, p) for p in points])
    c = np.array([float(p.concurrency) for p in points])
    b0 = model.verify_per_request_ms
    scale, step, per_req, names = _solve(g, meas, c, b0, below)
    pred = scale * g + step + per_req * c
    for _ in range(refine):
        trial = _apply(model, scale, step, per_req)
        sim = np.array([simulated_tpot(trial, p) for p in points])
        # the simulator's G (a negative step is inside the trial's table: take it out too)
        g = np.maximum(sim - step - per_req * c, 1e-6) / scale
        scale, step, per_req, names = _solve(g, meas, c, b0, below)
        pred = scale * g + step + per_req * c
    return Fit(scale, step, per_req, model.step_overhead_ms, b0, tuple(points),
               tuple(float(x) for x in pred), names)  # fmt: skip


KEEP = 0.05  # a negative step leaves at least this share of the scaled table's first point


def _check(f: Fit) -> None:
    worst = int(np.argmax(np.abs(f.residuals)))
    if abs(f.residuals[worst]) > MAX_RESIDUAL:
        p = f.points[worst]
        raise SpecsimError(
            f"no profile of this deployment explains the runs: {p.source} ({p.describe()}) is "
            f"{100 * f.residuals[worst]:+.0f}% off the best fit; check that every run is this "
            "deployment without speculation (same model, GPUs, engine flags)"
        )
    if not S_RANGE[0] <= f.scale <= S_RANGE[1]:
        raise SpecsimError(
            f"the runs put this deployment's GPU time at x{f.scale:.2f} the built one, outside "
            f"{S_RANGE[0]:g}-{S_RANGE[1]:g}: check --model / --gpu / --tp against the runs"
        )


def _apply(model: CostModel, scale: float, step: float, per_req: float) -> CostModel:
    """``model`` with its GPU time scaled and the engine's terms replaced (meta unchanged). A
    measured overhead curve gives way to the fitted line (the runs say nothing of its shape
    between their concurrencies; ``fitted_profile`` says so). A negative step is taken off the
    table (a profile's step cost is not negative), floored at ``KEEP`` of its first point."""
    table = np.asarray(model.step_ms, dtype=np.float64) * scale
    if step < 0:
        table = np.maximum(table + step, KEEP * float(table.min()))
    return replace(
        model,
        step_ms=table,
        kv_read_us_per_ktoken=model.kv_read_us_per_ktoken * scale,
        attn_us_per_qk_ktoken=model.attn_us_per_qk_ktoken * scale,
        accept_per_token_ms=model.accept_per_token_ms * scale,
        prefill_token_ms=model.prefill_token_ms * scale,
        step_overhead_ms=max(step, 0.0),
        verify_per_request_ms=per_req,
        overhead_curve=(),
    )


def fitted_profile(model: CostModel, f: Fit) -> CostModel:
    """The built profile with the fitted terms: its table (the target's GPU work) scaled, the
    engine's step and per-request costs replaced; the drafter as built (it did not run). Its
    header says it was fitted, on what, and how well."""
    runs = "; ".join(p.describe() for p in f.points)
    meta = {
        **model.meta,
        "fitted": (
            f"profile fit on {len(f.points)} runs without speculation ({runs}): GPU time "
            f"x{f.scale:.3f} the built, step {f.step_ms:.3f} ms (built {f.built_step_ms:.3f}), "
            f"per request {f.per_request_ms * 1000:.1f} us (built "
            f"{f.built_per_request_ms * 1000:.1f}); fitted: {', '.join(f.fitted)}"
            + (
                "; the negative step taken off the table (the base's fixed cost a step is above "
                "the runs')"
                if f.step_ms < 0
                else ""
            )
            + "; the drafter "
            "as given"
            + (
                "; the measured overhead curve replaced by the fitted line"
                if model.overhead_curve
                else ""
            )
        ),
        "fit_residual": f"TPOT {f.residual_text()}",
        # the measured throughput a tune at one of these concurrencies is anchored on
        "baseline_tok_s": ";".join(f"{p.concurrency}:{p.output_tok_s:.6g}" for p in f.points),
        # the runs' mean prompt / output tokens: a trace far from them is warned about
        "baseline_lengths": f"{np.mean([p.prompt_tokens for p in f.points]):.6g}:"
        f"{np.mean([p.output_tokens for p in f.points]):.6g}",
    }
    return replace(_apply(model, f.scale, f.step_ms, f.per_request_ms), meta=meta)


__all__ = [
    "MAX_RESIDUAL", "S_RANGE", "Fit", "fit", "fitted_profile", "gpu_ms", "predict_tpot",
    "simulated_tpot",
]  # fmt: skip

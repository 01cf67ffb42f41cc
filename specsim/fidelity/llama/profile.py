"""A cost profile of llama-server, fitted on its own steps in calibration runs.

The steps come from :mod:`specsim.serve.llama_steps` (each step's end time, the requests it
decoded, the tokens each verified and emitted, the prompts it prefilled). A step's duration is
fitted, by least squares with Huber weights, as the simulator's serving model v2 composes a
step from a profile (``specsim.sim.serving``, ``CostModel.verify_s``):

    table(B, ctx) + prefill_token_ms * P + emit_ms[T] * E

- ``table(B, ctx) = t(B) + attn * B * ctx``: ``B`` the verified tokens (every decoding slot's
  sampled token and its drafts: each gets logits), ``t`` piecewise linear between knots
  (1, 2, 4, ..., the largest B seen), ``ctx`` the decoders' mean context (prompt + output so
  far): the attention each verified token does over its cache;
- ``P`` prompt tokens prefilled in the step (no logits but the last one's);
- no term per running request (the per-slot loop): without drafts every decoding request
  verifies one token, so R equals B and the two cannot be told apart; fitted together they
  traded a negative table against a large R term on small calibrations (the table, clamped
  at 0, then under-priced every step). Its cost is in the table's per-token slope;
- ``E`` decode tokens emitted, at temperature T: sampling and streaming. The server samples
  row by row and stops at the first draft its sample rejects
  (``common_sampler_sample_and_accept_n``), so a rejected draft costs its logits (in ``B``)
  but no sampling; T = 0 and T = 1 sample with different chains, so each has its own term;
- three speculative terms (:data:`V3_TERMS`, chosen on the tuning grid's calibration steps and
  then frozen, docs/llama-cpp.md "The serving model's terms"): ``spec_step`` per step with a
  decoder of a server started with speculation (the simulator's ``draft_base_ms``: the
  speculative path's own work, paid even when nothing is drafted), ``draft_token`` per
  verified DRAFT token beyond the table's price of a token (``verify_draft_token_ms``: 3.4 ms
  in that calibration, where a step verifying 12 tokens of 12 decoders took 75.8 ms and one of
  8.7 decoders with drafts 100.5 ms) and ``drafter_request`` per decoder of a draft-model
  setting (``draft_per_request_ms``: the drafter's forward for its block; 0 where no step of
  such a setting was calibrated);
- ``passes`` (among the terms, though no coefficient of its own): the table read at each
  forward pass the server cut the step's decoders into and summed, ``sum_u t(n_u)`` for
  ``t(B)`` (:mod:`specsim.sim.ubatch`, the profile's ``passes_by_slot``): llama-server with
  one KV stream per slot runs one pass per run of consecutive slots holding as many tokens
  each, so the same B costs one pass or several by which slots verify how many tokens; known
  from the server's log only (``--step-clock server``); the simulator places requests in
  slots to price it.

Two structural words of the terms (PLAN.md step 9; the tuning runs' rule kept ``no_context``,
not ``by_kind``): ``no_context``
drops the ``attn * B * ctx`` column (at this model's contexts, a few hundred tokens, a lone
decode's cost barely moves with its context, and the column's price came from the large passes
of the draft-model server); ``by_kind`` fits the target-only servers (``none``, ``ngram``) and
the draft-model servers (``dspark``: the drafter runs in every step and prefills every prompt
too) apart, each setting's profile from its own kind's steps (:func:`fit_kinds`).

A step with no decoder costs ``t`` at the first knot (what the simulator charges, its
``step_time(0)``). The fitted numbers become one :class:`specsim.sim.cost.model.CostModel` per
temperature: a 2-D table (rows at two contexts: linear in ctx, so the table is exact between
them), ``prefill_token_ms`` and ``emit_per_token_ms``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

# The speculative terms (config.TERMS), frozen before the v3 held-out grid (issue 48): each
# lowered the mean absolute leave-one-run-out error of the calibration runs' wall time (13.1%
# without them, 10.8% with spec_step, 9.4% with both; docs/llama-cpp.md); drafter_request is
# structural: the drafter's forward, fitted where draft-model settings are calibrated. A grid
# fits the ones its --terms names (v4: drafter_request only, reports/llama-cpp-v4/PLAN.md).
from specsim.fidelity.llama.config import STRUCTURAL, V3_TERMS

BASE_KNOTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTEXT_ROWS = (0.0, 8192.0)
HUBER_K = 1.5  # residuals beyond this many robust sd get less weight (VM hiccups)


@dataclass(frozen=True)
class StepFit:
    """The fitted step model (ms; ``attn_us`` in microseconds per verified token per context
    token) and how well it fits the calibration steps."""

    knots: tuple[int, ...]
    table_ms: tuple[float, ...]
    attn_us: float
    prefill_token_ms: float
    per_request_ms: float
    emit_ms: dict[float, float]
    spec_step_ms: float = 0.0
    draft_token_ms: float = 0.0
    drafter_request_ms: float = 0.0
    passes_by_slot: bool = False
    pass_extra_ms: float = 0.0
    steps: int = 0
    resid_sd_ms: float = float("nan")
    r2: float = float("nan")
    extra: dict[str, float] = field(default_factory=dict)


def knots_for(b_max: int) -> tuple[int, ...]:
    """The table's knots: powers of two below the largest verified batch, and it."""
    ks = [k for k in BASE_KNOTS if k < b_max]
    return (*ks, int(b_max)) if b_max > 1 else (1, 2)


def hat_basis(b: np.ndarray, knots: Sequence[int]) -> np.ndarray:
    """(n, len(knots)): linear interpolation weights of each B between the knots (the first
    value held below the first knot, the last segment extended beyond the last)."""
    k = np.asarray(knots, dtype=np.float64)
    x = np.asarray(b, dtype=np.float64)
    out = np.zeros((x.shape[0], k.shape[0]))
    for j in range(k.shape[0]):
        e = np.zeros(k.shape[0])
        e[j] = 1.0
        out[:, j] = np.interp(x, k, e)
        if j >= k.shape[0] - 2:  # linear extrapolation beyond the last knot
            slope = (e[-1] - e[-2]) / (k[-1] - k[-2])
            out[:, j] = np.where(x > k[-1], e[-1] + slope * (x - k[-1]), out[:, j])
    return out


def spec_kind(spec: str) -> str:
    """``none``, ``ngram`` or ``dspark``: the kind of a setting's name (``ngram:3`` -> ngram)."""
    return str(spec).strip().split(":")[0]


def term_columns(frame) -> dict[str, np.ndarray]:  # noqa: ANN001
    """The speculative terms' regressors (config.TERMS) of a step table with a ``spec``
    column: steps with a decoder on a speculating server, verified draft tokens (B minus the
    decoders' own tokens), decoders of a draft-model setting."""
    dec = frame["decoding"].to_numpy(np.float64)
    kind = np.array([spec_kind(s) for s in frame["spec"]]) if "spec" in frame else None
    speculating = (kind != "none") if kind is not None else np.zeros(dec.shape[0], bool)
    drafter = (kind == "dspark") if kind is not None else np.zeros(dec.shape[0], bool)
    drafts = np.where(dec > 0, frame["batch_tokens"].to_numpy(np.float64) - dec, 0.0)
    extra_passes = np.zeros(dec.shape[0])
    if "passes" in frame:  # each decoding step's passes after its first (pass_extra)
        from specsim.sim.ubatch import pass_sizes

        extra_passes = np.array([max(len(pass_sizes(t)) - 1, 0) if d > 0 else 0
                                 for t, d in zip(frame["passes"].tolist(), dec, strict=True)],
                                dtype=np.float64)  # fmt: skip
    return {
        "pass_extra": extra_passes,
        "spec_step": np.where(speculating & (dec > 0), 1.0, 0.0),
        "draft_token": np.maximum(drafts, 0.0),
        "drafter_request": np.where(drafter, dec, 0.0),
    }


def design(  # noqa: ANN001
    frame, knots: Sequence[int], temperatures: Sequence[float], terms: Sequence[str] = V3_TERMS
) -> np.ndarray:
    """The regression's columns for a step table (with a ``temperature`` column): hats of B
    (with ``passes`` in ``terms``: of each pass's tokens, summed), B * ctx, P, E at each
    temperature, then the speculative ``terms``."""
    b = frame["batch_tokens"].to_numpy(np.float64)
    dec = frame["decoding"].to_numpy() > 0
    b_eff = np.where(dec, b, float(knots[0]))
    ctx = np.where(dec, frame["ctx_mean"].to_numpy(np.float64), CONTEXT_ROWS[0])
    hats = hat_basis(b_eff, knots)
    if "passes" in terms:
        hats = _pass_hats(frame, knots, hats)
    context = np.zeros_like(b) if "no_context" in terms else b * ctx
    cols = [hats, context[:, None] * 1e-3]
    cols.append(frame["prefill_tokens"].to_numpy(np.float64)[:, None])
    temp = frame["temperature"].to_numpy(np.float64)
    e = frame["emitted"].to_numpy(np.float64)
    cols += [np.where(np.isclose(temp, t), e, 0.0)[:, None] for t in temperatures]
    extra = term_columns(frame)
    cols += [extra[name][:, None] for name in terms if name not in STRUCTURAL]
    return np.hstack(cols)


def _pass_hats(frame, knots: Sequence[int], hats: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """The table's columns of a step table read pass by pass: each decoding step's hats are
    the sum of its passes' (the ``passes`` column, :func:`specsim.sim.ubatch.pass_text`)."""
    from specsim.sim.ubatch import pass_sizes

    if "passes" not in frame:
        from specsim.errors import SpecsimError

        raise SpecsimError(
            "the step model 'passes' needs the server's own step table (its 'passes' column); "
            "calibrate with --step-clock server, or leave 'passes' out of --terms"
        )
    out = hats.copy()
    dec = frame["decoding"].to_numpy() > 0
    for i, text in enumerate(frame["passes"].tolist()):
        sizes = pass_sizes(text) if dec[i] else []
        if sizes:
            out[i] = hat_basis(np.asarray(sizes, dtype=np.float64), knots).sum(axis=0)
    return out


def fit_steps(  # noqa: ANN001
    frame, temperatures: Sequence[float] | None = None, terms: Sequence[str] = V3_TERMS
) -> StepFit:
    """Fit the step model on the steps with a known duration (ms)."""
    st = frame[np.isfinite(frame["duration_s"]) & (frame["duration_s"] > 0)]
    temps = tuple(sorted(set(st["temperature"]))) if temperatures is None else tuple(temperatures)
    knots = knots_for(int(st["batch_tokens"].max()))
    x = design(st, knots, temps, terms)
    y = st["duration_s"].to_numpy(np.float64) * 1000.0
    nk = len(knots)
    coef = _monotone_fit(x, y, nk) if "monotone" in terms else _costs_fit(x, y, nk)
    table = _fill_knots(knots, coef[:nk], x[:, :nk].any(axis=0))
    r = y - x @ coef
    at = nk + 2 + len(temps)
    term = {name: float(coef[at + i])
            for i, name in enumerate(t for t in terms if t not in STRUCTURAL)}  # fmt: skip
    return StepFit(
        knots=tuple(int(k) for k in knots),
        table_ms=tuple(float(v) for v in table),
        attn_us=float(coef[nk]),
        prefill_token_ms=float(coef[nk + 1]),
        per_request_ms=0.0,
        emit_ms={float(t): float(coef[nk + 2 + i]) for i, t in enumerate(temps)},
        spec_step_ms=term.get("spec_step", 0.0),
        draft_token_ms=term.get("draft_token", 0.0),
        drafter_request_ms=term.get("drafter_request", 0.0),
        passes_by_slot="passes" in terms,
        pass_extra_ms=term.get("pass_extra", 0.0),
        steps=int(y.shape[0]),
        resid_sd_ms=float(np.std(r)),
        r2=float(1.0 - np.var(r) / np.var(y)),
    )


def fit_kinds(  # noqa: ANN001
    frame, temperatures: Sequence[float] | None = None, terms: Sequence[str] = V3_TERMS
) -> dict[bool, StepFit]:
    """The step fit for the target-only servers (key False) and the draft-model ones (True):
    one fit of every step, or with ``by_kind`` in ``terms`` each kind's own steps (a kind with
    no calibration steps has no fit)."""
    if "by_kind" not in terms:
        fit = fit_steps(frame, temperatures, terms)
        return {False: fit, True: fit}
    drafter = np.array([spec_kind(s) == "dspark" for s in frame["spec"]])
    return {d: fit_steps(frame[drafter == d], temperatures, terms)
            for d in (False, True) if (drafter == d).any()}  # fmt: skip


def _costs_fit(x: np.ndarray, y: np.ndarray, nk: int) -> np.ndarray:
    """The Huber fit with the table's ``nk`` knots first; the terms after the table are costs,
    never savings: the most negative one (noise, or a term the calibration loads do not
    separate) is dropped and the rest refitted, in turn."""
    keep = x.any(axis=0)  # a knot no step reaches stays at 0 (then patched)
    coef = _huber(x, y, keep)
    for _ in range(x.shape[1] - nk):
        worst = int(np.argmin(coef[nk:]))
        if coef[nk + worst] >= 0:
            break
        keep[nk + worst] = False
        coef = _huber(x, y, keep)
    return coef


def _monotone_fit(x: np.ndarray, y: np.ndarray, nk: int) -> np.ndarray:
    """The Huber fit (IRLS) under the constraints the physics gives: the table's ``nk`` knots
    never fall as B grows (a forward of more tokens costs no less) and every other coefficient
    is a cost (>= 0). Why: fitted freely, the calibration's few large-B steps, all of them
    drafted steps whose time the speculative terms share, left tables that price 16 tokens
    below 8 and 48 at zero (held-out-6's profiles), so a step cut into passes was priced by
    noise (PLAN.md step 17: tied with the free fit on the tuning runs, whose tables rise; not
    kept). The table is ``t = L d`` with ``d >= 0`` (``L`` lower triangular ones), solved by
    non-negative least squares in each reweighting."""
    from scipy.optimize import nnls

    lower = np.tril(np.ones((nk, nk)))
    z = x.copy()
    z[:, :nk] = x[:, :nk] @ lower
    sol = _huber(z, y, z.any(axis=0), lambda a, b: nnls(a, b, maxiter=50 * x.shape[1])[0])
    coef = sol.copy()
    coef[:nk] = lower @ sol[:nk]
    return coef


def calibration_steps(frame, clock: str):  # noqa: ANN001, ANN201
    """The calibration's steps on ``clock``'s clock (``client`` or ``server``, a ``clock``
    column: ``--step-clock``); a table from before that column is the client's. Refused where
    the runs were not timed by that clock."""
    if "clock" not in frame:
        frame = frame.assign(clock="client")
    mine = frame[frame["clock"] == clock]
    if mine.empty:
        from specsim.errors import SpecsimError

        raise SpecsimError(
            f"the calibration steps have no {clock!r} clock's table; measure with --step-clock "
            f"{clock} or score with --step-clock {frame['clock'].iloc[0]}"
        )
    return mine.drop(columns="clock")


def calibration_loads(frame, cfg):  # noqa: ANN001, ANN201
    """The calibration steps of the loads ``cfg.calib_concurrency`` names: all that were
    measured, or, in a rescore, fewer (what one load adds to the fit, on the same runs).
    Refused where it names a load that was not measured."""
    want = set(cfg.calib_concurrency)
    have = set(int(c) for c in frame["concurrency"].unique())
    if not want <= have:
        from specsim.errors import SpecsimError

        raise SpecsimError(
            f"--calib-concurrency {','.join(map(str, sorted(want - have)))} was not measured "
            f"here (measured: {','.join(map(str, sorted(have)))}); name some of those"
        )
    return frame[frame["concurrency"].isin(sorted(want))]


def run_time_errors(frame, terms: Sequence[str] = V3_TERMS) -> dict[str, float]:  # noqa: ANN001
    """Leave-one-run-out: for each calibration run (setting, temperature, concurrency), the
    model fitted on the other runs' steps predicts the run's steps; the signed error of their
    summed time against the measured (``sum(pred) / sum(real) - 1``). Why the run's time: it
    is what throughput is scored on, and a term that only moves the robust fit of typical
    steps (the fit's residual) can still leave every run's total as wrong as before. The
    rule the serving model's terms were chosen by (:data:`V3_TERMS`)."""
    st = frame[np.isfinite(frame["duration_s"]) & (frame["duration_s"] > 0)].reset_index()
    temps = tuple(sorted(set(st["temperature"])))
    knots = knots_for(int(st["batch_tokens"].max()))
    x = design(st, knots, temps, terms)
    y = st["duration_s"].to_numpy(np.float64) * 1000.0
    run = (st["spec"].astype(str) + " T=" + st["temperature"].map("{:g}".format)
           + " C=" + st["concurrency"].astype(str)).to_numpy()  # fmt: skip
    out = {}
    for name in dict.fromkeys(run):
        m = run == name
        fit = _monotone_fit if "monotone" in terms else _costs_fit
        coef = fit(x[~m], y[~m], len(knots))
        out[str(name)] = float((x[m] @ coef).sum() / y[m].sum() - 1.0)
    return out


def _lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.linalg.lstsq(a, b, rcond=None)[0]


def _huber(
    x: np.ndarray,
    y: np.ndarray,
    keep: np.ndarray,
    solve: Callable[[np.ndarray, np.ndarray], np.ndarray] = _lstsq,
) -> np.ndarray:
    """Least squares of ``y`` on the kept columns of ``x``, Huber-weighted (IRLS); the other
    coefficients are 0. ``solve``: each reweighted problem's solver (default unconstrained;
    :func:`_monotone_fit` passes non-negative least squares)."""
    cols = np.flatnonzero(keep)
    coef = np.zeros(x.shape[1])
    w = np.ones(y.shape[0])
    for _ in range(20):
        sw = np.sqrt(w)
        coef[cols] = solve(x[:, cols] * sw[:, None], y * sw)
        r = y - x @ coef
        s = 1.4826 * np.median(np.abs(r - np.median(r))) or 1.0
        w = np.minimum(1.0, HUBER_K * s / np.maximum(np.abs(r), 1e-12))
    return coef


def _fill_knots(knots: Sequence[int], vals: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Knots no step reached take the line through their neighbours that were."""
    k = np.asarray(knots, dtype=np.float64)
    v = np.asarray(vals, dtype=np.float64).copy()
    if seen.sum() >= 2 and not seen.all():
        v[~seen] = np.interp(k[~seen], k[seen], v[seen])
    return v


def cost_model(fit: StepFit, temperature: float, name: str, limits: dict[str, int],
               meta: dict[str, str], drafter: bool = False):  # fmt: skip  # noqa: ANN201
    """The fit at ``temperature`` as the simulator's profile (``limits``: ``max_running``,
    ``kv_tokens``, ``max_batched_tokens``). ``drafter``: the profile of a draft-model
    setting (its drafter's forward per decoder charged); the speculative step and draft-token
    terms are charged only where a policy drafts (``ar``, the ``none`` setting, never does)."""
    from specsim.sim.cost.model import CostModel

    knots = np.asarray(fit.knots, dtype=np.int64)
    base = np.maximum(np.asarray(fit.table_ms), 1e-3)
    rows = np.stack([base + fit.attn_us * 1e-3 * knots * c for c in CONTEXT_ROWS])
    info = {
        "source": "measured by specsim validate --engine llama-server (calibration steps)",
        "fit_steps": str(fit.steps),
        "fit_resid_sd_ms": f"{fit.resid_sd_ms:.3f}",
        "fit_r2": f"{fit.r2:.4f}",
        "attn_us_per_token_ctx": f"{fit.attn_us:.6g}",
        "temperature": f"{temperature:g}",
        **meta,
    }
    return CostModel(
        name=name,
        batch_tokens=knots,
        step_ms=rows,
        context_tokens=np.asarray(CONTEXT_ROWS),
        # never 0: at 0 the simulator would price prompt tokens with the table, which was
        # fitted on decode tokens only; a dropped (0) term means "free beyond R's term"
        prefill_token_ms=max(fit.prefill_token_ms, 1e-6),
        verify_per_request_ms=max(fit.per_request_ms, 0.0),
        emit_per_token_ms=max(fit.emit_ms.get(float(temperature), 0.0), 0.0),
        draft_base_ms=max(fit.spec_step_ms, 0.0),
        draft_per_request_ms=max(fit.drafter_request_ms, 0.0) if drafter else 0.0,
        verify_draft_token_ms=max(fit.draft_token_ms, 0.0),
        passes_by_slot=int(fit.passes_by_slot),
        pass_extra_ms=max(fit.pass_extra_ms, 0.0) if fit.passes_by_slot else 0.0,
        meta=info,
        **limits,
    )

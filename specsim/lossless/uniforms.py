"""Integrate a verifier over its uniforms exactly.

A verifier's output is a piecewise-constant function of its uniforms: it compares u_k with an
acceptance ratio and turns v into a token by an inverse CDF. Cut each uniform's range [0, 1) at
every threshold such code can use (acceptance ratios, cumulative sums of p, q, the residual and
its unnormalised form, p without the rejected token), evaluate the verifier once at the centre of
every cell of the product grid (vectorised: one call), and weight by the cell volumes: that is
the exact law. A verifier with other thresholds is refused rather than mis-integrated: it is
evaluated again near both edges of every cell (1% in), and any change raises
:class:`NotPiecewiseConstant` (use the statistical check for such a verifier). A threshold within
1% of a cell edge can slip through this net; the statistical check still sees its effect.

A *block rule* is the whole verification of one block given the scheduler's length l::

    rule(p, q, x, l, u, v) -> (n_accepted, token)
    p: (N, gamma+1, V); q: (N, gamma, V); x, u: (N, gamma); v: (N,)

:func:`truncated` turns a verifier (protocol in :mod:`verifiers`) into the correct rule: it sees
only the first l positions and the bonus position l+1.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specsim.errors import SpecsimError

BlockRule = Callable[..., tuple[np.ndarray, np.ndarray]]
ONE_BELOW = float(np.nextafter(1.0, 0.0))
_PROBES = (0.5, 0.01, 0.99)  # centre, then near both edges: a hidden threshold shows
MERGE = 1e-11


class NotPiecewiseConstant(SpecsimError):
    """The verifier uses thresholds the exact integrator does not know; check it statistically."""


def truncated(verify: Callable) -> BlockRule:
    """The correct block rule: verify the first l drafts; position l+1 is the bonus position."""

    def rule(p, q, x, length, u, v):
        return verify(p[:, : length + 1], q[:, :length], x[:, :length], u[:, :length], v)

    rule.verifier = verify  # type: ignore[attr-defined]
    return rule


def _cdf_points(law: np.ndarray) -> list[float]:
    total = law.sum()
    if total <= 0:
        return []
    return list(np.cumsum(law)[:-1] / total) + list(np.cumsum(law)[:-1])


def block_breakpoints(
    p: np.ndarray, q: np.ndarray, x: np.ndarray, length: int
) -> tuple[list, list]:
    """Thresholds for the acceptance uniforms and for v, from one block's tables.

    p: (gamma+1, V), q: (gamma, V), x: (gamma,). Positions up to l+1 are used (l+1: the bonus
    position, and the draft at the cut, which a broken truncation may treat as rejected).
    """
    gamma = x.shape[0]
    reach = min(length + 1, gamma)
    u_thr: list[float] = []
    v_thr: list[float] = []
    for k in range(reach):
        px, qx = p[k, x[k]], q[k, x[k]]
        u_thr.append(min(1.0, px / qx) if qx > 0 else 1.0)
        resid = np.maximum(p[k] - q[k], 0.0)
        no_x = p[k].copy()
        no_x[x[k]] = 0.0
        for law in (q[k], resid, no_x):
            v_thr += _cdf_points(law)
    for k in range(min(length + 2, gamma + 1)):
        v_thr += _cdf_points(p[k])
    return u_thr, v_thr


def multi_breakpoints(p: np.ndarray, q: np.ndarray, xs: np.ndarray) -> tuple[list, list]:
    """Thresholds for a multi-draft verifier: the i.i.d. (SpecInfer) and the without-replacement
    residual chains, and the raw ratios. p, q: (V,), xs: (k,)."""
    u_thr: list[float] = []
    v_thr: list[float] = _cdf_points(p) + _cdf_points(q)
    for without in (False, True):
        cur_p, cur_q = p.copy(), q.copy()
        for x in xs:
            qx = cur_q[x]
            u_thr += [min(1.0, cur_p[x] / qx) if qx > 0 else 1.0, min(1.0, p[x] / q[x])]
            resid = np.maximum(cur_p - cur_q, 0.0)
            if resid.sum() > 0:
                cur_p = resid / resid.sum()
            if without:
                cur_q = cur_q.copy()
                cur_q[x] = 0.0
                if cur_q.sum() > 0:
                    cur_q = cur_q / cur_q.sum()
            v_thr += _cdf_points(cur_p) + _cdf_points(resid)
    return u_thr, v_thr


def _cells(thresholds: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Left edges and widths of the cells that ``thresholds`` cut [0, 1) into."""
    thr = np.unique([t for t in thresholds if MERGE < t < 1.0 - MERGE])
    # Thresholds closer than MERGE are one (the same number computed two ways, e.g. a CDF point
    # and its normalised twin): a cell that thin holds < 1e-11 of mass, far below TOLERANCE.
    keep = np.concatenate(([True], np.diff(thr) > MERGE)) if thr.size else thr.astype(bool)
    edges = np.concatenate(([0.0], thr[keep], [1.0]))
    return edges[:-1], np.diff(edges)


def _grid(n_u: int, u_thr: list, v_thr: list, n_cols: int):
    """Product grid over n_u acceptance uniforms (the rest fixed) and v.

    Returns a function probe(frac) -> (u (N, n_cols), v (N,)) and the (N,) cell volumes.
    """
    u_lo, u_w = _cells(u_thr)
    v_lo, v_w = _cells(v_thr)
    axes_lo = [u_lo] * n_u + [v_lo]
    axes_w = [u_w] * n_u + [v_w]
    lo = np.meshgrid(*axes_lo, indexing="ij")
    w = np.meshgrid(*axes_w, indexing="ij")
    lo = [a.ravel() for a in lo]
    w = [a.ravel() for a in w]
    volume = np.prod(np.stack(w), axis=0)

    def probe(frac: float) -> tuple[np.ndarray, np.ndarray]:
        pts = [a + frac * b for a, b in zip(lo, w, strict=True)]
        u = np.full((volume.shape[0], n_cols), 0.5)
        for k in range(n_u):
            u[:, k] = pts[k]
        return u, pts[-1]

    return probe, volume


def _evaluate(fn: Callable, probe, what: str) -> list:
    outs = []
    for frac in _PROBES:
        out = fn(*probe(frac))
        outs.append(out)
    base = outs[0]
    for other in outs[1:]:
        for a, b in zip(base, other, strict=True):
            if not np.array_equal(a, b):
                raise NotPiecewiseConstant(
                    f"{what} changes its output inside a cell of the exact integration grid "
                    "(it compares uniforms with thresholds other than acceptance ratios and "
                    "inverse-CDF points); use the statistical check for it"
                )
    return base


def block_law(
    rule: BlockRule, p: np.ndarray, q: np.ndarray, x: np.ndarray, length: int, extra=None
) -> np.ndarray:
    """Exact law of (n_accepted, token) for one block, as an (length+1, V) array.

    p: (gamma+1, V), q: (gamma, V), x: (gamma,) the block's tables and drafts; ``length``: how many
    drafts the scheduler verifies. ``extra(p, q, x) -> (u_thr, v_thr)`` adds a rule's own
    thresholds.
    """
    gamma, vocab = x.shape[0], p.shape[1]
    u_thr, v_thr = block_breakpoints(p, q, x, length)
    if extra is not None:
        eu, ev = extra(p, q, x)
        u_thr, v_thr = u_thr + list(eu), v_thr + list(ev)
    probe, volume = _grid(length, u_thr, v_thr, gamma)
    n_pts = volume.shape[0]
    # Real copies, not broadcast views: a verifier may write to its inputs (or hand them to torch).
    pb = np.broadcast_to(p, (n_pts, *p.shape)).copy()
    qb = np.broadcast_to(q, (n_pts, *q.shape)).copy()
    xb = np.broadcast_to(x, (n_pts, gamma)).copy()

    def call(u, v):
        n, tok = rule(pb, qb, xb, length, u, v)
        return check_block_output(n, tok, n_pts, length, vocab, "verifier")

    n, tok = _evaluate(call, probe, "the verifier")
    law = np.zeros((length + 1, vocab))
    np.add.at(law, (n, tok), volume)
    return law


def multi_law(verify: Callable, p: np.ndarray, q: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Exact law (V,) of a multi-draft verifier's token for fixed candidates xs (k,)."""
    u_thr, v_thr = multi_breakpoints(p, q, xs)
    k, vocab = xs.shape[0], p.shape[0]
    probe, volume = _grid(k, u_thr, v_thr, k)
    n_pts = volume.shape[0]
    pb = np.broadcast_to(p, (n_pts, vocab)).copy()
    qb = np.broadcast_to(q, (n_pts, vocab)).copy()
    xb = np.broadcast_to(xs, (n_pts, k)).copy()

    def call(u, v):
        tok = np.asarray(verify(pb, qb, xb, u, v))
        if tok.shape != (n_pts,) or tok.min() < 0 or tok.max() >= vocab:
            raise SpecsimError(
                f"multi-draft verifier returned {tok.shape} tokens or ids outside [0, {vocab}); "
                "return one token id per case"
            )
        return (tok,)

    (tok,) = _evaluate(call, probe, "the multi-draft verifier")
    return np.bincount(tok, weights=volume, minlength=vocab)


def check_block_output(n, tok, n_cases: int, length: int, vocab: int, what: str):
    """Shapes and ranges of a verifier's (n_accepted, token), or a one-line error."""
    n = np.asarray(n)
    tok = np.asarray(tok)
    if n.shape != (n_cases,) or tok.shape != (n_cases,):
        raise SpecsimError(
            f"{what} returned shapes {n.shape} and {tok.shape}, expected ({n_cases},) each: "
            "(n_accepted, token) per case"
        )
    if not (np.issubdtype(n.dtype, np.integer) and np.issubdtype(tok.dtype, np.integer)):
        raise SpecsimError(f"{what} must return integer arrays (n_accepted, token)")
    if n_cases and (n.min() < 0 or n.max() > length):
        raise SpecsimError(f"{what} returned n_accepted outside [0, {length}]")
    if n_cases and (tok.min() < 0 or tok.max() >= vocab):
        raise SpecsimError(f"{what} returned token ids outside [0, {vocab})")
    return n.astype(np.int64), tok.astype(np.int64)


def edge_uniform_outputs(rule: BlockRule, p, q, x, length: int):
    """The rule's output at the extreme uniforms 0.0 and 1 - 2^-53 (every corner), which real
    fp32/fp64 generators do produce: (n, token) arrays over the 2^(length+1) corners."""
    gamma = x.shape[0]
    corners = np.array(np.meshgrid(*[[0.0, ONE_BELOW]] * (length + 1), indexing="ij"))
    corners = corners.reshape(length + 1, -1).T
    n_pts = corners.shape[0]
    u = np.full((n_pts, gamma), 0.5)
    u[:, :length] = corners[:, :length]
    v = corners[:, -1]
    n, tok = rule(
        np.broadcast_to(p, (n_pts, *p.shape)).copy(),
        np.broadcast_to(q, (n_pts, *q.shape)).copy(),
        np.broadcast_to(x, (n_pts, gamma)).copy(),
        length,
        u,
        v,
    )
    return check_block_output(n, tok, n_pts, length, p.shape[1], "verifier")

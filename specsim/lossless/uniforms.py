"""Integrate a verifier over its uniforms exactly, by finding every breakpoint of its output.

A verifier's output is a function of its uniforms (u_1..u_l, v). The exact check proves its
integral instead of trusting a list of thresholds:

1. **Seeds.** Thresholds such code usually uses (acceptance ratios for u_k; CDF points of p, q,
   the residual and p without the rejected token for v) cut each axis into cells. They only
   guarantee that narrow regions (a token of mass 1e-7) get a line through them.
2. **Scan.** Along every axis, on lines through the centres of the other axes' cells, the output
   is evaluated on a regular grid of ``1 / RESOLUTION`` spacing (seeded offset) plus both ends
   (0.0 and 1 - 2^-53). Every change between neighbours is **bisected to adjacent doubles** and
   becomes a breakpoint; if the code right after it is not the code at the far end, the rest of
   the interval is bisected again (a band narrower than the grid spacing between two points that
   differ is found whole). Scans repeat with the refined cells until no breakpoint is new.
3. **Prove.** On the product grid of all breakpoints, the output is evaluated at every cell centre
   and at :data:`PROBES` seeded random points per cell. If every cell is constant, the law is the
   sum of cell volumes per output: exact up to rounding. If not (a boundary that is not
   axis-aligned, e.g. ``u + v < 1``, or features that kept moving), :class:`NotPiecewiseConstant`
   is raised: the check says it cannot prove, and the statistical check speaks instead.

What "proven" assumes, stated: a region of the output narrower than the scan spacing (2^-10 along
v, 2^-8 along u) that no seed points at, lying between two scan points with equal outputs on
every scanned line, and missed by the per-cell probes, can escape. Every test mutant (bands of
width 1e-3 inside cells, rounded uniforms, a token flipped when v < 1e-3) is found.

A *block rule* is the whole verification of one block given the scheduler's length l::

    rule(p, q, x, l, u, v) -> (n_accepted, token)
    p: (N, gamma+1, V); q: (N, gamma, V); x, u: (N, gamma); v: (N,)

:func:`truncated` turns a verifier (protocol in :mod:`verifiers`) into the correct rule: it sees
only the first l positions and the bonus position l+1.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from specsim.errors import SpecsimError

BlockRule = Callable[..., tuple[np.ndarray, np.ndarray]]
ONE_BELOW = float(np.nextafter(1.0, 0.0))
RESOLUTION_V = 1024  # scan points along v per line (a 1e-3 band always holds one)
RESOLUTION_U = 256  # scan points along each acceptance uniform per line
MAX_LINES_U = 12  # lines per acceptance axis and block (seeded choice when there are more)
MAX_LINES_V = 64
PROBES = 2  # seeded random points per final cell, besides its centre
MAX_ROUNDS = 3
CHUNK = 1 << 17
NEW = 1e-12  # a breakpoint farther than this from every known edge is new
TINY = 2.0**-62  # bisection stops here: far below any mass the 1e-9 tolerance sees
SLIVER = 1e-12  # cells narrower than this are not probed (no interior at fp64)
MAX_CHANGES = 96  # changes along one scanned line beyond which no proof is attempted
MAX_BANDS = 8  # breakpoints resolved between two neighbouring scan points


class CannotProve(SpecsimError):
    """The exact check cannot prove this pipeline's law (the statistical check speaks instead)."""


class NotPiecewiseConstant(CannotProve):
    """The exact integrator cannot prove the verifier's law; check it statistically."""


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


def block_seeds(p: np.ndarray, q: np.ndarray, x: np.ndarray, length: int) -> list[list[float]]:
    """Seed thresholds per axis (u_1..u_l, then v) from one block's tables.

    p: (gamma+1, V), q: (gamma, V), x: (gamma,). v also gets the laws at position l+1 (the bonus,
    and the draft at the cut, which a broken truncation may treat as rejected).
    """
    gamma = x.shape[0]
    axes: list[list[float]] = []
    v_thr: list[float] = []
    for k in range(min(length + 1, gamma)):
        px, qx = p[k, x[k]], q[k, x[k]]
        if k < length:
            axes.append([min(1.0, px / qx) if qx > 0 else 1.0])
        resid = np.maximum(p[k] - q[k], 0.0)
        no_x = p[k].copy()
        no_x[x[k]] = 0.0
        for law in (q[k], resid, no_x):
            v_thr += _cdf_points(law)
    for k in range(min(length + 2, gamma + 1)):
        v_thr += _cdf_points(p[k])
    return [*axes, v_thr]


def multi_seeds(p: np.ndarray, q: np.ndarray, xs: np.ndarray) -> list[list[float]]:
    """Seeds for a multi-draft verifier (u_1..u_k, v): the i.i.d. (SpecInfer) and the
    without-replacement residual chains, and the raw ratios. p, q: (V,), xs: (k,)."""
    u_thr: list[list[float]] = [[] for _ in xs]
    v_thr: list[float] = _cdf_points(p) + _cdf_points(q)
    for without in (False, True):
        cur_p, cur_q = p.copy(), q.copy()
        for i, x in enumerate(xs):
            qx = cur_q[x]
            u_thr[i] += [min(1.0, cur_p[x] / qx) if qx > 0 else 1.0, min(1.0, p[x] / q[x])]
            resid = np.maximum(cur_p - cur_q, 0.0)
            if resid.sum() > 0:
                cur_p = resid / resid.sum()
            if without:
                cur_q = cur_q.copy()
                cur_q[x] = 0.0
                if cur_q.sum() > 0:
                    cur_q = cur_q / cur_q.sum()
            v_thr += _cdf_points(cur_p) + _cdf_points(resid)
    return [*u_thr, v_thr]


def _edges(thresholds) -> np.ndarray:
    """Sorted cell edges in [0, 1], both ends included."""
    t = np.asarray(list(thresholds), dtype=np.float64)
    t = t[(t > 0.0) & (t < 1.0)]
    return np.unique(np.concatenate(([0.0, 1.0], t)))


def _centres(edges: np.ndarray) -> np.ndarray:
    return (edges[:-1] + np.diff(edges) / 2)[np.diff(edges) > 0]


class _Integrator:
    """Breakpoint search and exact integration for B blocks sharing a dimension D.

    ``fn(block (N,), points (N, D)) -> (N,) int codes``: the output, one integer per case.
    """

    def __init__(self, fn, seeds: list[list], n_dims: int, salt: int):
        self.fn = fn
        self.d = n_dims
        self.edges = [[_edges(s) for s in blk] for blk in seeds]
        self.rng = np.random.default_rng([20261201, n_dims, salt])

    def eval(self, block: np.ndarray, pts: np.ndarray) -> np.ndarray:
        out = np.empty(block.shape[0], dtype=np.int64)
        for s in range(0, block.shape[0], CHUNK):
            out[s : s + CHUNK] = self.fn(block[s : s + CHUNK], pts[s : s + CHUNK])
        return out

    def _lines(self, axis: int) -> tuple[np.ndarray, np.ndarray]:
        """(block (L,), points (L, D)) of the lines along ``axis`` (its coordinate left 0)."""
        cap = MAX_LINES_V if axis == self.d - 1 else MAX_LINES_U
        blocks, pts = [], []
        for b, edges in enumerate(self.edges):
            others = [_centres(e) for j, e in enumerate(edges) if j != axis]
            combos = np.array(list(itertools.product(*others)), dtype=np.float64)
            combos = combos.reshape(len(combos), self.d - 1)
            if combos.shape[0] > cap:
                combos = combos[np.sort(self.rng.choice(combos.shape[0], cap, replace=False))]
            full = np.insert(combos, axis, 0.0, axis=1)
            blocks.append(np.full(full.shape[0], b))
            pts.append(full)
        return np.concatenate(blocks), np.concatenate(pts)

    def scan(self, axis: int) -> bool:
        """Scan every block along ``axis``; add the breakpoints; True if any is new."""
        res = RESOLUTION_V if axis == self.d - 1 else RESOLUTION_U
        grid = (self.rng.random() + np.arange(res)) / res
        grid = np.concatenate(([0.0], grid, [ONE_BELOW]))
        line_b, line_pts = self._lines(axis)
        # Each line also visits the centre of every cell its block has along this axis: a band
        # between two grid points that a seed already bounds is then never skipped over.
        cents = [_centres(e[axis]) for e in self.edges]
        own = np.full((len(cents), max(map(len, cents))), ONE_BELOW)
        for b, c in enumerate(cents):
            own[b, : len(c)] = c
        grid = np.sort(np.concatenate([np.broadcast_to(grid, (line_b.shape[0], grid.shape[0])),
                                       own[line_b]], axis=1), axis=1)  # fmt: skip
        n_l, n_g = grid.shape
        pts = np.repeat(line_pts, n_g, axis=0)
        pts[:, axis] = grid.ravel()
        codes = self.eval(np.repeat(line_b, n_g), pts).reshape(n_l, n_g)
        changes = codes[:, 1:] != codes[:, :-1]
        if changes.sum(axis=1).max(initial=0) > MAX_CHANGES:
            raise NotPiecewiseConstant(
                f"the verifier's output changes more than {MAX_CHANGES} times along one uniform "
                "(not a threshold rule); the exact check cannot prove it: use the statistical check"
            )
        li, gi = np.nonzero(changes)
        found = self._bisect(axis, line_b[li], line_pts[li], grid[li, gi], grid[li, gi + 1],
                             codes[li, gi], codes[li, gi + 1])  # fmt: skip
        new = False
        for b, bps in found.items():
            old = self.edges[b][axis]
            bps = np.asarray(bps)
            dist = np.min(np.abs(bps[:, None] - old[None, :]), axis=1)
            new |= bool((dist > NEW).any())
            self.edges[b][axis] = np.unique(np.concatenate((old, bps)))
        return new

    def _bisect(self, axis, blk, base, lo, hi, c_lo, c_hi) -> dict[int, list[float]]:
        """Bisect every (lo, hi) whose outputs differ until hi - lo <= 2^-62 (below any mass
        that matters); an interval whose code right after the breakpoint is not its far end's
        holds another breakpoint and is searched again from there."""
        found: dict[int, list[float]] = {}
        end, c_end = hi.copy(), c_hi.copy()
        for _ in range(MAX_BANDS):  # each pass finds the next breakpoint of every open interval
            if lo.size == 0:
                return found
            lo, hi, c_lo, c_at = lo.copy(), end.copy(), c_lo.copy(), c_end.copy()
            for _ in range(80):
                mid = lo + (hi - lo) / 2
                open_ = (hi - lo > TINY) & (mid > lo) & (mid < hi)
                if not open_.any():
                    break
                idx = np.flatnonzero(open_)
                pts = base[idx].copy()
                pts[:, axis] = mid[idx]
                c_mid = self.eval(blk[idx], pts)
                same = c_mid == c_lo[idx]
                lo[idx[same]] = mid[idx[same]]
                hi[idx[~same]] = mid[idx[~same]]
                c_at[idx[~same]] = c_mid[~same]
            for b, h in zip(blk.tolist(), hi.tolist(), strict=True):
                found.setdefault(b, []).append(h)
            more = c_at != c_end  # another breakpoint between this one and the far end
            blk, base, lo, c_lo = blk[more], base[more], hi[more], c_at[more]
            end, c_end = end[more], c_end[more]
        if lo.size:
            raise NotPiecewiseConstant(
                f"the verifier's output changes more than {MAX_BANDS} times between two scan "
                "points; the exact check cannot resolve it: use the statistical check for it"
            )
        return found

    def integrate(self, n_codes: int) -> np.ndarray:
        """(B, n_codes) exact law after scanning to a fixed point; raises if not provable."""
        for _ in range(MAX_ROUNDS):
            new = False
            for axis in range(self.d):
                new |= self.scan(axis)
            if not new:
                break
        blocks, lo, width = [], [], []
        for b, edges in enumerate(self.edges):
            lows = [e[:-1][np.diff(e) > 0] for e in edges]
            wids = [np.diff(e)[np.diff(e) > 0] for e in edges]
            lo_b = np.array(list(itertools.product(*lows)), dtype=np.float64)
            wi_b = np.array(list(itertools.product(*wids)), dtype=np.float64)
            blocks.append(np.full(lo_b.shape[0], b))
            lo.append(lo_b)
            width.append(wi_b)
        blk, lo_a, wid = np.concatenate(blocks), np.concatenate(lo), np.concatenate(width)
        centre = self.eval(blk, lo_a + wid / 2)
        # Slivers (two ways of computing one threshold, 1 ulp apart) hold < 1e-12 of mass each
        # and have no interior to probe.
        wide = np.flatnonzero(wid.min(axis=1) > SLIVER)
        for _ in range(PROBES):
            frac = self.rng.random((wide.shape[0], self.d))
            probe = self.eval(blk[wide], lo_a[wide] + frac * wid[wide])
            if not np.array_equal(probe, centre[wide]):
                raise NotPiecewiseConstant(
                    "the verifier's output is not constant on the cells of the breakpoints "
                    "found along each uniform (a boundary that is not axis-aligned, or one the "
                    "scans missed); the exact check cannot prove it: use the statistical check"
                )
        law = np.zeros((len(self.edges), n_codes))
        np.add.at(law, (blk, centre), np.prod(wid, axis=1))
        return law


def block_laws(
    rule: BlockRule,
    p: np.ndarray,
    q: np.ndarray,
    x: np.ndarray,
    length: int,
    extra: Callable | None = None,
) -> np.ndarray:
    """Exact laws of (n_accepted, token) for B blocks verified at the same ``length``.

    p: (B, gamma+1, V), q: (B, gamma, V), x: (B, gamma). Returns (B, length+1, V).
    ``extra(p, q, x) -> (u_thr, v_thr)`` adds a rule's own seed thresholds.
    """
    n_blk, gamma = x.shape
    vocab = p.shape[2]
    seeds = []
    for b in range(n_blk):
        s = block_seeds(p[b], q[b], x[b], length)
        if extra is not None:
            eu, ev = extra(p[b], q[b], x[b])
            s = [list(a) + list(eu) for a in s[:-1]] + [s[-1] + list(ev)]
        seeds.append(s)

    def fn(blk: np.ndarray, pts: np.ndarray) -> np.ndarray:
        n_pts = blk.shape[0]
        u = np.full((n_pts, gamma), 0.5)
        u[:, :length] = pts[:, :length]
        n, tok = rule(p[blk], q[blk], x[blk], length, u, pts[:, length].copy())
        n, tok = check_block_output(n, tok, n_pts, length, vocab, "verifier")
        return n * vocab + tok

    salt = int(abs(hash((length, n_blk, float(p.sum())))) % (1 << 31))
    law = _Integrator(fn, seeds, length + 1, salt).integrate((length + 1) * vocab)
    return law.reshape(n_blk, length + 1, vocab)


def block_law(
    rule: BlockRule, p: np.ndarray, q: np.ndarray, x: np.ndarray, length: int, extra=None
) -> np.ndarray:
    """Exact law of (n_accepted, token) for one block, as an (length+1, V) array."""
    return block_laws(rule, p[None], q[None], x[None], length, extra)[0]


def multi_law(verify: Callable, p: np.ndarray, q: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Exact law (V,) of a multi-draft verifier's token for fixed candidates xs (k,)."""
    k, vocab = xs.shape[0], p.shape[0]

    def fn(blk: np.ndarray, pts: np.ndarray) -> np.ndarray:
        n_pts = blk.shape[0]
        tok = np.asarray(
            verify(
                np.broadcast_to(p, (n_pts, vocab)).copy(),
                np.broadcast_to(q, (n_pts, vocab)).copy(),
                np.broadcast_to(xs, (n_pts, k)).copy(),
                pts[:, :k].copy(),
                pts[:, k].copy(),
            )
        )
        if tok.shape != (n_pts,) or (n_pts and (tok.min() < 0 or tok.max() >= vocab)):
            raise SpecsimError(
                f"multi-draft verifier returned {tok.shape} tokens or ids outside [0, {vocab}); "
                "return one token id per case"
            )
        return tok.astype(np.int64)

    return _Integrator(fn, [multi_seeds(p, q, xs)], k + 1, int(xs.sum())).integrate(vocab)[0]


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

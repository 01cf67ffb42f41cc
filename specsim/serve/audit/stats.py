"""The statistics of a server audit: each emitted token scored against the reference law.

Why this design (docs/losslessness.md, "Auditing a running server"): the reference server (the
same model, speculation off) reports, for every position of what the audited server emitted,
the law its sampler chain draws from there (top-K post-sampling probabilities, the rest lumped
as one tail). Under the null (the audited server keeps the model's law) the emitted token x_t
has that law given everything before it, whatever the history, by the chain rule. Two checks
use it, each a G-test from :mod:`specsim.lossless.stats`:

- **rank cells**: the reference rank of x_t (1, 2, 3, 4-5, 6-10, 11-K, unreported tail), counted
  per *stratum* of positions chosen from the past only (the reference's top-1 probability, and,
  where the server exposes it, the position's place in a speculative step: plain, first or
  later in a step, or first after a step that rejected a draft), against the sum of
  the reference's cell probabilities over the stratum's positions. Each position has its own
  law, so the counts are a sum of independent-given-the-past categoricals, not a multinomial:
  their covariance, sum_t (diag pi_t - pi_t pi_t'), is below the multinomial one at the pooled
  law (Cauchy-Schwarz), so the G-test is conservative (Hoeffding's bound for the binary case);
  the tests below and the real lossless audits check it at the 1e-6 tail. Most power per token:
  a bug that moves a little mass onto an unlikely rank shows against a small expectation.
- **top-1** (issue 46: more power where bugs live): per stratum, the count of tokens the
  reference ranks first against its expectation sum_t p1_t. Under the null the difference is a
  martingale with increments in [-1, 1] and predictable variance V = sum_t p1_t (1 - p1_t), so
  Freedman's inequality bounds its tails; a peeling over V (geometric bins; each bound taken at
  twice the bin's floor, so at 2V) makes the p-value valid whatever V turns out to be. One
  degree of freedom per stratum instead of the rank cells' dozens: a bug that moves a little mass
  off the argmax (a swap to the second token, a temperature slip) where the law is peaked is
  seen with far fewer positions.
- **PIT**: the randomised probability integral transform u_t = F_t(x_t-) + v p_t(x_t) (tokens in
  the reference order, the tail as one interval) is exactly i.i.d. uniform under the null, so its
  20-bin histogram is an exact multinomial: a check whose null needs no argument.

Sequential: looks at 1,024 x 2^j positions (j = 0, 1, ...), fixed in advance, so a run with a
budget in tokens or minutes and a run resumed from its state file look at the same points; look
k (1-based) of a check spends alpha_run / n_checks / (k (k + 1)) (the sum over every look ever
taken is alpha_run = 1e-6 per run, Bonferroni, whatever the budget). The floor: the TV of the
rank-cell law within strata (a shift of TV eps in every stratum, the strata's shares fixed: the
G-test conditions on them) that the last look detects with 99% power in the least favourable
direction (noncentral chi-square, noncentrality 4 n eps^2, as the rest of the suite).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specsim.lossless.stats import ALPHA_RUN, GTest, detectable_tv, effective_df, g_test

RANK_EDGES = (1, 2, 3, 5, 10)  # cells: ranks 1 | 2 | 3 | 4-5 | 6-10 | 11-K | unreported tail
CELL_NAMES = ("rank 1", "rank 2", "rank 3", "rank 4-5", "rank 6-10", "rank 11+", "tail")
N_CELLS = len(CELL_NAMES)
TAIL = N_CELLS - 1
TOP1_EDGES = (0.6, 0.9, 0.99)  # strata by the reference's top-1 probability
ROLES = ("plain", "step-first", "step-later", "after-rejection")  # place in a speculative step
N_STRATA = len(ROLES) * (len(TOP1_EDGES) + 1)
PIT_BINS = 20
SLACK = 1e-6  # tail mass a fully reported law still gets: a token just outside a top-k/top-p
# boundary because of arithmetic noise is not a proof of loss; many of them are
FIRST_LOOK = 1024
CHECKS = ("rank", "pit", "top1")


def stratum_name(s: int) -> str:
    role, b = divmod(s, len(TOP1_EDGES) + 1)
    lo = 0.0 if b == 0 else TOP1_EDGES[b - 1]
    hi = 1.0 if b == len(TOP1_EDGES) else TOP1_EDGES[b]
    return f"{ROLES[role]}, top-1 in [{lo:g}, {hi:g})"


def cell_law(probs: np.ndarray, complete: bool) -> np.ndarray:
    """The law of the rank cell at one position from its reported probabilities (sorted,
    descending). ``complete``: the report holds the whole support (the tail gets SLACK only)."""
    return cell_laws(np.asarray(probs, dtype=np.float64)[None, :], np.array([complete]))[0]


def cell_laws(probs: np.ndarray, complete: np.ndarray) -> np.ndarray:
    """``cell_law`` of many positions: (n, K) reported probabilities (rows descending, zeros
    past a short report) -> (n, N_CELLS)."""
    p = np.asarray(probs, dtype=np.float64)
    cum = np.concatenate([np.zeros((p.shape[0], 1)), np.cumsum(p, axis=1)], axis=1)
    k = p.shape[1]
    bounds = np.minimum((0, *RANK_EDGES, k), k)
    law = np.zeros((p.shape[0], N_CELLS))
    law[:, :TAIL] = cum[:, bounds[1:]] - cum[:, bounds[:-1]]
    rest = np.where(np.asarray(complete, dtype=bool), 0.0, np.maximum(1.0 - cum[:, -1], 0.0))
    law[:, TAIL] = rest + SLACK
    return law / law.sum(axis=1, keepdims=True)


def cell_of(rank: int | None) -> int:
    """Cell of a 0-based reference rank (None: not among the reported tokens)."""
    if rank is None:
        return TAIL
    return int(np.searchsorted(RANK_EDGES, rank, side="right"))


def pit(probs: np.ndarray, rank: int | None, complete: bool, v: float) -> float:
    """Randomised PIT of the emitted token: uniform on its interval of the reference law."""
    p = np.asarray(probs, dtype=np.float64)
    total = float(p.sum())
    tail = 0.0 if complete else max(1.0 - total, 0.0)
    scale = total + tail
    if rank is None:
        if tail <= 0.0:  # outside a complete support: the last bin (and the rank check's tail)
            return 1.0 - 1e-12
        return (total + v * tail) / scale
    return float((p[:rank].sum() + v * p[rank]) / scale)


def stratum_of(top1: float, role: int) -> int:
    return role * (len(TOP1_EDGES) + 1) + int(np.searchsorted(TOP1_EDGES, top1, side="right"))


@dataclass
class Counts:
    """What a run has seen, in job order: all the tests need (and what a state file stores)."""

    observed: np.ndarray = field(default_factory=lambda: np.zeros((N_STRATA, N_CELLS)))
    expected: np.ndarray = field(default_factory=lambda: np.zeros((N_STRATA, N_CELLS)))
    pit_bins: np.ndarray = field(default_factory=lambda: np.zeros(PIT_BINS))
    positions: int = 0
    outside_support: int = 0  # tokens the reference gives probability 0 (besides SLACK)
    top1_var: np.ndarray = field(default_factory=lambda: np.zeros(N_STRATA))  # sum p1 (1 - p1)

    def add(self, stratum: int, cell: int, law: np.ndarray, u: float, outside: bool) -> None:
        self.observed[stratum, cell] += 1
        self.expected[stratum] += law
        self.top1_var[stratum] += law[0] * (1.0 - law[0])
        self.pit_bins[min(int(u * PIT_BINS), PIT_BINS - 1)] += 1
        self.positions += 1
        self.outside_support += int(outside)

    def to_json(self) -> dict:
        return {
            "observed": self.observed.tolist(),
            "expected": self.expected.tolist(),
            "pit_bins": self.pit_bins.tolist(),
            "positions": self.positions,
            "outside_support": self.outside_support,
            "top1_var": self.top1_var.tolist(),
        }

    @classmethod
    def from_json(cls, d: dict) -> Counts:
        return cls(
            np.asarray(d["observed"], dtype=np.float64),
            np.asarray(d["expected"], dtype=np.float64),
            np.asarray(d["pit_bins"], dtype=np.float64),
            int(d["positions"]),
            int(d["outside_support"]),
            np.asarray(d.get("top1_var", np.zeros(N_STRATA)), dtype=np.float64),
        )

    def copy(self) -> Counts:
        return Counts.from_json(self.to_json())


def counts_of(strata: np.ndarray, cells: np.ndarray, laws: np.ndarray, u: np.ndarray) -> Counts:
    """Counts of many positions at once (simulations and tests): the same sums as ``add``."""
    c = Counts()
    np.add.at(c.observed, (strata, cells), 1)
    np.add.at(c.expected, strata, laws)
    np.add.at(c.top1_var, strata, laws[:, 0] * (1.0 - laws[:, 0]))
    bins = np.minimum((np.asarray(u) * PIT_BINS).astype(np.int64), PIT_BINS - 1)
    c.pit_bins = np.bincount(bins, minlength=PIT_BINS).astype(np.float64)
    c.positions = int(len(cells))
    return c


def look_points(limit: int) -> list[int]:
    """Positions at which the tests look, up to ``limit``: 1,024 x 2^j."""
    out, n = [], FIRST_LOOK
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def is_look(n: int) -> bool:
    """Whether the tests look after n positions."""
    q, r = divmod(n, FIRST_LOOK)
    return r == 0 and q > 0 and q & (q - 1) == 0


def look_index(n: int) -> int:
    """1-based index of the look at n positions (n must be a look point)."""
    return int(round(np.log2(n / FIRST_LOOK))) + 1


def alpha_look(k: int, n_checks: int = len(CHECKS), alpha_run: float = ALPHA_RUN) -> float:
    """Alpha spent by look k of one check: summed over k >= 1 and the checks, alpha_run."""
    return alpha_run / n_checks / (k * (k + 1))


@dataclass(frozen=True)
class Look:
    """Both checks at one look: the G-tests, the alpha they were held to and the floors."""

    n: int
    k: int
    alpha: float
    rank: GTest
    pit: GTest
    rank_floor: float  # TV of the rank-cell law within strata detected with 99% power
    pit_floor: float
    top1: Top1Test | None = None

    @property
    def rejected(self) -> str | None:
        """The check that rejected, or None."""
        for name, g in (("rank", self.rank), ("pit", self.pit)):
            if g.zero_hits or g.p_value <= self.alpha:
                return name
        if self.top1 is not None and self.top1.p_value <= self.alpha:
            return "top1"
        return None


def _bennett(v: float, t: float) -> float:
    """Freedman/Bennett tail bound exp(-v h(t / v)), h(u) = (1 + u) log(1 + u) - u, for a
    martingale with increments <= 1 and predictable variance at most v."""
    if t <= 0:
        return 1.0
    if v <= 0:
        return 0.0
    u = t / v
    return float(np.exp(-v * ((1.0 + u) * np.log1p(u) - u)))


def top1_p(deficit: float, v: float, n: int) -> float:
    """Two-sided p-value of a top-1 count ``deficit`` (observed minus expected) with realised
    predictable variance ``v`` after ``n`` positions: the bound at 2v (the peeling bin's
    ceiling), times the bins (log2 n + 2) and the two sides."""
    bins = np.log2(max(n, 1)) + 2.0
    return float(min(1.0, 2.0 * bins * _bennett(2.0 * max(v, 1.0 / max(n, 1)), abs(deficit))))


@dataclass(frozen=True)
class Top1Test:
    """The top-1 check at one look: the smallest p-value over strata, Bonferroni over them."""

    p_value: float
    stratum: int
    deficit: float  # observed minus expected top-1 count in that stratum
    variance: float


def top1_test(c: Counts) -> Top1Test:
    """Per stratum, top-1 count against its expectation; p = min over strata x their number."""
    obs = c.observed[:, 0]
    exp = c.expected[:, 0]
    n_s = c.observed.sum(axis=1)
    live = np.flatnonzero(n_s > 0)
    if live.size == 0:
        return Top1Test(1.0, 0, 0.0, 0.0)
    ps = np.array([top1_p(obs[s] - exp[s], c.top1_var[s], int(n_s[s])) for s in live])
    i = int(np.argmin(ps))
    s = int(live[i])
    return Top1Test(float(min(1.0, ps[i] * live.size)), s, float(obs[s] - exp[s]),
                    float(c.top1_var[s]))  # fmt: skip


def top1_threshold(v: float, n: int, alpha: float, strata: int = N_STRATA) -> float:
    """The smallest |deficit| the top-1 check rejects at ``alpha`` (variance v, n positions)."""
    from scipy import optimize

    def gap(t: float) -> float:
        return min(1.0, top1_p(t, v, n) * strata) - alpha

    hi = float(n) + 1.0
    if gap(hi) > 0:
        return float("inf")
    return float(optimize.brentq(gap, 0.0, hi, xtol=1e-9))


def top1_positions_needed(shift: float, var_per_position: float, alpha: float,
                          power: float = 0.99, strata: int = N_STRATA) -> int:  # fmt: skip
    """Positions of one stratum the top-1 check needs to catch a mean top-1 shift ``shift`` per
    position (e.g. a swap to the second token at rate r where the top-1 has p1: r p1) with
    ``power``: the smallest n with shift n - z_power sqrt(v n) >= the threshold at v n
    (the variance of the shifted count is at most v n + its shift)."""
    from scipy import stats as sps

    z = float(sps.norm.isf(1.0 - power))
    lo, hi = 1, 1

    def ok(n: int) -> bool:
        v = var_per_position * n
        return shift * n - z * np.sqrt(v + shift * n) >= top1_threshold(v, n, alpha, strata)

    while not ok(hi):
        lo, hi = hi, hi * 2
        if hi > 1 << 40:
            return -1
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return int(hi)


def top1_look_needed(shift: float, var_per_position: float, share: float,
                     power: float = 0.99, alpha_run: float = ALPHA_RUN) -> int:  # fmt: skip
    """The first look (positions in all, a look point) at which the top-1 check catches a mean
    top-1 shift ``shift`` per position of a stratum holding ``share`` of the positions, with
    ``power``, at that look's alpha; -1 if none below 2^40. Why: an audit only rejects at a
    look, and later looks spend less alpha, so "minutes to catch a bug" is this look divided by
    the audit's positions a minute (``AuditResult.per_minute``), not the stratum's need alone."""
    n = FIRST_LOOK
    while n <= 1 << 40:
        need = top1_positions_needed(shift, var_per_position, alpha_look(look_index(n),
                                     alpha_run=alpha_run), power)  # fmt: skip
        if 0 < need <= share * n:
            return n
        n *= 2
    return -1


def top1_floor(c: Counts, alpha: float, power: float = 0.99) -> tuple[float, int]:
    """The smallest per-position top-1 shift (e.g. rate x p1 of a swap to the second token) the
    top-1 check catches with ``power`` in the run's largest stratum, and that stratum."""
    n_s = c.observed.sum(axis=1)
    s = int(np.argmax(n_s))
    n = int(n_s[s])
    if n == 0:
        return float("nan"), s
    var = float(c.top1_var[s]) / n
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        need = top1_positions_needed(mid, var, alpha)
        lo, hi = (lo, mid) if 0 < need <= n else (mid, hi)
    return hi, s


def rank_test(c: Counts, alpha: float) -> GTest:
    rows = c.expected.sum(axis=1)
    keep = rows > 0
    probs = c.expected[keep] / rows[keep, None]
    return g_test(c.observed[keep], probs, alpha)


def pit_test(c: Counts, alpha: float) -> GTest:
    return g_test(c.pit_bins, np.full(PIT_BINS, 1.0 / PIT_BINS), alpha)


def look(c: Counts, n_checks: int = len(CHECKS), alpha_run: float = ALPHA_RUN) -> Look:
    """Both checks on counts of exactly a look point's positions (``alpha_run``: this run's
    share of a family's false-alarm rate; a sweep of m audits gives each 1e-6 / m)."""
    k = look_index(c.positions)
    a = alpha_look(k, n_checks, alpha_run)
    r, p = rank_test(c, a), pit_test(c, a)
    rows = c.expected.sum(axis=1)
    keep = rows > 0
    df = r.df if r.df >= 1 else effective_df(c.expected[keep] / rows[keep, None], c.positions)
    return Look(
        c.positions, k, a, r, p,
        detectable_tv(c.positions, max(df, 1), a),
        detectable_tv(c.positions, PIT_BINS - 1, a),
        top1_test(c) if n_checks >= 3 else None,
    )  # fmt: skip


def worst_cell(c: Counts) -> str:
    """The (stratum, cell) whose count is furthest from its expectation, in standard units."""
    e = np.maximum(c.expected, 1e-12)
    z = (c.observed - e) / np.sqrt(e)
    s, k = np.unravel_index(int(np.argmax(np.abs(z))), z.shape)
    return (
        f"{stratum_name(int(s))}, {CELL_NAMES[int(k)]}: {int(c.observed[s, k])} tokens vs "
        f"{c.expected[s, k]:.1f} expected"
    )

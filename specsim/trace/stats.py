"""Statistics of a trace: acceptance length, per-position acceptance, confidence quality.

Two acceptance lengths, both with the bonus token counted (the papers' tau):
- ``tau_replay``: the mean of ``accept_len[n] + 1`` over the positions a full-verification replay
  visits (the replay rule walk n -> n + accept_len[n] + 1). This is what serving a request with
  full verification measures; positions skipped over by an accepted block are not counted.
- ``tau_rows``: ``1 + mean(accept_len)`` over every row. Cheaper and smoother, but it weighs all
  positions equally, including ones a real run would jump over.
``tokens_per_step`` is ``tokens / replay_steps``: tau_replay with the last block of each request
capped at its output length.

Confidence quality is measured two ways. Conditional: every (row, k) whose drafts before k were
accepted is a sample, label "draft k accepted", score c_k. Survival: every (row, k) is a sample,
label "accept_len >= k", score a_k = prod_{i<=k} c_i. AUROC is rank-based (ties count one half);
ECE uses 15 equal-width bins on [0, 1].
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specsim.trace.model import Trace

ECE_BINS = 15


def auroc(score: np.ndarray, label: np.ndarray) -> float:
    """Area under the ROC curve; NaN if one class is empty.

    The Mann-Whitney U statistic of the positives over the negatives (ties count 1/2), divided by
    n_pos * n_neg: exactly the AUROC, from ``scipy.stats.mannwhitneyu``.
    """
    from scipy.stats import mannwhitneyu

    score = np.asarray(score, dtype=np.float64)
    label = np.asarray(label, dtype=bool)
    pos, neg = score[label], score[~label]
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    u = mannwhitneyu(pos, neg, alternative="two-sided", method="asymptotic").statistic
    return float(u) / (float(pos.size) * float(neg.size))


def calibration_bins(
    score: np.ndarray, label: np.ndarray, bins: int = ECE_BINS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, sum of scores, sum of labels) per equal-width bin of [0, 1], for each row.

    ``score`` is (n,) or (g, n) (g candidate scorings of the same labels, as STS fits them); the
    result has shape (bins,) or (g, bins). The one binning behind ECE, STS and reliability plots.
    """
    score = np.asarray(score, dtype=np.float64)
    two_d = score.ndim == 2
    s2 = score if two_d else score[None, :]
    g, n = s2.shape
    idx = np.minimum((s2 * bins).astype(np.int64), bins - 1)
    flat = (idx + bins * np.arange(g)[:, None]).ravel()
    lab = np.broadcast_to(np.asarray(label, dtype=np.float64), s2.shape).ravel()
    size = g * bins
    cnt = np.bincount(flat, minlength=size).reshape(g, bins)
    s_sum = np.bincount(flat, weights=s2.ravel(), minlength=size).reshape(g, bins)
    l_sum = np.bincount(flat, weights=lab, minlength=size).reshape(g, bins)
    return (cnt, s_sum, l_sum) if two_d else (cnt[0], s_sum[0], l_sum[0])


def ece(score: np.ndarray, label: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error: sum over equal-width bins of (share) * |mean score - rate|."""
    score = np.asarray(score, dtype=np.float64)
    if score.size == 0:
        return float("nan")
    _, s, y = calibration_bins(score, label, bins)
    return float(np.abs(s - y).sum() / score.size)


def conditional_samples(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(score c_k, label accepted, k) of every (row, k) with drafts < k accepted."""
    k = np.arange(1, trace.block_size + 1)
    acc = trace.accept_len.astype(np.int64)[:, None]
    at_risk = acc >= k - 1
    label = (acc >= k)[at_risk]
    return trace.conf[at_risk], label, np.broadcast_to(k, trace.conf.shape)[at_risk]


def replay_full(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Walk every request with full verification; return (row indices visited, steps/request).

    Vectorised over requests: each iteration advances every unfinished request by one step.
    """
    out = trace.output_len.astype(np.int64)
    pos = np.zeros_like(out)
    steps = np.zeros_like(out)
    acc = trace.accept_len.astype(np.int64)
    visited = []
    active = np.flatnonzero(out > 0)
    while active.size:
        rows = trace.offsets[active] + pos[active]
        visited.append(rows)
        pos[active] += np.minimum(acc[rows] + 1, out[active] - pos[active])
        steps[active] += 1
        active = active[pos[active] < out[active]]
    rows = np.sort(np.concatenate(visited)) if visited else np.zeros(0, dtype=np.int64)
    return rows, steps


def tau_interval(
    trace: Trace, level: float = 0.95, n_boot: int = 4000, seed: int = 0
) -> tuple[float, float]:
    """A ``level`` bootstrap interval of ``tau_replay``, resampling whole requests.

    Why requests and not rows: positions of one request share its text, so their acceptances
    are correlated and a row bootstrap would be far too narrow. The statistic is the same ratio
    as ``tau_replay`` (accepted + 1 summed over visited positions, over their count), so long
    requests weigh as they do in the point estimate. Percentile interval, fixed seed: the same
    trace always gives the same interval.
    """
    visited, _ = replay_full(trace)
    n = trace.n_requests
    if visited.size == 0 or n < 2:
        return float("nan"), float("nan")
    req = np.searchsorted(trace.offsets, visited, side="right") - 1
    total = np.bincount(req, weights=trace.accept_len[visited].astype(np.float64) + 1, minlength=n)
    count = np.bincount(req, minlength=n).astype(np.float64)
    rng = np.random.default_rng(seed)
    lo, hi = (1 - level) / 2, 1 - (1 - level) / 2
    boot = np.empty(n_boot)
    for start in range(0, n_boot, 500):  # bounded memory for long traces
        idx = rng.integers(0, n, size=(min(500, n_boot - start), n))
        boot[start : start + idx.shape[0]] = total[idx].sum(1) / count[idx].sum(1)
    return float(np.quantile(boot, lo)), float(np.quantile(boot, hi))


def per_position_table(trace: Trace) -> pd.DataFrame:
    """One row per draft position k = 1..gamma.

    ``n``: rows at risk (drafts < k accepted); ``accepted``: of those, draft k accepted;
    ``accept_rate``: accepted / n (conditional acceptance); ``mean_conf``: mean c_k over the
    rows at risk; ``survival_rate``: share of all rows with accept_len >= k; ``survival_mean``:
    mean a_k over all rows.
    """
    gamma = trace.block_size
    k = np.arange(1, gamma + 1)
    acc = trace.accept_len.astype(np.int64)[:, None]
    at_risk = acc >= k - 1
    accepted = acc >= k
    n = at_risk.sum(axis=0)
    n_acc = accepted.sum(axis=0)
    conf_sum = np.where(at_risk, trace.conf.astype(np.float64), 0.0).sum(axis=0)
    rows = max(trace.n_rows, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return pd.DataFrame(
            {
                "k": k.astype(np.int64),
                "n": n.astype(np.int64),
                "accepted": n_acc.astype(np.int64),
                "accept_rate": n_acc / n,
                "mean_conf": conf_sum / n,
                "survival_rate": n_acc / rows,
                "survival_mean": trace.survival().sum(axis=0) / rows,
            }
        )


def _core_stats(trace: Trace) -> dict:
    visited, steps = replay_full(trace)
    tokens = int(trace.output_len.astype(np.int64).sum())
    score, label, _ = conditional_samples(trace)
    surv = trace.survival()
    surv_label = trace.accept_len.astype(np.int64)[:, None] >= np.arange(1, trace.block_size + 1)
    table = per_position_table(trace)
    n_steps = int(steps.sum())
    return {
        "requests": trace.n_requests,
        "rows": trace.n_rows,
        "tokens": tokens,
        "gamma": trace.block_size,
        "tau_replay": float(trace.accept_len[visited].astype(np.float64).mean() + 1)
        if visited.size
        else float("nan"),
        "tau_ci95": list(tau_interval(trace)),
        "tokens_per_step": tokens / n_steps if n_steps else float("nan"),
        "replay_steps": n_steps,
        "tau_rows": float(trace.accept_len.astype(np.float64).mean() + 1)
        if trace.n_rows
        else float("nan"),
        "accept_rate": [float(x) for x in table["accept_rate"]],
        "conf_auroc": auroc(score, label),
        "conf_ece": ece(score, label),
        "survival_auroc": auroc(surv.ravel(), surv_label.ravel()),
        "survival_ece": ece(surv.ravel(), surv_label.ravel()),
    }


def trace_stats(trace: Trace) -> dict:
    """Headline statistics of a trace as a JSON-ready dict (see the module docstring).

    When the trace has a ``category`` column, ``categories`` maps each category (sorted) to the
    same statistics computed on its requests alone.
    """
    stats = _core_stats(trace)
    if trace.category is not None:
        cats = trace.category.astype(str)
        names = np.unique(cats)
        if names.size == 1:  # one category: its statistics are the trace's
            stats["categories"] = {str(names[0]): dict(stats)}
        else:
            stats["categories"] = {
                str(c): _core_stats(trace.select(np.flatnonzero(cats == c))) for c in names
            }
    return stats

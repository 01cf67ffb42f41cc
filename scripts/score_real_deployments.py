"""Score reports/real-deployments' predictions against the published numbers, by the rules of
its PREREGISTRATION.md (fixed before the run).

    python scripts/score_real_deployments.py reports/real-deployments

Reads ``predictions.csv`` and ``paper_gains.csv`` (the run), the published vLLM figure as read
by ``scripts/read_vllm_fig3.py`` (``specsim/data/published/vllm-adaptive-verification/
fig3_pareto.csv``) and the paper's gains (in ``paper_gains.csv`` beside each prediction, from
``specsim.sim.cost.deployments``); writes ``scorecard.csv``, one row per scored point:

- ``gain``: (1 + predicted gain) / (1 + published gain) over the baseline (vLLM: ``none`` at
  the same concurrency; paper: MTP-1 at the same SLA), a hit within [0.85, 1.15]; the low / high
  tables' gains give the range, and ``range_covers`` says whether it holds the published gain.
- ``level`` (vLLM ``none`` only): predicted / published throughput, a hit within [0.75, 1.33].
- ``best-arm`` (vLLM): the predicted best arm at each concurrency against the published one,
  scored only where the published gap between the first two arms exceeds 2%.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "specsim" / "data" / "published" / "vllm-adaptive-verification"
GAIN_BAND = (0.85, 1.15)
LEVEL_BAND = (0.75, 1.33)
PRIMARY_GPU = "H800"


def _vllm(pred: pd.DataFrame, pub: pd.DataFrame) -> list[dict]:
    v = pred[pred["source"] == "vllm-adaptive-verification"].set_index(["arm", "concurrency"])
    p = pub.set_index(["arm", "concurrency"])["throughput_tok_s"]
    rows = []
    for c in sorted(pub["concurrency"].unique()):
        base = {t: v.loc[("none", c), col] for t, col in
                (("primary", "throughput_tok_s"), ("low", "throughput_tok_s_low"),
                 ("high", "throughput_tok_s_high"))}  # fmt: skip
        for arm in [a for a in pub["arm"].unique() if a != "none"]:
            pub_g = p[(arm, c)] / p[("none", c)]
            g = {t: v.loc[(arm, c), col] / base[t] for t, col in
                 (("primary", "throughput_tok_s"), ("low", "throughput_tok_s_low"),
                  ("high", "throughput_tok_s_high"))}  # fmt: skip
            ratio = g["primary"] / pub_g
            lo, hi = min(g.values()), max(g.values())
            rows.append({"source": "vllm-adaptive-verification", "point": f"{arm} c={c}",
                         "rule": "gain", "baseline": "none", "published": pub_g - 1,
                         "predicted": g["primary"] - 1, "predicted_low": lo - 1,
                         "predicted_high": hi - 1, "score": ratio,
                         "hit": GAIN_BAND[0] <= ratio <= GAIN_BAND[1],
                         "range_covers": lo <= pub_g <= hi})  # fmt: skip
        lvl = base["primary"] / p[("none", c)]
        rows.append({"source": "vllm-adaptive-verification", "point": f"none c={c}",
                     "rule": "level", "baseline": "", "published": p[("none", c)],
                     "predicted": base["primary"], "predicted_low": base["low"],
                     "predicted_high": base["high"], "score": lvl,
                     "hit": LEVEL_BAND[0] <= lvl <= LEVEL_BAND[1],
                     "range_covers": min(base.values()) <= p[("none", c)]
                     <= max(base.values())})  # fmt: skip
        ranked = p.xs(c, level="concurrency").sort_values(ascending=False)
        gap = ranked.iloc[0] / ranked.iloc[1] - 1
        pred_best = v.xs(c, level="concurrency")["throughput_tok_s"].idxmax()
        scored = gap > 0.02
        rows.append({"source": "vllm-adaptive-verification", "point": f"best arm c={c}",
                     "rule": "best-arm", "baseline": f"gap {100 * gap:.1f}% to "
                     f"{ranked.index[1]}", "published": ranked.index[0],
                     "predicted": pred_best, "predicted_low": None, "predicted_high": None,
                     "score": None, "hit": (pred_best == ranked.index[0]) if scored else None,
                     "range_covers": None})  # fmt: skip
    return rows


def _paper(gains: pd.DataFrame) -> list[dict]:
    rows = []
    for (model, gpu, sla), d in gains.groupby(["model", "gpu", "sla_tok_s_user"], sort=False):
        by = d.set_index("table")["gain_pct"] / 100
        pub = d["published_gain_pct"].iloc[0] / 100
        ratio = (1 + by["primary"]) / (1 + pub)
        lo, hi = by.min(), by.max()
        rows.append({"source": "dspark-paper", "point": f"{model} {d['gpus'].iloc[0]}x{gpu} "
                     f"at {sla:g} tok/s/user", "rule": "gain" if gpu == PRIMARY_GPU
                     else "gain (second GPU, reported)", "baseline": "mtp1",
                     "published": pub, "predicted": by["primary"], "predicted_low": lo,
                     "predicted_high": hi, "score": ratio,
                     "hit": GAIN_BAND[0] <= ratio <= GAIN_BAND[1],
                     "range_covers": lo <= pub <= hi})  # fmt: skip
    return rows


def _figure(pred: pd.DataFrame, pub: pd.DataFrame):  # noqa: ANN202 - a matplotlib Figure
    """Published and predicted throughput-interactivity curves of every vLLM arm, same axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (the minor-label formatter)

    v = pred[pred["source"] == "vllm-adaptive-verification"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharex=True, sharey=True)
    colours = {"adaptive": "C0", "k1": "#f2a672", "k3": "#d4682e", "k5": "#b64d18",
               "k6": "#8a3a11", "k7": "#552008", "none": "C2"}  # fmt: skip
    panels = ((axes[0], pub, "published (vLLM post, fig. 3)"),
              (axes[1], v, "predicted (pre-registered, primary table)"))  # fmt: skip
    for ax, frame, title in panels:
        for arm, d in frame.groupby("arm", sort=False):
            d = d.sort_values("concurrency")
            ax.plot(d["interactivity_tok_s_user"], d["throughput_tok_s"], "o-", ms=3,
                    color=colours.get(arm, "k"), label=arm)  # fmt: skip
        ax.set_xscale("log")
        ticks = [30, 50, 75, 100, 150, 200, 300, 400]
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("interactivity (tok/s/user, log scale)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("aggregate output throughput (tok/s)")
    axes[1].legend(fontsize=8, title="arm", title_fontsize=8)
    fig.suptitle("DeepSeek-V4-Pro-0813 on 8 B300s, closed loops c = 1-256 (points right to left)",
                 fontsize=11)  # fmt: skip
    fig.tight_layout()
    return fig


PRED_COLUMNS = ("source", "arm", "concurrency", "throughput_tok_s", "throughput_tok_s_low",
                "throughput_tok_s_high", "interactivity_tok_s_user")  # fmt: skip
GAIN_COLUMNS = ("model", "gpu", "gpus", "sla_tok_s_user", "table", "gain_pct",
                "published_gain_pct")  # fmt: skip


def read_run(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """A table of the run, with the columns the scoring reads (one line naming the file
    otherwise: the report writes them; a hand-edited or foreign file may not)."""
    from specsim.errors import SpecsimError

    if not path.is_file():
        raise SpecsimError(f"{path} does not exist; run `specsim report real-deployments` first")
    try:
        frame = pd.read_csv(path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SpecsimError(f"{path} is not a readable CSV ({str(exc)[:120]})") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise SpecsimError(f"{path} has no column {missing[0]!r}; is it the report's own file?")
    return frame


def main(argv: list[str] | None = None) -> int:
    from specsim.errors import LineParser, run_script

    p = LineParser(prog="score_real_deployments.py", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", nargs="?", default=str(ROOT / "reports" / "real-deployments"),
                   help="the report folder (default: reports/real-deployments)")  # fmt: skip
    folder = Path(p.parse_args(sys.argv[1:] if argv is None else argv).folder)
    return run_script(p.prog, lambda: _run(folder))


def _run(folder: Path) -> int:
    """The scorecard and the figure, both from the run's two tables; both written through a
    temporary name, after the scoring succeeded."""
    from specsim.analysis.figures import save_figure
    from specsim.errors import SpecsimError
    from specsim.outputs import write_table

    pred = read_run(folder / "predictions.csv", PRED_COLUMNS)
    gains = read_run(folder / "paper_gains.csv", GAIN_COLUMNS)
    pub = pd.read_csv(PUBLISHED / "fig3_pareto.csv")
    try:
        card = pd.DataFrame(_vllm(pred, pub) + _paper(gains))
    except KeyError as exc:  # a point the published figure has and the run lacks
        raise SpecsimError(
            f"{folder}: the run has no prediction for {exc.args[0]!r}, which the published "
            "tables score; re-run the report with its config's arms, concurrencies and tables"
        ) from None
    write_table(card, folder / "scorecard.csv")
    save_figure(_figure(pred, pub), folder / "vllm-pareto.png", force=True, dpi=110)
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        print(card.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

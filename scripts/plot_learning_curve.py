"""Plot drafters' learning curves: held-out tau and training loss against CPU-minutes.

    python scripts/plot_learning_curve.py specsim/data/drafters/dspark-*/ --out curve.png

Reads each drafter folder's ``training_report.json`` (``learning_curve``: held-out tau, full
verification, raw confidences, on a fixed subset of held-out requests, every few minutes of
training; ``history``: the loss every 50 steps). Training loss is placed on the CPU-minute axis
by the curve's own (wall minutes, CPU minutes) pairs. One colour per drafter, one line style per
category.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _label(folder: Path, report: dict) -> str:
    cfg = report.get("train_config", {})
    return f"{folder.name} (lr {cfg.get('lr', '?')}, decay {cfg.get('loss_decay') or 'block'})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("drafters", nargs="+", type=Path, help="drafter folders")
    p.add_argument("--out", type=Path, required=True, help="PNG to write")
    p.add_argument("--names", help="legend names separated by '|', one per drafter")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = args.names.split("|") if args.names else None
    if names and len(names) != len(args.drafters):
        p.error("--names needs one name per drafter")
    fig, (ax_tau, ax_loss) = plt.subplots(1, 2, figsize=(11, 5.0))
    styles = {"tau": "-", "tau_chat": "--", "tau_code": "-.", "tau_math": ":"}
    for i, folder in enumerate(args.drafters):
        path = folder / "training_report.json"
        if not path.is_file():
            print(f"plot_learning_curve: {path} does not exist", file=sys.stderr)
            return 2
        rep = json.loads(path.read_text())
        colour = f"C{i}"
        name = names[i] if names else _label(folder, rep)
        curve = rep["learning_curve"]
        cpu = np.array([c["cpu_minutes"] for c in curve])
        for key, ls in styles.items():
            if key in curve[0]:
                what = "all" if key == "tau" else key.split("_")[1]
                ax_tau.plot(cpu, [c[key] for c in curve], ls, color=colour, marker="o", ms=3,
                            label=f"{name}: {what}")  # fmt: skip
        wall = np.array([c["minutes"] for c in curve])
        hist = rep.get("history", [])
        if hist:
            h_cpu = np.interp([h["minutes"] for h in hist], wall, cpu)
            ax_loss.plot(h_cpu, [h["loss"] for h in hist], color=colour, label=name)
    ax_tau.set_xlabel("training CPU-minutes")
    ax_tau.set_ylabel("held-out tau (tokens per step, bonus included)")
    ax_tau.set_title("Held-out acceptance length (full verification, greedy)")
    ax_tau.grid(alpha=0.3)
    ax_tau.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    ax_loss.set_xlabel("training CPU-minutes")
    ax_loss.set_ylabel("training loss (0.1 CE + 0.9 L1 + 1.0 BCE, weighted)")
    ax_loss.set_title(
        "Training loss (mean over 50 steps; each drafter's own\n"
        "position weights, so levels compare only within a drafter)",
        fontsize=10,
    )
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

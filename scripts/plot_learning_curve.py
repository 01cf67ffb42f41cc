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
from pathlib import Path


def _label(folder: Path, report: dict) -> str:
    cfg = report.get("train_config")
    cfg = cfg if isinstance(cfg, dict) else {}
    return f"{folder.name} (lr {cfg.get('lr', '?')}, decay {cfg.get('loss_decay') or 'block'})"


def read_report(folder: Path) -> dict:
    """A drafter folder's training report, checked for what the plot reads (one line naming
    the file otherwise): a non-empty ``learning_curve`` of points with ``minutes``,
    ``cpu_minutes`` and ``tau``, and a ``history`` list of ``minutes`` and ``loss``."""
    from specsim.errors import SpecsimError

    path = folder / "training_report.json"
    if not path.is_file():
        raise SpecsimError(f"{path} does not exist; give drafter folders that hold one")
    try:
        rep = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SpecsimError(f"{path} is not a readable JSON report ({exc})") from None
    curve = rep.get("learning_curve") if isinstance(rep, dict) else None
    keys = ("minutes", "cpu_minutes", "tau")
    if (
        not isinstance(curve, list)
        or not curve
        or not all(isinstance(c, dict) and all(_number(c.get(k)) for k in keys) for c in curve)
    ):
        raise SpecsimError(
            f"{path}: learning_curve must be a non-empty list of points with numbers "
            f"{', '.join(keys)}; was the drafter trained with a learning curve?"
        )
    hist = rep.get("history", [])
    if not isinstance(hist, list) or not all(
        isinstance(h, dict) and _number(h.get("minutes")) and _number(h.get("loss")) for h in hist
    ):
        raise SpecsimError(f"{path}: history must be a list of points with minutes and loss")
    return rep


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def main(argv: list[str] | None = None) -> int:
    from specsim.errors import LineParser, run_script

    p = LineParser(prog="plot_learning_curve.py", description=__doc__.split("\n\n")[0])
    p.add_argument("drafters", nargs="+", type=Path, help="drafter folders")
    p.add_argument("--out", type=Path, required=True, help="PNG to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--names", help="legend names separated by '|', one per drafter")
    args = p.parse_args(argv)
    return run_script(p.prog, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    """Every input and the output checked, then the figure drawn and saved (through a
    temporary name: a failure leaves no half-written PNG)."""
    from specsim.errors import SpecsimError
    from specsim.outputs import check_out

    names = args.names.split("|") if args.names is not None else None
    if names is not None and (len(names) != len(args.drafters) or "" in names):
        raise SpecsimError(
            f"--names {args.names!r}: give one non-empty name per drafter ({len(args.drafters)}), "
            "separated by '|'"
        )
    out = check_out(args.out, force=args.force, suffixes=(".png",))
    reports = [read_report(folder) for folder in args.drafters]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from specsim.analysis.figures import save_figure

    fig, (ax_tau, ax_loss) = plt.subplots(1, 2, figsize=(11, 5.0))
    styles = {"tau": "-", "tau_chat": "--", "tau_code": "-.", "tau_math": ":"}
    for i, (folder, rep) in enumerate(zip(args.drafters, reports, strict=True)):
        colour = f"C{i}"
        name = names[i] if names else _label(folder, rep)
        curve = rep["learning_curve"]
        cpu = np.array([c["cpu_minutes"] for c in curve])
        for key, ls in styles.items():
            if all(_number(c.get(key)) for c in curve):
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
    save_figure(fig, out, force=True, dpi=120)  # --out was checked (and --force) above
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

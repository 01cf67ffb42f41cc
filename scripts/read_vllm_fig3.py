"""Read vLLM's adaptive-verification Pareto figure (fig. 3) into a table, from the SVG's own
coordinates.

    python scripts/read_vllm_fig3.py fig3-pareto.svg \
        --out specsim/data/published/vllm-adaptive-verification/fig3_pareto.csv

The figure (vllm-project/vllm-project.github.io,
``assets/figures/2026-08-14-dspark-adaptive-verification/fig3-pareto.svg``) is a matplotlib SVG:
each arm is a polyline with one marker per concurrency (c = 1, 16, 32, 64, 128, 256, in the
order drawn, c = 1 at the highest interactivity), coloured by a CSS variable named for the arm;
the x axis (interactivity, tok/s/user) is logarithmic and the y axis (aggregate output
throughput, tok/s) linear. The axes are calibrated from the tick marks' positions and labels
(a least-squares line through every tick: log10 of the label for x, the label for y), so a
reading is as exact as the SVG's 6-digit coordinates; the markers are the data.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

ARMS = {"adaptive": "adaptive", "k1": "k1", "k3": "k3", "k5": "k5", "k6": "k6", "k7": "k7",
        "nospec": "none"}  # fmt: skip
CONCURRENCY = (1, 16, 32, 64, 128, 256)


def _fit(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of value against pixel."""
    n = len(pairs)
    if n < 2 or len({p for p, _ in pairs}) < 2:
        from specsim.errors import SpecsimError

        raise SpecsimError(
            f"the SVG has {n} usable tick marks on an axis (2 at different places are needed to "
            "calibrate it); is it matplotlib's fig3-pareto.svg?"
        )
    mx = sum(p for p, _ in pairs) / n
    my = sum(v for _, v in pairs) / n
    sxx = sum((p - mx) ** 2 for p, _ in pairs)
    slope = sum((p - mx) * (v - my) for p, v in pairs) / sxx
    return slope, my - slope * mx


def _label(text: str, positive: bool) -> float:
    """A tick's label as a finite number (> 0 on the logarithmic x axis), refused in one line."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (positive and value <= 0):
        from specsim.errors import SpecsimError

        what = "a number > 0" if positive else "a number"
        raise SpecsimError(f"a tick label {text[:40]!r} is not {what}; is it fig. 3's SVG?")
    return value


def read(svg: str) -> list[dict]:
    ticks: dict[str, list[tuple[float, float]]] = {"xtick": [], "ytick": []}
    for axis in ticks:
        for m in re.finditer(rf'<g id="{axis}_\d+">(.*?)<!-- ([^>]*) -->', svg, re.S):
            use = re.search(r'<use xlink:href="#\w+" x="([\d.]+)" y="([\d.]+)"', m.group(1))
            if use is None:
                continue
            value = _label(m.group(2), positive=axis == "xtick")
            if axis == "xtick":
                ticks[axis].append((float(use.group(1)), math.log10(value)))
            else:
                ticks[axis].append((float(use.group(2)), value))
    (ax, bx), (ay, by) = _fit(ticks["xtick"]), _fit(ticks["ytick"])
    rows = []
    for m in re.finditer(r'<path d="([^"]*)"[^>]*style="[^"]*stroke: var\(--(\w+)', svg):
        arm = ARMS.get(m.group(2))
        pts = [(float(x), float(y)) for x, y in re.findall(r"([\d.]+) ([\d.]+)", m.group(1))]
        if arm is None or len(pts) != len(CONCURRENCY):
            continue  # grid lines, legend swatches (3 points)
        for c, (x, y) in zip(CONCURRENCY, pts, strict=True):
            rows.append({"arm": arm, "concurrency": c,
                         "interactivity_tok_s_user": round(10 ** (ax * x + bx), 2),
                         "throughput_tok_s": round(ay * y + by, 1)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    from specsim.errors import LineParser, run_script

    p = LineParser(prog="read_vllm_fig3.py", description=__doc__.split("\n\n")[0])
    p.add_argument("svg", type=Path)
    p.add_argument("--out", type=Path, required=True, help="the table (.csv, .parquet or .json)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    args = p.parse_args(argv)
    return run_script(p.prog, lambda: _run(args))


def _read_svg(path: Path) -> str:
    from specsim.errors import SpecsimError

    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise SpecsimError(f"cannot read the SVG {path} ({why}); give fig3-pareto.svg") from None


def _run(args: argparse.Namespace) -> int:
    from specsim.errors import SpecsimError
    from specsim.outputs import check_out

    out = check_out(args.out, force=args.force)
    rows = read(_read_svg(args.svg))
    if len(rows) != len(ARMS) * len(CONCURRENCY):
        raise SpecsimError(
            f"{args.svg}: found {len(rows)} points, expected {len(ARMS) * len(CONCURRENCY)} "
            f"({len(ARMS)} arms x {len(CONCURRENCY)} concurrencies); is it fig. 3's SVG?"
        )
    import pandas as pd

    from specsim.outputs import write_table

    write_table(pd.DataFrame(rows), out)
    print(pd.DataFrame(rows).pivot(index="arm", columns="concurrency", values="throughput_tok_s"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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
import sys
from pathlib import Path

ARMS = {"adaptive": "adaptive", "k1": "k1", "k3": "k3", "k5": "k5", "k6": "k6", "k7": "k7",
        "nospec": "none"}  # fmt: skip
CONCURRENCY = (1, 16, 32, 64, 128, 256)


def _fit(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of value against pixel."""
    n = len(pairs)
    mx = sum(p for p, _ in pairs) / n
    my = sum(v for _, v in pairs) / n
    sxx = sum((p - mx) ** 2 for p, _ in pairs)
    slope = sum((p - mx) * (v - my) for p, v in pairs) / sxx
    return slope, my - slope * mx


def read(svg: str) -> list[dict]:
    ticks: dict[str, list[tuple[float, float]]] = {"xtick": [], "ytick": []}
    for axis in ticks:
        for m in re.finditer(rf'<g id="{axis}_\d+">(.*?)<!-- ([^>]*) -->', svg, re.S):
            use = re.search(r'<use xlink:href="#\w+" x="([\d.]+)" y="([\d.]+)"', m.group(1))
            if use is None:
                continue
            value = float(m.group(2))
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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("svg", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    rows = read(args.svg.read_text())
    if len(rows) != len(ARMS) * len(CONCURRENCY):
        print(f"read_vllm_fig3: found {len(rows)} points, expected 42", file=sys.stderr)
        return 1
    import pandas as pd

    from specsim.outputs import write_table

    write_table(pd.DataFrame(rows), args.out)
    print(pd.DataFrame(rows).pivot(index="arm", columns="concurrency", values="throughput_tok_s"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Write the held-out ``reasoning-gym`` EVALUATION prompts (issue #40): 80 procedurally made
reasoning tasks from Reasoning Gym (open-thought/reasoning-gym, Apache-2.0, on PyPI).

Why this set: shipped traces must be recorded on prompts the drafter never saw, with a licence
that allows shipping them. Reasoning Gym's generators make new items from a seed (no third-party
text: the tasks below read no data file), so the items are disjoint from every training source
by construction and a different category (short logic, time, sorting and kinship puzzles) from
the chat, code and math sets. Ten tasks, eight items each, seed 2026.

Needs reasoning-gym, which specsim does not depend on; run it in its own environment:

    python3 -m venv .venv-rg && .venv-rg/bin/pip install reasoning-gym==0.1.25
    .venv-rg/bin/python scripts/make_eval_prompts.py  # -> specsim/data/prompts/reasoning-gym.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# its own environment has reasoning-gym, not specsim: the few stdlib-only modules it uses
# (specsim.errors, specsim.outputs) are taken from the checkout
sys.path.insert(0, str(ROOT))
OUT = ROOT / "specsim" / "data" / "prompts" / "reasoning-gym.jsonl"
TASKS = (
    "basic_arithmetic", "calendar_arithmetic", "family_relationships", "knights_knaves",
    "number_sorting", "propositional_logic", "syllogism", "time_intervals", "course_schedule",
    "shortest_path",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from specsim.errors import LineParser, run_script, whole

    ap = LineParser(prog="make_eval_prompts.py", description=__doc__.split("\n")[0])
    ap.add_argument("--per-task", type=whole(1, 10_000), default=8)
    ap.add_argument("--seed", type=whole(0, 2**32 - 1), default=2026)
    ap.add_argument("--out", type=Path, default=OUT, help="a .jsonl (default: the shipped one)")
    ap.add_argument("--force", action="store_true", help="replace an --out of your own")
    args = ap.parse_args(argv)
    return run_script(ap.prog, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    """Checked first (the output, the generator's package), written last through a temporary
    name: the shipped file is regenerated in place, a file of the user's only with --force."""
    from specsim.errors import SpecsimError
    from specsim.outputs import check_out, write_text

    out = check_out(args.out, force=args.force or args.out.resolve() == OUT, suffixes=(".jsonl",))
    try:
        import reasoning_gym as rg  # the generator's own environment (module docstring)
    except ImportError:
        raise SpecsimError(
            "reasoning-gym is missing; run this in its own environment (module docstring): "
            "pip install reasoning-gym==0.1.25"
        ) from None
    lines = []
    for task in TASKS:
        ds = rg.create_dataset(task, size=args.per_task, seed=args.seed)
        for i in range(args.per_task):
            lines.append(json.dumps({"turns": [ds[i]["question"]], "source": f"{task}#{i}"}))
    write_text("\n".join(lines) + "\n", out)
    print(f"wrote {len(lines)} prompts to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

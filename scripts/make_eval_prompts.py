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
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "specsim" / "data" / "prompts" / "reasoning-gym.jsonl"
TASKS = (
    "basic_arithmetic", "calendar_arithmetic", "family_relationships", "knights_knaves",
    "number_sorting", "propositional_logic", "syllogism", "time_intervals", "course_schedule",
    "shortest_path",
)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-task", type=int, default=8)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    import reasoning_gym as rg  # the generator's own environment (module docstring)

    lines = []
    for task in TASKS:
        ds = rg.create_dataset(task, size=args.per_task, seed=args.seed)
        for i in range(args.per_task):
            lines.append(json.dumps({"turns": [ds[i]["question"]], "source": f"{task}#{i}"}))
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} prompts to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Prompt sets: the bundled ones by name (``gsm8k[80:380]``) or any JSONL file.

A prompt file has one JSON object per line with either ``"turns": [str, ...]`` (first turn
used) or ``"prompt": str``, and optionally ``"category"`` (else ``--category``, else the file's:
a bundled set's category or a user file's stem). Slices select a fixed, documented subset, so
the prompts a drafter is trained on and the prompts a trace is recorded on can be kept apart by
construction.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specsim.errors import SpecsimError

BUNDLED = {
    "mt-bench": "chat",
    "humaneval": "code",
    "mbpp": "code",
    "gsm8k": "math",
    "chat-train": "chat",  # training only; its 300 GSM8K-train rows are "math" (SOURCE_CATEGORY)
    "dolly-context": "passage",  # evaluation only: questions on / summaries of a given passage
    "code-train": "code",  # training only: templated Python tasks (scripts/make_train_prompts.py)
    "math-train": "math",  # training only: templated arithmetic word problems (same script)
    "reasoning-gym": "reasoning",  # evaluation only: Reasoning Gym puzzles (make_eval_prompts)
}
# a line's own "source" field overrides the file's category (chat-train mixes in GSM8K train)
SOURCE_CATEGORY = {"gsm8k": "math"}
_SPEC = re.compile(r"^(?P<name>.+?)(\[(?P<start>-?\d*):(?P<stop>-?\d*)\])?$")


@dataclass(frozen=True)
class Prompt:
    """One prompt with where it came from (``source`` is ``NAME#index``)."""

    text: str
    category: str
    source: str


def _bundled_path(name: str) -> Path:
    return Path(str(resources.files("specsim") / "data" / "prompts" / f"{name}.jsonl"))


def load_prompts(spec: str, category: str | None = None) -> list[Prompt]:
    """Prompts of ``NAME[START:STOP]`` (bundled name or path; the slice is optional)."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise SpecsimError(f"bad prompt spec {spec!r}; use NAME or NAME[START:STOP]")
    name = m.group("name")
    path = _bundled_path(name) if name in BUNDLED else Path(name).expanduser()
    if not path.exists():
        raise SpecsimError(
            f"prompt file {name!r} not found; pass a JSONL path or one of {sorted(BUNDLED)}"
        )
    cat = category or BUNDLED.get(name) or BUNDLED.get(path.stem) or path.stem
    rows = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                text = obj["turns"][0] if "turns" in obj else obj["prompt"]
                src = obj.get("source") if isinstance(obj, dict) else None
                own = obj.get("category") if isinstance(obj, dict) else None
            except (json.JSONDecodeError, KeyError, IndexError, TypeError):
                raise SpecsimError(
                    f"{path}:{i + 1} is not a JSON object with 'turns' or 'prompt'; fix that line"
                ) from None
            # --category wins; then the line's own "category"; then its source's; then the
            # file's (a bundled set's, or the file stem of a user's JSONL)
            row_cat = category or (str(own) if own else SOURCE_CATEGORY.get(str(src), cat))
            rows.append(Prompt(text=str(text), category=row_cat, source=f"{path.stem}#{i}"))
    start = int(m.group("start")) if m.group("start") else None
    stop = int(m.group("stop")) if m.group("stop") else None
    return rows[start:stop]


def load_many(specs: list[str], category: str | None = None) -> list[Prompt]:
    """Concatenation of several prompt specs, in order."""
    out: list[Prompt] = []
    for s in specs:
        out.extend(load_prompts(s, category))
    if not out:
        raise SpecsimError(f"no prompts selected by {specs}; check the slices")
    return out

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


def _lines(path: Path) -> list[str]:
    """A prompt file's lines, refused in one line when it cannot be one: a directory, a FIFO or
    device (reading would block or never end), or text that is not UTF-8 (with its line)."""
    import stat

    mode = path.stat().st_mode
    if stat.S_ISDIR(mode):
        raise SpecsimError(f"--prompts {path} is a directory; pass a JSONL file inside it")
    if not stat.S_ISREG(mode):
        raise SpecsimError(
            f"--prompts {path} is not a regular file (a FIFO or device would block); "
            "write the prompts to a JSONL file first"
        )
    data = path.read_bytes()
    try:
        return data.decode("utf-8").split("\n")  # not splitlines: U+2028 may sit in a string
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SpecsimError(
            f"{path}:{line} is not UTF-8 (byte 0x{data[exc.start]:02x}); re-save the file as "
            "UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None


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
    for i, line in enumerate(_lines(path)):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            text = obj["turns"][0] if "turns" in obj else obj["prompt"]
            if not isinstance(text, str) or not text:
                raise TypeError("empty or non-text turn")
            src = obj.get("source") if isinstance(obj, dict) else None
            own = obj.get("category") if isinstance(obj, dict) else None
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise SpecsimError(
                f"{path}:{i + 1} is not a JSON object with a non-empty text 'turns' or 'prompt'; "
                "fix that line"
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

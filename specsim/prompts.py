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
    "copy-edit": "edit",  # evaluation only: copy / edit a given passage or function
    "copy-edit-2": "edit",  # the same templates over the next 40 passages and stubs
    "copy-edit-3": "edit",  # the same templates over GSM8K questions and stubs 120-159
    "copy-edit-4": "edit",  # the same over the next 20 GSM8K questions and stubs 80-99
    "copy-edit-5": "edit",  # the next 12 GSM8K questions, stubs 112-119 and 160-163
    "copy-edit-6": "edit",  # the next 12 GSM8K questions, 12 standard-library stubs
    "copy-edit-7": "edit",  # the next 12 GSM8K questions, 12 other standard-library stubs
    "copy-edit-8": "edit",  # the next 12 GSM8K questions, 12 more standard-library stubs
    "copy-edit-9": "edit",  # the next 12 GSM8K questions, 12 further standard-library stubs
    "copy-edit-10": "edit",  # the next 12 GSM8K questions, 12 still other standard-library stubs
    "copy-edit-11": "edit",  # the next 12 GSM8K questions, 12 yet other standard-library stubs
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
    device (reading would block or never end), a file the system will not read (a name too
    long, /proc/self/mem), or text that is not UTF-8 (with its line)."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError as exc:  # a name too long, a symlink loop, no permission: one line
        raise _os_refusal(path, exc) from None
    if stat.S_ISDIR(mode):
        raise SpecsimError(f"--prompts {path} is a directory; pass a JSONL file inside it")
    if not stat.S_ISREG(mode):
        raise SpecsimError(
            f"--prompts {path} is not a regular file (a FIFO or device would block); "
            "write the prompts to a JSONL file first"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:  # /proc/self/mem: a "regular" file that fails on read (EIO)
        raise _os_refusal(path, exc) from None
    try:
        return data.decode("utf-8").split("\n")  # not splitlines: U+2028 may sit in a string
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SpecsimError(
            f"{path}:{line} is not UTF-8 (byte 0x{data[exc.start]:02x}); re-save the file as "
            "UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None


def _os_refusal(path: Path, exc: OSError) -> SpecsimError:
    """The system refused to open or read a prompt file: one line with its reason."""
    shown = str(path) if len(str(path)) <= 200 else str(path)[:200] + "..."
    return SpecsimError(
        f"--prompts {shown}: cannot read it ({exc.strerror or type(exc).__name__}); "
        "pass a readable JSONL file"
    )


def _text(obj: object) -> str:
    """The prompt text of one parsed line: ``turns`` (a list; its first string) or ``prompt``.
    Raises TypeError for any other shape: a ``turns`` string would send only its first
    character, and a lone surrogate (``"\\ud800"``) cannot be encoded to send at all."""
    if not isinstance(obj, dict):
        raise TypeError("not an object")
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns:
            raise TypeError("turns is not a non-empty list")
        text = turns[0]
    else:
        text = obj.get("prompt")
    if not isinstance(text, str) or not text:
        raise TypeError("empty or non-text turn")
    return text


def _parse(path: Path, lineno: int, line: str) -> object:
    """One line's JSON, or a one-line refusal naming the file, the line and why."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        why = f"not JSON: {exc.msg} at column {exc.colno}"
    except ValueError:  # an integer of more than sys.get_int_max_str_digits() digits
        why = "a number too long to read"
    except RecursionError:  # [[[[... deeper than the parser's stack
        why = "arrays or objects nested too deeply"
    raise SpecsimError(
        f"{path}:{lineno} is {why}; each line must be a JSON object with a non-empty text "
        "'turns' or 'prompt'"
    )


def load_prompts(spec: str, category: str | None = None) -> list[Prompt]:
    """Prompts of ``NAME[START:STOP]`` (bundled name or path; the slice is optional)."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise SpecsimError(f"bad prompt spec {spec!r}; use NAME or NAME[START:STOP]")
    name = m.group("name")
    path = _bundled_path(name) if name in BUNDLED else Path(name).expanduser()
    try:
        found = path.exists()
    except OSError as exc:  # ENAMETOOLONG and friends: Path.exists lets them through
        raise _os_refusal(path, exc) from None
    if not found:
        raise SpecsimError(
            f"prompt file {name[:200]!r} not found; pass a JSONL path or one of {sorted(BUNDLED)}"
        )
    cat = category or BUNDLED.get(name) or BUNDLED.get(path.stem) or path.stem
    rows = []
    for i, line in enumerate(_lines(path)):
        if not line.strip():
            continue
        obj = _parse(path, i + 1, line)
        try:
            text = _text(obj)
        except TypeError:
            raise SpecsimError(
                f"{path}:{i + 1} is not a JSON object with a non-empty text 'turns' list or "
                "'prompt'; fix that line"
            ) from None
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise SpecsimError(
                f"{path}:{i + 1} holds a lone surrogate escape (e.g. \\ud800), which no server "
                "can be sent; fix that line"
            ) from None
        assert isinstance(obj, dict)
        src, own = obj.get("source"), obj.get("category")
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

"""The code in the README and docs/ is what people paste first: it must run.

- Every ``python`` block of the docs (docs/api.md has its own test) runs, a page's blocks in
  order, in a scratch folder that sees the shipped traces.
- Every ``specsim ...`` command line of the README and docs parses (right sub-command, flags
  that exist); the README tour's cheap lines run and exit as documented.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from specsim.cli import build_parser, main
from specsim.commands.profile import legacy_argv

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "api.md")


def _blocks(page: Path, langs: tuple[str, ...]) -> list[str]:
    """The fenced blocks of ``page`` whose language is one of ``langs`` ("" for none), read
    fence by fence: a closing fence is never taken for the next block's opening."""
    out, lang, body = [], None, []
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, body = line[3:].strip(), []
            else:
                if lang in langs:
                    out.append("\n".join(body) + "\n")
                lang = None
        elif lang is not None:
            body.append(line)
    return out


def _python_blocks(page: Path) -> list[str]:
    return _blocks(page, ("python",))


def _command_lines(page: Path) -> list[str]:
    """``specsim ...`` lines inside bash blocks, continuation lines joined, comments cut."""
    out = []
    for block in _blocks(page, ("bash", "")):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split(" # ")[0].strip()
            if line.startswith("specsim "):
                out.append(line)
    return out


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
@pytest.mark.parametrize("page", [p for p in PAGES if _python_blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run(page, tmp_path, monkeypatch):
    (tmp_path / "traces").symlink_to(ROOT / "traces")
    monkeypatch.chdir(tmp_path)
    import specsim.policies  # noqa: F401  (the built-ins, before the page adds its own)
    from specsim.policies.base import POLICIES

    # a page may register an example policy: keep it out of the other tests' registry
    monkeypatch.setattr(POLICIES, "_factories", dict(POLICIES._factories))
    monkeypatch.setattr(POLICIES, "_help", dict(POLICIES._help))
    namespace: dict = {"__name__": f"doc_{page.stem}"}
    for i, code in enumerate(_python_blocks(page)):
        try:
            exec(compile(code, f"{page.name} block {i + 1}", "exec"), namespace)  # noqa: S102
        except Exception as exc:
            raise AssertionError(f"{page.name} block {i + 1} failed: {exc!r}\n{code}") from exc


COMMANDS = [
    (page.name, line)
    for page in [ROOT / "README.md", *PAGES, ROOT / "traces" / "README.md"]
    for line in _command_lines(page)
]


def test_there_are_documented_commands():
    assert len(COMMANDS) >= 15


@pytest.mark.parametrize(("page", "line"), COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_documented_commands_parse(page, line):
    line = re.sub(r"\[--[^\]]*\]", "", line)  # optional parts of a usage pattern
    if "..." in line:
        pytest.skip("a usage pattern with placeholders, not a command")
    argv = legacy_argv(shlex.split(line)[1:])  # as main() reads it
    build_parser().parse_args(argv)  # exits 2 (SystemExit) on an unknown flag or command


TOUR_RUNS = {  # README tour lines that run in seconds, and the exit code they document
    "specsim traces info traces/chat.parquet": 0,
    "specsim replay traces/chat.parquet --policy zos": 0,
    "specsim replay traces/code.parquet --policy auto": 0,
    "specsim replay traces/chat.parquet --policy hw-aware": 0,
    "specsim check-lossless --policy hw-aware-global": 1,
}


@pytest.mark.slow
@pytest.mark.parametrize("prefix", list(TOUR_RUNS))
def test_readme_tour_lines_run(prefix, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    lines = [c for p, c in COMMANDS if p == "README.md" and c.startswith(prefix)]
    assert lines, f"the README tour has no line starting {prefix!r}"
    argv = shlex.split(lines[0])[1:]
    if argv[0] == "check-lossless":
        argv += ["--checks", "exact"]  # the documented verdict, without the minute of G-tests
    assert main(argv) == TOUR_RUNS[prefix]
    err = capsys.readouterr().err
    assert "Traceback" not in err

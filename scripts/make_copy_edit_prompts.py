"""Write the ``copy-edit`` EVALUATION prompts (issue 66, item 1): 80 prompts whose answers copy
or lightly edit text the prompt holds, the workload where speculation should win on a small
target (an n-gram drafter proposes the prompt's own text; a drafter predicts a copy well).

Why this set: on the held-out grids so far (chat, GSM8K, HumanEval on SmolLM2-135M) no setting
beat plain decoding on this CPU, so the simulator was never checked where speculation wins.
Rewriting, reformatting and copying a given passage or function is a real serving workload
(editing assistants, code refactors) whose outputs repeat their inputs. Made from the bundled
evaluation sets only, so the sources and licences are theirs: 40 passages from
``dolly-context`` (databricks-dolly-15k, CC BY-SA 3.0: these rows stay under it) and 40
function stubs from ``humaneval`` (OpenAI, MIT). Deterministic: every template, passage and
stub is chosen by position, no randomness.

    python scripts/make_copy_edit_prompts.py   # -> specsim/data/prompts/copy-edit.jsonl
    python scripts/make_copy_edit_prompts.py --part 2   # -> copy-edit-2.jsonl

``--part 2`` (``copy-edit-2``): the same templates over the NEXT 40 passages (all of
dolly-context's 80 then used) and HumanEval stubs 40-79, for a held-out grid after every
``copy-edit`` prompt had been run (reports/llama-cpp-v4/PLAN.md, step 5).

``--part 3`` (``copy-edit-3``): the same templates over 40 GSM8K test questions (the bundled
``gsm8k``, OpenAI, MIT: rows from 1000 on of at least 160 characters, the step-by-step
instruction left out; no grid ran rows past 112) and HumanEval stubs 120-159 (earlier grids ran
0-79 as copy-edit and 100-111 as plain prompts), for a third held-out grid (PLAN.md, step 8).

``--part 4`` (``copy-edit-4``): the same templates over the next 20 GSM8K test questions (rows
after part 3's last, 1041, of at least 160 characters) and HumanEval stubs 80-99 (in no grid:
earlier ones ran 0-79, 100-111 and 120-159), 40 prompts, for a fourth held-out grid (PLAN.md,
step 10).

``--part 5`` (``copy-edit-5``): the same templates over the next 12 GSM8K test questions (rows
after part 4's last, 1068, of at least 160 characters) and the last 12 HumanEval stubs no grid
ran (112-119 and 160-163), 24 prompts, for a fifth held-out grid (PLAN.md, step 13).

``--part 6`` (``copy-edit-6``): the same templates over the next 12 GSM8K test questions (rows
after part 5's last, 1083) and, every HumanEval stub having run in some grid, 12 function stubs
from Python's standard library (``STDLIB_MODULES``: each module's first public function with a
docstring whose signature and docstring, the stub, are 150-700 characters; PSF License 2.0),
24 prompts, for a sixth held-out grid (PLAN.md, step 16). The stubs are read from the running
Python's library, so the part is written only by Python ``STDLIB_PYTHON`` (another version's
library may differ).

``--part 7`` (``copy-edit-7``): the same over the next 12 GSM8K test questions (rows after part
6's last, 1098) and the first stub of 12 other standard-library modules, for a seventh
held-out grid (PLAN.md, step 19).

``--part 8`` (``copy-edit-8``): the same over the next 12 GSM8K test questions (rows after part
7's last, 1118) and the first stub of 12 standard-library modules neither part 6 nor part 7
used, for an eighth held-out grid.

``--part 9`` (``copy-edit-9``): the same over the next 12 GSM8K test questions (rows after part
8's last, 1132) and the first stub of 12 standard-library modules none of parts 6-8 used, for a
ninth held-out grid.

``--part 10`` (``copy-edit-10``): the same over the next 12 GSM8K test questions (rows after
part 9's last, 1147) and the first stub of 12 standard-library modules none of parts 6-9 used,
for a tenth held-out grid.

``--part 11`` (``copy-edit-11``): the same over the next 12 GSM8K test questions (rows after
part 10's last, 1166) and the first stub of 12 standard-library modules none of parts 6-10
used, for an eleventh held-out grid.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROMPTS = ROOT / "specsim" / "data" / "prompts"
OUT = PROMPTS / "copy-edit.jsonl"
OUTS = {1: OUT, 2: PROMPTS / "copy-edit-2.jsonl", 3: PROMPTS / "copy-edit-3.jsonl",
        4: PROMPTS / "copy-edit-4.jsonl", 5: PROMPTS / "copy-edit-5.jsonl",
        6: PROMPTS / "copy-edit-6.jsonl", 7: PROMPTS / "copy-edit-7.jsonl",
        8: PROMPTS / "copy-edit-8.jsonl", 9: PROMPTS / "copy-edit-9.jsonl",
        10: PROMPTS / "copy-edit-10.jsonl", 11: PROMPTS / "copy-edit-11.jsonl"}  # fmt: skip
PASSAGE_TEMPLATES = (
    "Copy the following passage word for word, putting each sentence on its own line. Output "
    "only the passage.\n\n{text}",
    "Rewrite the following passage exactly as it is, but write every number in words. Output "
    "only the rewritten passage.\n\n{text}",
    "Repeat the following text unchanged, then add one sentence at the end that sums it up."
    "\n\n{text}",
    "Proofread the following passage: fix any spelling or punctuation mistakes and keep "
    "everything else exactly the same. Output the whole corrected passage.\n\n{text}",
)
CODE_TEMPLATES = (
    "Copy this Python code exactly, then complete the function body:\n```python\n{text}\n```",
    "Rewrite this Python code unchanged except that the function is renamed with the prefix "
    "`my_`. Output the whole code.\n```python\n{text}\n```",
    "Copy this Python code and add a comment line above the `def` saying in a few words what "
    "it does. Keep everything else exactly the same.\n```python\n{text}\n```",
    "Reformat this Python code so that its docstring uses single quotes instead of double "
    "quotes; change nothing else and output the whole code.\n```python\n{text}\n```",
)
PER_SOURCE = 40
PER_PART = {4: 20, 5: 12, 6: 12, 7: 12, 8: 12, 9: 12, 10: 12, 11: 12}  # of each kind if fewer
STUB_START = {1: 0, 2: 40, 3: 120, 4: 80}  # the first HumanEval stub of each part
STUB_ROWS = {5: (*range(112, 120), *range(160, 164))}  # a part's stubs where not one run
# each part's first GSM8K row
GSM8K_START = {3: 1000, 4: 1042, 5: 1069, 6: 1084, 7: 1099, 8: 1119, 9: 1133, 10: 1148,
               11: 1167}  # fmt: skip
GSM8K_MIN_CHARS = 160
# parts 6-11's code: one stub from each of these standard-library modules, read from Python.
# Part 9's are the first 12 modules, tried in this fixed order, that no earlier part used and
# whose stub under stdlib_stubs' rule is unlike every earlier part's: enum, abc, types,
# warnings, inspect, json, csv, random, sysconfig, selectors, socket, ssl, subprocess, weakref,
# zipimport, plistlib, configparser, argparse, getopt, gzip (json, csv, random, selectors,
# weakref, zipimport, configparser and argparse yield no stub, and were skipped; so do
# calendar, colorsys, keyword, reprlib, shlex, sched, netrc and queue, left out beforehand).
# Part 10's are the first 12 so chosen in this fixed order: pathlib, fractions, decimal,
# numbers, itertools, traceback, http.cookies, smtplib, ftplib, imaplib, poplib, tarfile, bz2,
# lzma, pickle, shelve, dbm, sqlite3, logging, optparse, cmd, code (pathlib, fractions,
# decimal, numbers, itertools (built in, no source), http.cookies, poplib, sqlite3, optparse
# and cmd yield no stub, and were skipped; so do the 16 named for part 9, left out beforehand).
# Part 11's are the first 12 so chosen in this fixed order: binascii, uu, mailbox, html.parser,
# xml.dom.minidom, http.client, wave, chunk, filecmp, unicodedata, platform, errno, atexit,
# tracemalloc, timeit, trace, pdb, doctest, unittest, ast, dis, os, stat, fileinput, getpass,
# pkgutil (binascii and unicodedata (in C, no source), errno and atexit (built in, no source),
# uu, mailbox, html.parser, xml.dom.minidom, wave, chunk, trace, pdb, unittest and stat yield
# no stub, and were skipped; so do the 26 named for parts 9 and 10, left out beforehand).
STDLIB_MODULES = {
    6: ("textwrap", "heapq", "bisect", "statistics", "fnmatch", "base64", "glob", "posixpath",
        "difflib", "string", "html", "shutil"),
    7: ("operator", "functools", "urllib.parse", "tempfile", "ipaddress", "uuid", "pprint",
        "quopri", "mimetypes", "email.utils", "secrets", "hmac"),
    8: ("copy", "zipfile", "locale", "gettext", "codecs", "hashlib", "ntpath", "genericpath",
        "linecache", "tokenize", "contextlib", "dataclasses"),
    9: ("enum", "abc", "types", "warnings", "inspect", "sysconfig", "socket", "ssl", "subprocess",
        "plistlib", "getopt", "gzip"),
    10: ("traceback", "smtplib", "ftplib", "imaplib", "tarfile", "bz2", "lzma", "pickle",
         "shelve", "dbm", "logging", "code"),
    11: ("http.client", "filecmp", "platform", "tracemalloc", "timeit", "doctest", "ast", "dis",
         "os", "fileinput", "getpass", "pkgutil"),
}  # fmt: skip
STDLIB_PYTHON = (3, 11)
STUB_CHARS = (150, 700)


def passages(part: int = 1) -> list[tuple[str, str]]:
    """The ``part``-th ``PER_SOURCE`` dolly-context rows' passages (the text after the
    instruction) with their ids; parts 3 and 4: GSM8K test questions."""
    if part in GSM8K_START:
        return gsm8k_passages(GSM8K_START[part], PER_PART.get(part, PER_SOURCE))
    out = []
    for line in (PROMPTS / "dolly-context.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        _, _, text = row["turns"][0].partition("\n\n")
        if text.strip():
            out.append((row["id"], text.strip()))
    return out[(part - 1) * PER_SOURCE : part * PER_SOURCE]


def gsm8k_passages(start: int = 1000, count: int = PER_SOURCE) -> list[tuple[str, str]]:
    """``count`` GSM8K questions from row ``start`` on, of at least ``GSM8K_MIN_CHARS``
    characters, without the step-by-step instruction, with their rows."""
    out = []
    lines = (PROMPTS / "gsm8k.jsonl").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines[start:], start=start):
        text = json.loads(line)["turns"][0].split("\nPlease reason step by step")[0].strip()
        if len(text) >= GSM8K_MIN_CHARS:
            out.append((f"gsm8k#{i}", text))
    return out[:count]


def stubs(part: int = 1) -> list[tuple[str, str]]:
    """The ``part``-th ``PER_SOURCE`` HumanEval stubs (the code between the fences), by line
    (parts 6-11: standard-library stubs, :func:`stdlib_stubs`)."""
    if part in STDLIB_MODULES:
        return stdlib_stubs(part)
    out = []
    lines = (PROMPTS / "humaneval.jsonl").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        turn = json.loads(line)["turns"][0]
        code = turn.split("```python\n", 1)[-1].rsplit("```", 1)[0].strip("\n")
        out.append((f"humaneval#{i}", code))
    if part in STUB_ROWS:
        return [out[i] for i in STUB_ROWS[part]]
    return out[STUB_START[part] : STUB_START[part] + PER_PART.get(part, PER_SOURCE)]


def stdlib_stubs(part: int = 6) -> list[tuple[str, str]]:
    """Part ``part``'s code: from each of its ``STDLIB_MODULES`` the first public top-level
    function (in source order) with a docstring whose stub (its ``def`` line through its
    docstring, as HumanEval's stubs are) is ``STUB_CHARS`` long, named
    ``stdlib:module.function``."""
    from specsim.errors import SpecsimError

    if sys.version_info[:2] != STDLIB_PYTHON:
        want = ".".join(map(str, STDLIB_PYTHON))
        raise SpecsimError(f"copy-edit-{part}'s code is read from Python {want}'s standard "
                         f"library and this is Python {sys.version_info[0]}."
                         f"{sys.version_info[1]}; run the script with Python {want}")  # fmt: skip
    out = []
    for name in STDLIB_MODULES[part]:
        lines = inspect.getsource(importlib.import_module(name)).splitlines()
        for node in ast.parse("\n".join(lines)).body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = node.body[0] if node.body else None
            if ast.get_docstring(node) is None or doc is None:
                continue
            stub = "\n".join(lines[node.lineno - 1 : doc.end_lineno])
            if STUB_CHARS[0] <= len(stub) <= STUB_CHARS[1]:
                out.append((f"stdlib:{name}.{node.name}", stub))
                break
        else:
            raise SpecsimError(f"no stub in {name} fits {STUB_CHARS}; change STDLIB_MODULES")
    return out


def build(part: int = 1) -> list[dict]:
    """Passages and stubs interleaved, each source's templates in turn."""
    rows = []
    pairs = zip(passages(part), stubs(part), strict=True)
    for i, ((pid, text), (cid, code)) in enumerate(pairs):
        tp = PASSAGE_TEMPLATES[i % len(PASSAGE_TEMPLATES)]
        tc = CODE_TEMPLATES[i % len(CODE_TEMPLATES)]
        rows.append({"turns": [tp.format(text=text)], "source": pid, "kind": "passage"})
        rows.append({"turns": [tc.format(text=code)], "source": cid, "kind": "code"})
    return rows


def main(argv: list[str] | None = None) -> int:
    from specsim.errors import LineParser, run_script

    ap = LineParser(prog="make_copy_edit_prompts.py", description=__doc__.split("\n")[0])
    ap.add_argument("--part", type=int, choices=tuple(OUTS), default=1,
                    help="1: copy-edit (sources 0-39), 2: copy-edit-2 (sources 40-79), 3: "
                    "copy-edit-3 (GSM8K questions, HumanEval stubs 120-159), 4: copy-edit-4 "
                    "(the next GSM8K questions, stubs 80-99), 5: copy-edit-5 (the next GSM8K "
                    "questions, stubs 112-119 and 160-163), 6: copy-edit-6 (the next GSM8K "
                    "questions, 12 standard-library stubs; Python 3.11), 7: copy-edit-7 (the "
                    "same, the next ones), 8: copy-edit-8 (the same, the next ones), 9: "
                    "copy-edit-9 (the same, the next ones), 10: copy-edit-10 (the same, the "
                    "next ones), 11: copy-edit-11 (the same, the next ones)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None,
                    help="JSONL to write (default: the part's bundled file)")  # fmt: skip
    ap.add_argument("--force", action="store_true", help="overwrite --out (the shipped file is "
                    "regenerated in place without it)")  # fmt: skip
    args = ap.parse_args(argv)
    return run_script(ap.prog, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    from specsim.outputs import check_out, write_text

    default = OUTS[args.part]
    path = default if args.out is None else args.out
    out = check_out(path, force=args.force or path.resolve() == default, suffixes=(".jsonl",))
    rows = build(args.part)
    write_text("".join(json.dumps(r) + "\n" for r in rows), out)
    print(f"wrote {len(rows)} prompts to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

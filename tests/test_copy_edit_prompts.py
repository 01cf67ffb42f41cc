"""The ``copy-edit`` prompts (issue 66, item 1): a bundled evaluation set whose answers copy or
lightly edit text the prompt holds, made deterministically from the bundled dolly-context
passages and HumanEval stubs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from specsim.prompts import load_prompts

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


@pytest.mark.parametrize("name", ["copy-edit", "copy-edit-2", "copy-edit-3"])
def test_the_set_loads_by_name_with_its_category(name):
    prompts = load_prompts(name)
    assert len(prompts) == 80
    assert {p.category for p in prompts} == {"edit"}
    assert len(load_prompts(f"{name}[0:10]")) == 10


@pytest.mark.parametrize("part", [1, 2, 3, 4, 5])
def test_every_prompt_holds_the_text_it_asks_to_copy(part):
    import make_copy_edit_prompts as m

    passages, stubs = dict(m.passages(part)), dict(m.stubs(part))
    for row in m.build(part):
        src = passages if row["kind"] == "passage" else stubs
        assert src[row["source"]] in row["turns"][0]
        assert len(src[row["source"]]) > 80  # enough text to copy


def test_the_second_set_shares_no_text_with_the_first():
    """copy-edit-2 is for a held-out grid after every copy-edit prompt had run: no source and
    no prompt in common."""
    import make_copy_edit_prompts as m

    one, two = m.build(1), m.build(2)
    assert not {r["source"] for r in one} & {r["source"] for r in two}
    assert not {p.text for p in load_prompts("copy-edit")} & {
        p.text for p in load_prompts("copy-edit-2")
    }
    out = m.OUTS[2].read_bytes()
    assert out == "".join(json.dumps(r) + "\n" for r in two).encode()


def test_the_third_set_shares_no_source_or_text_with_the_others():
    """copy-edit-3 is for a third held-out grid: no source, and no prompt, of the first two,
    and none of the HumanEval or GSM8K rows earlier grids ran as plain prompts."""
    import make_copy_edit_prompts as m

    three = m.build(3)
    sources = {r["source"] for r in three}
    assert not sources & ({r["source"] for r in m.build(1)} | {r["source"] for r in m.build(2)})
    rows = {int(s.split("#")[1]) for s in sources if s.startswith("humaneval#")}
    assert rows == set(range(120, 160))
    gsm = {int(s.split("#")[1]) for s in sources if s.startswith("gsm8k#")}
    assert len(gsm) == 40 and min(gsm) >= 1000
    texts = {p.text for p in load_prompts("copy-edit-3")}
    assert not texts & {p.text for n in ("copy-edit", "copy-edit-2") for p in load_prompts(n)}
    assert m.OUTS[3].read_bytes() == "".join(json.dumps(r) + "\n" for r in three).encode()


def test_the_fourth_set_shares_no_source_or_text_with_the_others():
    """copy-edit-4 is for a fourth held-out grid: 40 prompts over sources no earlier set or
    grid holds (GSM8K rows after copy-edit-3's, HumanEval stubs 80-99)."""
    import make_copy_edit_prompts as m

    four = m.build(4)
    assert len(four) == 40 and len(load_prompts("copy-edit-4")) == 40
    assert {p.category for p in load_prompts("copy-edit-4")} == {"edit"}
    sources = {r["source"] for r in four}
    assert not sources & {r["source"] for part in (1, 2, 3) for r in m.build(part)}
    rows = {int(s.split("#")[1]) for s in sources if s.startswith("humaneval#")}
    assert rows == set(range(80, 100))
    gsm = {int(s.split("#")[1]) for s in sources if s.startswith("gsm8k#")}
    assert len(gsm) == 20 and min(gsm) > max(
        int(s.split("#")[1]) for s in (r["source"] for r in m.build(3)) if "gsm8k" in s
    )
    texts = {p.text for p in load_prompts("copy-edit-4")}
    names = ("copy-edit", "copy-edit-2", "copy-edit-3")
    assert not texts & {p.text for n in names for p in load_prompts(n)}
    assert m.OUTS[4].read_bytes() == "".join(json.dumps(r) + "\n" for r in four).encode()


def test_the_fifth_set_shares_no_source_or_text_with_the_others():
    """copy-edit-5 is for a fifth held-out grid: 24 prompts over the last sources no earlier
    set or grid holds (GSM8K rows after copy-edit-4's, HumanEval stubs 112-119 and 160-163:
    earlier grids ran 0-111 as copy-edit or plain prompts but 112-119, and 120-159)."""
    import make_copy_edit_prompts as m

    five = m.build(5)
    assert len(five) == 24 and len(load_prompts("copy-edit-5")) == 24
    assert {p.category for p in load_prompts("copy-edit-5")} == {"edit"}
    sources = {r["source"] for r in five}
    assert not sources & {r["source"] for part in (1, 2, 3, 4) for r in m.build(part)}
    rows = {int(s.split("#")[1]) for s in sources if s.startswith("humaneval#")}
    assert rows == {*range(112, 120), *range(160, 164)}
    gsm = {int(s.split("#")[1]) for s in sources if s.startswith("gsm8k#")}
    assert len(gsm) == 12 and min(gsm) > max(
        int(s.split("#")[1]) for s in (r["source"] for r in m.build(4)) if "gsm8k" in s
    )
    texts = {p.text for p in load_prompts("copy-edit-5")}
    names = ("copy-edit", "copy-edit-2", "copy-edit-3", "copy-edit-4")
    assert not texts & {p.text for n in names for p in load_prompts(n)}
    assert m.OUTS[5].read_bytes() == "".join(json.dumps(r) + "\n" for r in five).encode()


@pytest.mark.slow
@pytest.mark.parametrize("part", [6, 7, 8, 9, 10, 11])
def test_the_standard_library_sets_share_no_source_or_text_with_the_others(part):
    """copy-edit-6 to -11 are for the sixth to eleventh held-out grids: the next 12 GSM8K
    questions each and, every HumanEval stub having run, 12 stubs from Python 3.11's standard
    library (one per module, signature and docstring, no module in two parts); the shipped file
    is what the script writes on that Python."""
    import make_copy_edit_prompts as m

    name = f"copy-edit-{part}"
    shipped = load_prompts(name)
    assert len(shipped) == 24 and {p.category for p in shipped} == {"edit"}
    rows = [json.loads(x) for x in m.OUTS[part].read_text().splitlines()]
    sources = [r["source"] for r in rows]
    code = [s for s in sources if s.startswith("stdlib:")]
    assert len(code) == 12 and len({s.rsplit(".", 1)[0] for s in code}) == 12
    earlier = {mod for k in m.STDLIB_MODULES if k < part for mod in m.STDLIB_MODULES[k]}
    assert not set(m.STDLIB_MODULES[part]) & earlier
    gsm = [int(s.split("#")[1]) for s in sources if s.startswith("gsm8k#")]
    before = [
        int(s.split("#")[1]) for s in (r["source"] for r in m.build(part - 1)) if "gsm8k" in s
    ]
    assert len(gsm) == 12 and min(gsm) > max(before)
    for r in rows:
        if r["kind"] == "code":
            body = r["turns"][0].split("```python\n", 1)[1].rsplit("```", 1)[0]
            assert body.startswith("def ") and body.rstrip().endswith(('"' * 3, "'" * 3))
    names = ["copy-edit", *(f"copy-edit-{k}" for k in range(2, part))]
    assert not {p.text for p in shipped} & {p.text for n in names for p in load_prompts(n)}
    if sys.version_info[:2] == m.STDLIB_PYTHON:
        assert (
            m.OUTS[part].read_bytes()
            == "".join(json.dumps(r) + "\n" for r in m.build(part)).encode()
        )


def test_the_sixth_set_is_refused_on_another_python(tmp_path, monkeypatch, capsys):
    import make_copy_edit_prompts as m

    monkeypatch.setattr(m, "STDLIB_PYTHON", (2, 7))
    assert m.main(["--part", "6", "--out", str(tmp_path / "six.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "Python 2.7's standard library" in err and "Traceback" not in err
    assert not (tmp_path / "six.jsonl").exists()


def test_the_shipped_file_is_what_the_script_writes(tmp_path):
    import make_copy_edit_prompts as m

    out = tmp_path / "c.jsonl"
    assert m.main(["--out", str(out)]) == 0
    assert out.read_bytes() == m.OUT.read_bytes()
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["kind"] for r in rows[:4]] == ["passage", "code", "passage", "code"]
    assert m.main(["--out", str(out)]) == 2  # the user's file is not overwritten silently

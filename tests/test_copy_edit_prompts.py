"""The ``copy-edit`` prompts (issue 66, item 1): a bundled evaluation set whose answers copy or
lightly edit text the prompt holds, made deterministically from the bundled dolly-context
passages and HumanEval stubs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specsim.prompts import load_prompts

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


def test_the_set_loads_by_name_with_its_category():
    prompts = load_prompts("copy-edit")
    assert len(prompts) == 80
    assert {p.category for p in prompts} == {"edit"}
    assert len(load_prompts("copy-edit[0:10]")) == 10


def test_every_prompt_holds_the_text_it_asks_to_copy():
    import make_copy_edit_prompts as m

    passages, stubs = dict(m.passages()), dict(m.stubs())
    for row in m.build():
        src = passages if row["kind"] == "passage" else stubs
        assert src[row["source"]] in row["turns"][0]
        assert len(src[row["source"]]) > 80  # enough text to copy


def test_the_shipped_file_is_what_the_script_writes(tmp_path):
    import make_copy_edit_prompts as m

    out = tmp_path / "c.jsonl"
    assert m.main(["--out", str(out)]) == 0
    assert out.read_bytes() == m.OUT.read_bytes()
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["kind"] for r in rows[:4]] == ["passage", "code", "passage", "code"]
    assert m.main(["--out", str(out)]) == 2  # the user's file is not overwritten silently

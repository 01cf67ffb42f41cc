"""What a plug-in policy's ``solo`` and ``plan`` hooks return goes through the same boundary as
``schedule`` (issue: reliability v3): a negative, a non-integer, NaN or more than gamma is
refused in one line naming the plug-in and the hook, never clamped or truncated in silence."""

from __future__ import annotations

import re
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.policies.base import StepInput, check_plan, get_policy


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hooks") / "t.parquet"
    assert main(["traces", "synth", "--out", str(path), "--requests", "12", "--output-len",
                 "40", "--prompt-len", "64", "--profile", "chat", "--seed", "3"]) == 0  # fmt: skip
    return path


PLUGIN = """
import numpy as np
from specsim.policies.base import Policy

def _schedule(inp):
    k = inp.drafted if inp.drafted is not None else inp.gamma
    return np.full(inp.n_requests, min(2, k), np.int64)

def policy():
    return Policy(name="mine", schedule=_schedule, {hook})
"""
PLAN = "plan=lambda inp: {value}"
SOLO = "solo=lambda conf, acc, st: {value}, rowwise=True, solo_rows=True"


@pytest.fixture(scope="module")
def table_profile(tmp_path_factory) -> Path:
    """A step table and nothing else. ``solo`` is called only by the lone request's walk, which
    runs on a 1-D table without measured-engine terms or attention compute
    (``StepV2.walk_ok`` in specsim.sim.serving); the default profile (the built
    llama-3-8b-h100) has those terms, so the walk and ``solo`` never run on it."""
    path = tmp_path_factory.mktemp("hooks-profile") / "table.csv"
    path.write_text("batch_tokens,step_ms\n1,6\n64,6.5\n4096,60\n")
    return path


def _run(tmp_path: Path, monkeypatch, trace: Path, hook: str, value: str, capsys,
         profile: Path | None = None) -> tuple:  # fmt: skip
    name = "hook_" + re.sub(r"\W", "_", f"{hook[:4]}_{value}")[:60] + f"_{abs(hash(value))}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(PLUGIN.format(hook=hook.format(
        value=value))))  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    extra = ["--profile", str(profile)] if profile is not None else []
    code = main(["replay", str(trace), "--policy", f"{name}:policy", "--requests", "4",
                 "--concurrency", "1", "--allow-unsteady", "--json", *extra])  # fmt: skip
    return code, capsys.readouterr().err, name


@pytest.mark.parametrize(
    "value, says",
    [("-1", "returned -1, outside [0, 7]"), ("99", "returned 99, outside [0, 7]"),
     ("float('nan')", "'nan', not a whole number"), ("2.5", "'2.5', not a whole number"),
     ("float('inf')", "'inf', not a whole number"), ("'3'", "returned str"),
     ("True", "returned bool"), ("np.array([1, 2])", "an array of shape (2,)"),
     ("1 + 2j", "returned complex")],
)  # fmt: skip
def test_a_bad_plan_is_refused_naming_the_plugin_and_the_hook(
    value, says, tmp_path, monkeypatch, trace, capsys
):
    code, err, name = _run(tmp_path, monkeypatch, trace, PLAN, value, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "policy (plan)" in lines[0] and name in lines[0], err
    assert says in lines[0], lines[0]


@pytest.mark.parametrize("value", ["None", "0", "7", "np.int64(3)", "3.0", "np.array(2)"])
def test_a_good_plan_runs(value, tmp_path, monkeypatch, trace, capsys):
    code, err, _ = _run(tmp_path, monkeypatch, trace, PLAN, value, capsys)
    assert code == 0, err


@pytest.mark.parametrize(
    "value, says",
    [("np.full(conf.shape[0], -1)", "outside [0, 7]"),
     ("np.full(conf.shape[0], 8)", "outside [0, 7]"),
     ("np.full(conf.shape[0], np.nan)", "non-integer lengths"),
     ("np.full(conf.shape[0], 1.5)", "non-integer lengths"),
     ("np.zeros(3, np.int64)", "returned shape (3,)"),
     ("'abc'", "returned shape ()")],
)  # fmt: skip
def test_a_bad_solo_is_refused_naming_the_plugin_and_the_hook(
    value, says, tmp_path, monkeypatch, trace, table_profile, capsys
):
    code, err, name = _run(tmp_path, monkeypatch, trace, SOLO, value, capsys, table_profile)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "policy (solo)" in lines[0] and name in lines[0], err
    assert says in lines[0], lines[0]


def test_check_plan_accepts_whole_numbers_in_range_and_nothing_else():
    inp = StepInput(conf=np.zeros((3, 5)), step_time=lambda b: b)
    for ok, want in ((None, None), (0, 0), (5, 5), (np.int32(2), 2), (4.0, 4), (Fraction(3), 3)):
        assert check_plan(ok, inp, "p") == want
    for bad in (-1, 6, 2**80, float("nan"), 2.5, True, "2", [2], np.array([1]), 1j, None.__class__):
        with pytest.raises(SpecsimError, match=r"policy \(plan\) 'p' returned"):
            check_plan(bad, inp, "p")


def test_builtin_policies_keep_their_hooks_unwrapped():
    """The check wraps user code only: a built-in's plan is the function it registered."""
    pol = get_policy("trtllm-schedule:4=3")
    assert pol.plan is not None and "plugin[" not in pol.plan.__qualname__

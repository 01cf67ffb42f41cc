"""Plug-in policies that fail in ways the older corpora did not try (issue 49's review corpus):
each is one line on stderr naming the policy, exit 2, never a traceback or an internal error,
and a plug-in that closes stdout loses only the printed result, never ``--out``."""

from __future__ import annotations

import itertools
import json
import sys
import textwrap

import pytest

from specsim.cli import main

PLUGIN = """
import sys
import numpy as np
from specsim.policies.base import Policy


class Boom(BaseException):
    pass


def _one(inp):
    return np.ones(inp.n_requests, np.int64)


def base_exception(inp):
    raise Boom("a BaseException that is not an Exception")


def generator_exit(inp):
    raise GeneratorExit("bye")


def ragged(inp):
    return [[1], [1, 2]] + [[0]] * max(inp.n_requests - 2, 0)


def draft_len_negative():
    return Policy(name="dl-neg", schedule=_one, draft_len=-3)


def draft_len_nan():
    return Policy(name="dl-nan", schedule=_one, draft_len=float("nan"))


def draft_len_half():
    return Policy(name="dl-half", schedule=_one, draft_len=2.5)


def needs_none():
    return Policy(name="needs-none", schedule=_one, needs=None)


def needs_bogus():
    return Policy(name="needs-bogus", schedule=_one, needs=frozenset({"bogus"}))


def zos_text():
    return Policy(name="zos-text", schedule=_one, zos="no")


class _Sig:
    @property
    def __signature__(self):
        raise RuntimeError("no signature for you")

    def __call__(self, inp):
        return _one(inp)


bad_signature = _Sig()


async def coroutine(inp):
    return _one(inp)


def close_stdout(inp):
    sys.stdout.close()
    return _one(inp)
"""

GETATTR = """
def __getattr__(name):
    raise RuntimeError("lazy import failed")
"""

_names = itertools.count()


@pytest.fixture()
def plugin(tmp_path, monkeypatch):
    """A fresh module name per test (no stale import), on sys.path for the test only."""
    name = f"plug_v3_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(PLUGIN))
    (tmp_path / f"{name}_ga.py").write_text(textwrap.dedent(GETATTR))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for mod in (name, f"{name}_ga"):
        sys.modules.pop(mod, None)


def _replay(spec: str, capsys, *extra: str) -> tuple[int, str, str]:
    args = ["replay", "chat", "--policy", spec, "--concurrency", "4", "--requests", "16",
            "--allow-unsteady", "--json", *extra]  # fmt: skip
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("attr", "says"),
    [
        ("base_exception", "raised Boom"),
        ("generator_exit", "raised GeneratorExit"),
        ("ragged", "which is not an array of lengths"),
        ("draft_len_negative", "draft_len must be None"),
        ("draft_len_nan", "draft_len must be None"),
        ("draft_len_half", "draft_len must be None"),
        ("needs_none", "needs must be a frozenset"),
        ("needs_bogus", "'bogus', which is not a StepInput field"),
        ("zos_text", "zos must be True or False"),
        ("coroutine", "is an async function"),
    ],
)
def test_a_broken_plugin_is_one_line_exit_2(plugin, attr, says, capsys):
    code, out, err = _replay(f"{plugin}:{attr}", capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and says in err and plugin in err, err
    assert "Traceback" not in err and "internal error" not in err


def test_a_module_getattr_that_raises_is_one_line(plugin, capsys):
    code, _, err = _replay(f"{plugin}_ga:anything", capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "RuntimeError" in err and "lazy import failed" in err


def test_a_callable_whose_signature_raises_is_still_run(plugin, capsys):
    code, out, err = _replay(f"{plugin}:bad_signature", capsys)
    assert code == 0, err
    assert '"requests_completed": 16' in out


def test_a_plugin_closing_stdout_keeps_out_and_says_what_was_lost(plugin, capsys, tmp_path):
    dest = tmp_path / "run.csv"
    code, _, err = _replay(f"{plugin}:close_stdout", capsys, "--out", str(dest))
    assert dest.exists() and dest.stat().st_size > 0
    assert code == 2 and err.count("\n") == 1 and "internal error" not in err, err


SOLO = """
import numpy as np
from specsim.policies.base import Policy


def _two(inp):
    return np.minimum(2, inp.gamma) + np.zeros(inp.n_requests, np.int64)


def _solo(conf, accept_len, step_time):
    raise ValueError("not for these rows")


def with_solo():
    return Policy(name="two-solo", schedule=_two, solo=_solo, rowwise=True, solo_rows=True)


def without_solo():
    return Policy(name="two", schedule=_two)
"""


def test_a_plugins_solo_value_error_falls_back_to_step_by_step(tmp_path, monkeypatch, capsys):
    """Policy's documented protocol: solo may raise ValueError where it does not apply, and the
    engine then schedules step by step; a plug-in is held to the same protocol as a built-in
    (one request in flight: the serving model's walk asks a policy's solo form)."""
    name = f"plug_v3_solo_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(SOLO))
    monkeypatch.syspath_prepend(str(tmp_path))
    runs = []
    for attr in ("with_solo", "without_solo"):
        code, out, err = _replay(f"{name}:{attr}", capsys, "--concurrency", "1")
        assert code == 0, err
        summary = json.loads(out)
        (
            summary.pop("config"),
            summary.pop("wall_time_s", None),
            summary.pop("sim_tokens_per_wall_s", None),
        )
        runs.append(summary)
    sys.modules.pop(name, None)
    assert runs[0] == runs[1] and runs[0]["requests_completed"] == 16

"""The command line as a newcomer meets it: help is plain, cheap and complete."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specsim.cli import build_parser, main
from specsim.commands import common, plot


def test_help_lists_every_builtin_policy_and_profile():
    import specsim.policies  # noqa: F401  (registers the built-ins)
    from specsim.analysis.plots import KINDS
    from specsim.policies.base import POLICIES
    from specsim.sim.cost.profiles import PROFILES

    listed = {n.split(":")[0] for n in common.POLICY_NAMES}
    assert listed == set(POLICIES.names())
    assert set(common.PROFILE_NAMES) == set(PROFILES)
    assert tuple(plot.KINDS) == tuple(KINDS)


@pytest.mark.parametrize("command", ["replay", "sweep", "plot", "traces", "report", "record"])
def test_help_is_plain_text(command, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and "usage: specsim " + command in out


def test_help_imports_neither_pandas_nor_numpy():
    """--help must stay fast: the heavy libraries load only when a command runs."""
    code = (
        "import sys\nfrom specsim.cli import build_parser\n"
        "for c in ['replay','sweep','plot','traces','report','record','engine','validate',"
        "]:\n"
        "    try:\n        build_parser().parse_args([c, '--help'])\n"
        "    except SystemExit:\n        pass\n"
        "print(sorted(m for m in ('numpy', 'pandas', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_burstiness_is_the_gamma_shape_vllm_means(tmp_path, capsys):
    trace = "traces/synthetic-chat.parquet"
    args = ["replay", trace, "--policy", "mtp1", "--rate", "4", "--requests", "40", "--json"]

    def summary(extra: list[str]) -> dict:
        assert main([*args, *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        return {k: v for k, v in out.items() if k != "config" and "wall" not in k}

    a = summary(["--burstiness", "0.25"])
    assert a == summary(["--cv", "2"])  # CV = 1 / sqrt(0.25)
    assert a != summary(["--cv", "1"])


def test_static_beyond_the_block_warns(capsys):
    args = ["replay", "traces/synthetic-chat.parquet", "--policy", "static:99"]
    assert main([*args, "--requests", "5"]) == 0
    err = capsys.readouterr().err
    assert "static:99" in err and "verifies 7" in err

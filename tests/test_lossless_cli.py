"""``specsim check-lossless`` on the worked example in examples/lossless and on bad callables:
exit 0 when lossless, 1 when lossy, 2 with a one-line error when the callable is unusable."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest

from specsim.cli import main
from specsim.lossless.mutants import catalogue

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "lossless"
FAST = ["--samples", "20000"]


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.syspath_prepend(str(tmp_path))


def _module(tmp_path: Path, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    return name


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_example_verifier_is_lossless(capsys):
    assert main(["check-lossless", "--verifier", "my_verifier:verify", *FAST]) == 0
    out = capsys.readouterr().out
    assert "verdict: no evidence of loss: 6 of 6 worlds proven exactly" in out
    assert "LOSSY" not in out and out.count("proven (exact)") == 6
    assert out.count(" exact ") == 6 and out.count(" statistical ") == 6


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_example_buggy_verifier_is_caught_with_a_counterexample(capsys):
    code = main(["check-lossless", "--verifier", "my_verifier:verify_buggy", *FAST])
    out = capsys.readouterr().out
    assert code == 1
    assert "verdict: LOSSY in 6 of 6 worlds" in out and "counterexample (appendix-A, exact)" in out
    assert "LOSSY (exact)" in out


def test_rng_verifier_gets_statistical_checks_only(capsys):
    args = ["--verifier", "my_verifier:verify_rng", "--policy", "hw-aware", *FAST]
    assert main(["check-lossless", *args]) == 0
    out = capsys.readouterr().out
    assert " exact " not in out and out.count(" statistical ") == 6
    assert "0 of 6 worlds proven exactly, 6 only tested statistically (floor TV" in out
    assert out.count("consistent (statistical, floor TV") == 6


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_example_policy_passes_and_peeking_policy_fails(capsys):
    assert main(["check-lossless", "--policy", "my_policy:survival_floor", *FAST]) == 0
    assert main(["check-lossless", "--policy", "my_policy:peeking", *FAST]) == 1
    assert "first-token law [0.85, 0.15]" in capsys.readouterr().out


def test_registry_policy_by_name(capsys):
    assert main(["check-lossless", "--policy", "hw-aware-global", "--checks", "exact"]) == 1
    assert "first-token law [0.85, 0.15]" in capsys.readouterr().out


def test_out_table_is_written_once_and_needs_force(tmp_path, capsys):
    out = tmp_path / "verdict.parquet"
    args = ["check-lossless", "--checks", "edge", "--out", str(out)]
    assert main(args) == 0
    df = pd.read_parquet(out)
    assert set(df["check"]) == {"edge"} and df["lossless"].all()
    assert main(args) == 2
    assert "--force" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0


WRONG_SHAPE = """
import numpy as np
def verify(p, q, x, u, v):
    return np.zeros(3, dtype=int), np.zeros(x.shape[0], dtype=int)
"""
RAISES = """
def verify(p, q, x, u, v):
    raise ValueError("boom")
"""
FLOATS = """
def verify(p, q, x, u, v):
    return u[:, 0], v
"""
BAD_MODEL = """
import numpy as np
from specsim.lossless.toy import ToyLM
def model():
    return ToyLM(vocab=2, p=lambda s: np.array([0.6, 0.6]), q=lambda s: np.array([0.5, 0.5]),
                 conf=lambda prefix, k, prev: 0.5)
"""
GOOD_MODEL = """
import numpy as np
from specsim.lossless.toy import ToyLM
def model():
    return ToyLM(vocab=2, p=lambda s: np.array([0.6, 0.4]), q=lambda s: np.array([0.5, 0.5]),
                 conf=lambda prefix, k, prev: 0.9 if prev == 0 else 0.1)
"""


@pytest.mark.parametrize(
    ("flag", "body", "message"),
    [
        ("--verifier", WRONG_SHAPE, "returned shapes (3,)"),
        ("--verifier", RAISES, "raised ValueError: boom"),
        ("--verifier", FLOATS, "integer arrays"),
        ("--model", BAD_MODEL, "sums to 1.2, not 1"),
    ],
    ids=["wrong-shape", "raises", "floats", "model-not-normalised"],
)
def test_bad_callables_exit_2_with_one_line(tmp_path, capsys, flag, body, message):
    name = _module(tmp_path, f"user_{abs(hash(body)) % 10**8}", body)
    target = f"{name}:verify" if flag == "--verifier" else f"{name}:model"
    assert main(["check-lossless", flag, target, "--checks", "exact"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--verifier", "no_such_module:verify"], "cannot import module"),
        (["--verifier", "my_verifier:nothing"], "has no attribute"),
        (["--verifier", "my_verifier:_sample"], "must take (p, q, x, u, v)"),
        (["--policy", "hw-awar"], "did you mean 'hw-aware'"),
        (["--checks", "exact,fuzzy"], "--checks"),
        (["--multi"], "--multi needs --verifier"),
    ],
)
def test_bad_arguments_exit_2(capsys, argv, message):
    assert main(["check-lossless", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_user_model_replaces_the_tables(tmp_path, capsys):
    name = _module(tmp_path, "user_good_model", GOOD_MODEL)
    assert main(["check-lossless", "--model", f"{name}:model", "--policy", "hw-aware", *FAST]) == 0
    assert "[user_good_model:model]" in capsys.readouterr().out


def test_multi_draft_verifier(capsys):
    spec = "specsim.lossless.verifiers:specinfer"
    assert main(["check-lossless", "--verifier", spec, "--multi", *FAST]) == 0
    spec = "specsim.lossless.mutants:specinfer_no_update"
    assert main(["check-lossless", "--verifier", spec, "--multi", *FAST]) == 1


@pytest.mark.slow  # every mutant is also its own test in test_lossless_mutants.py
def test_mutants_catalogue_from_the_cli(capsys):
    assert main(["check-lossless", "--mutants", "--checks", "exact,edge"]) == 0
    out = capsys.readouterr().out
    n = len(catalogue())
    assert f"caught {n} of {n} mutants" in out and "hw-aware-global" in out

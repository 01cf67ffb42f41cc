"""CI runs the real-server tests: a real-server test that cannot find llama-server fails under
CI=true (naming what was missing), skips outside CI or after a build that failed, and the run
ends with a count of the real-server tests that ran. Checked on a real test of the suite with
llama-server pointed at an empty folder, in a pytest of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REAL = "tests/test_llama_ngram.py::test_reconstruction_equals_llama_server_counts_per_request"


def _pytest(tmp_path: Path, **env: str) -> tuple[int, str, str]:
    summary = tmp_path / "summary.txt"
    base = {k: v for k, v in os.environ.items()
            if k not in ("CI", "SPECSIM_LLAMA_BUILD_FAILED", "SPECSIM_LLAMA_SERVER")}  # fmt: skip
    run_env = {**base, "SPECSIM_LLAMA_CPP_HOME": str(tmp_path / "nowhere"),
               "SPECSIM_REAL_SERVER_SUMMARY": str(summary), **env}  # fmt: skip
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--all", REAL]
    proc = subprocess.run(cmd, cwd=ROOT, env=run_env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    text = summary.read_text() if summary.exists() else ""
    return proc.returncode, proc.stdout + proc.stderr, text


@pytest.mark.slow
def test_a_missing_server_fails_under_ci_naming_what_is_missing(tmp_path):
    rc, out, summary = _pytest(tmp_path, CI="true")
    assert rc == 1, out
    assert "real-server test cannot run under CI=true" in out
    assert "llama-server not found" in out and "install-llama-server.sh" in out
    assert summary.strip() == (
        "real-server tests: 0 ran (0 passed, 0 failed), 0 skipped, 1 not run "
        "(what they need is missing)"
    )


@pytest.mark.slow
def test_a_failed_build_skips_with_its_reason_and_outside_ci_it_skips(tmp_path):
    rc, out, summary = _pytest(tmp_path, CI="true", SPECSIM_LLAMA_BUILD_FAILED="cmake: no g++")
    assert rc == 0, out
    assert "the llama-server build failed: cmake: no g++" in out
    assert "1 skipped" in summary
    rc, out, summary = _pytest(tmp_path)
    assert rc == 0 and "real-server test: llama-server not found" in out, out
    assert "0 ran" in summary and "1 skipped" in summary


def test_ci_builds_the_server_before_the_readme_tests_and_ends_with_the_count():
    """.ci/run's order: the build (a failure exported, not fatal), the README's two commands,
    then the count as its last line, whatever pytest returned."""
    text = (ROOT / ".ci" / "run").read_text()
    build = text.index("bash scripts/install-llama-server.sh")
    assert build < text.index('bash -euo pipefail -c "$main_cmd"')
    assert "export SPECSIM_LLAMA_BUILD_FAILED" in text
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert lines[-1] == "exit $rc" and "SPECSIM_REAL_SERVER_SUMMARY" in text
    assert 'cat "$summary"' in lines[-3]

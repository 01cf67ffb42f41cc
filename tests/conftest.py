"""Shared test settings: Hypothesis runs derandomised, without a database or deadline, so a
failure replays exactly and no run flakes on a slow machine."""

import os

from hypothesis import HealthCheck, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("SPECSIM_PROGRESS", "0")

settings.register_profile(
    "specsim",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("specsim")


# ---- slow tests: the default run is the fast one; --all (or CI=true, as .ci/run has) runs all
def pytest_addoption(parser):
    parser.addoption(
        "--all",
        action="store_true",
        default=False,
        help="also run the tests marked slow (CI, with CI=true, always does)",
    )


def pytest_collection_modifyitems(config, items):
    import pytest

    if config.getoption("--all") or os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return
    skip = pytest.mark.skip(reason="slow: run with pytest --all (CI runs it)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# ---- real-server tests: a real llama-server, started by the test that needs it --------------
# Marked ``@pytest.mark.real_server`` (``converter=True``: also llama.cpp's GGUF converter).
# Outside CI a test whose server is missing skips, naming what to install. Under CI=true it
# FAILS instead: .ci/run builds llama-server first, so a skip there would hide a regression in
# the parts that answer "does speculation change what a server says?". The one exception is a
# build that failed, which .ci/run prints and signals with SPECSIM_LLAMA_BUILD_FAILED.
def _strict_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def real_server_missing(converter: bool = False) -> str | None:
    """What a real-server test lacks (the binary, SmolLM2's GGUF, the converter), or None."""
    from specsim.errors import SpecsimError
    from specsim.record.models import smollm2_gguf
    from specsim.serve.llama_server import find_llama_server

    try:
        find_llama_server()
        smollm2_gguf()
        if converter:
            from specsim.record.draft_gguf import check_requirements

            check_requirements()
    except SpecsimError as exc:
        return str(exc)
    return None


def pytest_runtest_setup(item):
    import pytest

    mark = item.get_closest_marker("real_server")
    if mark is None:
        return
    missing = real_server_missing(bool(mark.kwargs.get("converter", False)))
    if missing is None:
        return
    failed_build = os.environ.get("SPECSIM_LLAMA_BUILD_FAILED")
    if _strict_ci() and not failed_build:
        pytest.fail(
            f"real-server test cannot run under CI=true (.ci/run builds llama-server "
            f"first; a skip would hide a regression): {missing}",
            pytrace=False,
        )
    why = f" (the llama-server build failed: {failed_build})" if failed_build else ""
    pytest.skip(f"real-server test: {missing}{why}")


_REAL_SERVER: dict[str, str] = {}  # node id -> passed / failed / skipped / not run


def pytest_runtest_logreport(report):
    if "real_server" not in report.keywords:
        return
    if report.when == "setup" and report.outcome != "passed":
        _REAL_SERVER[report.nodeid] = "skipped" if report.skipped else "not run"
    elif report.when == "call":
        _REAL_SERVER[report.nodeid] = "passed" if report.passed else "failed"
    elif report.failed:  # teardown: the server did not stop cleanly
        _REAL_SERVER[report.nodeid] = "failed"


def pytest_terminal_summary(terminalreporter):
    """One line counting the real-server tests; also written to $SPECSIM_REAL_SERVER_SUMMARY
    so that .ci/run can end its log with it."""
    if not _REAL_SERVER:
        return
    n = {k: sum(v == k for v in _REAL_SERVER.values())
         for k in ("passed", "failed", "skipped", "not run")}  # fmt: skip
    line = (f"real-server tests: {n['passed'] + n['failed']} ran ({n['passed']} passed, "
            f"{n['failed']} failed), {n['skipped']} skipped, {n['not run']} not run "
            "(what they need is missing)")  # fmt: skip
    terminalreporter.write_line(line)
    path = os.environ.get("SPECSIM_REAL_SERVER_SUMMARY")
    if path:
        with open(path, "w") as f:
            f.write(line + "\n")

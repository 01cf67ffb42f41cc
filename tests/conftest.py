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

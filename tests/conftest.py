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

"""The recording issue's torch verifier (specsim.record.verify), checked by the same suite:
exactly (its uniforms injected), at the extreme uniforms, and statistically; and its
temperature-0 path (one-hot p and q, u = 0) against the greedy chain."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from specsim.lossless.check import check_pipeline  # noqa: E402
from specsim.lossless.pipeline import Pipeline  # noqa: E402
from specsim.lossless.uniforms import truncated  # noqa: E402
from specsim.lossless.user import verifier_pipeline  # noqa: E402

pytestmark = pytest.mark.record


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
@pytest.mark.parametrize("policy", ["full", "hw-aware"])
def test_torch_verifier_is_lossless(policy):
    pipe = verifier_pipeline("specsim.record.verify:verify_np", policy)
    df = check_pipeline(pipe, seed=0, samples=100_000, progress=False)
    assert set(df["check"]) == {"exact", "edge", "statistical"}
    assert df["lossless"].all(), df[~df["lossless"]].to_dict("records")
    assert (df.loc[df["check"] == "exact", "tv"] <= 1e-9).all()


def _engine_greedy(p, q, x, u, v):
    """What speculative_generate does at temperature 0: one-hot p (argmax) and q (the drafts),
    u = 0, then the same torch verifier."""
    from specsim.record.verify import verify_np

    vocab = p.shape[-1]
    p1 = np.eye(vocab)[np.argmax(p, axis=-1)]
    q1 = np.eye(vocab)[x]
    return verify_np(p1, q1, x, np.zeros_like(u), v)


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_torch_verifier_temperature_zero_path_is_the_greedy_chain():
    pipe = Pipeline(name="torch greedy", rule=truncated(_engine_greedy), greedy=True)
    df = check_pipeline(pipe, seed=0, samples=50_000, progress=False)
    assert df["lossless"].all(), df[~df["lossless"]].to_dict("records")

"""The real engine at temperature > 0 samples from the target's law (the losslessness suite's
G-test, alpha 1e-6), and a verifier with the classic bug (resample from p instead of the
residual max(p - q, 0)) is caught by the same test."""

from __future__ import annotations

import numpy as np
import pytest
from record_tiny import tiny_model

torch = pytest.importorskip("torch")

from specsim.lossless.stats import g_test  # noqa: E402
from specsim.policies import get_policy  # noqa: E402
from specsim.record.dspark import DSparkDrafter, config_for_target, init_from_target  # noqa: E402
from specsim.sim.cost.profiles import get_profile  # noqa: E402
from specsim.sim.workload import Workload  # noqa: E402
from specsim.torch_engine.engine import EngineConfig, RealEngine  # noqa: E402
from specsim.torch_engine.proposers import DSparkProposer, Proposal  # noqa: E402

# G-tests over 3,000 sampled jobs through the real engine: 5-16 s each on a loaded machine
pytestmark = [pytest.mark.slow, pytest.mark.record]

T = 1.0
JOBS = 3000
PROMPT = [5, 17, 33, 8]
V = 96


@pytest.fixture(scope="module")
def model():
    m = tiny_model(seed=2)
    with torch.no_grad():  # soften the sharpened test model: top-token mass about 0.6
        m.model.embed_tokens.weight.mul_(0.45)
    return m


@pytest.fixture(scope="module")
def proposer(model):
    cfg = config_for_target(
        model.config, num_hidden_layers=1, markov_rank=8, block_size=3, context_window=16
    )
    torch.manual_seed(3)
    d = DSparkDrafter(cfg)
    init_from_target(d, model, None)
    return DSparkProposer(d.eval(), model)


@pytest.fixture(scope="module")
def exact_second_token(model):
    """p(y1 | prompt), the marginal P(y2) and the law of y2 given the likeliest y1."""
    with torch.no_grad():
        p1 = torch.softmax(model(torch.tensor([PROMPT])).logits[0, -1].double() / T, -1)
        seqs = torch.tensor([PROMPT + [y] for y in range(V)])
        p2 = torch.softmax(model(seqs).logits[:, -1].double() / T, -1)
    mode = int(p1.argmax())
    return p1.numpy(), (p1[:, None] * p2).sum(0).numpy(), mode, p2[mode].numpy()


class SkewedProposer:
    """Drafts from q = 95% on the target's own top token (given the context) + 5% uniform: the
    residual max(p - q, 0) then has no mass on that token while p has a lot, so a verifier that
    resamples from p on rejection is far off (TV 0.21 on the second token given the first)."""

    feature_layers = ()

    def __init__(self, model, gamma: int = 3) -> None:  # noqa: ANN001
        self.model, self.gamma = model, gamma

    def propose(self, slots, anchors, seq_buf, feat_buf, temperature, generator):  # noqa: ANN001
        r = len(slots)
        q = torch.full((r, self.gamma, V), 0.05 / (V - 1))
        with torch.no_grad():
            for i, (s, a) in enumerate(zip(slots.tolist(), anchors.tolist(), strict=True)):
                top = int(self.model(seq_buf[s, : a + 1][None]).logits[0, -1].argmax())
                q[i, :, :] = 0.05 / (V - 1)
                q[i, :, top] = 0.95
        toks = torch.multinomial(q.view(-1, V), 1, generator=generator).view(r, self.gamma)
        return Proposal(
            tokens=toks.numpy().astype(np.int64), conf=np.full((r, self.gamma), 0.5), q=q
        )


@pytest.fixture(scope="module")
def skewed(model):
    return SkewedProposer(model)


def sample(model, proposer, engine_cls=RealEngine, seed=0):
    wl = Workload(
        kind="closed",
        describe="closed 16",
        arrival_s=None,
        trace_idx=np.arange(1),
        prompt_len=np.array([len(PROMPT)]),
        output_len=np.array([3]),
        concurrency=16,
        max_jobs=JOBS,
    )
    cfg = EngineConfig(temperature=T, seed=seed, max_running=16, warmup_steps=0)
    res = engine_cls(
        model, proposer, get_policy("full"), get_profile("h100-dense-8b"), [PROMPT], wl, cfg
    ).run()
    out = np.array(res.outputs)
    assert out.shape == (JOBS, 3)
    return out, res


@pytest.mark.parametrize("which", ["dspark", "skewed"])
def test_first_and_second_tokens_follow_the_target(
    model, proposer, skewed, exact_second_token, which
):
    p1, p2, mode, p2_mode = exact_second_token
    out, res = sample(model, proposer if which == "dspark" else skewed)
    # the second token comes out of rejection sampling of a 3-token draft block
    assert res.summary["verified_draft_tokens"] >= JOBS
    assert 0 < res.summary["accepted_draft_tokens"] < res.summary["verified_draft_tokens"]
    t1 = g_test(np.bincount(out[:, 0], minlength=V), p1)
    t2 = g_test(np.bincount(out[:, 1], minlength=V), p2)
    t3 = g_test(np.bincount(out[out[:, 0] == mode, 1], minlength=V), p2_mode)
    assert t1.passed, t1
    assert t2.passed, t2
    assert t3.passed, t3


def test_same_seed_same_samples(model, proposer):
    a, _ = sample(model, proposer, seed=7)
    b, _ = sample(model, proposer, seed=7)
    c, _ = sample(model, proposer, seed=8)
    assert not np.array_equal(a, c)
    assert np.array_equal(a, b)


def test_residual_bug_is_caught(model, skewed, exact_second_token):
    """Mutant: on rejection, sample from p rather than norm(max(p - q, 0))."""

    class FromP(RealEngine):
        def _accept(self, logits, drafts, q):  # noqa: ANN001
            p = torch.softmax(logits / self.cfg.temperature, -1)
            for k in range(drafts.shape[0]):
                x = int(drafts[k])
                u = float(torch.rand(1, generator=self.gen, dtype=torch.float64))
                if u * float(q[k, x]) >= float(p[k, x]):
                    y = int(torch.multinomial(p[k], 1, generator=self.gen))  # the bug
                    return k, [int(v) for v in drafts[:k]] + [y]
            y = int(torch.multinomial(p[drafts.shape[0]], 1, generator=self.gen))
            return drafts.shape[0], [int(v) for v in drafts] + [y]

    _, _, mode, p2_mode = exact_second_token
    out, _ = sample(model, skewed, engine_cls=FromP)
    t3 = g_test(np.bincount(out[out[:, 0] == mode, 1], minlength=V), p2_mode)
    assert not t3.passed, t3

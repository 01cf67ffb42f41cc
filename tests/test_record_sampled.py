"""Temperature > 0 recording: the batched block scoring equals one block per forward, a shorter
verified prefix of a recorded block accepts exactly min(l, accept_len) with the recorded drafts
and uniforms, and the worked example of docs/trace-format.md (full-verification replay of a
sampled trace is not a speculative run's law) holds."""

from __future__ import annotations

import pytest
from record_tiny import tiny_target, torch

from specsim.record import sampled
from specsim.record.dspark import DSparkDrafter, config_for_target, init_from_target
from specsim.record.features import target_pass
from specsim.record.models import crop_cache, forward_cached, output_cache
from specsim.record.ngram import NgramDrafter
from specsim.record.verify import verify


def _dspark(target, block_size=4):
    cfg = config_for_target(
        target.model.config, num_hidden_layers=1, markov_rank=8, block_size=block_size,
        context_window=32,
    )  # fmt: skip
    d = DSparkDrafter(cfg)
    init_from_target(d, target.model, None)
    return d.eval()


def _sequence(target, drafter, seed=0, n_out=40):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, 96, (7,), generator=g).tolist()
    torch.manual_seed(seed)
    out = target.model.generate(
        torch.tensor([prompt]), max_new_tokens=n_out, do_sample=True, top_k=0, top_p=1.0,
        eos_token_id=None, pad_token_id=2,
    )[0, 7:].tolist()  # fmt: skip
    cfg = drafter.cfg
    return target_pass(target, prompt, out, cfg.target_layer_ids, cfg.context_window)


def test_batched_block_scoring_equals_one_block_per_forward(monkeypatch):
    target = tiny_target(seed=0)
    model = target.model
    g = 5
    s = _sequence(target, NgramDrafter(n=2, block_size=g))
    n = s.output_len
    anchors = torch.arange(s.prompt_len - 1, s.prompt_len - 1 + n)
    x = torch.randint(3, 96, (n, g), generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(sampled, "CHUNK", 7)  # several chunks, the last one short
    got = sampled.block_logits(model, s.seq, anchors, x)
    cache = output_cache(forward_cached(model, s.seq[None, : s.prompt_len - 1], None))
    for i, a in enumerate(anchors.tolist()):  # the reference: one cached forward per block
        ids = torch.cat([s.seq[a : a + 1], x[i]])[None]
        ref = forward_cached(model, ids, cache).logits[0].float()
        crop_cache(cache, a + 1)
        assert torch.allclose(got[i], ref, atol=1e-4, rtol=1e-4), i


@pytest.mark.parametrize("kind", ["dspark", "ngram"])
def test_a_shorter_verified_prefix_accepts_min_of_l_and_accept_len(kind, monkeypatch):
    """The acceptance test of draft k reads only u_k, x_1..x_k and the prefix, never whether
    drafts after k are verified: truncating the block to l drafts accepts min(l, accept_len)."""
    target = tiny_target(seed=0)
    g = 4
    drafter = _dspark(target, g) if kind == "dspark" else NgramDrafter(n=2, block_size=g)
    seen = {"blocks": 0, "partial": 0}
    real = sampled.verify

    def spy(p, q, x, u, v):
        n_full, tok = real(p, q, x, u, v)
        for ell in range(g + 1):
            n_l, _ = real(p[:, : ell + 1], q[:, :ell], x[:, :ell], u[:, :ell], v)
            assert torch.equal(n_l, torch.clamp(n_full, max=ell)), ell
        seen["blocks"] += int(n_full.numel())
        seen["partial"] += int(((n_full > 0) & (n_full < g)).sum())
        return n_full, tok

    monkeypatch.setattr(sampled, "verify", spy)
    total = 0
    for seed in range(3):
        s = _sequence(target, drafter, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        rows = sampled.sampled_rows(target, drafter, s, 1.0, gen)
        assert rows.accept_len.shape == (s.output_len,)
        assert ((rows.accept_prob >= 0) & (rows.accept_prob <= 1)).all()
        total += int(rows.accept_len.sum())
    assert seen["blocks"] >= 100 and seen["partial"] > 0 and total > 0


def test_full_verification_replay_of_a_sampled_trace_is_not_the_speculative_law():
    """docs/trace-format.md's example: tokens {a, b} (0, 1), the target uniform after anything,
    gamma 1; the drafter proposes a after a (q = 1) and draws uniformly after b. A speculative
    run rejects half its drafts after a and then emits the residual, b: its blocks start after
    an a 40% of the time and tau = 1.80. The recorder's walk over an independent target sample
    starts them after an a half the time: tau = 1.75. Both use the recorder's verifier."""
    n, steps = 20_000, 40
    gen = torch.Generator().manual_seed(0)
    p = torch.full((n, 2, 2), 0.5, dtype=torch.float64)

    def block(state):
        q = torch.where((state == 0)[:, None], torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]))
        q = q.double()[:, None]
        x = torch.multinomial(q[:, 0], 1, generator=gen)
        u = torch.rand((n, 1), generator=gen, dtype=torch.float64)
        v = torch.rand((n,), generator=gen, dtype=torch.float64)
        return verify(p, q, x, u, v)

    real = torch.randint(0, 2, (n,), generator=gen)
    walk = real.clone()
    tau_real = tau_walk = 0.0
    for _ in range(steps):
        acc, tok = block(real)
        tau_real += float((acc + 1).double().mean()) / steps
        real = tok  # the last emitted token: the bonus or the residual
        acc, _ = block(walk)
        tau_walk += float((acc + 1).double().mean()) / steps
        walk = torch.randint(0, 2, (n,), generator=gen)  # the recorded sample's next anchor
    assert abs(tau_real - 1.80) < 0.01 and abs(tau_walk - 1.75) < 0.01

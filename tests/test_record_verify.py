"""The torch verifier (exact cases and the losslessness suite, with a mutant it must catch) and a
real speculative decoding loop that must emit exactly accept_len + 1 tokens per step, as the
recorded trace predicts."""

from __future__ import annotations

import numpy as np
import pytest
from record_tiny import tiny_target, torch

from specsim.record.dspark import DSparkDrafter, config_for_target, init_from_target
from specsim.record.features import target_pass
from specsim.record.ngram import NgramDrafter
from specsim.record.recorder import greedy_rows
from specsim.record.train import TrainConfig, train
from specsim.record.verify import one_hot, speculative_generate, verify


def test_perfect_match_accepts_all_and_samples_the_bonus():
    x = torch.tensor([[1, 2, 0]])
    p = one_hot(torch.tensor([[1, 2, 0, 3]]), 4)
    n, tok = verify(
        p,
        one_hot(x, 4),
        x,
        torch.zeros(1, 3, dtype=torch.float64),
        torch.tensor([0.5], dtype=torch.float64),
    )
    assert n.tolist() == [3] and tok.tolist() == [3]


def test_early_mismatch_stops_and_emits_the_target_token():
    x = torch.tensor([[1, 1, 0]])
    p = one_hot(torch.tensor([[1, 2, 0, 3]]), 4)
    n, tok = verify(
        p,
        one_hot(x, 4),
        x,
        torch.zeros(1, 3, dtype=torch.float64),
        torch.tensor([0.99], dtype=torch.float64),
    )
    assert n.tolist() == [1] and tok.tolist() == [2]


def test_zero_probability_tokens_never_come_out_at_extreme_uniforms():
    p = torch.tensor([[[0.0, 0.5, 0.5], [0.3, 0.0, 0.7]]], dtype=torch.float64)
    q = torch.tensor([[[0.0, 0.9, 0.1]]], dtype=torch.float64)
    for u in (0.0, 1 - 2**-53):
        for v in (0.0, 1 - 2**-53):
            n, tok = verify(p, q, torch.tensor([[1]]), torch.tensor([[u]]), torch.tensor([v]))
            assert p[0, int(n), int(tok)] > 0


def _residual_from_p(p, q, x, u, v):
    """A known-lossy mutant: the recovered token is drawn from p, not norm(max(p - q, 0))."""
    from specsim.record.verify import verify_np

    n, tok = verify_np(p, q, x, u, v)
    from specsim.lossless.verifiers import sample_from

    rows = np.arange(len(n))
    rej = n < x.shape[1]
    alt = sample_from(np.asarray(p)[rows, n], np.asarray(v))
    return n, np.where(rej, alt, tok)


@pytest.mark.slow
def test_torch_verifier_passes_the_losslessness_suite_and_a_mutant_does_not():
    from specsim.lossless.check import check_pipeline
    from specsim.lossless.pipeline import Pipeline
    from specsim.lossless.uniforms import truncated
    from specsim.lossless.user import verifier_pipeline

    good = check_pipeline(
        verifier_pipeline("specsim.record.verify:verify_np"), samples=20_000, progress=False
    )
    assert len(good) >= 10 and good["lossless"].all(), good[~good["lossless"]]
    assert {"exact", "statistical"} <= set(good["check"])
    # Both kinds of check have teeth, each on its own: in a full run a world found LOSSY by the
    # exact check gets no statistical check (the verdict is known), so each kind runs alone here.
    mutant = Pipeline(name="mutant", rule=truncated(_residual_from_p))
    for kind in ("exact", "statistical"):
        bad = check_pipeline(mutant, samples=20_000, checks=(kind,), progress=False)
        assert (bad["check"] == kind).all() and not bad["lossless"].all(), bad
        assert (bad["status"] == "LOSSY").any(), bad


def _recorded(target, drafter, prompt, max_new):
    out = target.model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=2,
        pad_token_id=2,
    )[0, len(prompt) :].tolist()
    if 2 in out:
        out = out[: out.index(2) + 1]
    s = target_pass(target, prompt, out, drafter.cfg.target_layer_ids, drafter.cfg.context_window)
    assert s.first_mismatch() == s.output_len
    return out, greedy_rows(drafter, s)


def _trained_dspark(target):
    cfg = config_for_target(
        target.model.config, num_hidden_layers=1, markov_rank=8, block_size=4, context_window=32
    )
    d = DSparkDrafter(cfg)
    init_from_target(d, target.model, None)
    g = torch.Generator().manual_seed(3)
    seqs = []
    for _ in range(4):
        prompt = torch.randint(3, 96, (6,), generator=g).tolist()
        out = target.model.generate(
            torch.tensor([prompt]),
            max_new_tokens=30,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=2,
        )[0, 6:].tolist()
        seqs.append(target_pass(target, prompt, out, cfg.target_layer_ids, 32, topk=4))
    train(
        d,
        seqs,
        TrainConfig(
            steps=40, seqs_per_step=2, anchors_per_seq=8, lr=3e-3, warmup=5, log_every=1000
        ),
        log=lambda m: None,
    )
    return d


@pytest.mark.parametrize("kind", ["ngram", "dspark"])
def test_speculative_loop_emits_accept_len_plus_one_per_step(kind):
    target = tiny_target(seed=0)
    drafter = NgramDrafter(n=2, block_size=4) if kind == "ngram" else _trained_dspark(target)
    total_accepted = 0
    for seed in range(3):
        prompt = torch.randint(3, 96, (7,), generator=torch.Generator().manual_seed(seed)).tolist()
        out, rows = _recorded(target, drafter, prompt, 40)
        spec_out, steps = speculative_generate(target, drafter, prompt, 40)
        assert spec_out == out  # greedy speculative decoding is lossless
        pos = 0
        for emitted in steps:  # the replay walk with full verification
            assert emitted == int(rows.accept_len[pos]) + 1, (seed, pos)
            pos += emitted
        assert pos == len(out)
        total_accepted += int(sum(steps)) - len(steps)
    assert total_accepted > 0  # the check had drafts to accept, not only bonus tokens


def test_sampled_speculative_loop_runs_at_temperature_one():
    target = tiny_target(seed=0)
    drafter = _trained_dspark(target)
    g = torch.Generator().manual_seed(0)
    out, steps = speculative_generate(
        target, drafter, [5, 6, 7, 8], 20, temperature=1.0, generator=g
    )
    assert sum(steps) == len(out) and 1 <= len(out) <= 20
    assert all(1 <= s <= drafter.cfg.block_size + 1 for s in steps)

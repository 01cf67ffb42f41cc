"""Recording at temperature T > 0: every position's block verified by rejection sampling.

The output is sampled from the target at T (no top-k/top-p). Then, walking the positions in
order with one KV cache, each position drafts a block from q (the drafter at T), the target
scores ``[anchor, x_1..x_gamma]`` after the committed prefix, and ``verify.verify`` decides
accept_len with fresh uniforms; ``accept_prob[k] = min(1, p_k(x_k) / q_k(x_k))``. Cost: one
target forward of gamma + 1 tokens per position, so this is for GPUs or short recordings.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specsim.record.models import crop_cache, forward_cached, output_cache
from specsim.record.rows import RecordConfig, RequestRows
from specsim.record.verify import draft_law, verify


@torch.no_grad()
def sample_outputs(target: Any, prompts: list[list[int]], cfg: RecordConfig, salt: int):
    """Outputs sampled from the target at cfg.temperature, seeded per chunk."""
    out = []
    eos = set(target.eos_ids)
    for j, p in enumerate(prompts):
        torch.manual_seed(cfg.seed * 1_000_003 + salt + j)
        gen = target.model.generate(
            input_ids=torch.tensor([p], device=target.device),
            attention_mask=torch.ones((1, len(p)), dtype=torch.long, device=target.device),
            max_new_tokens=cfg.max_new_tokens,
            do_sample=True,
            temperature=cfg.temperature,
            top_k=0,
            top_p=1.0,
            pad_token_id=target.eos_ids[0],
        )[0, len(p) :].tolist()
        for i, t in enumerate(gen):
            if t in eos:
                gen = gen[: i + 1]
                break
        out.append(gen)
    return out


@torch.no_grad()
def sampled_rows(
    target: Any, drafter: Any, s: Any, temperature: float, generator: torch.Generator
) -> RequestRows:
    """Rows of one request sampled at ``temperature`` (``s`` from features.target_pass)."""
    model = target.model
    vocab = model.config.vocab_size
    g = drafter.cfg.block_size
    p_len, n_out = s.prompt_len, s.output_len
    seq = s.seq
    cache = output_cache(forward_cached(model, seq[None, : p_len - 1].to(target.device), None))
    toks = np.zeros((n_out, g), np.int32)
    conf = np.zeros((n_out, g), np.float32)
    acc = np.zeros(n_out, np.int16)
    aprob = np.zeros((n_out, g), np.float32)
    for n in range(n_out):
        a = p_len - 1 + n
        d = drafter.draft(
            s.feats,
            seq,
            torch.tensor([a]),
            temperature=temperature,
            generator=generator,
            start=s.start,
        )
        x = d.tokens[0]
        ids = torch.cat([seq[a : a + 1], x])[None].to(target.device)
        logits = forward_cached(model, ids, cache).logits[0].float().cpu()
        crop_cache(cache, a + 1)
        p = torch.softmax(logits.double() / temperature, -1)
        q = draft_law(drafter, d, 0, vocab)
        u = torch.rand((1, g), generator=generator, dtype=torch.float64)
        v = torch.rand((1,), generator=generator, dtype=torch.float64)
        k_acc, _ = verify(p[None], q[None], x[None], u, v)
        px = p[:g].gather(-1, x[:, None]).squeeze(-1)
        qx = q.gather(-1, x[:, None]).squeeze(-1)
        aprob[n] = (px / qx.clamp(min=1e-300)).clamp(max=1.0).numpy()
        toks[n] = x.numpy()
        conf[n] = d.conf[0].numpy()
        acc[n] = min(int(k_acc[0]), n_out - 1 - n)
    return RequestRows(draft_tokens=toks, confidence=conf, accept_len=acc, accept_prob=aprob)

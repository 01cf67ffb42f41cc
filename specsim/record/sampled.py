"""Recording at temperature T > 0: every position's block verified by rejection sampling.

The output is sampled from the target at T (no top-k/top-p), a chunk of requests at a time.
Then every position n drafts its block x_1..x_gamma from q (the drafter at T, all positions of
a request in one batched call), the target scores each block after its own prefix, and
``verify.verify`` decides accept_len with that position's own uniforms u_1..u_gamma, v;
``accept_prob[k] = min(1, p_k(x_k) / q_k(x_k))``.

Why batched: scoring one block per forward re-reads the target's weights for 8 tokens and is
memory-bound on a CPU (about 35 ms a position for SmolLM2-135M); here the sequence is run once
into a KV cache and the blocks of ``CHUNK`` positions go through one forward together, each
block attending to the cache up to its own anchor and causally to itself (a 4-D mask, explicit
position ids). The logits equal the one-block-at-a-time forward's (tests/test_record_sampled.py).

What the trace means at T > 0 and where its replay is exact: docs/trace-format.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specsim.record.models import crop_cache, forward_cached, output_cache
from specsim.record.rows import RecordConfig, RequestRows
from specsim.record.verify import draft_law, verify

CHUNK = 32  # positions whose blocks share one target forward


@torch.no_grad()
def sample_outputs(target: Any, prompts: list[list[int]], cfg: RecordConfig, salt: int):
    """Outputs sampled from the target at cfg.temperature, one left-padded batch, seeded per
    chunk (``salt`` = the chunk's first request) so a resumed recording draws the same."""
    from specsim.record.generate import left_pad

    pad = target.eos_ids[0]
    ids, mask = left_pad(prompts, pad)
    torch.manual_seed(cfg.seed * 1_000_003 + salt)
    gen = target.model.generate(
        input_ids=ids.to(target.device),
        attention_mask=mask.to(target.device),
        max_new_tokens=cfg.max_new_tokens,
        do_sample=True,
        temperature=cfg.temperature,
        top_k=0,
        top_p=1.0,
        pad_token_id=pad,
        eos_token_id=list(target.eos_ids),
    )[:, ids.shape[1] :].cpu()
    eos = set(target.eos_ids)
    out = []
    for row in gen.tolist():
        for i, t in enumerate(row):
            if t in eos:
                row = row[: i + 1]
                break
        out.append(row)
    return out


@torch.no_grad()
def block_logits(model: Any, seq: torch.Tensor, anchors: torch.Tensor, x: torch.Tensor):
    """Target logits [N, g+1, V] for ``[anchor, x_1..x_g]`` after each anchor's prefix.

    Row k of a block is the law of draft k+1 given the anchor's prefix and x_1..x_k (row g:
    the bonus). ``seq`` is run once up to the last anchor into a KV cache (its last N logits are
    the anchors' rows); the blocks follow in chunks of ``CHUNK`` positions.
    """
    n, g = x.shape
    dev = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    last = int(anchors[-1])
    if not torch.equal(anchors, torch.arange(last - n + 1, last + 1)):
        raise ValueError("block_logits needs consecutive anchors")
    out = forward_cached(model, seq[None, : last + 1].to(dev), None, logits_to_keep=n)
    first = out.logits[0].float().cpu()  # [n, V]: the law of x_1 at every anchor
    cache = output_cache(out)
    length = last + 1
    rows = []
    kpos = torch.arange(length)
    tri = torch.tril(torch.ones((g, g), dtype=torch.bool))
    for s in range(0, n, CHUNK):
        a = anchors[s : s + CHUNK]
        m = a.numel()
        allow = torch.zeros((m * g, length + m * g), dtype=torch.bool)
        allow[:, :length] = (kpos[None, :] <= a[:, None]).repeat_interleave(g, 0)
        allow[:, length:] = torch.block_diag(*([tri] * m))
        bias = torch.zeros(allow.shape, dtype=dtype).masked_fill(~allow, torch.finfo(dtype).min)
        pos = (a[:, None] + 1 + torch.arange(g)[None]).reshape(1, -1)
        res = forward_cached(
            model,
            x[s : s + CHUNK].reshape(1, -1).to(dev),
            cache,
            attention_mask=bias[None, None].to(dev),
            position_ids=pos.to(dev),
        )
        rows.append(res.logits[0].float().cpu().reshape(m, g, -1))
        crop_cache(cache, length)
    return torch.cat([first[:, None], torch.cat(rows)], 1)


@torch.no_grad()
def sampled_rows(
    target: Any, drafter: Any, s: Any, temperature: float, generator: torch.Generator
) -> RequestRows:
    """Rows of one request sampled at ``temperature`` (``s`` from features.target_pass).

    Randomness, all from ``generator``: first every position's drafts (sampled from q), then,
    position by position, its uniforms u_1..u_g (acceptance) and v (correction/bonus draw).
    """
    vocab = target.model.config.vocab_size
    g = drafter.cfg.block_size
    p_len, n_out = s.prompt_len, s.output_len
    anchors = torch.arange(p_len - 1, p_len - 1 + n_out)
    d = drafter.draft(
        s.feats, s.seq, anchors, temperature=temperature, generator=generator, start=s.start
    )
    logits = block_logits(target.model, s.seq, anchors, d.tokens)  # [n_out, g+1, V]
    acc = np.zeros(n_out, np.int16)
    aprob = np.zeros((n_out, g), np.float32)
    for c in range(0, n_out, CHUNK):
        idx = range(c, min(c + CHUNK, n_out))
        p = torch.softmax(logits[c : c + CHUNK].double() / temperature, -1)
        q = torch.stack([draft_law(drafter, d, i, vocab) for i in idx])
        x = d.tokens[c : c + CHUNK]
        uv = torch.rand((len(idx), g + 1), generator=generator, dtype=torch.float64)
        k_acc, _ = verify(p, q, x, uv[:, :g], uv[:, g])
        px = p[:, :g].gather(-1, x[..., None]).squeeze(-1)
        qx = q.gather(-1, x[..., None]).squeeze(-1)
        aprob[c : c + len(idx)] = (px / qx.clamp(min=1e-300)).clamp(max=1.0).numpy()
        left = n_out - 1 - torch.arange(c, c + len(idx))
        acc[c : c + len(idx)] = torch.minimum(k_acc, left).numpy()
    return RequestRows(
        draft_tokens=d.tokens.numpy().astype(np.int32),
        confidence=d.conf.numpy().astype(np.float32),
        accept_len=acc,
        accept_prob=aprob,
    )

"""The torch verifier and a real speculative decoding loop (draft, verify the block, accept).

Verification (standard rejection sampling, Leviathan et al. 2023 / Chen et al. 2023):
accept draft x_k with probability min(1, p_k(x_k) / q_k(x_k)) using its own uniform u_k; at the
first rejection emit a token from norm(max(p_k - q_k, 0)) AT THE REJECTED POSITION; if all l
verified drafts are accepted, emit a bonus token from p_{l+1}. Emitted per step: accepted + 1.
At temperature 0, p and q are one-hot (argmax), which is exact token matching.

The uniforms are explicit arguments so that the losslessness suite can check this exact code
both by exact integration and statistically (``verify_np`` follows its block-verifier protocol:
``verify(p, q, x, u, v) -> (n_accepted, token)``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specsim.record.models import crop_cache, forward_cached, output_cache


def sample_from(law: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling of (N, V) laws with (N,) uniforms; never a zero-probability token."""
    law = law.to(torch.float64)
    cdf = law.cumsum(-1)
    scaled = v.to(torch.float64) * cdf[:, -1]
    idx = (cdf <= scaled[:, None]).sum(-1)
    pos = (law > 0).to(torch.int64)
    last = law.shape[-1] - 1 - pos.flip(-1).argmax(-1)
    return torch.minimum(idx, last)


def verify(
    p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, u: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection-sample N blocks at once.

    p: [N, l+1, V] target law at draft positions 1..l and the bonus position; q: [N, l, V] the law
    each draft was drawn from; x: [N, l] drafts; u: [N, l] acceptance uniforms; v: [N] uniform
    for the final token. Returns (n_accepted [N], token [N]): emitted x_1..x_n, token.
    """
    p = p.to(torch.float64)
    q = q.to(torch.float64)
    n_cases, length = x.shape
    rows = torch.arange(n_cases)
    if length:
        px = p[:, :length].gather(-1, x[..., None]).squeeze(-1)
        qx = q.gather(-1, x[..., None]).squeeze(-1)
        # q < p: always accept; else accept with probability p/q. q(x) = 0 cannot have been drawn.
        ratio = torch.where(qx > 0, px / torch.where(qx > 0, qx, 1.0), (px > 0).double())
        accepted = u.to(torch.float64) < ratio.clamp(max=1.0)
        all_ok = accepted.all(1)
        n = torch.where(all_ok, length, (~accepted).to(torch.int64).argmax(1))
    else:
        n = torch.zeros(n_cases, dtype=torch.int64)
    law = p[rows, n].clone()  # the bonus law where n == l
    if length:
        k = n.clamp(max=length - 1)
        resid = (p[rows, k] - q[rows, k]).clamp(min=0)
        total = resid.sum(-1, keepdim=True)
        resid = torch.where(total > 0, resid / torch.where(total > 0, total, 1.0), p[rows, k])
        law = torch.where((n < length)[:, None], resid, law)
    return n, sample_from(law, v)


def verify_np(p, q, x, u, v):  # type: ignore[no-untyped-def]
    """numpy adapter for ``specsim check-lossless --verifier specsim.record.verify:verify_np``."""
    n, tok = verify(
        torch.from_numpy(np.asarray(p, dtype=np.float64)),
        torch.from_numpy(np.asarray(q, dtype=np.float64)),
        torch.from_numpy(np.asarray(x, dtype=np.int64)),
        torch.from_numpy(np.asarray(u, dtype=np.float64)),
        torch.from_numpy(np.asarray(v, dtype=np.float64)),
    )
    return n.numpy(), tok.numpy()


def one_hot(idx: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(idx, vocab).to(torch.float64)


def draft_law(drafter: Any, d: Any, row: int, vocab: int) -> torch.Tensor:
    """[g, V] law the drafts of ``row`` were drawn from (one-hot for deterministic drafters)."""
    if d.q is None:
        return one_hot(d.tokens[row], vocab)
    q = torch.zeros((d.tokens.shape[1], vocab), dtype=torch.float64)
    q[:, drafter.d2t] = d.q[row].double()
    return q


@torch.no_grad()
def speculative_generate(
    target: Any,
    drafter: Any,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[list[int], list[int]]:
    """Speculative decoding of one request with full-block verification.

    Returns (output tokens, tokens emitted at each step). The target keeps a KV cache of every
    committed token except the last (the anchor); its hidden states at the verified positions
    are the drafter's features for the next step, exactly as a serving engine would have them.
    """
    if len(prompt) < 2:
        raise ValueError("speculative_generate needs a prompt of at least 2 tokens")
    model = target.model
    vocab = model.config.vocab_size
    layer_ids = drafter.cfg.target_layer_ids
    g = drafter.cfg.block_size
    eos = set(target.eos_ids)

    def run(ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, torch.Tensor, Any]:
        out = forward_cached(model, ids[None], cache, output_hidden_states=bool(layer_ids))
        if layer_ids:
            f = torch.cat([out.hidden_states[i + 1][0] for i in layer_ids], -1)
        else:
            f = torch.zeros((ids.numel(), 0))
        return out.logits[0].float(), f.to(torch.float16), output_cache(out)

    seq = torch.tensor(prompt, dtype=torch.long)
    _, feats, cache = run(seq[:-1], None)
    out: list[int] = []
    steps: list[int] = []
    while len(out) < max_new_tokens:
        anchor = seq.numel() - 1
        d = drafter.draft(
            feats, seq, torch.tensor([anchor]), temperature=temperature, generator=generator
        )
        x = d.tokens[0]
        logits, f_new, cache = run(torch.cat([seq[-1:], x]), cache)  # [g+1, V]
        if temperature > 0:
            p = torch.softmax(logits.double() / temperature, -1)
            q = draft_law(drafter, d, 0, vocab)
            u = torch.rand((1, g), generator=generator, dtype=torch.float64)
            v = torch.rand((1,), generator=generator, dtype=torch.float64)
        else:
            p = one_hot(logits.argmax(-1), vocab)
            q = one_hot(x, vocab)
            u = torch.zeros((1, g), dtype=torch.float64)
            v = torch.full((1,), 0.5, dtype=torch.float64)
        n, tok = verify(p[None], q[None], x[None], u, v)
        n = int(n[0])
        emitted = x[:n].tolist() + [int(tok[0])]
        for j, t in enumerate(emitted):  # stop after EOS
            if t in eos:
                emitted = emitted[: j + 1]
                break
        emitted = emitted[: max_new_tokens - len(out)]
        out += emitted
        steps.append(len(emitted))
        seq = torch.cat([seq, torch.tensor(emitted, dtype=torch.long)])
        feats = torch.cat([feats, f_new[: len(emitted)]])  # anchor + accepted drafts
        crop_cache(cache, seq.numel() - 1)
        if emitted[-1] in eos:
            break
    return out, steps

"""EAGLE drafters (EAGLE-1, EAGLE-3) priced by their architecture, chain or tree.

Why a module: an EAGLE drafter drafts SEQUENTIALLY, where DSpark drafts a block in one forward:
``steps`` forward passes of its own decoder layer(s) and an LM head over its draft vocabulary
(EAGLE-3: a reduced one), each over ``topk`` candidates a request after the first, inside the
engine's captured draft loop; before them a draft-extend pass over the tokens the last verify
accepted, fed with the target's hidden states (EAGLE-1: the last layer's; EAGLE-3: three
layers' fused by a projection). A stand-in ``mtp:K`` priced each step as a launch of a
target-sized layer: the best K came out too small. Sources: Li et al., EAGLE (2024) and
EAGLE-3 (2025) for the architecture; vLLM's chain (``num_speculative_tokens`` k: k steps,
topk 1) and SGLang's tree (``--speculative-num-steps``, ``--speculative-eagle-topk``,
``--speculative-num-draft-tokens``: the verified tree's tokens, the root included) for the
engines' shapes.

A tree verifies ``draft_tokens`` tokens a request (the root, the accepted path's depth and the
other branches): the branches beyond the path are ``Drafter.tree_extra``, which the profile's
``tree_tokens_per_request`` charges in every speculative step. What is ASSUMED (printed): the
draft-extend pass runs over (1 + steps) / 2 tokens a request (half the path and the bonus), the
engines' defaults where the spec leaves a key out (steps 3, topk 1; SGLang's tree tokens
1 + steps x topk, capped at 64), EAGLE-3's draft vocabulary 32,000 (its released checkpoints').
"""

from __future__ import annotations

from typing import Any

import numpy as np

EAGLE_KINDS = ("eagle1", "eagle3")
DEFAULT_STEPS, DEFAULT_TOPK = 3, 1
EAGLE3_DRAFT_VOCAB = 32_000
EAGLE_LIMITS = {"layers": (1, 8), "steps": (1, 16), "topk": (1, 16), "draft_tokens": (2, 256)}
MAX_TREE = 64  # SGLang's tree tokens by default: 1 + steps x topk, at most this


def eagle_values(kind: str, vals: dict[str, int], given: set[str], vocab: int) -> dict[str, int]:
    """The spec's numbers with the defaults filled in (the ones not ``given``), checked for
    the shape of a tree: at least a chain's tokens, at most every candidate's."""
    from specsim.errors import SpecsimError

    out = dict(vals)
    if "draft_vocab" not in given:
        out["draft_vocab"] = EAGLE3_DRAFT_VOCAB if kind == "eagle3" else vocab
    out["draft_vocab"] = min(out["draft_vocab"], vocab)
    steps, topk = out["steps"], out["topk"]
    # the root, topk children of it, then topk x topk candidates at each later step (each of
    # the topk kept nodes expands topk), of which SGLang verifies the best draft_tokens - 1
    most = 1 + topk + (steps - 1) * topk * topk
    if "draft_tokens" not in given:
        out["draft_tokens"] = min(1 + steps * topk, MAX_TREE) if topk > 1 else steps + 1
    if not steps + 1 <= out["draft_tokens"] <= most:
        raise SpecsimError(
            f"--drafter {kind}: draft_tokens {out['draft_tokens']} must hold the root and the "
            f"path (>= steps + 1 = {steps + 1}) and at most every candidate (1 + topk + "
            f"(steps - 1) x topk^2 = {most}); give draft_tokens in that range"
        )
    return out


def eagle_draft_ms(p: Any, d: Any, requests: Any, point: str = "mid") -> np.ndarray:
    """Milliseconds of one EAGLE draft call for ``requests`` requests on deployment ``p``:
    the draft-extend pass, then ``steps`` sequential steps, plus the engine's fitted fixed cost
    a call and cost a drafted position (the same terms as a DSpark call)."""
    from specsim.sim.cost.operators import layer_s as _layer_s

    o, m, tp = p.ops, p.dep.model, p.dep.tp
    t = np.ceil(np.asarray(requests, dtype=np.float64) / p.dep.dp)
    w = d.width
    scale = (w / m.hidden) ** 2  # a decoder layer shaped like the target's, at its width

    def layers(tokens: np.ndarray) -> np.ndarray:
        one = _layer_s(o, tokens, w, m.attn_layer_params * scale,
                       int(m.intermediate * w / m.hidden), p.bpp, tp)  # fmt: skip
        ar = 2 * o.all_reduce_s(tokens * w * 2.0, tp) if tp > 1 else 0 * tokens
        return d.layers * (one + ar)

    def head(tokens: np.ndarray) -> np.ndarray:
        return o.gemm_s(tokens, d.vocab * w * 2.0 / tp)  # BF16, over the draft vocabulary

    ext = t * (1 + d.steps) / 2.0  # the accepted tokens the drafter extends over (ASSUMED)
    fc = o.gemm_s(ext, d.features * m.hidden * w * p.bpp / tp)
    total = fc + layers(ext) + head(t)  # the extend pass proposes the first draft
    launch, per_pos = p.eng.draft_launch_ms.at(point), p.eng.draft_position_us.at(point) / 1e3
    first = total * 1000.0 + launch + per_pos * t
    return first + (d.steps - 1) * eagle_step_ms(p, d, requests, point)


def eagle_step_ms(p: Any, d: Any, requests: Any, point: str = "mid") -> np.ndarray:
    """Milliseconds each later draft step adds for ``requests`` requests: its layer(s) and
    head over ``topk`` candidates a request, and the engine's cost a drafted position. A
    chain of k drafts pays the first (the extend pass) and k - 1 of these."""
    from specsim.sim.cost.operators import layer_s as _layer_s

    o, m, tp = p.ops, p.dep.model, p.dep.tp
    cand = np.ceil(np.asarray(requests, dtype=np.float64) / p.dep.dp) * d.topk
    w = d.width
    scale = (w / m.hidden) ** 2
    one = _layer_s(o, cand, w, m.attn_layer_params * scale, int(m.intermediate * w / m.hidden),
                   p.bpp, tp)  # fmt: skip
    ar = 2 * o.all_reduce_s(cand * w * 2.0, tp) if tp > 1 else 0 * cand
    head = o.gemm_s(cand, d.vocab * w * 2.0 / tp)
    per_pos = p.eng.draft_position_us.at(point) / 1e3
    return (d.layers * (one + ar) + head) * 1000.0 + per_pos * cand


__all__ = ["EAGLE3_DRAFT_VOCAB", "EAGLE_KINDS", "eagle_draft_ms", "eagle_step_ms", "eagle_values"]

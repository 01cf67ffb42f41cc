"""The subtle mutants of :mod:`specsim.lossless.mutants`: verifiers off by a total variation of
1e-4 to 1e-2 (the bugs that sampling alone misses), and the bugs that live past the first
block's first tokens (issue #36: a bonus token's temperature, a stale ratio on a request's
second block).

Why a module of their own: each is a careful construction (a band of uniforms, a bf16 rounding,
a fixed-point generator, a vocabulary chunk's carry) whose size the exact check must resolve;
the catalogue only lists them.
"""

from __future__ import annotations

import numpy as np

from specsim.lossless.state import BlockState
from specsim.lossless.uniforms import truncated
from specsim.lossless.verifiers import (
    acceptance_ratio,
    final_law,
    first_rejection,
    rejection,
    sample_from,
)


def _bf16(a: np.ndarray) -> np.ndarray:
    """Round to bfloat16 (round to nearest even), returned as float64."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


# --- subtle verifiers: TV 1e-4 to 1e-2, the bugs sampling alone misses ---------------------


def _shift(tok: np.ndarray, where: np.ndarray, vocab: int) -> np.ndarray:
    return np.where(where, (tok + 1) % vocab, tok)


def _band(lo: float, width: float, rejected_only: bool = False):
    def verify(p, q, x, u, v):
        n, tok = rejection(p, q, x, u, v)
        hit = (v >= lo) & (v < lo + width)
        if rejected_only:
            hit &= n < x.shape[1]
        return n, _shift(tok, hit, p.shape[-1])

    return verify


band_1e3 = _band(0.6, 1e-3)
band_1e3.__doc__ = (
    "The emitted token is shifted by one id when v falls in [0.6, 0.601): a band inside a cell "
    "of the old integrator (issue #12: true TV 8e-4, old exact check 7e-17)."
)
band_1e2 = _band(0.6, 1e-2)
band_1e2.__doc__ = "The same with a band of width 1e-2, [0.6, 0.61)."
band_3e3_rejected = _band(0.3, 3e-3, rejected_only=True)
band_3e3_rejected.__doc__ = (
    "Only the recovered token after a rejection is shifted when v is in [0.3, 0.303)."
)


def flip_small_v(p, q, x, u, v):
    """The emitted token is shifted by one id when v < 1e-3 (an off-by-one at the low end of
    the inverse CDF)."""
    n, tok = rejection(p, q, x, u, v)
    return n, _shift(tok, v < 1e-3, p.shape[-1])


def reject_small_u(p, q, x, u, v):
    """A draft is rejected whenever its uniform is below 1e-3 (treated as an invalid draw),
    whatever the acceptance ratio."""
    n = first_rejection((u < acceptance_ratio(p, q, x)) & (u >= 1e-3))
    return n, sample_from(final_law(p, q, n), v)


def bf16_acceptance_uniforms(p, q, x, u, v):
    """The acceptance uniforms are generated in bfloat16 (rounded to nearest) before the
    comparison u < p/q (issue #12: TV 2.7e-4 to 9.6e-4)."""
    n = first_rejection(_bf16(u) < acceptance_ratio(p, q, x))
    return n, sample_from(final_law(p, q, n), v)


def fixed_point_uniforms(p, q, x, u, v):
    """Uniforms from a 10-bit fixed-point generator: u and v truncated to multiples of 2^-10."""
    uf, vf = np.floor(u * 1024) / 1024, np.floor(v * 1024) / 1024
    n = first_rejection(uf < acceptance_ratio(p, q, x))
    return n, sample_from(final_law(p, q, n), vf)


def position2_bf16_ratio(p, q, x, u, v):
    """From the second draft position on, the acceptance ratio is computed from bf16-rounded p
    and q (a mixed-precision kernel that keeps only position 1 in fp64): lossy only at l >= 2."""
    ratio = acceptance_ratio(p, q, x)
    if x.shape[1] >= 2:
        ratio[:, 1:] = acceptance_ratio(_bf16(p[:, 1:]), _bf16(q[:, 1:]), x[:, 1:])
    n = first_rejection(u < ratio)
    return n, sample_from(final_law(p, q, n), v)


def vocab_chunk_carry(p, q, x, u, v):
    """The inverse CDF of the last token runs over the vocabulary in chunks of 4 ids, and the
    carry of the first chunk's mass into the next is rounded to bf16: lossy only at V >= 5."""
    n = first_rejection(u < acceptance_ratio(p, q, x))
    law = final_law(p, q, n)
    if law.shape[-1] <= 4:
        return n, sample_from(law, v)
    cdf = np.cumsum(law, axis=-1)
    carry = _bf16(cdf[:, 3:4])
    cdf = np.concatenate([cdf[:, :4], carry + np.cumsum(law[:, 4:], axis=-1)], axis=-1)
    idx = (cdf <= (v * cdf[:, -1])[:, None]).sum(axis=-1)
    last = law.shape[-1] - 1 - np.argmax((law > 0)[:, ::-1], axis=-1)
    return n, np.minimum(idx, last)


# --- issue #36: bugs past the first block's first tokens ------------------------------------

BONUS_TEMPERATURE = 0.97
BONUS_MIN_VOCAB = 4


def _tempered(law: np.ndarray, temperature: float) -> np.ndarray:
    """law^(1/T), renormalised (zeros stay zero)."""
    with np.errstate(divide="ignore"):
        logits = np.where(law > 0, np.log(np.where(law > 0, law, 1.0)), -np.inf) / temperature
    out = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return out / out.sum(axis=-1, keepdims=True)


def bonus_temperature_v4(p, q, x, u, v):
    """After every verified draft is accepted, the bonus token is drawn from p at temperature
    0.97 instead of 1, and only when the vocabulary has 4 or more tokens (a sampling kernel
    for larger vocabularies that applies its temperature twice): lossy only at the bonus
    position, only at V >= 4."""
    n = first_rejection(u < acceptance_ratio(p, q, x))
    law = final_law(p, q, n)
    if p.shape[-1] >= BONUS_MIN_VOCAB:
        bonus = n == x.shape[1]
        law[bonus] = _tempered(law[bonus], BONUS_TEMPERATURE)
    return n, sample_from(law, v)


def second_block_stale_ratio(p, q, x, length, u, v, key=False):
    """A verifier that keeps per-request state between steps (a warm-up path whose buffers are
    swapped one step late): on the SECOND block of a request only, the first draft is tested
    against the target law of position 2 instead of position 1 (its residual, if rejected, is
    right). Lossless on the first block and from the third on."""
    if not key or length == 0:
        return truncated(rejection)(p, q, x, length, u, v)
    ps, qs, xs = p[:, : length + 1], q[:, :length], x[:, :length]
    stale = ps.copy()
    stale[:, 0] = p[:, 1]
    n = first_rejection(u[:, :length] < acceptance_ratio(stale, qs, xs))
    return n, sample_from(final_law(ps, qs, n), v)


def _second_block(state: BlockState) -> bool:
    return state.step == 1


second_block_stale_ratio.state_key = _second_block  # type: ignore[attr-defined]

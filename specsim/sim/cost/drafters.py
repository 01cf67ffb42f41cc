"""The drafter priced by its own architecture on the measured operator curves.

Why: a drafter's cost is not a multiple of its target's. A DSpark/DFlash block drafter runs a
forward over B positions for every request (its few layers at the drafter's width, its LM head
over its vocabulary, a projection of the target's hidden-state features); MTP runs k extra
target-like layers one token at a time; n-gram lookup needs no GPU but a little CPU per request.
Each is priced with the same curves as the target (``operators``), so a drafter on a small
target is not the near-free term a roofline makes it.

Spec strings (``--drafter``): ``none``; ``ngram``; ``mtp:K``; ``dspark:layers=5,width=4096,
block=7,vocab=...,features=5`` (``dflash:`` the same); omitted keys take the target's width and
vocabulary, 5 layers, block 7, and the hidden states of 5 target layers (ASSUMED defaults).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost.models import MAX_HIDDEN, MAX_LAYERS, MAX_VOCAB
from specsim.sim.cost.operators import layer_s as _layer_s
from specsim.sim.cost.profile_csv import count

KINDS = ("none", "ngram", "mtp", "dspark", "dflash", "eagle1", "eagle3")
BLOCK_KINDS = ("dspark", "dflash")  # parallel block drafters, priced alike
EAGLE = ("eagle1", "eagle3")
NGRAM_US = (2.0, 10.0, 50.0)  # ASSUMED CPU lookup per request and step (low, mid, high)


@dataclass(frozen=True)
class Drafter:
    """A drafter's architecture. ``width``/``vocab`` 0: the target's."""

    kind: str
    layers: int = 0
    width: int = 0
    block: int = 7
    vocab: int = 0
    features: int = 5  # target layers whose hidden states a DSpark / EAGLE drafter reads
    steps: int = 0  # EAGLE: sequential draft steps (the path's depth)
    topk: int = 1  # EAGLE: candidates a request at each later step (1: a chain)
    draft_tokens: int = 0  # EAGLE: tokens a request verifies, the root included (a tree's)

    @property
    def drafts(self) -> int:
        """Draft tokens a request sends for verification each step: the block (DSpark,
        n-gram), K (MTP), the path's depth (EAGLE); 0 without a drafter."""
        if self.kind == "none":
            return 0
        if self.kind in EAGLE:
            return int(self.steps)
        return int(self.layers if self.kind == "mtp" else self.block)

    @property
    def tree_extra(self) -> int:
        """Tokens a request verifies beyond its path (a tree's other branches): 0 for a chain."""
        return max(0, self.draft_tokens - 1 - self.steps) if self.kind in EAGLE else 0

    @property
    def label(self) -> str:
        if self.kind in BLOCK_KINDS:
            return (f"{self.kind}:layers={self.layers},width={self.width},block={self.block},"
                    f"vocab={self.vocab},features={self.features}")  # fmt: skip
        if self.kind in EAGLE:
            return (f"{self.kind}:layers={self.layers},steps={self.steps},topk={self.topk},"
                    f"draft_tokens={self.draft_tokens},draft_vocab={self.vocab},"
                    f"width={self.width}")  # fmt: skip
        return f"mtp:{self.layers}" if self.kind == "mtp" else self.kind


# the bounds of a drafter's numbers (the value rule :func:`_number` applies): a block drafter
# of more than 64 layers or a block of more than 64 positions is no drafter; width and
# vocabulary are bounded as a target's are (``models``)
DSPARK_LIMITS = {"layers": (1, 64), "width": (64, MAX_HIDDEN), "block": (1, 64),
                 "vocab": (1, MAX_VOCAB), "features": (1, MAX_LAYERS)}  # fmt: skip
MTP_MAX = 16
WEIGHTS_ASSUMED = (
    "a drafter's weights are in the target's precision, its LM head and embedding the "
    "target's where their shapes match (counted against GPU memory otherwise)"
)


def _number(text: str, what: str, lo: int, hi: int, form: str = "key=N") -> int:
    """A drafter number: ASCII digits only (``str.isdigit`` also passes superscripts and other
    scripts' digits that ``int`` then refuses or reads differently), in [lo, hi]; ``form``:
    how the refusal says to write it."""
    if not re.fullmatch(r"[0-9]{1,12}", text):
        raise SpecsimError(
            f"{what} = {text!r}; write {form} with N a whole number in digits 0-9, from {lo} "
            f"to {hi}"
        )
    return count(int(text), what, lo, hi)


def parse_drafter(spec: str, hidden: int, vocab: int, layers: int = MAX_LAYERS) -> Drafter:
    """``--drafter`` text -> a Drafter with the target's defaults filled in (``layers``: the
    target's, which bounds the hidden-state features a DSpark drafter reads)."""
    kind, _, rest = spec.strip().lower().partition(":")
    if kind not in KINDS:
        raise SpecsimError(
            f"unknown --drafter {spec!r}; use none, ngram, mtp:K, "
            "dspark:layers=5,width=4096,block=7 (dflash: the same keys), or "
            "eagle3:layers=1,steps=3,topk=1,draft_tokens=4,draft_vocab=32000 (eagle1 too)"
        )
    if kind in ("none", "ngram"):
        if rest:
            raise SpecsimError(f"--drafter {kind} takes no parameters (got {spec!r})")
        return Drafter(kind)
    if kind == "mtp":
        k = _number(rest, f"--drafter {spec!r}: K", 1, MTP_MAX, "mtp:N")
        return Drafter("mtp", layers=k, block=k)
    if kind in EAGLE:
        return Drafter(kind, **_eagle_values(kind, spec, rest, hidden, vocab, layers))
    return Drafter(kind, **_dspark_values(spec, rest, hidden, vocab, layers))


def _parts(spec: str, rest: str, keys: tuple[str, ...]) -> dict[str, str]:
    """``key=N`` parts of a drafter spec, each key at most once (a repeated key silently taking
    the last value hides a typo), each key one of ``keys``."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, v = (x.strip() for x in part.partition("="))
        if key not in keys or not sep:
            raise SpecsimError(
                f"--drafter {spec!r}: each part is key=N with key in {', '.join(keys)} "
                "and N a whole number >= 1"
            )
        if key in out:
            raise SpecsimError(f"--drafter {spec!r} gives {key} twice; give it once")
        out[key] = v
    return out


def _eagle_values(kind: str, spec: str, rest: str, hidden: int, vocab: int, layers: int
                  ) -> dict[str, int]:  # fmt: skip
    """EAGLE's keys (layers, width, steps, topk, draft_tokens, draft_vocab, features) with
    their defaults (:mod:`~specsim.sim.cost.eagle`) and bounds."""
    from specsim.sim.cost.eagle import DEFAULT_STEPS, DEFAULT_TOPK, EAGLE_LIMITS, eagle_values

    keys = ("layers", "width", "steps", "topk", "draft_tokens", "draft_vocab", "features")
    given = _parts(spec, rest, keys)
    limits = {**EAGLE_LIMITS, "width": DSPARK_LIMITS["width"], "draft_vocab": (1, MAX_VOCAB),
              "features": (1, min(layers, 8))}  # fmt: skip
    vals = {"layers": 1, "width": hidden, "steps": DEFAULT_STEPS, "topk": DEFAULT_TOPK,
            "draft_tokens": 0, "draft_vocab": vocab,
            "features": 3 if kind == "eagle3" else 1}  # fmt: skip
    for key, v in given.items():
        vals[key] = _number(v, f"--drafter {spec!r}: {key}", *limits[key])
    if vals["width"] % 64:
        raise SpecsimError(f"--drafter {spec!r}: width must be a multiple of 64")
    vals = eagle_values(kind, vals, set(given), vocab)
    keep = ("layers", "width", "steps", "topk", "draft_tokens", "features")
    return {**{k: vals[k] for k in keep}, "vocab": vals["draft_vocab"], "block": vals["steps"]}


def _dspark_values(spec: str, rest: str, hidden: int, vocab: int, layers: int) -> dict[str, int]:
    """``key=N`` parts, each key at most once (a repeated key silently taking the last value
    hides a typo), each N by :func:`_number` within :data:`DSPARK_LIMITS`."""
    vals = {"layers": 5, "width": hidden, "block": 7, "vocab": vocab, "features": min(5, layers)}
    limits = {**DSPARK_LIMITS, "features": (1, min(layers, DSPARK_LIMITS["features"][1]))}
    for key, v in _parts(spec, rest, tuple(vals)).items():
        vals[key] = _number(v, f"--drafter {spec!r}: {key}", *limits[key])
    if vals["width"] % 64:
        raise SpecsimError(f"--drafter {spec!r}: width must be a multiple of 64")
    return vals


def weight_params(m, drafter: Drafter) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The drafter's parameters beyond its target's: (layers and projection, in the weights'
    precision; an LM head of its own, BF16 as :func:`draft_ms` reads it). Why: they sit on
    the same GPUs and take memory the KV cache would have; a drafter shaped like its target's
    layers at its own width, as :func:`draft_ms` prices it."""
    if drafter.kind == "mtp":  # DeepSeek-V3's MTP modules share the target's embedding and head
        return drafter.layers * (m.attn_layer_params + 3 * m.hidden * m.intermediate), 0.0
    if drafter.kind not in (*BLOCK_KINDS, *EAGLE):
        return 0.0, 0.0
    return _dspark_body(m, drafter), _own_head(m, drafter)


def _dspark_body(m, drafter: Drafter) -> float:  # type: ignore[no-untyped-def]
    """A DSpark drafter's feature projection and layers (parameters)."""
    w = drafter.width
    return (
        drafter.features * m.hidden * w
        + drafter.layers
        * (m.attn_layer_params + 3 * m.hidden * m.intermediate)
        * (w / m.hidden) ** 2
    )


def _own_head(m, drafter: Drafter) -> float:  # type: ignore[no-untyped-def]
    """An LM head the target cannot lend (another width or vocabulary): its parameters."""
    if (drafter.width, drafter.vocab) == (m.hidden, m.vocab):
        return 0.0
    return float(drafter.vocab) * drafter.width


def draft_ms(p, drafter: Drafter, requests, point: str = "mid"):  # type: ignore[no-untyped-def]
    """Milliseconds of one draft call for ``requests`` requests (array), each proposing the
    drafter's block, on the deployment ``p`` (``build.Priced``): its operators on the curves
    plus the engine's per-call and per-position terms (fitted for vLLM on its fig. 2 draft
    table: the operators alone were 7x too cheap there)."""
    r = np.asarray(requests, dtype=np.float64)
    if drafter.kind == "none":
        return 0 * r
    if drafter.kind == "ngram":
        return r * NGRAM_US[("low", "mid", "high").index(point)] / 1000.0
    o, m, tp = p.ops, p.dep.model, p.dep.tp
    launch, per_pos = p.eng.draft_launch_ms.at(point), p.eng.draft_position_us.at(point) / 1e3
    if drafter.kind in EAGLE:
        from specsim.sim.cost.eagle import eagle_draft_ms

        return eagle_draft_ms(p, drafter, r, point)
    if drafter.kind == "mtp":  # K sequential steps of one target-like layer + LM head
        t = np.ceil(r / p.dep.dp)
        layer = _layer_s(o, t, m.hidden, m.attn_layer_params, m.intermediate, p.bpp, tp)
        head = o.gemm_s(t, m.vocab * m.hidden * 2.0 / tp)
        return drafter.layers * ((layer + head) * 1000.0 + launch + per_pos * t)
    t = np.ceil(r / p.dep.dp) * drafter.block  # every request's block of positions
    w = drafter.width
    scale = (w / m.hidden) ** 2  # a layer shaped like the target's, at the drafter's width
    layer = _layer_s(o, t, w, m.attn_layer_params * scale, int(m.intermediate * w / m.hidden),
                     p.bpp, tp)  # fmt: skip
    head = o.gemm_s(t, drafter.vocab * w * 2.0 / tp)
    # the target's features of the accepted tokens, projected to the drafter's width
    fc = o.gemm_s(np.ceil(r / p.dep.dp), drafter.features * m.hidden * w * p.bpp / tp)
    reduce = 2 * drafter.layers * o.all_reduce_s(t * w * 2.0, tp) if tp > 1 else 0 * t
    # plus the engine's fitted fixed cost per call and per drafted position (calibration)
    return (drafter.layers * layer + head + fc + reduce) * 1000.0 + launch + per_pos * t


def draft_step_ms(p, drafter: Drafter, requests, point: str = "mid"):  # type: ignore[no-untyped-def]
    """Milliseconds a SEQUENTIAL drafter's call adds per drafted position for ``requests``
    requests (EAGLE: a later step; MTP: one of its K layers and the head), or None for a
    drafter that proposes its block in one forward. Why: the engine may draft fewer tokens than
    the drafter was built for (``tune``'s k), and a sequential drafter's call is that much
    cheaper; ``draft_ms`` at the built count stays the sum."""
    r = np.asarray(requests, dtype=np.float64)
    if drafter.kind in EAGLE:
        from specsim.sim.cost.eagle import eagle_step_ms

        return eagle_step_ms(p, drafter, r, point)
    if drafter.kind == "mtp":
        return draft_ms(p, drafter, r, point) / drafter.layers
    return None


def context_us(p, drafter: Drafter) -> float:  # type: ignore[no-untyped-def]
    """µs per context token a drafter's attention reads per request and draft call (its own
    KV: K and V at its width, BF16), at the measured memory bandwidth. Split over TP as the
    target's KV is (by min(TP, KV heads); MLA's latent is replicated on every GPU: v4 divided
    it by TP), and the DP ranks read their own requests' at once (as the target's KV read)."""
    m, d = p.dep.model, p.dep
    if drafter.kind in (*BLOCK_KINDS, *EAGLE):  # a KV as the target's layer's, at its width
        kv = drafter.layers * m.kv_elems_per_layer * (drafter.width / m.hidden) * 2.0
    elif drafter.kind == "mtp":
        kv = drafter.layers * m.kv_elems_per_layer * 2.0
    else:
        return 0.0
    split = min(d.tp, m.kv_heads) if m.kv_sharded else 1
    return float(p.ops.read_s(kv)) * 1e6 / split / d.dp


def prefill_us(p, drafter: Drafter) -> float:  # type: ignore[no-untyped-def]
    """µs a drafter spends per prompt token (its features and KV), compute-bound."""
    m = p.dep.model
    if drafter.kind in (*BLOCK_KINDS, *EAGLE):
        params = _dspark_body(m, drafter)
    elif drafter.kind == "mtp":
        params = drafter.layers * (m.attn_layer_params + 3 * m.hidden * m.intermediate)
    else:
        return 0.0
    return float(p.ops.flops_s(2.0 * params / p.dep.tp)) * 1e6


__all__ = [
    "BLOCK_KINDS", "EAGLE", "KINDS", "Drafter", "context_us", "draft_ms", "draft_step_ms",
    "parse_drafter",
    "prefill_us", "weight_params",
]  # fmt: skip

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
from specsim.sim.cost.profile_csv import count

KINDS = ("none", "ngram", "mtp", "dspark")
NGRAM_US = (2.0, 10.0, 50.0)  # ASSUMED CPU lookup per request and step (low, mid, high)


@dataclass(frozen=True)
class Drafter:
    """A drafter's architecture. ``width``/``vocab`` 0: the target's."""

    kind: str
    layers: int = 0
    width: int = 0
    block: int = 7
    vocab: int = 0
    features: int = 5  # target layers whose hidden states a DSpark drafter reads

    @property
    def drafts(self) -> int:
        """Draft tokens a request sends for verification each step: the block (DSpark,
        n-gram), K (MTP); 0 without a drafter. What a verify step's width is made of."""
        if self.kind == "none":
            return 0
        return int(self.layers if self.kind == "mtp" else self.block)

    @property
    def label(self) -> str:
        if self.kind == "dspark":
            return (f"dspark:layers={self.layers},width={self.width},block={self.block},"
                    f"vocab={self.vocab},features={self.features}")  # fmt: skip
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
    kind = "dspark" if kind == "dflash" else kind
    if kind not in KINDS:
        raise SpecsimError(
            f"unknown --drafter {spec!r}; use none, ngram, mtp:K or "
            "dspark:layers=5,width=4096,block=7"
        )
    if kind in ("none", "ngram"):
        if rest:
            raise SpecsimError(f"--drafter {kind} takes no parameters (got {spec!r})")
        return Drafter(kind)
    if kind == "mtp":
        k = _number(rest, f"--drafter {spec!r}: K", 1, MTP_MAX, "mtp:N")
        return Drafter("mtp", layers=k, block=k)
    return Drafter("dspark", **_dspark_values(spec, rest, hidden, vocab, layers))


def _dspark_values(spec: str, rest: str, hidden: int, vocab: int, layers: int) -> dict[str, int]:
    """``key=N`` parts, each key at most once (a repeated key silently taking the last value
    hides a typo), each N by :func:`_number` within :data:`DSPARK_LIMITS`."""
    vals = {"layers": 5, "width": hidden, "block": 7, "vocab": vocab, "features": min(5, layers)}
    limits = {**DSPARK_LIMITS, "features": (1, min(layers, DSPARK_LIMITS["features"][1]))}
    seen: set[str] = set()
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, v = (x.strip() for x in part.partition("="))
        if key not in vals or not sep:
            raise SpecsimError(
                f"--drafter {spec!r}: each part is key=N with key in {', '.join(vals)} "
                "and N a whole number >= 1"
            )
        if key in seen:
            raise SpecsimError(f"--drafter {spec!r} gives {key} twice; give it once")
        seen.add(key)
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
    if drafter.kind != "dspark":
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


def _layer_s(o, t, width, attn_params, inter, bpp, tp):  # type: ignore[no-untyped-def]
    """One dense transformer layer's linear and elementwise ops (seconds)."""
    lin = o.gemm_s(t, attn_params * bpp / tp) + o.gemm_s(t, 3 * width * inter * bpp / tp)
    ew = 2 * o.elementwise_s("input_layernorm", t * width) + 2 * o.elementwise_s("add", t * width)
    return lin + ew + o.elementwise_s("mlp_act", t * inter / tp) + o.launch_s[0]


def context_us(p, drafter: Drafter) -> float:  # type: ignore[no-untyped-def]
    """µs per context token a drafter's attention reads per request and draft call (its own
    KV: K and V at its width, BF16), at the measured memory bandwidth. Split over TP as the
    target's KV is (by min(TP, KV heads); MLA's latent is replicated on every GPU: v4 divided
    it by TP), and the DP ranks read their own requests' at once (as the target's KV read)."""
    m, d = p.dep.model, p.dep
    if drafter.kind == "dspark":  # a KV as the target's layer's, at the drafter's width
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
    if drafter.kind == "dspark":
        params = _dspark_body(m, drafter)
    elif drafter.kind == "mtp":
        params = drafter.layers * (m.attn_layer_params + 3 * m.hidden * m.intermediate)
    else:
        return 0.0
    return float(p.ops.flops_s(2.0 * params / p.dep.tp)) * 1e6


__all__ = [
    "KINDS", "Drafter", "context_us", "draft_ms", "parse_drafter", "prefill_us", "weight_params",
]  # fmt: skip

"""A DSpark drafter's shape and behaviour (:class:`DSparkConfig`, saved as the checkpoint's
config.json) and the checkpoint's constants. Its own module, without torch, so that the drafter
(:mod:`specsim.record.dspark`) and its layers (:mod:`specsim.record.dspark_layers`) both import
it and neither imports the other back; :mod:`specsim.record.dspark` re-exports every name here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from specsim.errors import SpecsimError

ARCH = "Qwen3DSparkModel"
# A context window this long covers every context: the drafter attends to all positions before
# the anchor, as llama.cpp's draft KV cache does (it keeps every injected target position).
FULL_CONTEXT = 1 << 20
# "vanilla" is DeepSpec's (and llama.cpp's) name for W2(W1[x_prev]); "linear" is the name older
# specsim checkpoints carry for the same structure.
MARKOV_HEAD_TYPES = ("vanilla", "linear")


@dataclass(frozen=True)
class DSparkConfig:
    """Shape and behaviour of a drafter (saved as the checkpoint's config.json)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary
    num_hidden_layers: int = 2
    block_size: int = 7
    target_layer_ids: tuple[int, ...] = (2, 10, 18, 26)
    mask_token_id: int = 3
    markov_rank: int = 64
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    rms_norm_eps: float = 1e-5
    rope_theta: float = 100000.0
    qk_norm: bool = True  # per-head q/k RMSNorm: llama.cpp requires it; off in old checkpoints
    draft_vocab_size: int | None = None  # None: the full target vocabulary
    context_window: int = FULL_CONTEXT  # target positions before the anchor it attends to
    sts_temperatures: tuple[float, ...] | None = None  # per-position STS, fitted after training
    extra: dict[str, Any] = field(default_factory=dict)  # provenance (target hash, training)

    def __post_init__(self) -> None:
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise SpecsimError(
                f"markov_head_type {self.markov_head_type!r} is not one of {MARKOV_HEAD_TYPES}"
            )
        if self.context_window < 1:
            raise SpecsimError(f"context_window must be >= 1, got {self.context_window}")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)
        if self.sts_temperatures is not None:
            d["sts_temperatures"] = list(self.sts_temperatures)
        d["architectures"] = [ARCH]
        d["model_type"] = "dspark"
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DSparkConfig:
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if "head_dim" not in kw and "hidden_size" in d and "num_attention_heads" in d:
            kw["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        kw["target_layer_ids"] = tuple(kw.get("target_layer_ids", cls.target_layer_ids))
        if kw.get("sts_temperatures") is not None:
            kw["sts_temperatures"] = tuple(float(t) for t in kw["sts_temperatures"])
        return cls(**kw)

    @property
    def n_draft_vocab(self) -> int:
        return self.draft_vocab_size or self.vocab_size


__all__ = ["ARCH", "FULL_CONTEXT", "MARKOV_HEAD_TYPES", "DSparkConfig"]

"""Model architectures a profile is built for: built-in ones with sources, or a HF config.json.

Why: a step priced from measured operators needs the SHAPES of the model's matrices (hidden,
heads, KV heads, MLP width, experts, vocabulary), not only its parameter count; the same 8B of
parameters cost differently as 32 thin layers or 16 wide ones, and an MoE's step depends on how
many distinct experts its tokens touch. Each built-in is copied from the model's Hugging Face
``config.json`` (named in ``source``); DeepSeek-V4 reuses ``deployments``' sourced facts and
derives what its card does not give (said in ``derived``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specsim.errors import SpecsimError
from specsim.sim.cost.deployments import V4_FLASH, V4_PRO, ModelFacts


@dataclass(frozen=True)
class ModelArch:
    """One transformer's shapes. ``experts`` = 0: dense. MLA models give ``kv_elems`` (cached
    values per token and layer) and ``attn_params`` (per layer) directly."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (gated: up, gate and down)
    vocab: int
    source: str
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    shared_experts: int = 0
    dense_layers: int = 0  # leading dense layers of an MoE model (first_k_dense_replace)
    kv_elems: int = 0  # 0: 2 x kv_heads x head_dim (K and V)
    attn_params: int = 0  # 0: from heads, kv_heads and head_dim
    tied_embeddings: bool = False
    weight_dtype: str = "bf16"  # the released checkpoint's precision
    expert_dtype: str = ""  # "": as weight_dtype
    kv_sharded: bool = True  # False: MLA's latent KV is replicated on every TP rank
    derived: str = ""  # what was derived rather than read

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def attn_layer_params(self) -> int:
        if self.attn_params:
            return self.attn_params
        return self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim + (
            self.heads * self.head_dim * self.hidden
        )

    @property
    def kv_elems_per_layer(self) -> int:
        return self.kv_elems or 2 * self.kv_heads * self.head_dim

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    @property
    def expert_params(self) -> int:
        """One routed (or shared) expert's parameters (gated: up, gate, down)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def routed_params(self) -> int:
        return self.moe_layers * self.experts * self.expert_params

    @property
    def total_params(self) -> int:
        dense_mlp = (self.layers - self.moe_layers) * self.dense_mlp_params
        shared = self.moe_layers * (self.shared_experts * self.expert_params
                                    + self.hidden * self.experts)  # fmt: skip
        return (self.layers * self.attn_layer_params + dense_mlp + shared + self.routed_params
                + self.embedding_params)  # fmt: skip


def _hf(repo: str) -> str:
    return f"{repo} config.json (Hugging Face)"


def _v4(m: ModelFacts, name: str) -> ModelArch:
    """DeepSeek-V4 from ``deployments``' facts: the expert width from the expert share, the
    attention from what is left of the non-expert parameters (vocabulary assumed V3's)."""
    hidden, layers = int(float(m.hidden)), int(float(m.layers))
    e, k = int(float(m.routed_experts)), int(float(m.top_k))
    vocab = 129_280  # DeepSeek-V3's tokenizer (assumed for V4)
    routed = m.expert_share * float(m.total_params)
    moe_i = round(routed / (e * layers * 3 * hidden) / 64) * 64
    rest = float(m.total_params) - e * layers * 3 * hidden * moe_i - 2 * vocab * hidden
    shared = int(float(m.shared_experts)) * 3 * hidden * moe_i + hidden * e
    attn = int(rest / layers - shared)
    return ModelArch(
        name=name, hidden=hidden, layers=layers, heads=64, kv_heads=1, head_dim=128,
        intermediate=moe_i, vocab=vocab, experts=e, top_k=k, moe_intermediate=moe_i,
        shared_experts=int(float(m.shared_experts)), kv_elems=round(m.kv_bytes_per_token / 2 /
        layers), attn_params=attn, weight_dtype="fp8", expert_dtype="fp4", kv_sharded=False,
        source=f"{m.total_params.source}; {m.layers.source} (specsim/sim/cost/deployments.py)",
        derived=f"expert width {moe_i} from the expert share, attention {attn / 1e6:.0f}M "
        "params/layer from the rest, vocabulary 129,280 (V3's), 64 heads (V3's), KV from the "
        "V4 report's 10% of V3.2",
    )  # fmt: skip


def _dense(name: str, repo: str, h: int, n: int, heads: int, kv: int, hd: int, inter: int,
           vocab: int, tied: bool = False) -> ModelArch:  # fmt: skip
    return ModelArch(name=name, hidden=h, layers=n, heads=heads, kv_heads=kv, head_dim=hd,
                     intermediate=inter, vocab=vocab, tied_embeddings=tied,
                     source=_hf(repo))  # fmt: skip


MODELS: dict[str, ModelArch] = {
    "llama-3-8b": _dense(
        "llama-3-8b", "meta-llama/Meta-Llama-3-8B", 4096, 32, 32, 8, 128, 14336, 128256
    ),  # fmt: skip
    "llama-3-70b": _dense(
        "llama-3-70b", "meta-llama/Meta-Llama-3-70B", 8192, 80, 64, 8, 128, 28672, 128256
    ),  # fmt: skip
    "qwen3-8b": _dense("qwen3-8b", "Qwen/Qwen3-8B", 4096, 36, 32, 8, 128, 12288, 151936),
    "qwen3-14b": _dense("qwen3-14b", "Qwen/Qwen3-14B", 5120, 40, 40, 8, 128, 17408, 151936),
    "qwen3-32b": _dense("qwen3-32b", "Qwen/Qwen3-32B", 5120, 64, 64, 8, 128, 25600, 151936),
    "deepseek-v4-flash": _v4(V4_FLASH, "deepseek-v4-flash"),
    "deepseek-v4-pro": _v4(V4_PRO, "deepseek-v4-pro"),
    # Kimi-K2 (DeepSeek-V3 architecture): MLA with q_lora_rank 1536, kv_lora_rank 512,
    # qk_nope 128 + qk_rope 64, v_head 128; attention params per layer from those shapes
    "kimi-k2": ModelArch(
        name="kimi-k2",
        hidden=7168,
        layers=61,
        heads=64,
        kv_heads=1,
        head_dim=128,
        intermediate=18432,
        vocab=163840,
        experts=384,
        top_k=8,
        moe_intermediate=2048,
        shared_experts=1,
        dense_layers=1,
        kv_elems=512 + 64,
        attn_params=7168 * 1536 + 1536 * 64 * 192 + 7168 * 576 + 512 * 64 * 256 + 64 * 128 * 7168,
        weight_dtype="fp8",
        kv_sharded=False,
        source=_hf("moonshotai/Kimi-K2-Instruct"),
        derived="attention params from the MLA ranks in config.json",
    ),  # fmt: skip
}


def _get(cfg: dict, keys: tuple[str, ...], where: str, default: int | None = None) -> int:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            v = cfg[k]
            if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v) or v < 0:
                raise SpecsimError(f"{where}: {k} = {v!r} must be a whole number >= 0")
            return int(v)
    if default is None:
        raise SpecsimError(f"{where} has no {keys[0]}; a Hugging Face config.json needs it")
    return default


def from_hf_config(path: str | Path) -> ModelArch:
    """A model from a Hugging Face ``config.json`` (``text_config`` is read where present)."""
    p = Path(path)
    where = f"--model {str(p)!r}"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecsimError(f"{where} is not a readable JSON config ({exc})") from None
    if not isinstance(cfg, dict):
        raise SpecsimError(f"{where} is not a JSON object")
    cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    h = _get(cfg, ("hidden_size",), where)
    heads = _get(cfg, ("num_attention_heads",), where)
    if h < 1 or heads < 1:
        raise SpecsimError(f"{where}: hidden_size and num_attention_heads must be >= 1")
    experts = _get(cfg, ("num_experts", "n_routed_experts", "num_local_experts"), where, 0)
    mla = _get(cfg, ("kv_lora_rank",), where, 0)
    arch = ModelArch(
        name=p.stem if p.stem != "config" else p.parent.name or "config",
        hidden=h,
        layers=_get(cfg, ("num_hidden_layers",), where),
        heads=heads,
        kv_heads=_get(cfg, ("num_key_value_heads",), where, heads) or heads,
        head_dim=_get(cfg, ("head_dim",), where, h // heads) or h // heads,
        intermediate=_get(cfg, ("intermediate_size",), where),
        vocab=_get(cfg, ("vocab_size",), where),
        experts=experts,
        top_k=_get(cfg, ("num_experts_per_tok",), where, 0) if experts else 0,
        moe_intermediate=_get(cfg, ("moe_intermediate_size",), where, 0) if experts else 0,
        shared_experts=_get(cfg, ("n_shared_experts", "num_shared_experts"), where, 0),
        dense_layers=_get(cfg, ("first_k_dense_replace",), where, 0) if experts else 0,
        kv_elems=mla + _get(cfg, ("qk_rope_head_dim",), where, 0) if mla else 0,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        kv_sharded=not mla,
        source=f"{p} (Hugging Face config.json)",
    )
    if arch.layers < 1 or arch.vocab < 1 or arch.intermediate < 1:
        raise SpecsimError(f"{where}: layers, vocab_size and intermediate_size must be >= 1")
    if experts and (arch.top_k < 1 or arch.top_k > experts or arch.moe_intermediate < 1):
        raise SpecsimError(
            f"{where}: an MoE config needs num_experts_per_tok in [1, experts] and "
            "moe_intermediate_size >= 1"
        )
    return arch


def model_arch(spec: str) -> ModelArch:
    """A built-in model by name (case-insensitive) or a path to a HF ``config.json``."""
    key = spec.strip().lower()
    if key in MODELS:
        return MODELS[key]
    if spec.endswith(".json") or Path(spec).is_file():
        return from_hf_config(spec)
    raise SpecsimError(
        f"unknown model {spec!r}; use one of {', '.join(MODELS)}, or a path to a Hugging Face "
        "config.json"
    )


__all__ = ["MODELS", "ModelArch", "from_hf_config", "model_arch"]

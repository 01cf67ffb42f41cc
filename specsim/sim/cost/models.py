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
import re
from dataclasses import dataclass, replace
from pathlib import Path

from specsim.errors import SpecsimError
from specsim.sim.cost.calibration import V4_EXTRA_KERNELS
from specsim.sim.cost.deployments import V4_FLASH, V4_PRO, ModelFacts
from specsim.sim.cost.profile_csv import count, read_text_file, whole


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
    # kernels a layer launches beyond the components priced (``eager``): a family's own
    # operators, which only an eager (ungraphed) step pays for; V4's are FITTED (calibration)
    extra_kernels: float = 0.0

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
        extra_kernels=V4_EXTRA_KERNELS,
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


# --------------------------------------------------------------------------- value rules
# One rule per number of an architecture, shared by a HF config.json's reader and by every
# build (``build.check`` runs :func:`check_arch` on whatever ModelArch it is given), so a config
# and a ModelArch made in code are held to the same ranges. Each bound is far past any released
# model and small enough that a product of them stays finite: a size out of them is a typo or a
# hostile file, never a model.
MAX_HIDDEN = 131_072
MAX_VOCAB = 1_048_576
MAX_LAYERS = 1_024
MAX_HEADS = 4_096
MAX_HEAD_DIM = 4_096
MAX_INTERMEDIATE = 1_048_576
MAX_EXPERTS = 65_536
MAX_SHARED_EXPERTS = 64
MAX_CONFIG_BYTES = 4 << 20  # a config.json is a few KB; 4 MiB is no config

# ModelArch field -> (the HF config.json keys it is read from, least, most)
FIELDS: dict[str, tuple[tuple[str, ...], int, int]] = {
    "hidden": (("hidden_size",), 1, MAX_HIDDEN),
    "layers": (("num_hidden_layers",), 1, MAX_LAYERS),
    "heads": (("num_attention_heads",), 1, MAX_HEADS),
    "kv_heads": (("num_key_value_heads",), 1, MAX_HEADS),
    "head_dim": (("head_dim",), 1, MAX_HEAD_DIM),
    "intermediate": (("intermediate_size",), 1, MAX_INTERMEDIATE),
    "vocab": (("vocab_size",), 1, MAX_VOCAB),
    "experts": (("num_experts", "n_routed_experts", "num_local_experts"), 0, MAX_EXPERTS),
    "top_k": (("num_experts_per_tok",), 0, MAX_EXPERTS),
    "moe_intermediate": (("moe_intermediate_size",), 0, MAX_INTERMEDIATE),
    "shared_experts": (("n_shared_experts", "num_shared_experts"), 0, MAX_SHARED_EXPERTS),
    "dense_layers": (("first_k_dense_replace",), 0, MAX_LAYERS),
    "kv_elems": (("kv_lora_rank + qk_rope_head_dim",), 0, 2 * MAX_HEADS * MAX_HEAD_DIM),
    "attn_params": (("attention parameters per layer",), 0, 10**12),
}


def check_arch(m: ModelArch, where: str) -> ModelArch:
    """``m`` if its numbers are whole, in range and consistent as the architecture defines
    them, else a one-line ``SpecsimError`` naming the config key. Why each rule: KV heads are
    shared by groups of query heads (>= 1, dividing them); an MoE routes each token to top-k of
    its experts (1 <= top-k <= experts) and its leading dense layers are some of its layers (more
    would price a negative number of MoE layers). ``heads x head_dim`` may differ from the hidden
    size (Qwen3-4B: 32 x 128 over 2,560), so it is not required to match."""
    for name, (keys, lo, hi) in FIELDS.items():
        count(getattr(m, name), f"{where}: {keys[0]}", lo, hi)
    if m.kv_heads > m.heads or m.heads % m.kv_heads:
        raise SpecsimError(
            f"{where}: num_key_value_heads = {m.kv_heads} must divide num_attention_heads = "
            f"{m.heads} (each KV head serves a whole group of query heads); fix the config"
        )
    if m.is_moe:
        if not 1 <= m.top_k <= m.experts:
            raise SpecsimError(
                f"{where}: num_experts_per_tok = {m.top_k} must be in [1, {m.experts}] (the "
                "experts each token is routed to); fix the config"
            )
        if m.moe_intermediate < 1:
            raise SpecsimError(f"{where}: an MoE config needs moe_intermediate_size >= 1")
        if m.dense_layers > m.layers:
            raise SpecsimError(
                f"{where}: {m.dense_layers} dense layers (first_k_dense_replace) but only "
                f"{m.layers} layers (num_hidden_layers); fix the config"
            )
    return m


def _value(cfg: dict, keys: tuple[str, ...], where: str, lo: int, hi: int) -> int | None:
    """The first of ``keys`` in ``cfg`` (null: absent) as a whole number in [lo, hi], by the
    shared rule; None if none is there. JSON text and booleans are not numbers."""
    for k in keys:
        v = cfg.get(k)
        if v is None:
            continue
        if isinstance(v, str):
            raise SpecsimError(f"{where}: {k} = {v!r} is text; write it as a JSON number")
        return count(v, f"{where}: {k}", lo, hi)
    return None


def _field(cfg: dict, name: str, where: str, default: int | None = None) -> int:
    """ModelArch field ``name`` read from its config keys (:data:`FIELDS`), or ``default``;
    no default: the config must give it."""
    keys, lo, hi = FIELDS[name]
    v = _value(cfg, keys, where, lo, hi)
    if v is not None:
        return v
    if default is None:
        raise SpecsimError(f"{where} has no {keys[0]}; a Hugging Face config.json needs it")
    return default


def _head_dim(cfg: dict, hidden: int, heads: int, where: str) -> int:
    """``head_dim`` where given (any value: Qwen3-4B's heads x head_dim is not its hidden
    size), else hidden / heads as transformers derives it, which needs heads <= hidden."""
    given = _value(cfg, ("head_dim",), where, 1, MAX_HEAD_DIM)
    if given is not None:
        return given
    if heads > hidden:
        raise SpecsimError(
            f"{where}: num_attention_heads = {heads} is more than hidden_size = {hidden}, so "
            "there is no head dimension (hidden / heads); give head_dim or fix the config"
        )
    return hidden // heads


def _dense_layers(cfg: dict, layers: int, where: str) -> int:
    """Layers without routed experts: DeepSeek's leading ``first_k_dense_replace``, plus
    Qwen-MoE's ``mlp_only_layers`` and every layer ``decoder_sparse_step`` skips."""
    first = _value(cfg, ("first_k_dense_replace",), where, 0, MAX_LAYERS) or 0
    if first > layers:
        raise SpecsimError(
            f"{where}: first_k_dense_replace = {first} dense layers but only {layers} layers "
            "(num_hidden_layers); fix the config"
        )
    step = _value(cfg, ("decoder_sparse_step",), where, 1, max(layers, 1)) or 1
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list):
        raise SpecsimError(f"{where}: mlp_only_layers must be a list of layer indices")
    dense = {int(i) for i in whole(only, f"{where}: mlp_only_layers", 0, layers - 1)}
    sparse = [i for i in range(first, layers) if i not in dense and (i + 1) % step == 0]
    return layers - len(sparse)


def _flag(cfg: dict, key: str, where: str) -> bool:
    """A JSON boolean (absent or null: false); the text "false" is not false."""
    v = cfg.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise SpecsimError(f"{where}: {key} = {v!r} must be true or false")
    return v


def read_config(path: Path, where: str) -> dict:
    """The config's JSON object (its ``text_config`` where present), or one line: the shared
    file rule (a regular file under :data:`MAX_CONFIG_BYTES`), then the JSON, whose syntax
    errors, nesting too deep for the parser and numbers too long for Python are all the
    user's to fix."""
    text = read_text_file(
        path, "--model", MAX_CONFIG_BYTES, "give a built-in model name or a config.json path",
        f"pass the config.json in it (--model {path / 'config.json'})",
    )  # fmt: skip
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecsimError(f"{where} is not a readable JSON config ({exc})") from None
    except RecursionError:
        raise SpecsimError(f"{where} is not a readable JSON config (nested too deep)") from None
    except ValueError:  # an integer past Python's digit limit: no size is thousands of digits
        raise SpecsimError(
            f"{where} is not a readable JSON config (a number thousands of digits long)"
        ) from None
    if not isinstance(cfg, dict):
        raise SpecsimError(f"{where} is not a JSON object; give a Hugging Face config.json")
    text_cfg = cfg.get("text_config")
    return text_cfg if isinstance(text_cfg, dict) else cfg


def from_hf_config(path: str | Path) -> ModelArch:
    """A model from a Hugging Face ``config.json`` (``text_config`` is read where present);
    every number checked by the module's value rules (:func:`check_arch`)."""
    p = Path(path)
    where = f"--model {str(p)!r}"
    cfg = read_config(p, where)
    h = _field(cfg, "hidden", where)
    heads = _field(cfg, "heads", where)
    layers = _field(cfg, "layers", where)
    inter = _field(cfg, "intermediate", where)
    experts = _field(cfg, "experts", where, 0)
    mla = _value(cfg, ("kv_lora_rank",), where, 0, MAX_HEADS * MAX_HEAD_DIM) or 0
    rope = _value(cfg, ("qk_rope_head_dim",), where, 0, MAX_HEAD_DIM) or 0
    arch = ModelArch(
        name=p.stem if p.stem != "config" else p.parent.name or "config",
        hidden=h,
        layers=layers,
        heads=heads,
        kv_heads=_field(cfg, "kv_heads", where, heads),
        head_dim=_head_dim(cfg, h, heads, where),
        intermediate=inter,
        vocab=_field(cfg, "vocab", where),
        experts=experts,
        top_k=_field(cfg, "top_k", where, 0) if experts else 0,
        # Mixtral-style configs give no moe_intermediate_size: intermediate_size is the expert's
        moe_intermediate=_field(cfg, "moe_intermediate", where, inter) if experts else 0,
        shared_experts=_field(cfg, "shared_experts", where, 0) if experts else 0,
        dense_layers=_dense_layers(cfg, layers, where) if experts else 0,
        kv_elems=mla + rope if mla else 0,
        tied_embeddings=_flag(cfg, "tie_word_embeddings", where),
        kv_sharded=not mla,
        source=f"{p} (Hugging Face config.json)",
    )
    return check_arch(arch, where)


# --------------------------------------------------------------------------- names
# Hugging Face repo ids and common spellings of the built-ins, where the architecture (every
# shape this module prices) is the same: Llama 3.1 and 3.3 changed the training and the RoPE
# scaling, not the shapes (their config.json files agree on hidden, layers, heads, KV heads,
# MLP width and vocabulary). Quantized re-releases (FP8, AWQ) are not aliases: their weights'
# precision differs (give --weight-dtype).
ALIASES: dict[str, str] = {
    "llama-3-8b": "llama-3-8b",
    "llama-3.1-8b": "llama-3-8b",
    "llama-3-70b": "llama-3-70b",
    "llama-3.1-70b": "llama-3-70b",
    "llama-3.3-70b": "llama-3-70b",
    "qwen3-8b": "qwen3-8b",
    "qwen3-14b": "qwen3-14b",
    "qwen3-32b": "qwen3-32b",
    "deepseek-v4-flash": "deepseek-v4-flash",
    "deepseek-v4-pro": "deepseek-v4-pro",
    "kimi-k2": "kimi-k2",
}


def alias_key(spec: str) -> str:
    """A model spelling as :data:`ALIASES` keys it: case-folded, an ``owner/name`` repo id's
    owner dropped (``meta-llama/``), ``Meta-`` and a trailing ``-Instruct`` / ``-Base`` /
    ``-HF`` dropped, ``llama3.3`` spelt ``llama-3.3``, ``_``, spaces and ``:`` (Ollama's
    ``llama3.3:70b``) as ``-``."""
    k = spec.strip().lower()
    if re.fullmatch(r"[^/]+/[^/]+", k):  # an owner/name repo id (a longer path is a path)
        k = k.split("/")[1]
    k = re.sub(r"[\s_:]+", "-", k)
    k = re.sub(r"^meta-", "", k)
    k = re.sub(r"-(instruct|base|hf|chat)$", "", k)
    return re.sub(r"^llama(\d)", r"llama-\1", k)


def builtin_model(spec: str) -> ModelArch | None:
    """The built-in ``spec`` names (its own name or an alias), or None."""
    name = ALIASES.get(alias_key(spec))
    if name is None:
        return None
    arch = MODELS[name]
    if alias_key(spec) == name:
        return arch
    return replace(arch, source=f"{arch.source}; {spec.strip()!r} has the same architecture")


def model_arch(spec: str) -> ModelArch:
    """A built-in model by name, HF repo id or common spelling (case-insensitive: see
    :data:`ALIASES`), or a path to a HF ``config.json``."""
    key = spec.strip().lower()
    if key in MODELS:
        return MODELS[key]
    if key.endswith(".json") or Path(spec).exists():  # a file (or a folder: said so)
        return from_hf_config(spec)
    arch = builtin_model(spec)
    if arch is not None:
        return arch
    # no "did you mean": the nearest spelling is often another size (llama-3.2-1b, 3.1-8b)
    raise SpecsimError(
        f"unknown model {spec!r}; use one of {', '.join(MODELS)} (or their Hugging Face "
        "repo ids, e.g. meta-llama/Llama-3.3-70B-Instruct), or a path to a Hugging Face "
        "config.json"
    )


__all__ = [
    "ALIASES", "FIELDS", "MODELS", "ModelArch", "alias_key", "builtin_model", "check_arch",
    "from_hf_config", "model_arch",
]  # fmt: skip

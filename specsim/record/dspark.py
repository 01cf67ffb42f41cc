"""The DSpark drafter: a parallel block drafter, a Markov sequential head and a confidence head.

Architecture (DSpark paper; DFlash backbone; names follow the DeepSpec checkpoint layout):

- Target features: hidden states of ``target_layer_ids`` (concatenated, ``n*H``) at the positions
  STRICTLY BEFORE the anchor, projected by ``fc`` (``n*H -> H``) and ``hidden_norm``, become extra
  keys/values in every drafter layer (each layer's own ``k_proj``/``v_proj``).
- Block input: ``[anchor, mask x (gamma-1)]`` embedded with the target's frozen embedding; one
  non-causal forward of ``num_hidden_layers`` decoder layers gives ``h_1..h_gamma``; ``h_k``
  predicts draft token ``x_k`` (the token after the anchor, then the next, ...).
- Markov head: step logits ``U_k + W2(W1[x_{k-1}])`` (``x_0`` is the anchor), sampled left to
  right. ``W1: Embedding(V, r)``, ``W2: Linear(r, V_draft)``.
- Confidence head: ``c_k = sigmoid(w^T [h_k ; W1[x_{k-1}]])``, the conditional probability that
  ``x_k`` is accepted given ``x_{<k}`` were.
- LM head: the target's, frozen; optionally restricted to a draft vocabulary (``d2t`` maps draft
  ids to target ids, as EAGLE-3 does) because on a CPU the full 49k-row head dominates the cost.

Checkpoint layout (DeepSpec): ``config.json`` with ``architectures=["Qwen3DSparkModel"]``,
``block_size``, ``num_hidden_layers``, ``target_layer_ids``, ``mask_token_id``, ``markov_rank``,
``markov_head_type``, ``enable_confidence_head`` and the Qwen3 shape keys; ``model.safetensors``
with ``fc``, ``hidden_norm``, ``layers.{i}.self_attn.{q,k,v,o}_proj``, ``q_norm``, ``k_norm``,
``mlp.*``, ``norm``, ``lm_head``, ``markov_head.markov_w1``, ``markov_head.markov_w2``,
``confidence_head.proj``. specsim adds ``d2t`` (reduced vocabulary) and ``sts_temperatures``
(in the config) when present.

llama.cpp (``--spec-type draft-dspark``) computes exactly this drafter when the config has
``qk_norm=True`` (its backbone is Qwen3's and requires q/k norms) and a ``context_window`` that
covers the whole context (its draft KV cache holds every position before the anchor):
``config_for_target`` makes both the default. ``dspark_export.export_deepspec`` writes the
checkpoint its converter reads; docs/llama-cpp-dspark.md lists every point that must match.
Checkpoints saved before (``qk_norm=false``, ``context_window=192``, ``markov_head_type=linear``)
load and draft as they always did.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specsim.errors import SpecsimError
from specsim.record.dspark_config import (  # noqa: F401 - re-exported: the config's home
    ARCH,
    FULL_CONTEXT,
    MARKOV_HEAD_TYPES,
    DSparkConfig,
)
from specsim.record.dspark_layers import ConfidenceHead, Layer, MarkovHead, RMSNorm


@dataclass(frozen=True)
class Drafts:
    """One block per anchor: draft ids (target vocabulary), confidences, draft log-probs."""

    tokens: torch.Tensor  # [A, gamma] long
    conf: torch.Tensor  # [A, gamma] float, conditional c_k (STS applied when the drafter has it)
    raw_conf: torch.Tensor  # [A, gamma] float, before STS
    q: torch.Tensor | None  # [A, gamma, V_draft] draft probabilities (sampling only)


class DSparkDrafter(nn.Module):
    """A DSpark drafter. ``embed`` (the target's frozen embedding) is bound, never saved."""

    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n_feat = len(cfg.target_layer_ids) * cfg.hidden_size
        self.fc = nn.Linear(n_feat, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.n_draft_vocab, bias=False)
        self.markov_head = MarkovHead(cfg)
        self.confidence_head = ConfidenceHead(cfg)
        d2t = torch.arange(cfg.n_draft_vocab)
        self.register_buffer("d2t", d2t, persistent=True)
        self.embed: nn.Embedding | None = None

    # ---- vocabulary ---------------------------------------------------------------------------
    def t2d(self) -> torch.Tensor:
        """Target id -> draft id, -1 where the draft vocabulary lacks the token."""
        out = torch.full((self.cfg.vocab_size,), -1, dtype=torch.long, device=self.d2t.device)
        out[self.d2t] = torch.arange(self.d2t.numel(), device=self.d2t.device)
        return out

    def bind(self, embed: nn.Embedding) -> DSparkDrafter:
        """Attach the target's input embedding (frozen, shared, not part of the checkpoint)."""
        object.__setattr__(self, "embed", embed)  # not a submodule: never saved or trained
        return self

    # ---- the parallel backbone ----------------------------------------------------------------
    def backbone(
        self, feats: torch.Tensor, seq: torch.Tensor, anchors: torch.Tensor, start: int = 0
    ) -> torch.Tensor:
        """Block hidden states ``h_1..h_gamma`` for anchors of ONE sequence.

        feats: [L, n*H] target features of positions start..start+L-1; seq: token ids (at least
        up to the last anchor); anchors: [A] positions of the anchor tokens. The block of anchor
        ``a`` attends to the features of positions ``[a - context_window, a)`` (strictly before
        the anchor: the anchor is the bonus token, whose target hidden state does not exist when
        drafting) and to its own block, non-causally. Returns [A, gamma, H].
        """
        if self.embed is None:
            raise RuntimeError("bind the target's embedding first: drafter.bind(embed)")
        g, w = self.cfg.block_size, self.cfg.context_window
        a_n = anchors.numel()
        lo = max(start, int(anchors.min()) - w)
        hi = int(anchors.max())
        ctx = self.hidden_norm(self.fc(feats[lo - start : hi - start].to(self.fc.weight.dtype)))
        cpos = torch.arange(lo, hi, device=feats.device)
        qpos = (anchors[:, None] + torch.arange(g, device=feats.device)[None, :]).reshape(-1)
        toks = torch.full((a_n, g), self.cfg.mask_token_id, dtype=torch.long, device=seq.device)
        toks[:, 0] = seq[anchors]
        x = self.embed(toks.reshape(-1)).to(self.fc.weight.dtype)
        a_q = anchors.repeat_interleave(g)  # anchor of each query
        ctx_ok = (cpos[None, :] < a_q[:, None]) & (cpos[None, :] >= a_q[:, None] - w)
        blk = torch.arange(a_n, device=feats.device).repeat_interleave(g)
        blk_ok = blk[:, None] == blk[None, :]
        mask = torch.cat([ctx_ok, blk_ok], dim=1)
        for layer in self.layers:
            x = layer(x, ctx, qpos, cpos, mask)
        return self.norm(x).view(a_n, g, -1)

    # ---- heads ---------------------------------------------------------------------------------
    def heads(self, h: torch.Tensor, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step logits ``U_k + W2(W1[x_{k-1}])`` and confidence logits, for given previous tokens.

        h: [..., H]; prev: [...] target ids of x_{k-1}. Returns ([..., V_draft], [...]).
        """
        m = self.markov_head.markov_w1(prev)
        logits = self.lm_head(h) + self.markov_head.markov_w2(m)
        conf = self.confidence_head.proj(torch.cat([h, m.to(h.dtype)], -1)).squeeze(-1)
        return logits, conf

    @torch.no_grad()
    def draft(
        self,
        feats: torch.Tensor,
        seq: torch.Tensor,
        anchors: torch.Tensor,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
        chunk: int = 64,
        start: int = 0,
    ) -> Drafts:
        """Draft a block after every anchor (greedy at temperature 0, else sampled from q)."""
        outs = [
            self._draft_chunk(feats, seq, anchors[s : s + chunk], temperature, generator, start)
            for s in range(0, anchors.numel(), chunk)
        ]
        cat = lambda xs: None if xs[0] is None else torch.cat(xs)  # noqa: E731
        return Drafts(
            tokens=torch.cat([o.tokens for o in outs]),
            conf=torch.cat([o.conf for o in outs]),
            raw_conf=torch.cat([o.raw_conf for o in outs]),
            q=cat([o.q for o in outs]),
        )

    def _draft_chunk(self, feats, seq, anchors, temperature, generator, start) -> Drafts:  # type: ignore[no-untyped-def]
        h = self.backbone(feats, seq, anchors, start)
        return self.markov_walk(h, seq[anchors], temperature, generator)

    def markov_walk(
        self,
        h: torch.Tensor,
        prev: torch.Tensor,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> Drafts:
        """The sequential half of drafting, the one loop the recorder and the real engine share:
        position by position, the Markov head's step logits from the previous token, a greedy
        or sampled token, and the confidence of it (raw and STS-scaled).

        h: [R, gamma, H] block hidden states (``backbone``); prev: [R] the anchors' token ids.
        Sampling draws on the generator's device (a CPU generator with GPU logits works), so one
        seed gives one block wherever the model runs. ``q`` is over the draft vocabulary.
        """
        toks, confs, qs = [], [], []
        for k in range(self.cfg.block_size):
            logits, c = self.heads(h[:, k], prev)
            logits = logits.float()
            if temperature > 0:
                q = torch.softmax(logits / temperature, -1)
                on = generator.device if generator is not None else q.device
                d = torch.multinomial(q.to(on), 1, generator=generator).squeeze(-1).to(q.device)
                qs.append(q)
            else:
                d = logits.argmax(-1)
            prev = self.d2t[d]
            toks.append(prev)
            confs.append(c.float())
        raw = torch.stack(confs, 1)
        temps = self.cfg.sts_temperatures
        scale = torch.tensor(temps, dtype=raw.dtype, device=raw.device) if temps else None
        return Drafts(
            tokens=torch.stack(toks, 1),
            conf=torch.sigmoid(raw / scale if scale is not None else raw),
            raw_conf=torch.sigmoid(raw),
            q=torch.stack(qs, 1) if qs else None,
        )


# ---- construction, save and load ---------------------------------------------------------------
def config_for_target(target_config: Any, **overrides: Any) -> DSparkConfig:
    """A drafter config shaped like the target's layers (so they can initialise it).

    The defaults are what llama.cpp's ``draft-dspark`` computes: q/k norms on (its backbone is
    Qwen3's, whatever the target's architecture), the whole context attended to, the ``vanilla``
    Markov head. Feature layers are target layer OUTPUTS (``hidden_states[i + 1]``); the last
    layer's is excluded because llama.cpp extracts layer inputs and layer ``n`` does not exist.
    """
    tc = target_config
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    rope_theta = getattr(tc, "rope_theta", None)
    if rope_theta is None:
        rope_theta = (getattr(tc, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    n = tc.num_hidden_layers
    base = dict(
        hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads,
        head_dim=head_dim,
        vocab_size=tc.vocab_size,
        rms_norm_eps=float(tc.rms_norm_eps),
        rope_theta=float(rope_theta),
        target_layer_ids=tuple(sorted({max(1, round(i * (n - 2) / 3)) for i in range(4)})),
        qk_norm=True,
        markov_head_type="vanilla",
        context_window=FULL_CONTEXT,
    )
    base.update(overrides)
    cfg = DSparkConfig(**base)
    if max(cfg.target_layer_ids) > n - 2 or min(cfg.target_layer_ids) < 0:
        raise SpecsimError(
            f"target_layer_ids {list(cfg.target_layer_ids)} must lie in [0, {n - 2}] for a "
            f"{n}-layer target (llama.cpp reads layer i's output as layer i+1's input)"
        )
    return cfg


def init_from_target(drafter: DSparkDrafter, target_model: Any, vocab: torch.Tensor | None) -> None:
    """Initialise layers from the target's last layers; LM head = the target's rows, frozen."""
    tl = target_model.model.layers
    n = drafter.cfg.num_hidden_layers
    for i, layer in enumerate(drafter.layers):
        src = tl[len(tl) - n + i].state_dict()
        missing, _ = layer.load_state_dict(src, strict=False)
        assert all("q_norm" in m or "k_norm" in m for m in missing), missing
    full = target_model.get_output_embeddings().weight.detach()
    if vocab is not None:
        drafter.d2t.copy_(vocab)
        full = full[vocab]
    drafter.lm_head.weight.data.copy_(full)
    drafter.lm_head.weight.requires_grad_(False)
    drafter.bind(target_model.get_input_embeddings())


def save_drafter(
    drafter: DSparkDrafter,
    out_dir: str | Path,
    force: bool = False,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write config.json + model.safetensors atomically (DeepSpec layout); floating tensors in
    ``dtype`` when given (fp16 halves a shipped checkpoint; loading upcasts to fp32)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    if out.exists() and not force:
        raise SpecsimError(f"{out} exists; pass --force to overwrite it")
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    if drafter.cfg.draft_vocab_size is None:
        state.pop("d2t")
    save_file(state, str(tmp / "model.safetensors"))
    conf = {**drafter.cfg.to_json(), "d2t_format": "absolute"}
    (tmp / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def load_drafter(path: str | Path, device: str = "cpu") -> DSparkDrafter:
    """Load a DeepSpec-layout drafter directory (ours or a released ``dspark_*`` checkpoint)."""
    from safetensors.torch import load_file

    p = Path(path).expanduser()
    cfg_file = p / "config.json"
    if not cfg_file.exists():
        raise SpecsimError(f"{p} is not a drafter directory (no config.json); train one first")
    raw = json.loads(cfg_file.read_text())
    if ARCH not in raw.get("architectures", [ARCH]):
        raise SpecsimError(f"{p} holds {raw.get('architectures')}, not a {ARCH} drafter")
    cfg = DSparkConfig.from_json(raw)
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise SpecsimError(f"{p} has no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    state = {k.removeprefix("model."): v for k, v in state.items()}
    state.pop("t2d", None)  # DeepSpec/EAGLE-3 exports carry the inverse map too; unused
    if "d2t" in state and d2t_format(raw) == "offset":
        state["d2t"] = state["d2t"].long() + torch.arange(state["d2t"].numel())
    if "d2t" in state and cfg.draft_vocab_size is None:
        cfg = DSparkConfig.from_json({**raw, "draft_vocab_size": int(state["d2t"].numel())})
    drafter = DSparkDrafter(cfg)
    state.setdefault("d2t", drafter.d2t)
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SpecsimError(
            f"{p} does not match the DSpark layout (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); is it a DeepSpec dspark_* checkpoint?"
        )
    for prm in drafter.lm_head.parameters():
        prm.requires_grad_(False)
    return drafter.to(device).eval()


def d2t_format(raw_config: dict[str, Any]) -> str:
    """How a checkpoint stores ``d2t``: ``"offset"`` (target id = i + d2t[i], the EAGLE-3 and
    DeepSpec convention that llama.cpp's converter reads) or ``"absolute"`` (target ids).

    Why a guess is needed: specsim wrote absolute ids without saying so before ``d2t_format``
    existed; its configs are recognised by ``context_window``, which DeepSpec configs lack.
    """
    fmt = raw_config.get("d2t_format")
    if fmt is None:
        fmt = "absolute" if "context_window" in raw_config else "offset"
    if fmt not in ("offset", "absolute"):
        raise SpecsimError(f"d2t_format {fmt!r} is neither 'offset' nor 'absolute'")
    return str(fmt)


def position_weights(block_size: int, decay: float | None = None) -> torch.Tensor:
    """The paper's per-position loss weights exp(-(k-1)/decay), k = 1..block_size.

    ``decay`` None: the block size (specsim's drafters v1 and v2). DeepSpec's released configs
    and NeMo AutoModel's use 4.0 whatever the block (``loss_decay_gamma``), weighting the early
    positions, which every accepted block needs, more (drafter v3)."""
    d = float(block_size if decay is None else decay)
    return torch.tensor([math.exp(-k / d) for k in range(block_size)])

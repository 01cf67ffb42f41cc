"""The target side of the real engine: one forward over many requests' new tokens, with a KV cache.

Why our own forward instead of ``model(...)``: a speculative step verifies a DIFFERENT number of
tokens per request (prefill prompts, 1 + l_r decode tokens), each against its own cached context.
Hugging Face's batched cache assumes equal lengths. So we reuse the model's own modules (norms,
projections, MLPs, rotary embedding, LM head) and only do the bookkeeping ourselves:

- KV cache: per layer one tensor ``[slots * cap, n_kv, head_dim]``; request slot ``s`` keeps
  position ``p`` at row ``s * cap + p``. Rolling back rejected drafts is just a shorter length.
- ``layout="flat"``: the B new tokens of all requests are one ``[B, H]`` matrix for every linear
  layer (no padding; what vLLM calls flattened verification, DSpark's marker tensor), and
  attention runs per request over that request's own cached keys (a CPU has no varlen attention
  kernel; one SDPA over all requests' keys with a block-diagonal mask was measured to waste
  B x sum(context) work).
- ``layout="padded"``: tokens are padded to ``[R, Lmax]`` (the HF way); linear layers also run on
  the padding, attention is batched per request. Kept to measure which is faster (docs/fidelity.md).

Llama-family decoders (SmolLM2, Llama, Qwen2/3 with q/k norms) are supported: anything whose
layers have ``input_layernorm``, ``self_attn.{q,k,v,o}_proj``, ``post_attention_layernorm`` and
``mlp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812

from specsim.errors import SpecsimError

LAYOUTS = ("flat", "padded")


@dataclass(frozen=True, eq=False)
class StepOut:
    """One forward's results, rows in the order the requests' tokens were given (flattened)."""

    logits: torch.Tensor  # [L, V] float32: the rows that asked for logits (all B by default)
    feats: torch.Tensor | None  # [B, n*H] concatenated hidden states of the feature layers
    offsets: np.ndarray  # (R+1,) row offsets of each request's tokens
    logit_offsets: np.ndarray | None = None  # (R+1,) row offsets into ``logits`` (None: offsets)

    def logits_of(self, i: int) -> torch.Tensor:
        """Request ``i``'s logit rows (its LAST rows when it asked for fewer than it fed)."""
        off = self.offsets if self.logit_offsets is None else self.logit_offsets
        return self.logits[int(off[i]) : int(off[i + 1])]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class FlatTarget:
    """A decoder-only target run over variable-length token groups with a slot KV cache."""

    def __init__(
        self,
        model: Any,
        slots: int,
        cap: int,
        feature_layers: tuple[int, ...] = (),
        layout: str = "flat",
    ) -> None:
        if layout not in LAYOUTS:
            raise SpecsimError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
        inner = getattr(model, "model", None)
        if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
            raise SpecsimError(
                f"{type(model).__name__} is not a Llama-family decoder; the engine supports "
                "Llama/Qwen-style models"
            )
        cfg = model.config
        self.model = model
        self.inner = inner
        self.layers = list(inner.layers)
        self.n_layers = len(self.layers)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads)
        self.slots = int(slots)
        self.cap = int(cap)
        self.layout = layout
        self.feature_layers = tuple(int(i) for i in feature_layers)
        bad = [i for i in self.feature_layers if not 0 <= i < self.n_layers]
        if bad:
            raise SpecsimError(
                f"drafter wants target layers {bad} but the target has {self.n_layers}"
            )
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        shape = (self.n_layers, self.slots * self.cap, self.n_kv, self.hd)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.lengths = np.zeros(self.slots, dtype=np.int64)

    # ---- cache bookkeeping ---------------------------------------------------------------------
    def reset(self, slot: int) -> None:
        self.lengths[slot] = 0

    def truncate(self, slot: int, length: int) -> None:
        """Keep the first ``length`` cached positions of ``slot`` (drops rejected drafts)."""
        self.lengths[slot] = min(int(length), int(self.lengths[slot]))

    # ---- the forward ---------------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self, slots: list[int], tokens: list[list[int]], n_logits: list[int] | None = None
    ) -> StepOut:
        """Append ``tokens[i]`` to the context of ``slots[i]`` and run them all in ONE forward.

        Returns logits (and feature-layer hidden states) for every new token, or, with
        ``n_logits``, logits for only the last ``n_logits[i]`` tokens of request ``i``: a prompt
        being prefilled needs the LM head at its last token only, as in any serving engine (on
        SmolLM2-135M the LM head is ~20% of a token's cost). The cache then holds the new tokens
        too (call :meth:`truncate` to drop rejected ones).
        """
        lens = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
        past = self.lengths[np.asarray(slots, dtype=np.int64)]
        if np.any(lens < 1):
            raise SpecsimError("internal: a request fed no token to the target")
        if np.any(past + lens > self.cap):
            raise SpecsimError(
                f"a request reached {int((past + lens).max())} cached tokens, over the cache "
                f"capacity {self.cap}; raise the engine's max context"
            )
        rows = None
        if n_logits is not None:
            nl = np.minimum(np.asarray(n_logits, dtype=np.int64), lens)
            if np.any(nl < 1):
                raise SpecsimError("internal: every request needs at least one logit row")
            if not np.array_equal(nl, lens):
                ends = np.cumsum(lens)
                rows = np.concatenate([np.arange(e - k, e) for e, k in zip(ends, nl, strict=True)])
        if self.layout == "flat":
            out = self._flat(slots, tokens, lens, past, rows)
        else:
            out = self._padded(slots, tokens, lens, past, rows)
        self.lengths[np.asarray(slots, dtype=np.int64)] = past + lens
        if rows is not None:
            lo = np.zeros(len(slots) + 1, dtype=np.int64)
            np.cumsum(nl, out=lo[1:])
            out = StepOut(logits=out.logits, feats=out.feats, offsets=out.offsets, logit_offsets=lo)
        return out

    def _embed_rope(self, ids: torch.Tensor, pos: torch.Tensor):  # type: ignore[no-untyped-def]
        x = self.inner.embed_tokens(ids)
        cos, sin = self.inner.rotary_emb(x, pos)
        return x, cos.unsqueeze(-2), sin.unsqueeze(-2)  # cos/sin broadcast over heads

    def _qkv(self, layer: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):  # type: ignore[no-untyped-def]
        attn = layer.self_attn
        lead = h.shape[:-1]
        q = attn.q_proj(h).view(*lead, self.n_heads, self.hd)
        k = attn.k_proj(h).view(*lead, self.n_kv, self.hd)
        v = attn.v_proj(h).view(*lead, self.n_kv, self.hd)
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def _finish(
        self,
        x: torch.Tensor,
        feats: list[torch.Tensor],
        offsets: np.ndarray,
        rows: np.ndarray | None = None,
    ) -> StepOut:
        if rows is not None:  # the LM head only where logits are wanted
            x = x[torch.from_numpy(rows).to(x.device)]
        x = self.inner.norm(x)
        logits = self.model.lm_head(x).float()
        f = torch.cat(feats, -1) if feats else None
        return StepOut(logits=logits, feats=f, offsets=offsets)

    def _feature(self, i: int, x: torch.Tensor, feats: list[torch.Tensor]) -> None:
        # hidden_states[i + 1] in Hugging Face terms; the last one is after the final norm
        if i in self.feature_layers:
            feats.append(self.inner.norm(x) if i == self.n_layers - 1 else x)

    def _flat(self, slots, tokens, lens, past, rows=None) -> StepOut:  # type: ignore[no-untyped-def]
        dev = self.device
        r = len(slots)
        offsets = np.zeros(r + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        owner = np.repeat(np.arange(r), lens)
        qpos_np = np.concatenate([np.arange(p, p + n) for p, n in zip(past, lens, strict=True)])
        slot_np = np.asarray(slots, dtype=np.int64)
        write = torch.from_numpy(slot_np[owner] * self.cap + qpos_np).to(dev)
        base = (slot_np * self.cap).tolist()
        tot = (past + lens).tolist()
        # per request: its rows of the batch, its cached keys, and a causal mask for new tokens
        groups = []
        for j in range(r):
            lo, hi = int(offsets[j]), int(offsets[j + 1])
            mask = None
            if hi - lo > 1:
                kpos = torch.arange(tot[j], device=dev)
                mask = kpos[None, :] <= torch.from_numpy(qpos_np[lo:hi]).to(dev)[:, None]
            groups.append((lo, hi, base[j], base[j] + tot[j], mask))
        ids = torch.as_tensor(np.concatenate(tokens), dtype=torch.long, device=dev)
        x, cos, sin = self._embed_rope(ids[None], torch.from_numpy(qpos_np)[None].to(dev))
        x, cos, sin = x[0], cos[0], sin[0]
        feats: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(x), cos, sin)  # [B, heads, hd]
            self.k[i][write] = k
            self.v[i][write] = v
            q = q.transpose(0, 1)  # [heads, B, hd]
            kc, vc = self.k[i], self.v[i]
            # attention per request over its own keys only: no work on other requests' keys
            o = torch.cat(
                [
                    F.scaled_dot_product_attention(
                        q[None, :, lo:hi],
                        kc[k0:k1].transpose(0, 1)[None],
                        vc[k0:k1].transpose(0, 1)[None],
                        attn_mask=mask,
                        enable_gqa=True,
                    )[0]
                    for lo, hi, k0, k1, mask in groups
                ],
                dim=1,
            )  # [heads, B, hd]
            x = x + layer.self_attn.o_proj(o.transpose(0, 1).reshape(x.shape[0], -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            self._feature(i, x, feats)
        return self._finish(x, feats, offsets, rows)

    def _padded(self, slots, tokens, lens, past, rows=None) -> StepOut:  # type: ignore[no-untyped-def]
        dev = self.device
        r = len(slots)
        lq = int(lens.max())
        tot = past + lens
        lk = int(tot.max())
        offsets = np.zeros(r + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        ids = np.zeros((r, lq), dtype=np.int64)
        valid = np.arange(lq)[None, :] < lens[:, None]  # [R, Lq]
        for j, t in enumerate(tokens):
            ids[j, : len(t)] = t
        qpos = past[:, None] + np.arange(lq)[None, :]  # padding rows get harmless positions
        slot_np = np.asarray(slots, dtype=np.int64)
        write = torch.from_numpy((slot_np[:, None] * self.cap + qpos)[valid]).to(dev)
        kpos = np.arange(lk)[None, :]
        read = torch.from_numpy(slot_np[:, None] * self.cap + np.minimum(kpos, tot[:, None] - 1))
        read = read.reshape(-1).to(dev)
        mask = torch.from_numpy(
            (kpos[:, None, :] <= qpos[:, :, None]) & (kpos[:, None, :] < tot[:, None, None])
        )[:, None].to(dev)  # [R, 1, Lq, Lk]
        x, cos, sin = self._embed_rope(
            torch.from_numpy(ids).to(dev), torch.from_numpy(qpos).to(dev)
        )  # [R, Lq, H], [R, Lq, 1, hd]
        vmask = torch.from_numpy(valid).to(dev)
        feats: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(x), cos, sin)  # [R, Lq, heads, hd]
            self.k[i][write] = k[vmask]
            self.v[i][write] = v[vmask]
            kk = self.k[i][read].view(r, lk, self.n_kv, self.hd).transpose(1, 2)
            vv = self.v[i][read].view(r, lk, self.n_kv, self.hd).transpose(1, 2)
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), kk, vv, attn_mask=mask, enable_gqa=True
            )  # [R, heads, Lq, hd]
            x = x + layer.self_attn.o_proj(o.transpose(1, 2).reshape(r, lq, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            self._feature(i, x, feats)
        out = self._finish(x, feats, offsets)
        logits = out.logits[vmask]
        return StepOut(
            logits=logits if rows is None else logits[torch.from_numpy(rows).to(dev)],
            feats=None if out.feats is None else out.feats[vmask],
            offsets=offsets,
        )

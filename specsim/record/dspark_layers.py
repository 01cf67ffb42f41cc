"""The DSpark drafter's layers: a Qwen3-style decoder layer (RMSNorm, rotary attention that
also attends to the projected target features, a gated MLP), the Markov head and the confidence
head. :mod:`specsim.record.dspark` assembles them into the drafter (its docstring has the
architecture and the checkpoint layout these names follow).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from specsim.record.dspark_config import DSparkConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (half-split, as Llama/Qwen3). x: [N, heads, hd]; pos: [N]."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]  # [N, hd/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :].to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :].to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        h, nh, nkv, hd = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.nh, self.nkv, self.hd, self.theta = nh, nkv, hd, cfg.rope_theta
        self.q_proj = nn.Linear(h, nh * hd, bias=False)
        self.k_proj = nn.Linear(h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,  # [Q, H] block tokens (normed)
        ctx: torch.Tensor,  # [C, H] projected target features
        qpos: torch.Tensor,  # [Q]
        cpos: torch.Tensor,  # [C]
        mask: torch.Tensor,  # [Q, C + Q] bool, True = may attend
    ) -> torch.Tensor:
        q = self.q_proj(x).view(-1, self.nh, self.hd)
        k = torch.cat([self.k_proj(ctx), self.k_proj(x)]).view(-1, self.nkv, self.hd)
        v = torch.cat([self.v_proj(ctx), self.v_proj(x)]).view(-1, self.nkv, self.hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        kpos = torch.cat([cpos, qpos])
        q, k = rope(q, qpos, self.theta), rope(k, kpos, self.theta)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        # [heads, Q, hd] attention over [heads, C+Q, hd]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
        )
        return self.o_proj(out.transpose(0, 1).reshape(-1, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, ctx, qpos, cpos, mask):  # type: ignore[no-untyped-def]
        x = x + self.self_attn(self.input_layernorm(x), ctx, qpos, cpos, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(cfg.vocab_size, cfg.markov_rank)
        self.markov_w2 = nn.Linear(cfg.markov_rank, cfg.n_draft_vocab, bias=False)
        nn.init.normal_(self.markov_w1.weight, std=0.02)
        nn.init.zeros_(self.markov_w2.weight)  # starts as the plain parallel drafter


class ConfidenceHead(nn.Module):
    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(cfg.hidden_size + cfg.markov_rank, 1)

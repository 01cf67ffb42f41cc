"""Train a DSpark drafter for a target by self-distillation, on a CPU, in minutes.

Data: the target's own greedy continuations of prompts (``generate.py``), one teacher-forced pass
each (``features.py``). Loss per block position k (the DSpark paper), weighted exp(-(k-1)/d)
(``loss_decay`` d: the block size by default; DeepSpec's configs use 4):

    0.1 * CE(draft, target token) + 0.9 * ||p_draft - p_target||_1 + 1.0 * BCE(c_k, c*_k)

- CE and L1 use the Markov step logits with the TRUE previous token (teacher forcing: position k
  only matters when x_{<k} was accepted, and then x_{k-1} is the target's token).
- ``||p_d - p_t||_1`` is computed over the target's top-k tokens plus one cell for the rest of
  the mass (a lower bound of the exact L1, exact when the target's tail is negligible).
- ``c*_k`` is the exact acceptance probability of the verification the drafter is trained for:
  at temperature 0 (greedy drafts, exact-match verification) it is 1 when the draft's argmax is
  the target's token, else 0; at temperature 1 it is ``1 - 0.5 * L1``.

Why a reduced draft vocabulary: the frozen 576 x 49,152 LM head was 40% of a training step on
this CPU; the most frequent ``draft_vocab`` tokens of the training outputs cover nearly all of
them (the coverage is reported) and make steps 2-3x faster.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812

from specsim.record.dspark import DSparkDrafter, position_weights
from specsim.record.features import Sequence


@dataclass(frozen=True)
class TrainConfig:
    """Training knobs (saved in the drafter's config under ``extra.training``)."""

    steps: int = 3000
    max_minutes: float = 30.0
    seqs_per_step: int = 8
    anchors_per_seq: int = 12
    lr: float = 6e-4
    warmup: int = 50
    weight_decay: float = 0.0
    verify_temperature: float = 0.0  # 0: greedy exact-match acceptance; 1: rejection sampling
    seed: int = 0
    # per-position loss weight exp(-(k-1)/decay); None: the block size (drafters v1, v2).
    # DeepSpec's configs and NeMo AutoModel use 4.0 (``loss_decay_gamma``)
    loss_decay: float | None = None
    log_every: int = 50
    checkpoint_minutes: float = 5.0  # save the resumable training state this often
    eval_minutes: float = 5.0  # held-out tau for the learning curve this often (0: never)


def choose_vocab(seqs: list[Sequence], size: int, vocab_size: int) -> torch.Tensor:
    """The ``size`` most frequent target tokens of the outputs (ties by id): sorted draft ids."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(s.seq[s.prompt_len :], minlength=vocab_size)
    order = torch.argsort(-counts * vocab_size + torch.arange(vocab_size))  # stable by id
    return torch.sort(order[:size]).values


def vocab_coverage(seqs: list[Sequence], d2t: torch.Tensor) -> float:
    """Share of output tokens the draft vocabulary can produce."""
    tot = sum(s.output_len for s in seqs)
    hit = sum(int(torch.isin(s.seq[s.prompt_len :], d2t).sum()) for s in seqs)
    return hit / max(tot, 1)


def block_loss(
    drafter: DSparkDrafter,
    s: Sequence,
    anchors: torch.Tensor,
    t2d: torch.Tensor,
    vt: float,
    decay: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The three-term DSpark loss for blocks at ``anchors`` of one sequence."""
    g = drafter.cfg.block_size
    n = s.seq.numel()
    h = drafter.backbone(s.feats, s.seq, anchors, s.start)  # [A, g, H]
    pos = anchors[:, None] + torch.arange(g)[None, :]  # position whose next token x_k predicts
    valid = pos < n - 1
    posc = pos.clamp(max=n - 2)
    prev = s.seq[posc]  # x_{k-1}: the anchor, then the target's tokens
    logits, conf_logit = drafter.heads(h, prev)
    logp = torch.log_softmax(logits.float(), -1)  # [A, g, Vd]
    y = t2d[s.greedy[posc]]  # target's greedy token in draft ids (-1: not drafted)
    in_vocab = y >= 0
    ce = -logp.gather(-1, y.clamp(min=0)[..., None]).squeeze(-1)
    # L1 over the target's top-k (temperature 1) plus one cell for the remaining mass
    tk = t2d[s.topk_ids[posc]]  # [A, g, K]
    pt = s.topk_p[posc].float()
    pd = logp.exp().gather(-1, tk.clamp(min=0)) * (tk >= 0)
    pt_in = pt * (tk >= 0)
    l1 = (pd - pt_in).abs().sum(-1) + ((1 - pd.sum(-1)) - (1 - pt_in.sum(-1))).abs()
    if vt > 0:
        c_star = (1 - 0.5 * l1).clamp(0, 1).detach()
    else:
        c_star = (logits.argmax(-1) == y).float()
    bce = F.binary_cross_entropy_with_logits(conf_logit.float(), c_star, reduction="none")
    w = position_weights(g, decay)[None, :] * valid
    wsum = w.sum().clamp(min=1e-9)
    ce_w = w * in_vocab
    loss = (
        0.1 * (ce * ce_w).sum() / ce_w.sum().clamp(min=1e-9)
        + 0.9 * (l1 * w).sum() / wsum
        + 1.0 * (bce * w).sum() / wsum
    )
    acc = ((logits.argmax(-1) == y) & valid).float().sum() / valid.sum().clamp(min=1)
    with torch.no_grad():
        parts = {
            "ce": float((ce * ce_w).sum() / ce_w.sum().clamp(min=1e-9)),
            "l1": float((l1 * w).sum() / wsum),
            "bce": float((bce * w).sum() / wsum),
            "acc": float(acc),
        }
    return loss, parts


def _save_state(path: Path, state: dict) -> None:
    """Write the resumable training state atomically (a killed run keeps the previous one)."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, tmp)
    tmp.replace(path)


def train(
    drafter: DSparkDrafter,
    seqs: list[Sequence],
    cfg: TrainConfig,
    log: Callable[[str], None] = print,
    state_file: Path | None = None,
    evaluate: Callable[[], dict[str, float]] | None = None,
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Train in place; returns (logged history, held-out learning curve).

    Seeded; capped by ``max_minutes`` of training time (evaluation excluded). With
    ``state_file`` the run saves its whole state (weights, optimiser, both RNGs, step, minutes,
    history) every ``checkpoint_minutes`` and resumes from it when it exists, so a stopped run
    continues where it stopped; resuming with a larger ``max_minutes`` stretches the remaining
    cosine schedule. ``evaluate`` is called every ``eval_minutes`` (and at the end) for the
    curve of held-out tau against training minutes, wall and CPU.
    """
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    t2d = drafter.t2d()
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    hist: list[dict[str, float]] = []
    curve: list[dict[str, float]] = []
    first, prior_min, prior_cpu = 0, 0.0, 0.0
    if state_file is not None and state_file.exists():
        st = torch.load(state_file, weights_only=False)
        drafter.load_state_dict(st["drafter"])
        opt.load_state_dict(st["opt"])
        rng.bit_generator.state = st["np_rng"]
        torch.set_rng_state(st["torch_rng"])
        first, prior_min, prior_cpu = st["step"], st["minutes"], st["cpu_minutes"]
        hist, curve = st["hist"], st["curve"]
        log(f"resumed from {state_file} at step {first} ({prior_min:.1f} min)")
        if first >= cfg.steps or prior_min >= cfg.max_minutes:
            log(
                f"warning: {state_file} has already trained {first} steps in {prior_min:.1f} min, "
                f"at or past this run's cap ({cfg.steps} steps, {cfg.max_minutes:g} min): no "
                "step will run and the drafter is that earlier run's; delete the state file to "
                "train a new one"
            )
    drafter.train()
    t0, c0, paused, paused_cpu = time.perf_counter(), time.process_time(), 0.0, 0.0
    minutes = lambda: prior_min + (time.perf_counter() - t0 - paused) / 60  # noqa: E731
    cpu_minutes = lambda: prior_cpu + (time.process_time() - c0 - paused_cpu) / 60  # noqa: E731
    next_eval = (
        (math.floor(prior_min / cfg.eval_minutes) + 1) * cfg.eval_minutes
        if cfg.eval_minutes > 0
        else math.inf
    )
    if evaluate is not None and not curve:
        curve.append({"step": 0, "minutes": 0.0, "cpu_minutes": 0.0, **evaluate()})
        drafter.train()
    next_ckpt = prior_min + cfg.checkpoint_minutes

    def snapshot(step: int) -> dict:
        return {
            "drafter": drafter.state_dict(),
            "opt": opt.state_dict(),
            "np_rng": rng.bit_generator.state,
            "torch_rng": torch.get_rng_state(),
            "step": step,
            "minutes": minutes(),
            "cpu_minutes": cpu_minutes(),
            "hist": hist,
            "curve": curve,
        }

    acc: dict[str, float] = {}
    usable = [s for s in seqs if s.output_len >= 2]
    step = first
    for step in range(first, cfg.steps):
        frac = max(step / cfg.steps, minutes() / cfg.max_minutes)
        if frac >= 1:
            log(f"time cap reached at step {step}")
            break
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * frac))
        for gparam in opt.param_groups:
            gparam["lr"] = lr
        opt.zero_grad(set_to_none=True)
        picks = rng.choice(len(usable), size=min(cfg.seqs_per_step, len(usable)), replace=False)
        total = 0.0
        for i in picks:
            s = usable[int(i)]
            lo, hi = s.prompt_len - 1, s.seq.numel() - 2  # anchors inside the output region
            a = np.sort(
                rng.choice(
                    np.arange(lo, hi + 1), size=min(cfg.anchors_per_seq, hi - lo + 1), replace=False
                )
            )
            loss, parts = block_loss(
                drafter, s, torch.from_numpy(a), t2d, cfg.verify_temperature, cfg.loss_decay
            )
            (loss / len(picks)).backward()
            total += loss.item() / len(picks)
            for k, v in parts.items():
                acc[k] = acc.get(k, 0.0) + v / len(picks)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if (step + 1) % cfg.log_every == 0:
            row = {"step": step + 1, "loss": total, "lr": lr, "minutes": minutes()}
            row.update({k: v / cfg.log_every for k, v in acc.items()})
            acc = {}
            hist.append(row)
            log(" ".join(f"{k}={v:.4g}" for k, v in row.items()))
        if evaluate is not None and minutes() >= next_eval:
            w, c = time.perf_counter(), time.process_time()
            point = {"step": step + 1, "minutes": minutes(), "cpu_minutes": cpu_minutes()}
            curve.append({**point, **evaluate()})
            log("held-out " + " ".join(f"{k}={v:.4g}" for k, v in curve[-1].items()))
            drafter.train()
            paused += time.perf_counter() - w
            paused_cpu += time.process_time() - c
            next_eval += cfg.eval_minutes
        if state_file is not None and minutes() >= next_ckpt:
            _save_state(state_file, snapshot(step + 1))
            next_ckpt += cfg.checkpoint_minutes
    else:
        step = cfg.steps
    if evaluate is not None and (not curve or curve[-1]["step"] != step):
        point = {"step": step, "minutes": minutes(), "cpu_minutes": cpu_minutes()}
        curve.append({**point, **evaluate()})
    if state_file is not None:
        _save_state(state_file, snapshot(step))
    drafter.eval()
    return hist, curve

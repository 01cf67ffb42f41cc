"""``specsim train-drafter`` end to end: data, training, STS, evaluation, checkpoint.

1. Greedy continuations of the training prompts by the target (cached, resumable).
2. One teacher-forced target pass per sequence: features, greedy next tokens, top-k.
   Every 10th prompt is held out (never trained on): half fits STS, half reports.
3. Reduced draft vocabulary from the training outputs; drafter layers initialised from the
   target's last layers; training (``train.py``).
4. STS temperatures fitted on the held-out fit half (``specsim.policies.calibrate.fit_sts``) and
   stored in the checkpoint's config; tau, per-position acceptance and AUROC/ECE before and after
   STS reported on the held-out report half, per category.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from specsim.progress import Progress
from specsim.prompts import Prompt

DRAFTER_DIRS = {"dspark": "dspark-v3", "dspark-v3": "dspark-v3", "dspark-v2": "dspark"}
"""The drafters ``--drafter`` knows by name, and the folder stem each is shipped (and cached)
under. ``dspark`` is the current drafter, v3: llama.cpp's ``draft-dspark`` architecture (q/k
norms, the whole context, offset d2t on export), trained only on sources no shipped benchmark
records from; ``dspark-v3`` names it explicitly. ``dspark-v2`` (Llama-style layers, a
192-position window; folder ``dspark-<sha>``) is the drafter the traces without a ``-v3`` in
their name were recorded with, and what ``dspark`` meant before 4 Dec 2026: kept so those traces
and the reports made from them stay reproducible."""
DRAFTER_NAMES = tuple(DRAFTER_DIRS)


def _dir_name(target: Any, name: str) -> str:
    if name not in DRAFTER_DIRS:
        from specsim.errors import SpecsimError

        raise SpecsimError(f"unknown drafter name {name!r}; use one of {', '.join(DRAFTER_NAMES)}")
    return f"{DRAFTER_DIRS[name]}-{target.sha256[:12]}"


def default_drafter_dir(target: Any, name: str = "dspark") -> Path:
    """Where ``train-drafter`` writes a drafter for ``target`` (the user's cache)."""
    from specsim.record.models import cache_dir

    return cache_dir() / "drafters" / _dir_name(target, name)


def shipped_drafter_dir(target: Any, name: str = "dspark") -> Path:
    """Where the drafter ``name`` shipped inside the package for ``target`` would be."""
    from importlib import resources

    root = Path(str(resources.files("specsim") / "data" / "drafters"))
    return root / _dir_name(target, name)


def find_drafter_dir(target: Any, name: str = "dspark") -> Path:
    """``--drafter NAME``: the shipped drafter of that name for this target, else the cache's."""
    shipped = shipped_drafter_dir(target, name)
    return shipped if (shipped / "config.json").exists() else default_drafter_dir(target, name)


def train_state_file(target: Any, key: dict[str, Any]) -> Path:
    """The resumable training state of one run, keyed by everything that shapes it."""
    import hashlib

    from specsim.record.models import cache_dir

    h = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_dir() / "train-state" / f"dspark-{target.sha256[:12]}-{h}.pt"


def build_drafter(
    target: Any,
    prompts: list[Prompt],
    out: Path,
    *,
    max_new_tokens: int = 160,
    block_size: int = 7,
    layers: int = 2,
    draft_vocab: int = 8192,
    markov_rank: int = 64,
    context_window: int | None = None,
    train_cfg: Any = None,
    force: bool = False,
    cached_only: bool = False,
    gen_batch_size: int = 16,
    curve_sequences: int = 48,
    resume: bool = True,
    prepare_only: bool = False,
    log: Any = print,
) -> dict[str, Any]:
    """Build a drafter for ``target`` into ``out``; returns the training report.

    ``prepare_only`` stops after steps 1-2 (generation and teacher-forced passes, both cached):
    the expensive, recipe-independent half, so it can run on a bigger machine or while the
    training recipe is still being chosen, and a later run trains from the cache.
    """
    import torch

    from specsim.errors import SpecsimError
    from specsim.policies.calibrate import apply_sts, fit_sts
    from specsim.record.dspark import (
        DSparkDrafter,
        config_for_target,
        init_from_target,
        save_drafter,
    )
    from specsim.record.evaluate import rows_trace, summary
    from specsim.record.features import cached_target_pass as target_pass
    from specsim.record.generate import cached_mask, greedy_outputs
    from specsim.record.models import prompt_ids
    from specsim.record.train import TrainConfig, choose_vocab, train, vocab_coverage

    if out.exists() and not force and not prepare_only:
        raise SpecsimError(f"{out} exists; pass --force to overwrite it")
    train_cfg = train_cfg or TrainConfig()
    timings: dict[str, float] = {}
    cfg = config_for_target(
        target.model.config,
        num_hidden_layers=layers,
        block_size=block_size,
        markov_rank=markov_rank,
        draft_vocab_size=draft_vocab if draft_vocab else None,
        # None: the whole context before the anchor, as llama.cpp's draft-dspark attends
        **({} if context_window is None else {"context_window": context_window}),
    )
    t = time.perf_counter()
    ids = [prompt_ids(target.tokenizer, p.text) for p in prompts]
    if cached_only:
        keep = cached_mask(target, ids, max_new_tokens)
        prompts = [p for p, k in zip(prompts, keep, strict=True) if k]
        ids = [i for i, k in zip(ids, keep, strict=True) if k]
        if not prompts:
            raise SpecsimError("--cached-only: no cached generations for these prompts yet")
    outs = greedy_outputs(target, ids, max_new_tokens, gen_batch_size, desc="generate")
    timings["generate_s"] = time.perf_counter() - t
    t = time.perf_counter()
    seqs = []
    with Progress(len(prompts), "target features", " seqs") as bar:
        for p, i, o in zip(prompts, ids, outs, strict=True):
            s = target_pass(
                target, i, o, cfg.target_layer_ids, cfg.context_window, topk=8, category=p.category
            )
            cut = s.first_mismatch()
            if cut >= 2:
                if cut < s.output_len:
                    s = target_pass(
                        target,
                        i,
                        o[:cut],
                        cfg.target_layer_ids,
                        cfg.context_window,
                        topk=8,
                        category=p.category,
                    )
                seqs.append(s)
            bar.update()
    timings["features_s"] = time.perf_counter() - t
    if prepare_only:
        return {
            "prepared_sequences": len(seqs),
            "prepared_tokens": int(sum(s.output_len for s in seqs)),
            "timings_s": {k: round(v, 1) for k, v in timings.items()},
        }
    held = [s for j, s in enumerate(seqs) if j % 10 == 9]
    trn = [s for j, s in enumerate(seqs) if j % 10 != 9]
    fit_half, report_half = held[0::2], held[1::2]
    vocab = choose_vocab(trn, cfg.n_draft_vocab, cfg.vocab_size) if draft_vocab else None
    drafter = DSparkDrafter(cfg)
    init_from_target(drafter, target.model, vocab)
    n_trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    log(
        f"train seqs {len(trn)} ({sum(s.output_len for s in trn)} tokens), held-out "
        f"{len(held)}; trainable params {n_trainable / 1e6:.2f}M"
    )
    coverage = vocab_coverage(held, drafter.d2t) if vocab is not None else 1.0
    curve_seqs = report_half[:curve_sequences]

    def heldout() -> dict[str, float]:
        """tau (full verification, raw confidences) on a fixed held-out subset, per category."""
        drafter.eval()
        tr = rows_trace(drafter, curve_seqs, raw=True)
        return {
            ("tau" if cat == "all" else f"tau_{cat}"): float(d["tau_replay"])
            for cat, d in summary(tr).items()
        }

    key = {
        "prompts": [p.source for p in prompts],
        "max_new_tokens": max_new_tokens,
        "drafter": cfg.to_json(),
        "train": {k: v for k, v in train_cfg.__dict__.items() if k != "max_minutes"},
    }
    state = train_state_file(target, key) if resume else None
    t = time.perf_counter()
    hist, curve = train(drafter, trn, train_cfg, log=log, state_file=state, evaluate=heldout)
    timings["train_s"] = time.perf_counter() - t
    # the checkpoint is stored in fp16 (DeepSpec layout, half the size): round the weights now,
    # so that STS, the report and every later recording use exactly what is shipped
    with torch.no_grad():
        for prm in drafter.parameters():
            prm.copy_(prm.to(torch.float16).to(prm.dtype))
    t = time.perf_counter()
    fit_tr = rows_trace(drafter, fit_half, raw=True)
    temps = fit_sts(fit_tr.conf, fit_tr.accept_len)
    rep_tr = rows_trace(drafter, report_half, raw=True)
    before = summary(rep_tr)
    after = summary(rep_tr.with_conf(apply_sts(rep_tr.conf, temps)))
    timings["evaluate_s"] = time.perf_counter() - t
    report = {
        "prompts_used": len(prompts),
        "train_sequences": len(trn),
        "train_tokens": int(sum(s.output_len for s in trn)),
        "heldout_fit_sequences": len(fit_half),
        "heldout_report_sequences": len(report_half),
        "draft_vocab_coverage": round(coverage, 4),
        "trainable_params": int(n_trainable),
        "steps": int(curve[-1]["step"]),  # the final held-out point is taken after the last step
        "sts_temperatures": [round(float(x), 4) for x in temps],
        "before_sts": before,
        "after_sts": after,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "train_config": train_cfg.__dict__,
        "learning_curve": curve,
        "history": hist,
    }
    from dataclasses import replace

    drafter.cfg = replace(
        cfg,
        sts_temperatures=tuple(float(x) for x in temps),
        extra={
            "target": target.name,
            "target_sha256": target.sha256,
            "prompts": sorted({p.source.split("#")[0] for p in prompts}),
            "max_new_tokens": max_new_tokens,
            "train_config": train_cfg.__dict__,
        },
    )
    save_drafter(drafter, out, force=force, dtype=torch.float16)
    (out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report

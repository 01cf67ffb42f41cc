"""Record a trace: per decoding position, the drafter's block, its confidences and acceptance.

Greedy (temperature 0): one greedy generation plus one teacher-forced target pass give every
position's draft, confidences and accept_len EXACTLY: greedy verification accepts draft k iff it
equals the target's argmax given the prefix, and with the drafts' prefix accepted that prefix is
the generated text itself. Position n (n output tokens committed) drafts from the anchor, the
last committed token, with target features strictly before it; accept_len is the number of
leading drafts equal to the output's next tokens, capped at ``output_len - 1 - n`` so that a step
never emits more than the output holds (accept_len + 1 tokens per step).

Sampling (temperature T > 0): the output is sampled from the target at T; at every position the
drafter samples a block from q, the target scores prefix + block in one batched pass (a 4-D mask,
each block seeing only its own prefix), and the block is verified by rejection sampling
(``verify.py``); ``accept_prob`` = min(1, p/q) is recorded.

Resumable: finished requests are appended to ``OUT.partial.parquet`` side files (one per chunk);
a restarted run skips them, and the final trace is written atomically.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specsim.errors import SpecsimError
from specsim.outputs import atomic
from specsim.progress import Progress
from specsim.prompts import Prompt
from specsim.record.rows import RecordConfig, RequestRows


def greedy_rows(drafter: Any, s: Any, raw: bool = False) -> RequestRows:
    """Rows of one greedy request from its teacher-forced ``Sequence`` (features.py)."""
    import torch

    p, n_out = s.prompt_len, s.output_len
    g = drafter.cfg.block_size
    anchors = torch.arange(p - 1, p - 1 + n_out)
    d = drafter.draft(s.feats, s.seq, anchors, start=s.start)
    out = s.seq[p:]
    pad = torch.cat([out, torch.full((g,), -1, dtype=out.dtype)])
    nxt = torch.stack([pad[torch.arange(n_out) + k] for k in range(g)], 1)  # [L, g]
    match = (d.tokens == nxt).to(torch.int64)
    acc = match.cumprod(1).sum(1)
    cap = n_out - 1 - torch.arange(n_out)
    acc = torch.minimum(acc, cap)
    conf = d.raw_conf if raw else d.conf
    return RequestRows(
        draft_tokens=d.tokens.numpy().astype(np.int32),
        confidence=conf.numpy().astype(np.float32),
        accept_len=acc.numpy().astype(np.int16),
    )


def rows_frame(rows: RequestRows, request_id: int, prompt_len: int, category: str) -> pd.DataFrame:
    n = rows.accept_len.shape[0]
    frame = pd.DataFrame(
        {
            "request_id": np.full(n, request_id, dtype=np.int64),
            "position": np.arange(n, dtype=np.int32),
            "prompt_len": np.full(n, prompt_len, dtype=np.int32),
            "output_len": np.full(n, n, dtype=np.int32),
            "draft_tokens": list(rows.draft_tokens),
            "confidence": list(rows.confidence),
            "accept_len": rows.accept_len,
            "category": category,
        }
    )
    if rows.accept_prob is not None:
        frame["accept_prob"] = list(rows.accept_prob)
    return frame


def early_key(prompts: list[Prompt], cfg: RecordConfig) -> dict[str, Any]:
    """What changes a recording's output and is known before any model loads: the prompts'
    text (hashed) and categories, and the settings. A resumed run must match it."""
    import hashlib

    text = hashlib.sha256("\x00".join(p.text for p in prompts).encode("utf-8")).hexdigest()
    return {
        "prompts": [p.source for p in prompts],
        "prompt_text_sha256": text,
        "categories": sorted({p.category for p in prompts}),
        "temperature": cfg.temperature,
        "max_new_tokens": cfg.max_new_tokens,
        "seed": cfg.seed,
    }


def check_partial(out: Path, key: dict[str, Any]) -> None:
    """Refuse to resume a partial recording made with other settings (only the fields both
    keys have are compared, so this runs before the model loads and again after)."""
    key_file = out.with_name(out.name + ".partial") / "key.json"
    if not key_file.exists():
        return
    try:
        old = json.loads(key_file.read_text())
    except (OSError, ValueError):
        return  # a torn key: the chunks it guarded are re-checked after the load
    diff = sorted(k for k in key if k in old and old[k] != key[k])
    missing = sorted(k for k in key if k not in old)
    if diff or missing:
        raise SpecsimError(
            f"{key_file.parent} holds a partial recording made with other "
            f"{', '.join(diff or missing)}; delete it to start over, or rerun with its settings"
        )


def record(
    target: Any,
    drafter: Any,
    drafter_name: str,
    prompts: list[Prompt],
    out: Path,
    cfg: RecordConfig,
    force: bool = False,
    extra_meta: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Record ``prompts`` into the trace ``out``; returns a summary (timings, counts)."""
    import torch

    from specsim.record.features import cached_target_pass as target_pass
    from specsim.record.generate import greedy_outputs
    from specsim.record.models import prompt_ids
    from specsim.trace.io import write_trace

    if out.exists() and not force:
        raise SpecsimError(f"{out} exists; pass --force to overwrite it")
    part_dir = out.with_name(out.name + ".partial")
    part_dir.mkdir(parents=True, exist_ok=True)
    key = {
        **early_key(prompts, cfg),
        "target": target.sha256,
        "drafter": drafter_name,
        "block_size": int(drafter.cfg.block_size),
    }
    check_partial(out, key)
    key_file = part_dir / "key.json"
    key_file.write_text(json.dumps(key))
    done = {int(f.stem.split("-")[1]) for f in part_dir.glob("chunk-*.parquet")}
    ids = [prompt_ids(target.tokenizer, p.text) for p in prompts]
    t0 = time.perf_counter()
    timings = {"generate_s": 0.0, "target_pass_s": 0.0, "draft_s": 0.0}
    mismatches = 0
    all_outs: list[list[int]] = []
    if cfg.temperature == 0:  # stage 1: every greedy output (batched, cached, resumable)
        t = time.perf_counter()
        all_outs = greedy_outputs(target, ids, cfg.max_new_tokens, cfg.batch_size)
        timings["generate_s"] += time.perf_counter() - t
    with Progress(len(prompts), f"record {out.name}", " requests") as bar:
        for c0 in range(0, len(prompts), cfg.chunk):
            if c0 in done:
                bar.update(min(cfg.chunk, len(prompts) - c0))
                continue
            idx = list(range(c0, min(c0 + cfg.chunk, len(prompts))))
            t = time.perf_counter()
            if cfg.temperature == 0:
                outs = [all_outs[i] for i in idx]
            else:
                from specsim.record.sampled import sample_outputs

                outs = sample_outputs(target, [ids[i] for i in idx], cfg, c0)
            timings["generate_s"] += time.perf_counter() - t
            frames = []
            for i, o in zip(idx, outs, strict=True):
                if len(o) == 0:
                    continue
                t = time.perf_counter()
                s = target_pass(
                    target, ids[i], o, drafter.cfg.target_layer_ids, drafter.cfg.context_window
                )
                timings["target_pass_s"] += time.perf_counter() - t
                t = time.perf_counter()
                if cfg.temperature == 0:
                    cut = s.first_mismatch()
                    if cut < s.output_len:  # batched generation and the full pass disagree
                        mismatches += 1
                        if cut == 0:
                            continue
                        s = target_pass(
                            target,
                            ids[i],
                            o[:cut],
                            drafter.cfg.target_layer_ids,
                            drafter.cfg.context_window,
                        )
                    rows = greedy_rows(drafter, s)
                else:
                    from specsim.record.sampled import sampled_rows

                    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + i)
                    rows = sampled_rows(target, drafter, s, cfg.temperature, gen)
                timings["draft_s"] += time.perf_counter() - t
                frames.append(rows_frame(rows, i, len(ids[i]), prompts[i].category))
            chunk_file = part_dir / f"chunk-{c0:06d}.parquet"
            with atomic(chunk_file) as tmp:
                frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
                frame.to_parquet(tmp)
            bar.update(len(idx))
    parts = [pd.read_parquet(f) for f in sorted(part_dir.glob("chunk-*.parquet"))]
    frame = pd.concat([p for p in parts if len(p)], ignore_index=True)
    meta = {
        "temperature": f"{cfg.temperature:g}",
        "target": target.name,
        "drafter": drafter_name,
        "source": "recorded",
        "max_new_tokens": str(cfg.max_new_tokens),
        "seed": str(cfg.seed),
        "prompts": json.dumps(sorted({p.source.split("#")[0] for p in prompts})),
        "recorded_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "greedy_mismatch_requests": str(mismatches),
    }
    meta.update(target.provenance())
    meta.update(extra_meta or {})
    write_trace(frame, out, meta, force=force)
    for f in part_dir.iterdir():
        f.unlink()
    part_dir.rmdir()
    timings["total_s"] = time.perf_counter() - t0
    return {
        "requests": int(frame["request_id"].nunique()),
        "rows": len(frame),
        "mismatch_requests": mismatches,
        **timings,
    }

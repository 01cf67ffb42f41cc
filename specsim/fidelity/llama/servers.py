"""The llama-server processes of a grid and the load sent to them.

One server per speculative setting, the same flags for the calibration runs and the grid:
``-np`` slots of ``ctx_per_slot`` tokens each, ``-t`` threads, the default batch
(``-b 2048``, ``-ub 512``), continuous batching on, bound to 127.0.0.1. Every request is sent
by ``specsim bench``'s client (``run_bench``) with token-id prompts, ``ignore_eos`` and the
trace's output length, so both sides generate the same number of tokens. A draft-dspark server
serves its drafter's GGUF (``-md``, made once into the cache: :mod:`specsim.record.draft_gguf`)
with ``--spec-draft-n-max N --spec-draft-p-min P``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specsim.fidelity.llama.config import LlamaValidationConfig, SpecSetting
from specsim.serve.bench_config import BenchConfig, Job, Result
from specsim.serve.llama_server import LlamaServer, ServerSpec
from specsim.serve.ngram import NgramSimple

N_BATCH = 2048  # llama-server's default -b: the simulator's max_batched_tokens


def drafter_of(cfg: LlamaValidationConfig, s: SpecSetting) -> NgramSimple | None:
    return NgramSimple(cfg.ngram_n, s.n_max) if s.kind == "ngram" else None


def server_args(cfg: LlamaValidationConfig, s: SpecSetting) -> tuple[str, ...]:
    """The server's flags, its pinning explicit (``-np`` slots, ``-t`` decode threads,
    ``--threads-batch`` prompt threads: llama.cpp's own default for the last is ``-t``, written
    out so that a run's recorded flags say what the server ran with)."""
    tb = cfg.threads if cfg.threads_batch is None else cfg.threads_batch
    args = ["-np", str(cfg.parallel), "-c", str(cfg.parallel * cfg.ctx_per_slot)]
    args += ["-t", str(cfg.threads), "--threads-batch", str(tb), "-b", str(N_BATCH)]
    if s.kind == "ngram":
        args += list(NgramSimple(cfg.ngram_n, s.n_max).server_args())
    if s.kind == "dspark":
        from specsim.record.draft_gguf import draft_dspark_args, gguf_path

        args += list(draft_dspark_args(gguf_path(drafter_folder(cfg)), s.n_max, s.p_min))
    return tuple(args)


def drafter_folder(cfg: LlamaValidationConfig) -> Path:
    """The checkpoint of the draft-dspark settings (``--dspark-drafter``; torch-free)."""
    from specsim.record.draft_gguf import drafter_dir

    return drafter_dir(cfg.dspark_drafter)


def draft_gguf(cfg: LlamaValidationConfig, target: Any = None) -> Path:
    """The draft-dspark settings' GGUF, exported and converted now if the cache lacks it (torch
    then, and a minute of the converter; a cached one costs nothing)."""
    from specsim.record.dspark_export import cached_gguf

    return cached_gguf(drafter_folder(cfg), target)


def start_server(  # noqa: ANN201
    cfg: LlamaValidationConfig, s: SpecSetting, log_dir: Path | None = None, steps: bool = False
):
    """A started-on-enter llama-server for setting ``s`` (a context manager: always stopped);
    ``steps``: it logs every step it takes (:mod:`specsim.serve.spec_log`; for recording, not
    for timed runs: the debug log costs time)."""
    from specsim.serve import spec_log

    if s.kind == "dspark":
        draft_gguf(cfg)  # its -md file: made once, before the server needs it
    log = None if log_dir is None else log_dir / f"server-{s.slug}.log"
    args = server_args(cfg, s) + (spec_log.ARGS if steps else ())
    spec = ServerSpec(model=target_gguf(cfg), args=args, log_path=log,
                      startup_timeout_s=STARTUP_TIMEOUT_S,
                      env=dict(spec_log.ENV) if steps else {})  # fmt: skip
    return LlamaServer(spec)


def target_gguf(cfg: LlamaValidationConfig) -> Path:
    """The target's GGUF in ``cfg.target_type`` (the shipped file, or re-encoded once)."""
    from specsim.record.models import cache_dir, smollm2_gguf  # torch-free: locates the GGUF
    from specsim.record.requant import requantized

    return requantized(smollm2_gguf(), cfg.target_type, cache_dir() / "targets")


# SmolLM2-135M's GGUF (~100 MB) loads in about a second: a server not healthy after a minute
# is not loading, it is stuck (the generic 300 s is for models a hundred times larger)
STARTUP_TIMEOUT_S = 60.0


def limits(cfg: LlamaValidationConfig) -> dict[str, int]:
    """The simulator's capacity knobs for these servers: slots, fixed per-slot KV (a
    reservation never preempts), the step's token budget."""
    return {
        "max_running": cfg.parallel,
        "kv_tokens": cfg.parallel * cfg.ctx_per_slot,
        "max_batched_tokens": N_BATCH,
    }


def send(
    srv: LlamaServer,
    prompts: Sequence[list[int]],
    lengths: Sequence[int],
    *,
    temperature: float,
    seed: int,
    concurrency: int | None = None,
    rate: float | None = None,
    requests: int | None = None,
) -> tuple[list[Job], list[Result], dict[str, Any]]:
    """One ``specsim bench`` run against ``srv``: its jobs, per-request results and summary."""
    from specsim.serve.bench import make_jobs, run_bench, summarize_bench

    bc = BenchConfig(
        url=srv.url,
        concurrency=concurrency,
        rate=rate,
        requests=requests,
        max_tokens=max(lengths),
        temperature=temperature,
        seed=seed,
    )
    jobs = make_jobs(list(prompts), bc, output_len=list(lengths))
    res = run_bench(bc, jobs)
    return jobs, res, summarize_bench(res, concurrency)

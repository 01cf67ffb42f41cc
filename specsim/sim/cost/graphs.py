"""The engine's CUDA-graph capture limit, as each engine sets it by default and as a user sets it.

Why a module: past the largest captured size a step runs without graphs (eager), which costs far
more than a captured one (vLLM's fig. 2: 20.6 ms at 1,024 captured tokens, 104 ms at 1,536
eager on V4-Flash TP4 B300). So WHERE that edge sits decides which steps pay it, and it moves
with the engine, its version, the GPU, ``max_num_seqs`` and the draft length. One fitted
constant at 512 tokens for every deployment put the edge in the wrong place for speculation
(a verify of 64 requests x 8 tokens is 512 tokens) and for data-center Blackwell.

The rules, with their public sources (the engines' own code and pull requests):

- vLLM v1 (``vllm/config/vllm.py``, ``_set_cudagraph_sizes``): ``max_cudagraph_capture_size``
  defaults to ``min(max_num_seqs x (1 + k) x 2, ceiling)``, ``k`` the speculative tokens
  (0 without speculation), capped at ``max_num_batched_tokens``; sizes count TOKENS. The
  ceiling is 512, and 1,024 on data-center Blackwell (compute capability 10.x: B200, B300,
  GB200, GB300) since vllm PR #49390 (2026-07-22); vllm PR #54418 keeps generated decode sizes
  within it ("512 tokens on H200, 1024 on data-center Blackwell"). ``--capture`` is
  ``max_cudagraph_capture_size`` given explicitly (an older vLLM: give ``--capture 512``).
- SGLang (``cuda_graph_runner.py`` and its speculative runners): ``--cuda-graph-max-bs`` counts
  REQUESTS; a verify graph holds ``bs x speculative_num_draft_tokens`` tokens (k + 1 for a
  DSpark block of k). Its default comes from GPU memory and TP ("internal defaults", SGLang
  docs ``advanced_features/cuda_graphs.md``): ASSUMED 256 requests here. ``--capture`` is
  ``--cuda-graph-max-bs``.
- TensorRT-LLM: ``cuda_graph_config.max_batch_size`` counts requests; ASSUMED as vLLM's 512
  tokens (no public default read here). ``--capture`` is tokens.

Everything is per DP rank (each rank captures its own graphs).

The graph MODE decides what a step inside the capture range replays (vLLM
``docs/design/cuda_graphs.md``, PR #20059): a uniform decode / verify batch (every request
``1 + k`` query tokens) and a NON-uniform one (prefill chunks, mixed prefill + decode) differ.

- ``full_and_piecewise`` (vLLM v1's default): uniform batches in a FULL graph; non-uniform ones
  in PIECEWISE graphs, attention eager between the pieces.
- ``piecewise`` (vLLM's earlier default): every batch piecewise.
- ``full_decode_only``: uniform batches in a full graph, non-uniform ones with no graph (eager).
  SGLang's extend (prefill) batches run outside its decode / verify graphs unless its piecewise
  prefill graphs are on (a gap in the public docs: ASSUMED), and TensorRT-LLM's graphs hold
  generation batches only (ASSUMED): both are priced this way by default.
- ``none`` (vLLM ``--enforce-eager``): every step eager.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim.errors import SpecsimError

DC_BLACKWELL = frozenset({"B200", "B300", "GB200", "GB300"})  # compute capability 10.x
VLLM_CEILING, VLLM_CEILING_DC_BLACKWELL = 512, 1024
SGLANG_MAX_BS = 256  # ASSUMED: SGLang picks it from GPU memory and TP
TRTLLM_TOKENS = 512  # ASSUMED
MODES = ("full_and_piecewise", "piecewise", "full_decode_only", "none")
DEFAULT_MODE = {"vllm": "full_and_piecewise", "sglang": "full_decode_only",
                "trtllm": "full_decode_only"}  # fmt: skip
MODE_SOURCE = {
    "vllm": "vLLM v1's default cudagraph_mode (docs/design/cuda_graphs.md)",
    "sglang": "SGLang: extend batches outside the decode / verify graphs (ASSUMED)",
    "trtllm": "TensorRT-LLM: graphs for generation batches only (ASSUMED)",
}
UNITS = {"vllm": "tokens", "sglang": "requests", "trtllm": "tokens"}
FLAG = {"vllm": "max_cudagraph_capture_size", "sglang": "--cuda-graph-max-bs",
        "trtllm": "cuda_graph_config (tokens)"}  # fmt: skip


@dataclass(frozen=True)
class Capture:
    """Where a DP rank's captured graphs end: ``tokens`` (what the step table staircases to),
    how it was set (``rule``: the engine's default or the user's, in words, with its source)."""

    tokens: int
    rule: str
    mode: str = "full_and_piecewise"
    mode_rule: str = ""


def capture(engine: str, gpu: str, drafts: int, max_num_seqs: int, max_batched_tokens: int,
            given: int = 0) -> Capture:  # fmt: skip
    """The capture limit of ``engine`` on ``gpu`` with ``drafts`` speculative tokens a request
    (0: none), ``max_num_seqs`` requests and ``max_batched_tokens`` a step per DP rank;
    ``given``: ``--capture`` in the engine's unit (0: its default)."""
    q = 1 + max(int(drafts), 0)  # tokens a request brings to a decode / verify step
    unit = UNITS.get(engine)
    if unit is None:
        raise SpecsimError(f"unknown engine {engine!r} for CUDA graphs; use {', '.join(UNITS)}")
    if given:
        tokens = given * q if unit == "requests" else given
        why = f"--capture {given} {unit} ({FLAG[engine]})"
        if unit == "requests":
            why += f" x {q} tokens a request"
        return Capture(min(tokens, max_batched_tokens), _capped(why, tokens, max_batched_tokens))
    if engine == "vllm":
        ceiling = VLLM_CEILING_DC_BLACKWELL if gpu in DC_BLACKWELL else VLLM_CEILING
        tokens = min(max_num_seqs * q * 2, ceiling)
        why = (
            f"vLLM's default: min(max_num_seqs {max_num_seqs} x {q} token{'s' * (q > 1)} x 2, "
            f"{ceiling} on "
            f"{gpu}) (vllm/config/vllm.py; 1,024 on data-center Blackwell since PR #49390)"
        )
        return Capture(min(tokens, max_batched_tokens), _capped(why, tokens, max_batched_tokens))
    if engine == "sglang":
        tokens = SGLANG_MAX_BS * q
        why = (
            f"SGLang: --cuda-graph-max-bs {SGLANG_MAX_BS} requests (ASSUMED: set from GPU memory)"
            f" x {q} tokens a request"
        )
        return Capture(min(tokens, max_batched_tokens), _capped(why, tokens, max_batched_tokens))
    why = f"TensorRT-LLM: {TRTLLM_TOKENS} tokens (ASSUMED)"
    return Capture(min(TRTLLM_TOKENS, max_batched_tokens),
                   _capped(why, TRTLLM_TOKENS, max_batched_tokens))  # fmt: skip


def graph_mode(engine: str, given: str = "") -> tuple[str, str]:
    """The graph mode (``given``, or the engine's default) and how it was set, in words."""
    if given and given not in MODES:
        raise SpecsimError(f"unknown --graph-mode {given!r}; use one of {', '.join(MODES)}")
    if given:
        return given, f"--graph-mode {given}"
    return DEFAULT_MODE[engine], MODE_SOURCE[engine]


def _capped(why: str, tokens: int, max_batched_tokens: int) -> str:
    if tokens > max_batched_tokens:
        return f"{why}, capped at max_num_batched_tokens {max_batched_tokens:,}"
    return why


def cuda_graph_buckets(max_graph: int = 512) -> np.ndarray:
    """vLLM-like captured batch sizes: 1, 2, 4, 8, 16, ..., 248 by 8, then by 16 to max_graph."""
    small = [1, 2, 4]
    return np.array(
        small + list(range(8, 256, 8)) + list(range(256, max_graph + 1, 16)), dtype=np.int64
    )


__all__ = ["DC_BLACKWELL", "MODES", "Capture", "capture", "cuda_graph_buckets", "graph_mode"]

"""What a step past the CUDA-graph capture limit costs: the CPU launching every kernel itself.

Why a module: v4 added one fitted constant (74.3 ms, vLLM's fig. 2 on V4-Flash) to every step
past the capture limit, whatever the model. Outside graphs the CPU launches each kernel through
the framework (dispatcher, the engine's module code): an eager step costs its GPU work plus
``kernels x launch time``, the model's own count of kernels. Added, not overlapped: a forward
holds host syncs (top-k routing, the sampler) that serialize the two, and fig. 2's five eager
sizes fit the sum (median 5.3%, in-sample) far better than ``max(GPU, launches)`` (13%: 104 ms
at 1,536 tokens and 136 ms at 8,192 against 20.6 ms captured at 1,024 are not one floor).

The kernels a step launches are counted per layer from the components the builder prices (the
layer structure of vLLM's model code, e.g. ``vllm/model_executor/models/llama.py`` and
``deepseek_v2.py``); ``ModelArch.extra_kernels`` adds what a family has beyond them (V4's
compressed sparse attention and hyper-connections: FITTED on fig. 2, the one eager number
fitted). The CPU time per launch is ASSUMED (``Engine.launch_us``): no public per-launch figure
for a current engine was found (engine facts §6).
"""

from __future__ import annotations

from typing import Any

# kernels one layer launches, by component (a fused residual add + RMSNorm counts once)
NORMS = 2  # input and post-attention RMSNorm (residual add fused)
GQA = 5  # QKV GEMM, rotary, KV-cache write, attention, output GEMM
MLA = 11  # q_a, q norm, q_b, kv_a, kv norm, rotary, cache write, absorb, attention, up, output
MLP = 3  # gate-up GEMM, activation, down GEMM
MOE = 7  # router GEMM, top-k, align/permute, grouped GEMM 1, activation, grouped GEMM 2, combine
SHARED = 3  # shared experts: gate-up, activation, down
EP_A2A = 2  # expert parallelism: dispatch and combine
TP_AR = 2  # tensor parallelism: two all-reduces a layer
HEAD = 8  # once a step: final norm, LM head, logits gather, sampling kernels
# a piecewise step: attention runs eager between the graph pieces, so each layer launches its
# attention op's kernels (GQA: KV-cache write, attention; MLA's op also absorbs q and
# up-projects the output) and replays one piece (``cudaGraphLaunch``)
PIECE_ATTN = {"gqa": 2, "mla": 4}
PIECE = 1


def kernels(m: Any, tp: int, ep: int) -> float:
    """Kernels one forward of model ``m`` launches at ``tp`` / ``ep`` (one DP rank)."""
    attn = MLA if m.attn_params else GQA
    per = NORMS + attn + (TP_AR if tp > 1 else 0) + m.extra_kernels
    moe = MOE + (SHARED if m.shared_experts else 0) + (EP_A2A if ep > 1 else 0)
    dense = m.layers - m.moe_layers
    return float(m.layers * per + dense * MLP + m.moe_layers * moe + HEAD)


def piecewise_kernels(m: Any) -> float:
    """Launches a PIECEWISE step of model ``m`` makes on the CPU: per layer its eager attention
    op and one graph piece, plus the piece after the last layer."""
    attn = PIECE_ATTN["mla" if m.attn_params else "gqa"]
    return float(m.layers * (attn + PIECE) + PIECE)


def mode_kernels(p: Any, uniform: bool) -> float:
    """Launches a step inside the capture range makes on the CPU under the deployment's graph
    mode (``p.eng.graph_mode``): a ``uniform`` decode / verify batch, or a non-uniform one
    (prefill chunks in it). 0: a full graph (its one launch is in the step's fixed cost)."""
    d, mode = p.dep, p.eng.graph_mode
    if mode == "none" or (mode == "full_decode_only" and not uniform):
        return kernels(d.model, d.tp, d.ep)
    if mode == "piecewise" or (mode == "full_and_piecewise" and not uniform):
        return piecewise_kernels(d.model)
    return 0.0


def launch_ms(p: Any, count: float | None = None) -> float:
    """The CPU's time to launch one eager step of deployment ``p`` (``build.Priced``): every
    kernel (or ``count`` launches) at the engine's launch time at the assumption point."""
    d = p.dep
    n = kernels(d.model, d.tp, d.ep) if count is None else count
    return n * p.eng.launch_us.at(d.point) / 1000.0


__all__ = ["kernels", "launch_ms", "mode_kernels", "piecewise_kernels"]

"""``specsim profile build``: a deployment's profile priced from MEASURED operator times.

Why: the roofline profiles' error goes both ways (a 256-token verify nearly free on one H100;
an MoE deployment's gain too small). Here every term of a step is an operator priced on the
measured curves of :mod:`~specsim.sim.cost.operators` (Vidur's H100/A100 tables, carried to
other GPUs by the stated rule), summed over the model's shapes (:mod:`~specsim.sim.cost.models`):

- weights: every linear op of every layer (QKV, out, MLP) at the step's tokens;
- attention: per layer its elementwise ops and a kernel launch in the table, and each
  sequence's KV read (context x KV values x dtype bytes x layers / TP) charged per cached token
  (``kv_read_us_per_ktoken``) at the measured memory-bound bandwidth;
- all-reduce: two per layer of the step's activations over the TP group (measured NVLink fit);
- MoE: the router, the shared experts, and the DISTINCT experts the step's tokens touch (uniform
  routing), as one grouped GEMM at their tokens per expert; with EP the dispatch/combine bytes
  over the scale-up link;
- LM head over the vocabulary for every verified row; sampling per verified token (passes over
  the logits: ASSUMED, a range); the engine's per-step and per-request overheads (ASSUMED per
  engine, a range); a CUDA-graph staircase to the engine's capture size;
- the drafter by its own architecture on the same curves (:mod:`~specsim.sim.cost.drafters`).

What is assumed rather than measured carries (low, mid, high); the profile is written at the
chosen point (``mid`` by default) and the printout shows the range.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost import calibration as cal
from specsim.sim.cost.assumed import Assumed
from specsim.sim.cost.drafters import Drafter, parse_drafter, weight_params
from specsim.sim.cost.graphs import cuda_graph_buckets
from specsim.sim.cost.models import ModelArch, check_arch
from specsim.sim.cost.operators import WEIGHT_DTYPES, OperatorCurves, curves, gpu_name
from specsim.sim.cost.paths import ar_latency, expert_flops
from specsim.sim.cost.profile_csv import count
from specsim.sim.cost.tables import MAX_PROFILE_BATCH

KV_DTYPES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
POINTS = ("low", "mid", "high")
# a term whose high value is the cheap one; a corner names its end by the fact's own ``spec``
FLIP = {"low": "high", "mid": "mid", "high": "low", "against": "against", "favour": "favour"}


@dataclass(frozen=True)
class Engine:
    """An engine's own costs and defaults: ASSUMED (no measured source here), with ranges."""

    name: str
    step_ms: Assumed  # the loop's fixed cost per step (scheduling, input prep, graph launch)
    per_request_us: Assumed  # per request in the step (metadata, detokenize, stream)
    capture_max_tokens: int  # largest CUDA-graph capture size in tokens, per DP rank
    max_running: int
    max_batched_tokens: int
    # vLLM: FITTED on its published fig. 2 tables (``calibration``); the others: assumed
    moe_gemm_eff: Assumed  # routed grouped GEMM's share of published FLOP/s, not overlapped
    # CPU time to launch one kernel outside graphs: an eager step (past the capture limit)
    # takes max(GPU, kernels x this) (specsim.sim.cost.eager)
    launch_us: Assumed
    draft_launch_ms: Assumed  # a draft call's fixed cost (launches, CPU, sampling setup)
    draft_position_us: Assumed  # per drafted position (its sampling and confidence)
    capture_rule: str = ""  # how capture_max_tokens was set (graphs.capture), for the printout
    graph_mode: str = "full_and_piecewise"  # what a captured step replays (graphs.MODES)
    mode_rule: str = ""  # how graph_mode was set, for the printout


def _fitted(key: str, why: str, carried: bool = False, spec: int = 0) -> Assumed:
    """A term fitted on vLLM's fig. 2 (``calibration``): its fitted mid and stated range; for
    an engine it was not fitted on (``carried``) the same mid, the range twice as wide."""
    lo, mid, hi = cal.VLLM[key]
    if not carried:
        return Assumed(lo, mid, hi, f"FITTED: {cal.SOURCE} ({why})", spec)
    if key == "moe_gemm_eff":  # a ratio: widened by factors
        lo, hi = mid * (lo / mid) ** 2, mid * (hi / mid) ** 2
    else:
        lo, hi = max(mid - 2 * (mid - lo), 0.0), mid + 2 * (hi - mid)
    return Assumed(lo, mid, hi, f"ASSUMED: vLLM's fitted value carried ({why})", spec)


LAUNCH_US = Assumed(
    8.0, 15.0, 40.0, "ASSUMED: CPU time per kernel launched outside graphs (the framework's "
    "dispatch and the engine's module code); no public per-launch figure for a current engine",
    spec=+1,  # launches are paid per step
)  # fmt: skip


def _engine(name: str, step: Assumed, per_request: Assumed) -> Engine:
    carried = name != "vllm"
    return Engine(
        name, step, per_request, 512, 256, 8192,  # capture, max running, batched tokens
        _fitted("moe_gemm_eff", "MoE grouped GEMM", carried, spec=+1),  # high: cheap tokens
        LAUNCH_US,
        _fitted("draft_launch_ms", "drafter fixed cost per call", carried, spec=-1),
        _fitted("draft_position_us", "drafter cost per drafted position", carried, spec=-1),
    )  # fmt: skip


ENGINES = {
    "vllm": _engine(
        "vllm",
        Assumed(*cal.VLLM["step_ms"], f"FITTED: {cal.SOURCE} (fixed cost per step)", +1),
        Assumed(3.0, 10.0, 30.0, "vLLM per-request bookkeeping (not in fig. 2: assumed)", +1),
    ),
    "sglang": _engine(
        "sglang",
        Assumed(0.3, 0.8, 2.0, "SGLang scheduler loop per step (overlap scheduling)", +1),
        Assumed(2.0, 8.0, 25.0, "SGLang per-request bookkeeping and streaming", +1),
    ),
    "trtllm": _engine(
        "trtllm",
        Assumed(0.2, 0.5, 1.5, "TensorRT-LLM C++ executor loop per step", +1),
        Assumed(1.0, 5.0, 15.0, "TensorRT-LLM per-request bookkeeping", +1),
    ),
}
SAMPLING_PASSES = Assumed(
    1.0, 2.0, 6.0, "passes over each verified row's fp32 logits: argmax 1-2, softmax + "
    "rejection sampling at T > 0 up to 6", spec=-1,  # paid per verified token
)  # fmt: skip
ACTIVATION_GIB = Assumed(1.0, 2.0, 4.0, "GiB per GPU kept for activations and graphs")
HBM_SHARE = 0.90  # vLLM's gpu_memory_utilization default: the share of HBM the engine uses
ACT_BYTES = 2.0  # activations travel in BF16
# --tp, --ep and --dp: each a whole number to 1,024 (past the largest deployments served), and
# tp x dp GPUs to 65,536; a profile's own limits (``CostModel``) then hold at the engines'
# defaults (512 captured tokens x 1,024 DP ranks is inside a step table's million tokens)
MAX_DEGREE = 1024
MAX_GPUS = 65_536
# what a profile holds at most, per key (``CostModel``): a DP rank's limit times the ranks
PROFILE_LIMITS = {"capture_max_tokens": MAX_PROFILE_BATCH, "max_running": 10**7,
                  "max_batched_tokens": 10**9}  # fmt: skip


def degree(value, flag: str) -> int:  # type: ignore[no-untyped-def]
    """A parallel degree (``--tp``, ``--ep``, ``--dp``): the shared whole-number rule in
    [1, :data:`MAX_DEGREE`], naming the flag. Used where the flag is parsed and by
    :func:`check`, so a Deployment made in code is held to the same rule."""
    return count(value, flag, 1, MAX_DEGREE)


@dataclass(frozen=True)
class Deployment:
    """What ``profile build`` prices: a model on GPUs under an engine, with a drafter."""

    model: ModelArch
    gpu: str = "H100"
    tp: int = 1
    ep: int = 1
    dp: int = 1
    weight_dtype: str = ""  # "": the model's released precision
    kv_dtype: str = "bf16"
    engine: str = "vllm"
    drafter: str = "none"
    point: str = "mid"
    # --capture in the engine's unit (vLLM, TensorRT-LLM: tokens; SGLang: requests, its
    # --cuda-graph-max-bs); 0: the engine's default rule (specsim.sim.cost.graphs)
    capture: int = 0
    max_running: int = 0  # max running requests per DP rank (0: the engine's default)
    max_batched_tokens: int = 0  # per step and DP rank (0: the engine's default)
    graph_mode: str = ""  # --graph-mode (graphs.MODES; "": the engine's default)

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


@dataclass(frozen=True, eq=False)
class Priced:
    """The priced deployment: the operator curves and every derived constant the terms use."""

    dep: Deployment
    ops: OperatorCurves
    eng: Engine
    bpp: float  # weight bytes per parameter
    ebpp: float  # routed-expert bytes per parameter
    kv_bytes_gpu: float  # KV bytes one cached token takes on one GPU (all layers)
    weights_gpu: float  # weight bytes per GPU
    drafter: Drafter = field(default_factory=lambda: Drafter("none"))
    drafter_weights_gpu: float = 0.0  # the drafter's weight bytes per GPU (beyond the target's)
    assumed: list[str] = field(default_factory=list)


def check(dep: Deployment, engine: Engine | None = None) -> Priced:
    """The deployment's constants, or a one-line ``SpecsimError`` naming what is wrong.
    ``engine``: the engine's terms to use instead of ``ENGINES[dep.engine]`` (the calibration
    script prices candidate values this way)."""
    m = check_arch(dep.model, f"model {dep.model.name!r}")
    if dep.engine not in ENGINES:
        raise SpecsimError(f"unknown engine {dep.engine!r}; use one of {', '.join(ENGINES)}")
    if dep.point not in FLIP:
        raise SpecsimError(f"unknown assumption point {dep.point!r}; use one of {', '.join(FLIP)}")
    dep = replace(dep, **{k: degree(getattr(dep, k), f"--{k}") for k in ("tp", "ep", "dp")})
    if dep.gpus > MAX_GPUS:
        raise SpecsimError(
            f"--tp {dep.tp} x --dp {dep.dp} = {dep.gpus:,} GPUs, over {MAX_GPUS:,}; use fewer"
        )
    dep = replace(dep, gpu=gpu_name(dep.gpu))
    _check_layout(dep)
    if dep.kv_dtype not in KV_DTYPES:
        raise SpecsimError(
            f"unknown --kv-dtype {dep.kv_dtype!r}; use one of {', '.join(KV_DTYPES)}"
        )
    wd = dep.weight_dtype or m.weight_dtype
    ops = curves(dep.gpu, wd)
    lat = ar_latency(dep.gpu)
    if lat is not None:  # cheap point = the low factor
        ops = replace(ops, ar_latency_scale=lat.at(dep.point))
    bpp = WEIGHT_DTYPES[wd]
    ebpp = WEIGHT_DTYPES[m.expert_dtype] if m.expert_dtype and not dep.weight_dtype else bpp
    kv_split = min(dep.tp, m.kv_heads) if m.kv_sharded else 1
    kv_gpu = m.layers * m.kv_elems_per_layer * KV_DTYPES[dep.kv_dtype] / kv_split
    routed = m.routed_params * ebpp / (dep.ep if dep.ep > 1 else dep.tp)
    weights = (m.total_params - m.routed_params) * bpp / dep.tp + routed
    drafter = parse_drafter(dep.drafter, m.hidden, m.vocab, m.layers)
    body, head = weight_params(m, drafter)
    drafter_gpu = (body * bpp + head * 2.0) / dep.tp  # its own head is read in BF16
    eng = _limits(dep, engine or ENGINES[dep.engine], drafter.drafts + drafter.tree_extra)
    p = Priced(dep, ops, eng, bpp, ebpp, kv_gpu, weights, drafter, drafter_gpu)
    if kv_tokens(p, dep.point) < 1:
        raise SpecsimError(_no_kv_room(p))
    return p


def _check_layout(dep: Deployment) -> None:
    """TP must split the heads, EP the experts over every GPU (one line naming the flag)."""
    m = dep.model
    if m.heads % dep.tp:
        raise SpecsimError(
            f"--tp {dep.tp} does not divide {m.name}'s {m.heads} attention heads; use a divisor"
        )
    if m.kv_sharded and m.kv_heads % dep.tp and dep.tp % m.kv_heads:
        raise SpecsimError(
            f"--tp {dep.tp} neither divides nor is a multiple of {m.kv_heads} KV heads"
        )
    if dep.ep > 1 and (not m.is_moe or dep.ep != dep.gpus):
        raise SpecsimError(
            f"--ep {dep.ep}: expert parallelism needs an MoE model and spans all tp x dp = "
            f"{dep.gpus} GPUs (vLLM's --enable-expert-parallel); use --ep 1 or --ep {dep.gpus}"
        )
    if m.is_moe and dep.ep > 1 and m.experts % dep.ep:
        raise SpecsimError(f"--ep {dep.ep} does not divide {m.name}'s {m.experts} experts")


def _limits(dep: Deployment, eng: Engine, drafts: int = 0) -> Engine:
    """The engine with the deployment's own limits per DP rank, each checked, the capture limit
    by the engine's rule for this GPU and draft length (:mod:`~specsim.sim.cost.graphs`), and
    each checked again times the DP ranks against what a profile holds (naming --dp)."""
    from specsim.sim.cost.graphs import capture, graph_mode

    limits = {"--capture": dep.capture, "--max-num-seqs": dep.max_running,
              "--max-num-batched-tokens": dep.max_batched_tokens}  # fmt: skip
    for flag, v in limits.items():
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10**6:
            raise SpecsimError(f"{flag} {v!r} must be a whole number in [1, 1000000]")
    eng = replace(eng, max_running=dep.max_running or eng.max_running,
                  max_batched_tokens=dep.max_batched_tokens or eng.max_batched_tokens)  # fmt: skip
    cap = capture(eng.name, dep.gpu, drafts, eng.max_running, eng.max_batched_tokens,
                  dep.capture)  # fmt: skip
    mode, mode_rule = graph_mode(eng.name, dep.graph_mode)
    eng = replace(eng, capture_max_tokens=cap.tokens, capture_rule=cap.rule, graph_mode=mode,
                  mode_rule=mode_rule)  # fmt: skip
    for key, hi in PROFILE_LIMITS.items():
        per_rank = getattr(eng, key)
        if per_rank * dep.dp > hi:
            raise SpecsimError(
                f"--dp {dep.dp}: {key} {per_rank:,} per DP rank x {dep.dp} ranks is over the "
                f"{hi:,} a profile holds; use a smaller --dp (or a smaller {key})"
            )
    return eng


def kv_tokens(p: Priced, point: str = "mid") -> int:
    """KV cache capacity of the whole deployment in tokens: every GPU's free bytes over what
    a token takes on it (each TP rank holds its share; DP ranks hold their own)."""
    return int(hbm_free(p, point) * p.dep.dp / p.kv_bytes_gpu)


def _no_kv_room(p: Priced) -> str:
    """The refusal of a deployment whose weights leave no token of KV cache: a profile with
    ``kv_tokens`` forced to 1 would replay as a --kv-tokens problem the user never set."""
    d, m = p.dep, p.dep.model
    drafter = (f" + {p.drafter_weights_gpu / 1e9:.1f} GB of drafter ({p.drafter.label})"
               if p.drafter_weights_gpu else "")  # fmt: skip
    act = ACTIVATION_GIB.at(FLIP[d.point])
    room = "no room" if hbm_free(p, d.point) <= 0 else "under one token of room"
    return (
        f"{m.name} does not fit: {p.weights_gpu / 1e9:.1f} GB of weights{drafter} and a "
        f"{act:g} GiB activation reserve per GPU leave {room} for the KV cache on "
        f"{d.gpus} x {p.ops.gpu} ({ops_hbm(d.gpu) / 1e9:.0f} GB, {HBM_SHARE:.0%} usable; TP "
        f"{d.tp}, DP {d.dp}); add GPUs (--tp, or --dp with --ep), use a smaller --weight-dtype, "
        "--kv-dtype or --drafter, or a GPU with more memory"
    )


def ops_hbm(gpu: str) -> float:
    """HBM bytes of one GPU (Vidur's A100: the 80 GB part its curves were measured on)."""
    from specsim.sim.cost.accelerators import accelerator

    name = gpu_name(gpu)
    return 80e9 if name == "A100" else float(accelerator(name).hbm_bytes)


def hbm_free(p: Priced, point: str = "mid") -> float:
    """Bytes per GPU left for the KV cache after the target's and the drafter's weights (a
    HIGH activation reserve leaves the least)."""
    act = ACTIVATION_GIB.at(FLIP[point]) * 2**30
    return HBM_SHARE * ops_hbm(p.dep.gpu) - p.weights_gpu - p.drafter_weights_gpu - act


def step_terms(p: Priced, batch) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """Milliseconds of each MEASURED term of a step over ``batch`` tokens (the deployment's
    total; each DP rank holds batch / dp). The engine's and sampling's terms are separate."""
    m, d, o = p.dep.model, p.dep, p.ops
    b = np.maximum(np.asarray(batch, dtype=np.float64), 1.0)
    t = np.ceil(b / d.dp)  # tokens per DP rank
    bpp, tp, h = p.bpp, d.tp, m.hidden
    attn_w = m.attn_layer_params * bpp / tp
    if m.attn_params:  # MLA: down and up projections (two GEMMs of half each)
        attn = 2 * o.gemm_s(t, attn_w / 2)
    else:
        qkv = h * (m.heads + 2 * m.kv_heads) * m.head_dim * bpp / tp
        attn = o.gemm_s(t, qkv) + o.gemm_s(t, attn_w - qkv)
    dense_layers = m.layers - m.moe_layers
    mlp = o.gemm_s(t, 2 * h * m.intermediate * bpp / tp) + o.gemm_s(
        t, h * m.intermediate * bpp / tp
    )
    weights = m.layers * attn + dense_layers * mlp
    rope = (m.heads + m.kv_heads) * m.head_dim / tp
    per_layer = (
        2 * o.elementwise_s("input_layernorm", t * h)
        + o.elementwise_s("attn_rope", t * rope)
        + 2 * o.elementwise_s("add", t * h)
        + o.launch_s[0]  # the attention kernel's own launch (its KV read: per sequence)
    )
    act_w = m.intermediate / tp
    attention = m.layers * per_layer + dense_layers * o.elementwise_s("mlp_act", t * act_w)
    reduce = 2 * m.layers * o.all_reduce_s(t * h * ACT_BYTES, tp) if tp > 1 else 0 * t
    moe = 0 * t
    if m.is_moe:
        moe = m.moe_layers * moe_layer_s(p, b, t)
    lm_head = o.gemm_s(t, m.vocab * h * 2.0 / tp) + o.elementwise_s("emb", t * h)
    ms = {"weights": weights, "attention": attention, "all-reduce": reduce, "moe": moe,
          "lm head": lm_head}  # fmt: skip
    return {k: np.asarray(v, dtype=np.float64) * 1000.0 for k, v in ms.items()}


def distinct_experts(batch, experts: int, top_k: int):  # type: ignore[no-untyped-def]
    """Expected distinct experts touched by B tokens each routed to top_k of E (uniform):
    E * (1 - (1 - k/E)^B)."""
    b = np.asarray(batch, dtype=np.float64)
    return experts * (1.0 - (1.0 - top_k / experts) ** b)


def moe_layer_s(p: Priced, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """One MoE layer: router, shared experts, the distinct routed experts touched (one grouped
    GEMM at their tokens per expert) and, with EP, dispatch + combine over the link."""
    m, d, o = p.dep.model, p.dep, p.ops
    h, tp = m.hidden, d.tp
    router = o.gemm_s(t, h * m.experts * 2.0)
    shared = 0 * t
    if m.shared_experts:
        sw = m.shared_experts * m.moe_intermediate * h * p.bpp / tp
        shared = o.gemm_s(t, 2 * sw) + o.gemm_s(t, sw)
    touched = distinct_experts(b, m.experts, m.top_k)  # over the whole deployment's batch
    per_expert_tokens = b * m.top_k / touched
    split = d.ep if d.ep > 1 else 1
    wbytes = touched / split * m.moe_intermediate * h * p.ebpp / (1 if d.ep > 1 else tp)
    routed = o.gemm_s(per_expert_tokens, 2 * wbytes) + o.gemm_s(per_expert_tokens, wbytes)
    # its FLOPs at the fitted share of published FLOP/s, on top of the weight stream (small
    # per-expert tiles: not overlapped); cheapest point = the highest share
    eff = p.eng.moe_gemm_eff.at(FLIP[d.point])
    pairs = b * m.top_k / d.ep if d.ep > 1 else t * m.top_k / tp  # token-expert pairs a GPU
    flop = 2.0 * pairs * 3 * h * m.moe_intermediate
    routed = routed + flop / (expert_flops(p) * eff)
    act = o.elementwise_s("mlp_act", t * m.top_k * m.moe_intermediate / (split * tp))
    a2a = 0 * t
    if d.ep > 1:  # dispatch in the weights' precision-ish (FP8) + combine in BF16, each way
        nbytes = t * m.top_k * h * (1.0 + ACT_BYTES) * (d.ep - 1) / d.ep
        a2a = 2 * o.all_reduce_s(0 * t, min(d.ep, 8)) + nbytes / o.link_bw
    return router + shared + routed + act + a2a


def sampling_ms(p: Priced, point: str = "mid") -> float:
    """Per verified token: passes over its fp32 logits (vocab / TP per GPU) at the measured
    memory bandwidth."""
    passes = SAMPLING_PASSES.at(point)
    return float(p.ops.read_s(passes * p.dep.model.vocab * 4.0)) * 1000.0


def kv_read_us_per_ktoken(p: Priced) -> float:
    """Decode attention: µs per 1,000 cached tokens read, at the measured memory bandwidth
    (DP ranks read their own sequences at once: / dp)."""
    return float(p.ops.read_s(p.kv_bytes_gpu * 1000.0)) * 1e6 / p.dep.dp


def attn_us_per_qk_ktoken(p: Priced) -> float:
    """Decode attention's COMPUTE: µs per query token x 1,000 context tokens of a sequence (all
    layers; each GPU holds heads / TP; DP ranks in parallel). QK and PV are 2 FLOPs per
    multiply-add over the key width each: 4 x heads x width per layer, the width being the
    head dimension (GQA) or, for MLA's absorbed path, the cached latent (``kv_elems``). At
    the measured compute-bound fraction of BF16. The engine charges the longer of this and the
    KV read: a GQA verify stays memory-bound, an MLA one turns compute-bound past a context
    (engine facts §4: the absorbed path's cost grows with query tokens x context)."""
    m, d = p.dep.model, p.dep
    width = m.kv_elems_per_layer if m.attn_params else m.head_dim
    flop = 4.0 * (m.heads / d.tp) * width * m.layers * 1000.0
    return float(p.ops.flops_s(flop)) * 1e6 / d.dp


def prefill_attention_us_per_token(p: Priced, prompt_tokens: float) -> float:
    """Reported, not in the table: causal attention FLOPs of one prompt token in a prompt of
    ``prompt_tokens`` (QK and PV: 2 x 2 x heads x head_dim x prompt / 2 per layer)."""
    m = p.dep.model
    flop = 2.0 * m.heads * m.head_dim * prompt_tokens * m.layers / p.dep.tp
    return float(p.ops.flops_s(flop)) * 1e6


def table_ms(p: Priced, batch) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The profile's table at ``batch`` tokens (a uniform decode / verify step) before the
    running maximum: every measured term, and the CPU's launches where the step is not one full
    graph: past the capture limit (eager) every kernel, inside it what the graph mode leaves
    eager (:mod:`~specsim.sim.cost.eager`); the engine's per-step and per-request terms stay
    separate, as does what a step holding prompt tokens adds (:func:`mixed_step_ms`)."""
    from specsim.sim.cost.eager import launch_ms, mode_kernels

    gpu = sum(step_terms(p, batch).values())
    b = np.asarray(batch, dtype=np.float64)
    eager = b > p.eng.capture_max_tokens * p.dep.dp
    return np.where(eager, gpu + launch_ms(p), gpu + launch_ms(p, mode_kernels(p, True)))


def mixed_step_ms(p: Priced) -> float:
    """What a step holding prompt tokens (a non-uniform batch) pays inside the capture range
    beyond a uniform step of its size: the launches its graph mode adds (vLLM's default runs it
    piecewise, attention eager; SGLang and TensorRT-LLM run it without graphs). Past the
    capture range every step is eager and the table holds it."""
    from specsim.sim.cost.eager import launch_ms, mode_kernels

    return launch_ms(p, mode_kernels(p, False) - mode_kernels(p, True))


def table_points(p: Priced) -> np.ndarray:
    """Captured sizes to the engine's capture limit (a batch pays the next), then eager sizes
    every 64 tokens to 4 x max_batched_tokens x dp, at most the million tokens a step table
    covers (beyond: extrapolated, as the eager steps are linear there)."""
    cap = p.eng.capture_max_tokens * p.dep.dp
    graphs = cuda_graph_buckets(p.eng.capture_max_tokens) * p.dep.dp
    top = min(4 * p.eng.max_batched_tokens * p.dep.dp, MAX_PROFILE_BATCH)
    eager = np.arange(cap + 64, top + 1, 64)
    return np.concatenate([graphs, eager]).astype(np.int64)


def pad_to_table(model, batch) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The table size a batch pays inside the capture range (its CUDA graph), else itself."""
    b = np.asarray(batch, dtype=np.int64)
    pts = model.batch_tokens
    idx = np.minimum(np.searchsorted(pts, b, side="left"), pts.size - 1)
    return np.where(b <= model.capture_max_tokens, pts[idx], b)


__all__ = [
    "ENGINES", "KV_DTYPES", "MAX_DEGREE", "Assumed", "Deployment", "Engine", "Priced", "check",
    "attn_us_per_qk_ktoken", "degree", "hbm_free", "kv_read_us_per_ktoken", "kv_tokens",
    "mixed_step_ms", "pad_to_table",
    "sampling_ms", "step_terms", "table_ms", "table_points",
]  # fmt: skip

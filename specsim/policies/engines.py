"""The serving engines' own DSpark verification rules, as built-in policies.

An operator deploys their engine's rule, not specsim's; predicting what their engine does under
load needs that rule exactly. Each rule here is read from the engine's source (file and commit
in its docstring, which is also the policy's ``doc``) and tested against steps worked by hand
(tests/test_policies_engines.py); each is built from the public blocks of
:mod:`specsim.policies.blocks`, the same ones a plug-in uses.

- ``vllm-adaptive``: vLLM's ``enable_adaptive_verification`` (lagged budget with drafting
  priced, live top-B).
- ``trtllm-confidence[:G[:F]]``: TensorRT-LLM's DSpark ``enable_confidence_scheduling`` (F drafts
  always, lagged budget above them, the whole block unless a trim gains G, live top-n).
- ``trtllm-schedule:B=K,...``: TensorRT-LLM's ``draft_len_schedule`` (K drafts up to B requests).
- ``sglang-dspark[:G]``: SGLang's ``--speculative-algorithm DSPARK`` in its default static
  verify mode (G drafts, all verified).
- ``llama-dspark[:P[:N]]``: llama.cpp's ``--spec-type draft-dspark`` cut.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import replace

import numpy as np

from specsim.errors import SpecsimError
from specsim.policies.base import POLICIES, Policy, StepInput, StepTime
from specsim.policies.blocks import (
    budget_search,
    draft_seconds,
    lagged_survival,
    ranked_values,
    survival,
    throughput_by_budget,
    top_k_lengths,
)
from specsim.policies.static import _constant
from specsim.policies.threshold import leading_true

VLLM_DOC = """``vllm-adaptive``: vLLM's adaptive verification (``enable_adaptive_verification``,
PR #47808; vllm-project/vllm@057929c3632766486896597cf27e1425fd838e63,
vllm/v1/worker/gpu/spec_decode/adaptive_verification.py, ``AdaptiveVerificationManager.
get_num_tokens`` and ``_assign_draft_token_budget``):

1. Budget, on the CPU from confidences two decode steps old (a double-buffered copy): the
   survivals ``cumprod(conf)`` of every scheduled draft, sorted descending (``s``); a request
   with no confidences yet is seeded with 1.0 at every position (optimistic). Then
   ``B* = argmax_B (N_sampling + sum_{i<B} s_i) / (draft_cost[num_reqs] + verify_cost[T + B])``,
   the first maximum (``np.argmax``: ties go to the smaller budget); no minimum-gain guard.
   ``T`` counts every scheduled non-draft token (one per decoding request, and prompt chunks):
   here the step time the engine gives a policy is already the table at ``T + B``.
2. Allocation, on the GPU from the live confidences: the global top-B of (request, position)
   survivals; survival falls along a request, so the winners are a prefix of each.

Lossless for the same reason as ``zos``: the budget reads only lagged rows and the allocation's
rank of (r, j) depends only on candidates ranked before it. What specsim leaves out: vLLM's
``N_sampling`` also counts prefilling requests whose last chunk is in this step, and its
``num_reqs`` counts them in the draft cost; the simulator's policies see decoding requests only.
vLLM drafts the whole block every step (it never skips the drafter), so the policy has no plan.
"""


def vllm_lagged_survival(inp: StepInput) -> np.ndarray:
    """The survivals vLLM's budget reads: the lagged rows, 1.0 where a request has none yet
    (:func:`specsim.policies.blocks.lagged_survival` with vLLM's seed)."""
    return lagged_survival(inp, unknown=1.0)


def vllm_adaptive_lengths(inp: StepInput) -> np.ndarray:
    """vLLM's budget (lagged survivals, drafting in the denominator), then the live top-B."""
    r = inp.n_requests
    if r == 0:
        return np.zeros(0, dtype=np.int64)
    budget = budget_search(vllm_lagged_survival(inp), r, inp.step_time, draft_seconds(inp))
    return top_k_lengths(survival(inp.conf, inp.survival), budget, r, inp.gamma)


def vllm_adaptive_first(inp: StepInput, k: int) -> np.ndarray:
    """vLLM's adaptive verification with ``num_speculative_tokens`` k below the block: the
    drafter drafts k, so the budget and the allocation see the block's first k drafts only."""
    if k >= inp.gamma:
        return vllm_adaptive_lengths(inp)
    cut = lambda a: None if a is None else a[:, :k]  # noqa: E731
    return vllm_adaptive_lengths(replace(
        inp, conf=inp.conf[:, :k], lagged_conf=cut(inp.lagged_conf),
        survival=cut(inp.survival), lagged_survival=cut(inp.lagged_survival),
    ))  # fmt: skip


@POLICIES.register(
    "vllm-adaptive",
    help="vllm-adaptive[:K]: vLLM's adaptive verification (PR #47808): lagged budget, drafting "
    "priced, over the first K drafts (num_speculative_tokens; default the block)",
)
def vllm_adaptive(arg: str | None = None) -> Policy:
    if arg is None:
        return Policy(
            name="vllm-adaptive",
            schedule=vllm_adaptive_lengths,
            zos=True,  # the budget is computed ahead, overlapped with the previous step
            needs=frozenset(
                {"lagged_conf", "survival", "lagged_survival", "lag_known", "draft_time"}
            ),  # fmt: skip
            doc=VLLM_DOC,
        )
    k = int(arg) if arg.isascii() and arg.isdigit() else 0
    if not 1 <= k <= 1024:
        raise SpecsimError(
            f"vllm-adaptive:{arg}: K (num_speculative_tokens) must be a whole number 1..1024"
        )
    return replace(
        vllm_adaptive(), name=f"vllm-adaptive:{k}", draft_len=k,
        schedule=lambda inp: vllm_adaptive_first(inp, k),
    )  # fmt: skip


# ---------------------------------------------------------------- TensorRT-LLM
TRTLLM_DOC = """TensorRT-LLM's DSpark confidence scheduling (``DSparkDecodingConfig``:
``enable_confidence_scheduling=True``, ``confidence_min_predicted_gain`` G, default 0.04).

Read from NVIDIA/TensorRT-LLM:

- ``tensorrt_llm/_torch/speculative/dspark_planner.py`` at
  52cd02d5b6344ae30ef638e5f94cfe474262cde2, ``compute_verify_token_budget`` (no
  ``allowed_lens``): every request verifies its first ``min_verify_len`` = F drafts (default 1)
  unconditionally; the budget n over the other candidates (drafts F+1..K) is
  ``argmax_n tau(n) / T(R * (F + 1) + n)`` with ``tau(n) = R + sum of the F always-verified
  survivals + the n best other survivals`` (the global argmax: "a first-descent stop parks on the
  first shelf"), and a trim must beat verifying the whole block by G:
  ``if best != full and theta[best] < theta[full] * (1 + G): return full``. Its token count
  includes the bonus token, as specsim's ``step_time(B)`` does.
- ``tensorrt_llm/_torch/speculative/dspark_schedule.py`` at
  104193cad115c080f5f7d3d9e4ca602371297c66, ``schedule_verify_lens_topk``: the n best
  candidates by survival are granted, ties by (position, request), candidates below
  ``survival_eps`` = 1e-6 never; lengths ``F + granted``. The unknown-row convention is the
  same file's ``NEUTRAL_CONFIDENCE_LOGIT`` (a row with no measurement reads as "certainly
  accept": survival 1.0).
- The default G = 0.04 is the ``DSparkDecodingConfig`` reference page of TensorRT-LLM 1.4.0rc4
  (nvidia.github.io/TensorRT-LLM/1.4.0rc4/llm-api/reference/DSparkDecodingConfig.html); the
  planner's own ``SpsCostTable.minimum_predicted_gain`` defaults to 0 (0.01 when a cost-table
  file omits it). The worker that wires config to planner was not found in the stored source:
  ASSUMED, as the planner's "runs on the host" and the neutral-row convention imply, that the
  budget reads the two-step-old confidences (as vLLM's and SGLang's do) and the allocation the
  live ones; that the whole block is drafted every step (confidence scheduling changes what is
  verified, not drafted); and that ``T`` is the profile's step time (TensorRT-LLM's cost table
  is ``bias + alpha(bs) + theta(M)``, the same quantity measured).

Not modelled: ``confidence_verify_len_tiers`` (a budget restricted to uniform captured tiers),
``acceptance_rate_threshold`` (speculation switched off on a low rolling acceptance),
``confidence_calibration_path`` (the trace's confidences are used as they are) and the float32
survivals of the GPU allocation (specsim ranks in float64). Lossless as ``zos``: the budget
reads lagged rows only, the floor is a constant, and the rank of (r, k) depends only on
candidates ranked before it.
"""

TRTLLM_MIN_GAIN = 0.04  # DSparkDecodingConfig.confidence_min_predicted_gain (1.4.0rc4 docs)
# The largest G taken: a trim must predict (1 + G)x the block's throughput, and no trim of a
# block predicts 11x, so a larger G is the same "never trim" (and 1e308 overflowed).
MAX_MIN_GAIN = 10.0


def valid_min_gain(gain: float) -> bool:
    """G as TensorRT-LLM's confidence scheduling reads it: a finite share in [0, 10]; the one
    rule for the policy's argument and ``tune --gains``."""
    return bool(np.isfinite(gain)) and 0.0 <= gain <= MAX_MIN_GAIN


TRTLLM_MIN_VERIFY = 1  # DSparkScheduleConfig.min_verify_len
TRTLLM_SURVIVAL_EPS = 1e-6  # DSparkScheduleConfig.survival_eps


def trtllm_verify_budget(
    lagged: np.ndarray, step_time: StepTime, min_gain: float, floor: int = TRTLLM_MIN_VERIFY
) -> int:
    """``compute_verify_token_budget``: candidates granted above the floor, from (R, gamma)
    survivals; the whole block's count when no trim beats it by ``min_gain``."""
    r, gamma = lagged.shape
    if r == 0 or gamma <= floor:
        return 0
    ranked = ranked_values(lagged[:, floor:])
    base = float(r) + float(lagged[:, :floor].sum())
    theta = throughput_by_budget(ranked, step_time, base=base, start=r * (floor + 1))
    best, full = int(np.argmax(theta)), theta.shape[0] - 1
    if best != full and theta[best] < theta[full] * (1.0 + min_gain):
        return full
    return best


def trtllm_allocate(live: np.ndarray, budget: int, floor: int = TRTLLM_MIN_VERIFY) -> np.ndarray:
    """``schedule_verify_lens_topk``: ``floor`` plus each request's share of the ``budget`` best
    candidates above it, ties by (position, request), none below the survival epsilon."""
    r, gamma = live.shape
    floor = min(floor, gamma)
    cand = live[:, floor:]
    eligible = cand >= TRTLLM_SURVIVAL_EPS  # a prefix of each row: survival falls along it
    scores = np.where(eligible, cand, -1.0)  # ranked after every eligible candidate
    granted = top_k_lengths(scores, budget, r, gamma - floor, ties="position")
    return floor + np.minimum(granted, eligible.sum(axis=1))


def trtllm_confidence_lengths(inp: StepInput, min_gain: float, floor: int) -> np.ndarray:
    """Budget from the lagged survivals (new requests at 1.0), allocation from the live ones."""
    r, gamma = inp.conf.shape
    if r == 0:
        return np.zeros(0, dtype=np.int64)
    floor = min(floor, gamma)
    lagged = lagged_survival(inp, unknown=1.0).reshape(r, gamma)
    budget = trtllm_verify_budget(lagged, inp.step_time, min_gain, floor)
    live = survival(inp.conf, inp.survival).reshape(r, gamma)
    return trtllm_allocate(live, budget, floor)


def _trtllm_confidence_args(arg: str | None) -> tuple[float, int]:
    usage = (
        f"trtllm-confidence:{arg}: use trtllm-confidence[:G[:F]] (G, the minimum predicted gain, "
        f"0..{MAX_MIN_GAIN:g}; F, the drafts always verified, >= 1)"
    )
    parts = [] if arg is None else arg.split(":")
    try:
        gain = float(parts[0]) if parts and parts[0] else TRTLLM_MIN_GAIN
        floor = int(parts[1]) if len(parts) > 1 else TRTLLM_MIN_VERIFY
    except ValueError:
        raise SpecsimError(usage) from None
    if len(parts) > 2 or not valid_min_gain(gain) or floor < 1:
        raise SpecsimError(usage)
    return gain, floor


@POLICIES.register(
    "trtllm-confidence",
    help="trtllm-confidence[:G[:F]]: TensorRT-LLM's DSpark confidence scheduling: F drafts always "
    "(1), lagged budget, whole block unless a trim gains G (0.04)",
)
def trtllm_confidence(arg: str | None = None) -> Policy:
    gain, floor = _trtllm_confidence_args(arg)

    def schedule(inp: StepInput) -> np.ndarray:
        return trtllm_confidence_lengths(inp, gain, floor)

    name = "trtllm-confidence" if arg is None else f"trtllm-confidence:{gain:g}:{floor}"
    return Policy(
        name=name,
        schedule=schedule,
        zos=True,  # the host planner runs ahead, on lagged confidences
        needs=frozenset({"lagged_conf", "survival", "lagged_survival", "lag_known"}),
        doc=TRTLLM_DOC,
    )


TRTLLM_SCHEDULE_DOC = """TensorRT-LLM's ``draft_len_schedule``: the draft length by batch size.

Read from NVIDIA/TensorRT-LLM ``tensorrt_llm/_torch/speculative/utils.py`` at
011d0933dcb5e592f5fa2626beaf42a96324c578, ``get_draft_len_for_batch_size``: the keys are
batch sizes, each value the draft length for batch sizes UP TO its key (``bisect_left``: the
first key >= the batch size); above the largest key speculation stops (``min_draft_len``,
0). ``{4: 4, 8: 2, 32: 1}``: 1-4 requests draft 4, 5-8 draft 2, 9-32 draft 1, 33+ none. The
value is what is DRAFTED (and verified: TensorRT-LLM's runtime draft length), so the policy
plans it (``Policy.plan``; 0 skips the drafter). The batch size is the number of decoding
requests (ASSUMED: TensorRT-LLM's "active batch size" of the generation step). A value above the
trace's block is capped at it. Spelled ``trtllm-schedule:4=4,8=2,32=1``. Lossless: a length
that depends only on how many requests run.
"""


def parse_draft_len_schedule(arg: str | None) -> tuple[tuple[int, int], ...]:
    """``"1=7,8=4,32=2"`` -> ((1, 7), (8, 4), (32, 2)), sorted by batch size."""
    usage = (
        f"trtllm-schedule:{arg}: use trtllm-schedule:B=K,B=K,... (batch size B >= 1 up to "
        "which K >= 0 drafts are used, e.g. trtllm-schedule:1=7,8=4,32=2)"
    )
    if not arg:
        raise SpecsimError(usage)
    pairs: dict[int, int] = {}
    try:
        for item in arg.split(","):
            b, k = item.split("=")
            pairs[int(b)] = int(k)
    except ValueError:
        raise SpecsimError(usage) from None
    if len(pairs) != len(arg.split(",")) or min(pairs) < 1 or min(pairs.values()) < 0:
        raise SpecsimError(usage)
    return tuple(sorted(pairs.items()))


def draft_len_for_batch(schedule: tuple[tuple[int, int], ...], batch_size: int) -> int:
    """``get_draft_len_for_batch_size``: the value of the first key >= ``batch_size``; 0 above
    every key."""
    keys = [b for b, _ in schedule]
    idx = bisect_left(keys, batch_size)
    return schedule[idx][1] if idx < len(keys) else 0


@POLICIES.register(
    "trtllm-schedule",
    help="trtllm-schedule:B=K,...: TensorRT-LLM's draft_len_schedule, K drafts up to B requests",
)
def trtllm_schedule(arg: str | None = None) -> Policy:
    sched = parse_draft_len_schedule(arg)

    def plan(inp: StepInput) -> int:
        return min(draft_len_for_batch(sched, inp.n_requests), inp.gamma)

    def schedule(inp: StepInput) -> np.ndarray:
        k = min(plan(inp), inp.drafted if inp.drafted is not None else inp.gamma)
        return np.full(inp.n_requests, k, dtype=np.int64)

    name = "trtllm-schedule:" + ",".join(f"{b}={k}" for b, k in sched)
    return Policy(
        name=name, schedule=schedule, plan=plan, decides=False, doc=TRTLLM_SCHEDULE_DOC
    )  # fmt: skip


# ---------------------------------------------------------------- SGLang
SGLANG_DOC = """SGLang's DSpark (``--speculative-algorithm DSPARK``) as it runs by default.

Read from sgl-project/sglang: ``python/sglang/srt/speculative/dspark_components/
dspark_config.py`` at 01f476234ab4ee99c7fb7cb31b68d31b6a7c54a8 (``resolve_runtime_config``:
``verify_num_draft_tokens = gamma + 1``; ``DEFAULT_DSPARK_GAMMA`` 7, else the draft
checkpoint's block size), the server-argument hook (``--speculative-dspark-block-size`` sets
gamma and ``--speculative-num-draft-tokens`` must equal gamma + 1) and
``python/sglang/srt/speculative/ragged_verify.py`` at
02d548f314373ad861130ad9b9e13fc7c1e9ba59 with ``SGLANG_RAGGED_VERIFY_MODE`` defaulting to
``static`` (``environ.py``): the verify window is the whole gamma + 1 tokens for every request,
every step. So ``sglang-dspark:G`` drafts and verifies G tokens a request (the trace's block when
G is omitted or larger). The ``compact`` / ``cap-accept`` modes (``dspark_scheduler.py``: a
budget from confidences two steps old, fresh rows at 1.0, no drafting in the denominator, then a
top-k) are not this policy: ``zos`` is that rule. Lossless: a constant length.
"""


@POLICIES.register(
    "sglang-dspark",
    help="sglang-dspark[:G]: SGLang's DSPARK in its default static verify mode: G drafts "
    "(--speculative-dspark-block-size, default the block), all verified",
)
def sglang_dspark(arg: str | None = None) -> Policy:
    if arg is None:
        return replace(_constant("sglang-dspark", None), doc=SGLANG_DOC)
    try:
        g = int(arg)
    except ValueError:
        g = 0
    if g < 1:
        raise SpecsimError(
            f"sglang-dspark:{arg}: G (--speculative-dspark-block-size) must be a positive integer"
        )
    return replace(_constant(f"sglang-dspark:{g}", g), doc=SGLANG_DOC)


# ---------------------------------------------------------------- llama.cpp
def llama_dspark_lengths(conf: np.ndarray, p_min: float, n_max: int | None = None) -> np.ndarray:
    """llama.cpp's draft-dspark cut, per request: the drafts before the first position whose
    confidence is below ``p_min`` (none below: all of them), capped at ``n_max``.

    llama.cpp build 11434, ``common/speculative.cpp``, ``draft()`` (the ``is_dspark`` branch):
    the block is cut before the first position whose confidence-head sigmoid is ``< p_min``
    (``--spec-draft-p-min``, default 0: the whole block); ``n_max`` is ``--spec-draft-n-max``.
    A cut to 0 drafts means no speculation that step (one token)."""
    conf = np.asarray(conf)
    keep = leading_true(conf >= p_min)
    if n_max is None or n_max >= conf.shape[-1]:  # a cap past the block cuts nothing (and a
        return keep  # huge N must not reach numpy, where it overflows an int64)
    return np.minimum(keep, n_max)


@POLICIES.register(
    "llama-dspark",
    help="llama-dspark[:P[:N]]: llama.cpp's draft-dspark, cut at the first confidence < P "
    "(--spec-draft-p-min, default 0), at most N drafts (--spec-draft-n-max)",
)
def llama_dspark(arg: str | None = None) -> Policy:
    """llama.cpp's ``--spec-type draft-dspark`` rule (see :func:`llama_dspark_lengths`).

    Row-wise and non-anticipating (position k's admission reads c_1..c_k only), so lossless.
    llama.cpp compares the RAW confidence head; specsim's recorded traces store STS-calibrated
    confidences (trace metadata ``confidence: sts``), and calibration moves every confidence
    by its position's temperature: with a trace whose temperatures are far from 1 the cut lands
    elsewhere than llama.cpp's. reports/llama-cpp-dspark measures the server's cut on raw
    confidences directly. Serve with ``--spec-draft-n-max`` equal to the drafter's block size
    (attention in the block is non-causal; docs/llama-cpp-dspark.md), so N is a cap for studies.
    """
    parts = [] if arg is None else arg.split(":")
    try:
        p_min = float(parts[0]) if parts else 0.0
        n_max = int(parts[1]) if len(parts) > 1 else None
    except ValueError:
        raise SpecsimError(
            f"llama-dspark:{arg}: use llama-dspark:P or llama-dspark:P:N (P in [0, 1], N >= 0)"
        ) from None
    if len(parts) > 2 or not 0.0 <= p_min <= 1.0 or (n_max is not None and n_max < 0):
        raise SpecsimError(
            f"llama-dspark:{arg}: use llama-dspark:P or llama-dspark:P:N (P in [0, 1], N >= 0)"
        )

    def schedule(inp: StepInput) -> np.ndarray:
        return llama_dspark_lengths(inp.conf, p_min, n_max)

    def solo(conf: np.ndarray, accept_len: np.ndarray, step_time) -> np.ndarray:  # noqa: ANN001
        return llama_dspark_lengths(conf, p_min, n_max)

    name = f"llama-dspark:{p_min:g}" + (f":{n_max}" if n_max is not None else "")
    return Policy(
        name=name, schedule=schedule, solo=solo, rowwise=True, solo_rows=True,
        doc=llama_dspark.__doc__ or "",
    )  # fmt: skip


__all__ = [
    "budget_search",
    "draft_len_for_batch",
    "llama_dspark",
    "llama_dspark_lengths",
    "parse_draft_len_schedule",
    "sglang_dspark",
    "trtllm_allocate",
    "trtllm_confidence",
    "trtllm_confidence_lengths",
    "trtllm_schedule",
    "trtllm_verify_budget",
    "vllm_adaptive",
    "vllm_adaptive_lengths",
    "vllm_lagged_survival",
]

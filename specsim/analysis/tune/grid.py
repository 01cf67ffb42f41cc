"""The grid ``tune`` searches: each engine's DSpark knobs as settings (``Candidate``), each the
built-in policy that is that engine's rule at those knobs (:mod:`specsim.analysis.tune.run` says
which knobs, and which setting is each engine's default); and TensorRT-LLM's
``draft_len_schedule`` tuned across loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Candidate:
    """One setting: its label, the specsim policy that is the engine's rule at it, the engine's
    knobs by the engine's names (what the config renders), and ``block`` (the trace truncated to
    its first ``block`` drafts; None: as recorded)."""

    label: str
    policy: str
    knobs: tuple[tuple[str, Any], ...] = ()
    block: int | None = None
    role: str = "grid"  # "no-spec", "default" or "grid"
    max_batched_tokens: int | None = None  # the engine's token limit a step (None: profile's)

    def with_batched_tokens(self, n: int) -> Candidate:
        """This setting at the engine's batched-token limit ``n`` (a grid row of its own)."""
        from dataclasses import replace

        return replace(
            self, label=f"{self.label}, {n} tok/step", role="grid", max_batched_tokens=int(n),
            knobs=(*self.knobs, (BATCHED_TOKENS, int(n))),
        )  # fmt: skip

    def knob_dict(self) -> dict[str, Any]:
        return dict(self.knobs)

    def knob_text(self) -> str:
        return ", ".join(f"{k}={_knob_value(v)}" for k, v in self.knobs) or "speculation off"


def _knob_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "{" + ", ".join(f"{b}: {k}" for b, k in v) + "}"
    return f"{v:g}" if isinstance(v, float) else str(v)


# The engine's limit on the tokens one step holds (prompt chunks and verified drafts): vLLM's
# --max-num-batched-tokens, SGLang's --chunked-prefill-size, TensorRT-LLM's max_num_tokens,
# llama.cpp's -b. A knob of its own where it decides whether an SLA is met (prompt chunks
# lengthen the decode steps they share). BATCHED_LADDER: what tune tries when nothing meets
# the SLA at the profile's limit and --max-batched-tokens is not given.
BATCHED_TOKENS = "max_batched_tokens"
BATCHED_LADDER = (256, 512, 1024, 2048, 4096, 8192, 16384)

# ------------------------------------------------------------------ the grid per engine
NO_SPEC = Candidate("no speculation", "ar", (), None, "no-spec")


def _lens(block: int, draft_lens: tuple[int, ...] | None) -> list[int]:
    """The draft lengths tried: the given ones up to the block (a longer one is no setting the
    trace can predict: the drafter proposes ``block`` drafts a step), else 1..block."""
    if draft_lens is None:
        return list(range(1, block + 1))
    return sorted({int(k) for k in draft_lens if int(k) <= block})


def dropped_lens(block: int, draft_lens: tuple[int, ...] | None) -> list[int]:
    """The ``--draft-lens`` longer than the block, which :func:`_lens` leaves out."""
    return sorted({int(k) for k in draft_lens or () if int(k) > block})


def _trunc(k: int, block: int) -> int | None:
    return None if k >= block else k


def vllm_grid(block: int, lens: list[int]) -> list[Candidate]:
    """``num_speculative_tokens`` k with ``enable_adaptive_verification`` off and on."""

    def knobs(k: int, adaptive: bool) -> tuple[tuple[str, Any], ...]:
        return (("num_speculative_tokens", k), ("enable_adaptive_verification", adaptive))

    out = [Candidate(f"k={block} static", f"static:{block}", knobs(block, False), None, "default")]
    for k in lens:
        out.append(Candidate(f"k={k} static", f"static:{k}", knobs(k, False)))
        adaptive = "vllm-adaptive" if k >= block else f"vllm-adaptive:{k}"  # what replay takes
        out.append(Candidate(f"k={k} adaptive", adaptive, knobs(k, True)))
    return out


def ladder_schedules(block: int) -> list[tuple[tuple[int, int], ...]]:
    """``draft_len_schedule`` candidates: the block at small batches, halving every 4x more
    requests down to 1 draft, speculation off beyond; starting at 1, 4 and 16 requests."""
    out = []
    for start in (1, 4, 16):
        steps, k, b = [], block, start
        while k > 1:
            steps.append((b, k))
            k, b = max(1, k // 2), b * 4
        steps.append((b, 1))
        out.append(tuple(steps))
    return out


def trtllm_grid(
    block: int, lens: list[int], gains: tuple[float, ...], schedules: list | None = None
) -> list[Candidate]:
    """``max_draft_len`` k, confidence scheduling off / on at each gain G, and schedules."""

    def off(k: int) -> tuple[tuple[str, Any], ...]:
        return (("max_draft_len", k), ("enable_confidence_scheduling", False))

    out = [Candidate(f"max_draft_len={block}", f"static:{block}", off(block), None, "default")]
    for k in lens:
        out.append(Candidate(f"max_draft_len={k}", f"static:{k}", off(k)))
    for k in lens:
        if k < 2:  # one draft, always verified (min_verify_len 1): nothing to trim
            continue
        for g in gains:
            knobs = (("max_draft_len", k), ("enable_confidence_scheduling", True),
                     ("confidence_min_predicted_gain", float(g)))  # fmt: skip
            label = f"max_draft_len={k} confidence G={g:g}"
            out.append(Candidate(label, f"trtllm-confidence:{g:g}:1", knobs, _trunc(k, block)))
    for sched in ladder_schedules(block) if schedules is None else schedules:
        out.append(schedule_candidate(tuple(sched), "ladder"))
    return out


def sglang_grid(block: int, lens: list[int]) -> list[Candidate]:
    """``--speculative-dspark-block-size`` G (num-draft-tokens G + 1), all verified."""

    def knobs(g: int) -> tuple[tuple[str, Any], ...]:
        return (("speculative_dspark_block_size", g), ("speculative_num_draft_tokens", g + 1))

    out = [Candidate(f"G={block}", "sglang-dspark", knobs(block), None, "default")]
    out += [Candidate(f"G={g}", f"sglang-dspark:{g}", knobs(g)) for g in lens]
    return out


def llama_grid(block: int, lens: list[int], p_mins: tuple[float, ...]) -> list[Candidate]:
    """``--spec-draft-n-max`` N x ``--spec-draft-p-min`` P."""

    def knobs(n: int, p: float) -> tuple[tuple[str, Any], ...]:
        return (("spec_draft_n_max", n), ("spec_draft_p_min", float(p)))

    out = [Candidate(f"N={block} P=0", f"llama-dspark:0:{block}", knobs(block, 0.0), None,
                     "default")]  # fmt: skip
    for p in p_mins:
        for n in lens:
            out.append(Candidate(f"N={n} P={p:g}", f"llama-dspark:{p:g}:{n}", knobs(n, p)))
    return out


def candidates(cfg: Any, block: int) -> list[Candidate]:
    """No speculation, the engine's default, then the grid (duplicates of either dropped)."""
    lens = _lens(block, cfg.draft_lens)
    if cfg.engine == "vllm":
        grid = vllm_grid(block, lens)
    elif cfg.engine == "trtllm":
        grid = trtllm_grid(block, lens, cfg.gains)
    elif cfg.engine == "sglang":
        grid = sglang_grid(block, lens)
    else:
        grid = llama_grid(block, lens, cfg.p_mins)
    seen: set[tuple[str, int | None]] = set()
    out: list[Candidate] = []
    for c in [NO_SPEC, *grid]:
        key = (_canonical(c.policy, block), c.block)
        if key in seen:
            continue
        seen.add(key)
        out.append(c)
    return out


def _canonical(policy: str, block: int) -> str:
    """Names of the same rule on the same trace (``sglang-dspark`` = ``sglang-dspark:7`` =
    ``static:7``; ``llama-dspark:0:7`` = the whole block too) compare equal."""
    name, _, arg = policy.partition(":")
    if name == "sglang-dspark":
        return f"static:{min(int(arg), block) if arg else block}"
    if name == "static":
        return f"static:{min(int(arg), block)}"
    if name == "llama-dspark" and arg.split(":")[0] in ("0", "0.0"):
        parts = arg.split(":")
        return f"static:{min(int(parts[1]), block) if len(parts) > 1 else block}"
    return policy


def schedule_candidate(sched: tuple[tuple[int, int], ...], why: str) -> Candidate:
    """The ``trtllm-schedule`` setting of a ``draft_len_schedule``."""
    spec = ",".join(f"{b}={k}" for b, k in sched)
    knobs = (
        ("max_draft_len", max(k for _, k in sched)),
        ("enable_confidence_scheduling", False),
        ("draft_len_schedule", tuple(sched)),
    )
    return Candidate(f"draft_len_schedule {spec} ({why})", f"trtllm-schedule:{spec}", knobs)


# ------------------------------------------------------------------ one schedule for all loads
def _fixed_len(policy: str) -> int | None:
    """The draft length of a constant-length setting (``ar`` 0, ``static:k`` k), else None."""
    if policy == "ar":
        return 0
    name, _, arg = policy.partition(":")
    return int(arg) if name == "static" and arg.isdigit() else None


def tuned_schedule(results: list[Any], objective: str) -> tuple[tuple[int, int], ...] | None:
    """TensorRT-LLM's ``draft_len_schedule`` from the searched closed-loop loads (each a
    :class:`specsim.analysis.tune.run.LoadResult`): at each load C the best fixed draft length
    meeting the SLA (0: no speculation), for batch sizes up to C
    (``get_draft_len_for_batch_size``: the first key >= the batch), never longer at a larger
    batch than at a smaller one (the engine's validator refuses it); runs of one length merged
    into their largest key, and speculation off above the largest load searched (the rule's
    own behaviour above its last key). None when no load has a fixed length worth drafting."""
    from specsim.analysis.tune.score import maximize

    sign = 1.0 if maximize(objective) else -1.0
    pairs: list[tuple[int, int]] = []
    for lr in sorted(results, key=lambda r: float(r.load.value)):
        fixed = [
            (r["objective"], -_fixed_len(r["policy"]), r)
            for r in lr.rows
            if _fixed_len(r["policy"]) is not None and r["sla_met"]
        ]
        if not fixed:
            continue
        best = max(fixed, key=lambda t: (sign * t[0], t[1]))[2]
        pairs.append((int(lr.load.value), _fixed_len(best["policy"]) or 0))
    # TensorRT-LLM's validator (DecodingBaseConfig.validate_draft_len_schedule_and_sort in
    # llm_args.py) wants the smallest batch's length = max_draft_len >= every other length: a
    # length that grows with the load is raised at the smaller batches (the candidate is
    # replayed like any other, so the table shows what that costs).
    for i in range(len(pairs) - 2, -1, -1):
        pairs[i] = (pairs[i][0], max(pairs[i][1], pairs[i + 1][1]))
    merged: list[tuple[int, int]] = []
    for c, k in pairs:
        if merged and merged[-1][1] == k:
            merged[-1] = (c, k)
        else:
            merged.append((c, k))
    while merged and merged[-1][1] == 0:
        merged.pop()
    return tuple(merged) if merged else None

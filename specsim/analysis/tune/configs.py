"""The config an operator pastes into their engine, for one setting of its DSpark knobs.

Why a module of its own: ``specsim tune`` predicts in specsim's terms (a policy name, a block
truncated to ``k`` drafts), but an operator deploys their engine's flags. Each renderer here
turns the engine's knobs, by the names the engine's source uses (cited in
:mod:`specsim.policies.engines`), into the text its config takes:

- vLLM: the ``--speculative-config`` JSON (``method`` ``"dspark"``, as ``docs/vllm.md`` serves
  the speculators export; ``num_speculative_tokens``; ``enable_adaptive_verification``).
- TensorRT-LLM: the ``speculative_config`` section of an ``extra_llm_api_options`` YAML
  (``DSparkDecodingConfig``: ``decoding_type: DSpark``, ``max_draft_len``,
  ``enable_confidence_scheduling``, ``confidence_min_predicted_gain``,
  ``confidence_cost_table_path``, ``draft_len_schedule``).
- SGLang: ``--speculative-algorithm DSPARK --speculative-dspark-block-size G
  --speculative-num-draft-tokens G+1`` (``dspark_config.py``: the second must be the first + 1).
- llama-server: ``--spec-type draft-dspark --spec-draft-n-max N --spec-draft-p-min P`` (the flags
  :func:`specsim.record.dspark_export.llama_server_args` writes).

No speculation renders as the engine run without its speculative flags. The drafter's path is a
placeholder that says so (``./REPLACE-ME-...``, and a note; ``--drafter`` names the real one);
every other value is the tuned one, and a note names the engine source the keys were read from
(the commits ``tests/data/engine_config_schemas.json`` checks every rendering against).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, replace
from typing import Any

from specsim.analysis.tune.grid import BATCHED_TOKENS

ENGINE_NAMES = {
    "vllm": "vLLM",
    "trtllm": "TensorRT-LLM",
    "sglang": "SGLang",
    "llama": "llama-server",
}
# Placeholders with no shell metacharacters, so a pasted command line still parses, named so
# that nobody mistakes them for a path that exists.
DEFAULT_DRAFTER = {
    "vllm": "./REPLACE-ME-dspark-speculators",
    "trtllm": "./REPLACE-ME-dspark-drafter",
    "sglang": "./REPLACE-ME-dspark-drafter",
    "llama": "./REPLACE-ME-dspark-drafter.gguf",
}
# Where each engine's keys and flags were read (the sources of tests/data/engine_config_schemas
# .json): a release older than these may not know them.
KEYS_FROM = {
    "vllm": "vLLM's SpeculativeConfig at vllm-project/vllm@002e77c1 (vllm/config/speculative.py); "
    "enable_adaptive_verification is PR #47808 (@057929c3): a vLLM without it refuses the key",
    "trtllm": "TensorRT-LLM's DSparkDecodingConfig at NVIDIA/TensorRT-LLM@00043967 "
    "(tensorrt_llm/llmapi/llm_args.py)",
    "sglang": "SGLang's server arguments at sgl-project/sglang@001067ff "
    "(python/sglang/srt/server_args.py)",
    "llama": "llama.cpp's flags at ggml-org/llama.cpp@0017d6fb (common/arg.cpp)",
}
TRTLLM_COST_TABLE = "cost_table.json"
# The first release whose DSparkDecodingConfig declares the confidence-scheduling fields
# (nvidia.github.io/TensorRT-LLM/1.4.0rc4/llm-api/reference/DSparkDecodingConfig.html).
TRTLLM_CONFIDENCE_RELEASE = "1.4.0rc4"


@dataclass(frozen=True)
class EngineConfig:
    """What to paste: ``text`` (a command-line fragment or YAML), its ``kind`` (``json`` for
    vLLM's value, ``yaml``, ``flags``), ``data`` (the same settings as a dict, for ``--json``)
    and ``notes`` (what the pasted text needs beside it)."""

    engine: str
    kind: str
    text: str
    data: dict[str, Any]
    notes: tuple[str, ...] = ()


def render(
    engine: str,
    knobs: dict[str, Any],
    *,
    block: int | None = None,
    drafter: str | None = None,
    cost_table: str | None = None,
) -> EngineConfig:
    """The config for ``knobs`` (the engine's own names; empty: no speculation); ``block``: the
    drafter's block size, so a shorter setting carries its caveat."""
    path = drafter or DEFAULT_DRAFTER[engine]
    knobs = dict(knobs)
    batched = knobs.pop(BATCHED_TOKENS, None)
    if engine == "trtllm":
        ec = trtllm(knobs, path, cost_table or TRTLLM_COST_TABLE, block)
    else:
        ec = {"vllm": vllm, "sglang": sglang, "llama": llama}[engine](knobs, path, block)
    ec = _with_batched_tokens(ec, batched)
    if not knobs:  # speculation off: nothing to paste, nothing to replace
        return ec
    notes = [f"keys as in {KEYS_FROM[engine]}"]
    if not drafter:
        notes.insert(
            0,
            f"{path} is a placeholder: replace it with your drafter's path (or give tune "
            "--drafter PATH); public DSpark drafters exist for Qwen3-4B/8B/14B and Gemma4-12B "
            "only (docs/vllm.md, 'Where the drafter comes from')",
        )
    return replace(ec, notes=(*notes, *ec.notes))


# each engine's name for the tokens one step may hold, as the pasted text spells it
BATCHED_FLAG = {"vllm": "--max-num-batched-tokens", "sglang": "--chunked-prefill-size",
                "llama": "-b", "trtllm": "max_num_tokens"}  # fmt: skip


def _with_batched_tokens(ec: EngineConfig, n: int | None) -> EngineConfig:
    """The pasted text with the engine's batched-token limit ``n`` beside it (None: as is)."""
    if n is None:
        return ec
    flag = BATCHED_FLAG[ec.engine]
    line = f"{flag}: {int(n)}" if ec.engine == "trtllm" else f"{flag} {int(n)}"
    note = (f"{flag} {int(n)}: a setting of the engine's server, beside the speculative "
            "config (tune searched it)")  # fmt: skip
    return replace(ec, text=f"{ec.text}\n{line}", data={**ec.data, flag.lstrip("-"): int(n)},
                   notes=(*ec.notes, note))  # fmt: skip


def vllm(knobs: dict[str, Any], drafter: str, block: int | None = None) -> EngineConfig:
    """``--speculative-config`` JSON (vLLM's ``SpeculativeConfig`` field names)."""
    if not knobs:
        return EngineConfig("vllm", "json", "(no --speculative-config: speculation off)", {})
    data = {
        "method": "dspark",
        "model": drafter,
        "num_speculative_tokens": int(knobs["num_speculative_tokens"]),
        "enable_adaptive_verification": bool(knobs["enable_adaptive_verification"]),
    }
    text = "--speculative-config " + shlex.quote(json.dumps(data))
    return EngineConfig(
        "vllm", "json", text, data, _block_note(knobs, "num_speculative_tokens", block)
    )


def trtllm(
    knobs: dict[str, Any], drafter: str, cost_table: str, block: int | None = None
) -> EngineConfig:
    """The ``speculative_config`` YAML section (``DSparkDecodingConfig`` field names)."""
    if not knobs:
        return EngineConfig("trtllm", "yaml", "# no speculative_config: speculation off", {})
    data: dict[str, Any] = {
        "decoding_type": "DSpark",
        "max_draft_len": int(knobs["max_draft_len"]),
        "speculative_model": drafter,
    }
    notes: list[str] = list(_block_note(knobs, "max_draft_len", block))
    if knobs.get("enable_confidence_scheduling", False):
        # Only TensorRT-LLM 1.4.0rc4's DSparkDecodingConfig has the confidence fields (its API
        # reference; llm_args.py before it says they are "intentionally omitted"), so a row
        # without them prints none: it then loads on every release that has DSpark.
        data["enable_confidence_scheduling"] = True
        data["confidence_min_predicted_gain"] = float(knobs["confidence_min_predicted_gain"])
        data["confidence_cost_table_path"] = cost_table
        notes.append(
            f"confidence scheduling needs TensorRT-LLM {TRTLLM_CONFIDENCE_RELEASE} or newer: "
            "older DSparkDecodingConfig classes have no confidence fields and refuse them"
        )
        notes.append(
            f"{cost_table}: the step costs the planner reads; write it from the profile with "
            f"'specsim profile export PROFILE --format trtllm --out {cost_table}' (or tune's "
            "--trtllm-cost-table)"
        )
    schedule = knobs.get("draft_len_schedule")
    if schedule:
        data["draft_len_schedule"] = {int(b): int(k) for b, k in schedule}
    return EngineConfig("trtllm", "yaml", _yaml({"speculative_config": data}), data, tuple(notes))


def sglang(knobs: dict[str, Any], drafter: str, block: int | None = None) -> EngineConfig:
    """``sglang.launch_server`` flags (the DSPARK algorithm, gamma and gamma + 1)."""
    if not knobs:
        return EngineConfig("sglang", "flags", "(no --speculative-algorithm: speculation off)", {})
    g = int(knobs["speculative_dspark_block_size"])
    data = {
        "speculative_algorithm": "DSPARK",
        "speculative_draft_model_path": drafter,
        "speculative_dspark_block_size": g,
        "speculative_num_draft_tokens": g + 1,
    }
    return EngineConfig(
        "sglang",
        "flags",
        _flags(data),
        data,
        _block_note(knobs, "speculative_dspark_block_size", block),
    )


def llama(knobs: dict[str, Any], drafter: str, block: int | None = None) -> EngineConfig:
    """``llama-server`` flags of the draft-dspark drafter."""
    if not knobs:
        return EngineConfig("llama", "flags", "(no -md / --spec-type: speculation off)", {})
    n, p = int(knobs["spec_draft_n_max"]), float(knobs["spec_draft_p_min"])
    args = [
        "-md",
        drafter,
        "--spec-type",
        "draft-dspark",
        "--spec-draft-n-max",
        str(n),
        "--spec-draft-p-min",
        repr(p),
    ]  # fmt: skip  (repr: the p-min scored, unrounded)
    data = {"md": drafter, "spec_type": "draft-dspark", "spec_draft_n_max": n,
            "spec_draft_p_min": p}  # fmt: skip
    notes = list(_block_note(knobs, "spec_draft_n_max", block))
    if p > 0:
        notes.append(
            "llama.cpp cuts on the RAW confidence head; specsim's recorded traces carry "
            "STS-calibrated confidences, so the cut lands where the trace's temperatures are "
            "near 1 (docs/policies.md, llama-dspark)"
        )
    return EngineConfig("llama", "flags", shlex.join(args), data, tuple(notes))


def _block_note(knobs: dict[str, Any], name: str, block: int | None) -> tuple[str, ...]:
    """A block shorter than the drafter's: specsim predicts it as the block's first k drafts."""
    if block is None or int(knobs[name]) >= int(block):
        return ()
    return (
        f"{name} {knobs[name]} < the drafter's block {block}: predicted as the block's first "
        f"{knobs[name]} drafts; DSpark's block is non-causal, so a drafter run with a shorter "
        "block drafts differently (docs/vllm.md): measure it before relying on it",
    )


def _flags(data: dict[str, Any]) -> str:
    """``--name value`` pairs, shell-quoted."""
    parts: list[str] = []
    for k, v in data.items():
        parts += ["--" + k.replace("_", "-"), str(v)]
    return shlex.join(parts)


def _yaml(obj: dict[str, Any], indent: int = 0) -> str:
    """A small YAML writer for nested dicts of scalars: deterministic, no dependency."""
    lines: list[str] = []
    pad = "  " * indent
    for k, v in obj.items():
        if isinstance(v, dict):
            lines.append(f"{pad}{k}:")
            lines.append(_yaml(v, indent + 1))
        else:
            lines.append(f"{pad}{k}: {_scalar(v)}")
    return "\n".join(lines)


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        # YAML 1.1 (PyYAML, which TensorRT-LLM reads configs with) takes a float only with a
        # '.' in its mantissa: repr's 1e-05 would load as a string, 1.0e-05 loads as 1e-05.
        mantissa, e, exponent = repr(v).partition("e")
        return f"{mantissa}.0{e}{exponent}" if e and "." not in mantissa else repr(v)
    if isinstance(v, int):
        return str(v)
    text = str(v)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS and not _NUMBER.fullmatch(text):
        return text
    return json.dumps(text)  # a quoted string is valid YAML whatever it holds


# A YAML plain scalar that reads back as this very string: path-like, no YAML keyword, no number
_PLAIN = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./-]*")
_NUMBER = re.compile(r"[-+]?(\d[\d_]*)?\.?\d*([eE][-+]?\d+)?|0[xo][0-9a-fA-F]+|\.(inf|nan)")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"}


__all__ = ["ENGINE_NAMES", "EngineConfig", "llama", "render", "sglang", "trtllm", "vllm"]

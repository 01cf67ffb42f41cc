"""An operator's own benchmark of the deployment WITHOUT speculation, as ``profile fit`` reads it.

Why: the no-speculation level is what every engine, kernel and driver version moves and no table
of public facts follows; a few minutes of ``vllm bench serve`` at two or three concurrencies pin
it. Each file is one run (one closed-loop concurrency), in any of the forms engines write:

- ``vllm bench serve --save-result`` JSON (``max_concurrency``, ``completed``,
  ``total_input_tokens``, ``total_output_tokens``, ``output_throughput``, ``mean_tpot_ms``,
  ``mean_ttft_ms``);
- SGLang's ``python -m sglang.bench_serving --output-file`` JSONL (one such object a line, the
  same names; every line is a run);
- ``specsim bench --json`` output (``summary`` and ``config``);
- TensorRT-LLM's ``trtllm-bench ... throughput --streaming --concurrency C --report_json FILE``
  (and ``latency``'s, the same report): the dict ``ReportUtility.get_statistics_dict`` writes in
  ``tensorrt_llm/bench/dataclasses/reporting.py`` (NVIDIA/TensorRT-LLM, read at commit
  2787769cae353023784dce105d648bcd4d04f4d4; 0249976575050d2c624a5f285683c66de311a3b7 the same
  keys): ``request_info`` (``avg_input_length``, ``avg_output_length``,
  ``avg_num_concurrent_requests``), ``performance`` (``system_output_throughput_tok_s``),
  ``streaming_metrics`` (``avg_tpot_ms``, ``avg_ttft_ms``; written only with ``--streaming``),
  ``world_info`` (``max_batch_size``), and ``decoding_stats`` only when speculation was on. The
  report does not write ``--concurrency``: the run's mean number of requests in flight (sum of
  request latencies over the run's span), rounded up, stands in for it (a closed loop never has
  more than C in flight; the mean falls short of C as the last requests drain, by under one
  request in a long run); where it falls further, give the run as a CSV row;
- a CSV, one row a run: ``concurrency, prompt_tokens, output_tokens, output_tok_s,
  mean_tpot_ms`` and optionally ``mean_ttft_ms`` (prompt and output tokens: per request, mean).

A run with speculation is refused: its steps verify an unknown number of drafts.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost import profile_csv as rules

MAX_BYTES = 64 * 2**20  # a bench result is kilobytes; a saved detailed run a few MB
CSV_COLUMNS = ("concurrency", "prompt_tokens", "output_tokens", "output_tok_s", "mean_tpot_ms")
# the keys engines write for speculation (decoding_stats: trtllm-bench's section)
SPEC_KEYS = ("spec_decode_num_drafts", "num_drafts", "spec_decode_acceptance_rate",
             "accept_length", "avg_spec_accept_length", "spec_accept_length",
             "decoding_stats")  # fmt: skip


@dataclass(frozen=True)
class BaselinePoint:
    """One benchmark run without speculation: a closed loop of ``concurrency`` requests of
    ``prompt_tokens`` / ``output_tokens`` (means a request), what it measured, and where from."""

    concurrency: int
    prompt_tokens: float
    output_tokens: float
    output_tok_s: float
    mean_tpot_ms: float
    mean_ttft_ms: float | None
    source: str

    def describe(self) -> str:
        return (
            f"C={self.concurrency} ({self.prompt_tokens:,.0f} in / {self.output_tokens:,.0f} out):"
            f" {self.output_tok_s:,.0f} tok/s, TPOT {self.mean_tpot_ms:.2f} ms"
        )


def _number(obj: dict, key: str, where: str, *, whole: bool = False, positive: bool = True
            ) -> float:  # fmt: skip
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise SpecsimError(f"{where}: {key} is {v!r}, not a finite number; give the file the "
                           "benchmark wrote, unedited")  # fmt: skip
    if positive and not v > 0:
        raise SpecsimError(f"{where}: {key} is {v}; a run without it measured nothing")
    if whole and float(v) != int(v):
        raise SpecsimError(f"{where}: {key} {v} is not a whole number")
    return float(v)


def refuse_speculation(obj: dict, where: str) -> None:
    """One line when a benchmark result says speculation was on (any key engines write for it):
    the one rule for ``profile fit`` and ``profile import bench``."""
    for key in SPEC_KEYS:
        v = obj.get(key)
        if v not in (None, 0, 0.0, "", False, {}) and not (isinstance(v, float) and math.isnan(v)):
            shown = f"mode {v.get('mode')!r}" if isinstance(v, dict) else f"= {v!r}"
            raise SpecsimError(
                f"{where} ran with speculation ({key} {shown}): its steps hold an unknown "
                "number of tokens; run the benchmark with speculation off"
            )


def _from_bench_json(obj: dict, where: str) -> BaselinePoint:
    """vLLM's and SGLang's result object (the same key names)."""
    refuse_speculation(obj, where)
    if obj.get("max_concurrency") in (None, 0):
        raise SpecsimError(
            f"{where} has no max_concurrency: run the benchmark as a closed loop "
            "(--max-concurrency C), one run per concurrency"
        )
    c = int(_number(obj, "max_concurrency", where, whole=True))
    done = _number(obj, "completed", where, whole=True)
    ttft = obj.get("mean_ttft_ms")
    return BaselinePoint(
        concurrency=c,
        prompt_tokens=_number(obj, "total_input_tokens", where) / done,
        output_tokens=_number(obj, "total_output_tokens", where) / done,
        output_tok_s=_number(obj, "output_throughput", where),
        mean_tpot_ms=_number(obj, "mean_tpot_ms", where),
        mean_ttft_ms=_number(obj, "mean_ttft_ms", where) if ttft is not None else None,
        source=where,
    )


def _from_specsim(obj: dict, where: str) -> BaselinePoint:
    s, cfg = obj["summary"], obj["config"]
    if not (isinstance(s, dict) and isinstance(cfg, dict)):
        raise SpecsimError(f"{where}: 'summary' and 'config' must be objects, as 'specsim bench "
                           "--json' writes them")  # fmt: skip
    refuse_speculation({"num_drafts": s.get("draft_tokens")}, where)
    c = int(_number(cfg, "concurrency", where, whole=True))
    done = _number(s, "requests_completed", where)
    return BaselinePoint(
        concurrency=c,
        prompt_tokens=_number(s, "input_tokens", where) / done,
        output_tokens=_number(s, "output_tokens", where) / done,
        output_tok_s=_number(s, "throughput_tok_s", where),
        mean_tpot_ms=_number(s, "tpot_ms_mean", where),
        mean_ttft_ms=_number(s, "ttft_ms_mean", where) if "ttft_ms_mean" in s else None,
        source=where,
    )


def _section(obj: dict, key: str, where: str) -> dict:
    v = obj.get(key)
    if not isinstance(v, dict):
        raise SpecsimError(f"{where}: {key} is {v!r}, not an object as trtllm-bench's "
                           "--report_json writes it; give the report unedited")  # fmt: skip
    return v


def _from_trtllm(obj: dict, where: str) -> BaselinePoint:
    """trtllm-bench's report (throughput and latency alike; the keys in the module docstring)."""
    refuse_speculation(obj, where)
    req, perf = _section(obj, "request_info", where), _section(obj, "performance", where)
    if obj.get("streaming_metrics") is None:
        raise SpecsimError(f"{where} has no streaming_metrics (no TPOT): run trtllm-bench "
                           "throughput with --streaming (and --concurrency C)")  # fmt: skip
    stream = _section(obj, "streaming_metrics", where)
    if req.get("avg_num_concurrent_requests") in (None, 0):
        raise SpecsimError(f"{where} has no request_info.avg_num_concurrent_requests (the run's "
                           "concurrency): give this run as a CSV row (concurrency, "
                           "prompt_tokens, output_tokens, output_tok_s, mean_tpot_ms)")  # fmt: skip
    at = f"{where} request_info"
    in_flight = _number(req, "avg_num_concurrent_requests", at)
    c = max(1, math.ceil(in_flight - 1e-3))  # the mean of a closed loop of C is at most C
    cap = _section(obj, "world_info", where).get("max_batch_size")
    if isinstance(cap, (int, float)) and not isinstance(cap, bool) and c > cap:
        raise SpecsimError(f"{at}: {in_flight:.2f} requests in flight on average, over "
                           f"max_batch_size {cap}: requests queued; run trtllm-bench with "
                           "--concurrency C at most max_batch_size")  # fmt: skip
    s_at = f"{where} streaming_metrics"
    ttft = stream.get("avg_ttft_ms")
    return BaselinePoint(
        concurrency=c,
        prompt_tokens=_number(req, "avg_input_length", at),
        output_tokens=_number(req, "avg_output_length", at),
        output_tok_s=_number(perf, "system_output_throughput_tok_s", f"{where} performance"),
        mean_tpot_ms=_number(stream, "avg_tpot_ms", s_at),
        mean_ttft_ms=_number(stream, "avg_ttft_ms", s_at) if ttft is not None else None,
        source=where,
    )


def _from_csv(text: str, where: str) -> list[BaselinePoint]:
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise SpecsimError(f"{where} has no rows; give one run a row")
    missing = [c for c in CSV_COLUMNS if c not in (rows[0].keys() or ())]
    if missing:
        raise SpecsimError(f"{where} lacks column(s) {', '.join(missing)}; a baseline CSV has "
                           f"{', '.join(CSV_COLUMNS)} (and optionally mean_ttft_ms)")  # fmt: skip
    out = []
    for i, row in enumerate(rows, start=2):
        at = f"{where} line {i}"
        vals: dict[str, Any] = {}
        for key in (*CSV_COLUMNS, "mean_ttft_ms"):
            text_v = (row.get(key) or "").strip()
            if key == "mean_ttft_ms" and not text_v:
                continue
            try:
                vals[key] = float(text_v)
            except ValueError:
                raise SpecsimError(f"{at}: {key} {text_v!r} is not a number") from None
        out.append(BaselinePoint(
            concurrency=int(_number(vals, "concurrency", at, whole=True)),
            prompt_tokens=_number(vals, "prompt_tokens", at),
            output_tokens=_number(vals, "output_tokens", at),
            output_tok_s=_number(vals, "output_tok_s", at),
            mean_tpot_ms=_number(vals, "mean_tpot_ms", at),
            mean_ttft_ms=_number(vals, "mean_ttft_ms", at) if "mean_ttft_ms" in vals else None,
            source=at,
        ))  # fmt: skip
    return out


def read_baseline(path: str | os.PathLike) -> list[BaselinePoint]:
    """The runs one file holds (a JSON result: one; a JSONL or CSV: one a line / row)."""
    where = f"baseline {str(path)!r}"
    text = rules.read_text_file(
        path, "baseline", MAX_BYTES, "give a benchmark's result file",
        "give a result file, not a folder (one --baseline per file)",
    )  # fmt: skip
    if Path(path).suffix.lower() == ".csv":
        return _from_csv(text, where)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise SpecsimError(f"{where} is empty; give a benchmark's result file")
    try:
        objs = [json.loads(text)] if _one(text) else [json.loads(ln) for ln in lines]
    except (json.JSONDecodeError, RecursionError) as exc:
        raise SpecsimError(f"{where} is not JSON or JSONL ({exc}); give the file the benchmark "
                           "wrote (vllm --save-result, sglang --output-file, trtllm-bench "
                           "--report_json, specsim bench --json) or a CSV") from None  # fmt: skip
    out = []
    for i, obj in enumerate(objs, start=1):
        at = where if len(objs) == 1 else f"{where} line {i}"
        if not isinstance(obj, dict):
            raise SpecsimError(f"{at} is not a JSON object; give a benchmark's result")
        if "summary" in obj and "config" in obj:
            out.append(_from_specsim(obj, at))
        elif "request_info" in obj or "world_info" in obj:  # trtllm-bench's sections
            out.append(_from_trtllm(obj, at))
        else:
            out.append(_from_bench_json(obj, at))
    return out


def _one(text: str) -> bool:
    """Whether ``text`` is one JSON value (a pretty-printed result spans lines)."""
    try:
        json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True


LENGTH_SPAN = 2.0  # a trace whose mean prompt or output is over 2x off the runs' is warned


def lengths_warning(model: Any, trace: Any) -> str | None:
    """One line when ``trace``'s requests are far from the runs a fitted ``model`` was fitted
    on (mean prompt or output tokens off by more than ``LENGTH_SPAN``x): the fitted terms hold
    for the steps those runs made (their prompt chunks, their contexts), not for other ones."""
    text = (model.meta or {}).get("baseline_lengths", "")
    try:
        p_fit, o_fit = (float(x) for x in text.split(":"))
    except ValueError:
        return None
    p_tr = float(np.mean(trace.prompt_len))
    o_tr = float(np.mean(trace.output_len))
    off = [(n, a, b) for n, a, b in (("prompt", p_tr, p_fit), ("output", o_tr, o_fit))
           if a > LENGTH_SPAN * b or b > LENGTH_SPAN * a]  # fmt: skip
    if not off:
        return None
    what = ", ".join(f"{n} {a:,.0f} tokens against the runs' {b:,.0f}" for n, a, b in off)
    return (
        f"profile {model.name!r} was fitted on runs whose requests differ from this trace's "
        f"({what}, means): its fitted terms may not hold here; fit on runs of this workload's "
        "lengths"
    )


__all__ = ["CSV_COLUMNS", "BaselinePoint", "lengths_warning", "read_baseline", "refuse_speculation"]

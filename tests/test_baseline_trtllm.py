"""``profile fit --baseline`` reads TensorRT-LLM's ``trtllm-bench --report_json`` (issue 64):
the report's shape as ``ReportUtility.get_statistics_dict`` writes it
(tensorrt_llm/bench/dataclasses/reporting.py, NVIDIA/TensorRT-LLM at 2787769c), numbers made up
but consistent; each field lands where the other formats put it, and every refusal is one line."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.sim.cost import build as bd
from specsim.sim.cost.baseline import BaselinePoint, read_baseline
from specsim.sim.cost.build_profile import build
from specsim.sim.cost.fit import simulated_tpot
from specsim.sim.cost.models import builtin_model

DEP = ["--model", "llama-3-8b", "--gpu", "h100", "--drafter", "dspark:layers=5,block=7"]


def _pct(avg: float) -> dict:
    return {"p50": avg, "p90": avg * 1.1, "p95": avg * 1.2, "p99": avg * 1.4,
            "minimum": avg * 0.8, "maximum": avg * 1.5, "average": avg}  # fmt: skip


def _report(in_flight: float, tok_s: float, tpot: float, *, prompt: float = 400.0,
            out: float = 200.0, ttft: float = 31.5, streaming: bool = True,
            max_batch_size: int = 256, **extra) -> dict:  # fmt: skip
    """A throughput report of 256 requests, laid out key for key as trtllm-bench writes it."""
    n = 256
    total_ms = 1000.0 * n * out / tok_s
    rep = {
        "engine": {"model": "meta-llama/Llama-3.1-8B", "model_path": "None",
                   "engine_dir": "None", "version": "1.1.0", "backend": "Pytorch",
                   "dtype": "bfloat16", "kv_cache_dtype": None, "quantization": None},
        "world_info": {"tp_size": 1, "pp_size": 1, "ep_size": None, "world_size": 1,
                       "max_batch_size": max_batch_size, "max_num_tokens": 8192,
                       "scheduling_policy": "GUARANTEED_NO_EVICT", "kv_cache_percentage": 0.9,
                       "issue_rate": 1.2e10},
        "request_info": {"num_requests": n, "avg_num_concurrent_requests": in_flight,
                         "avg_input_length": prompt, "avg_output_length": out},
        "performance": {"total_latency_ms": total_ms,
                        "avg_request_latency_ms": in_flight * total_ms / n,
                        "request_throughput_req_s": 1000.0 * n / total_ms,
                        "system_output_throughput_tok_s": tok_s,
                        "system_total_throughput_tok_s": tok_s * (prompt + out) / out,
                        "output_throughput_per_user_tok_s": 1000.0 / tpot,
                        "output_throughput_per_gpu_tok_s": tok_s,
                        "request_latency_percentiles_ms": _pct(in_flight * total_ms / n)},
        "dataset": {"isl_stats": _pct(prompt), "osl_stats": _pct(out),
                    "seq_len_stats": _pct(prompt + out), "num_requests": n,
                    "dataset_path": "/data/synthetic_400_200.jsonl", "max_isl": int(prompt),
                    "max_osl": int(out), "max_sequence_length": int(prompt + out),
                    "avg_isl": int(prompt), "avg_osl": int(out),
                    "avg_sequence_length": int(prompt + out)},
    }  # fmt: skip
    if streaming:
        rep["streaming_metrics"] = {
            "token_output_speed_tok_s": 1000.0 / tpot, "avg_ttft_ms": ttft, "avg_tpot_ms": tpot,
            "tpot_percentiles": _pct(tpot), "ttft_percentiles": _pct(ttft),
            "gen_tps_percentiles": _pct(1000.0 / tpot),
        }  # fmt: skip
    return rep | extra


def _write(path, rep: dict) -> str:
    path.write_text(json.dumps(rep, indent=4))
    return str(path)


def test_a_report_reads_into_the_run_it_measured(tmp_path):
    (p,) = read_baseline(_write(tmp_path / "c32.json", _report(31.3, 3650.0, 8.4)))
    assert p == BaselinePoint(concurrency=32, prompt_tokens=400.0, output_tokens=200.0,
                              output_tok_s=3650.0, mean_tpot_ms=8.4, mean_ttft_ms=31.5,
                              source=p.source)  # fmt: skip
    assert "c32.json" in p.source
    # the mean in flight is at most the run's --concurrency: rounded up, not to the nearest
    for in_flight, c in ((32.0, 32), (31.02, 32), (255.5, 256)):
        (q,) = read_baseline(_write(tmp_path / "c.json", _report(in_flight, 3650.0, 8.4)))
        assert q.concurrency == c, in_flight
    # the latency subcommand writes the same report (max_batch_size 1, one request in flight)
    (q,) = read_baseline(_write(tmp_path / "lat.json", _report(0.99, 160.0, 6.1,
                                                                max_batch_size=1)))  # fmt: skip
    assert (q.concurrency, q.mean_tpot_ms) == (1, 6.1)
    rep = _report(0.99, 160.0, 6.1)
    del rep["streaming_metrics"]["avg_ttft_ms"]
    (r,) = read_baseline(_write(tmp_path / "nottft.json", rep))
    assert r.mean_ttft_ms is None


def _refused(path: str, match: str) -> None:
    with pytest.raises(SpecsimError) as err:
        read_baseline(path)
    assert "\n" not in str(err.value) and match in str(err.value), str(err.value)


def test_a_report_with_speculation_is_refused(tmp_path):
    spec = {"mode": "Eagle3", "num_draft_tokens_percentiles": _pct(12.0),
            "num_accepted_draft_tokens_percentiles": _pct(5.0),
            "draft_acceptance_rate_percentiles": _pct(0.42),
            "acceptance_length_percentiles": _pct(2.7)}  # fmt: skip
    f = _write(tmp_path / "spec.json", _report(31.6, 5100.0, 6.0, decoding_stats=spec))
    _refused(f, "ran with speculation (decoding_stats mode 'Eagle3')")


def test_a_report_without_tpot_asks_for_streaming(tmp_path):
    _refused(_write(tmp_path / "s.json", _report(31.6, 3650.0, 8.4, streaming=False)),
             "--streaming")  # fmt: skip


@pytest.mark.parametrize(
    "section, key, value, match",
    [("streaming_metrics", "avg_tpot_ms", "8.4", "avg_tpot_ms is '8.4', not a finite number"),
     ("streaming_metrics", "avg_tpot_ms", float("nan"), "not a finite number"),
     ("performance", "system_output_throughput_tok_s", -3.0, "measured nothing"),
     ("request_info", "avg_input_length", None, "avg_input_length is None"),
     ("request_info", "avg_num_concurrent_requests", 0, "give this run as a CSV row"),
     ("request_info", "avg_num_concurrent_requests", None, "give this run as a CSV row"),
     ("request_info", "avg_num_concurrent_requests", -2.0, "measured nothing"),
     ("request_info", "avg_num_concurrent_requests", 256.4, "requests queued"),
     ("request_info", None, None, "request_info is None, not an object")],
)  # fmt: skip
def test_a_malformed_value_is_one_line(tmp_path, section, key, value, match):
    rep = _report(31.6, 3650.0, 8.4)
    if key is None:
        del rep[section]
    else:
        rep[section][key] = value
    _refused(_write(tmp_path / "bad.json", rep), match)


def test_two_reports_fit_a_profile(tmp_path, capsys):
    """Runs of a known deployment (GPU time x1.3, 0.6 ms a step) at 1 and 32 in flight, written
    as trtllm-bench reports; profile fit reads them and writes the fitted profile."""
    dep = bd.Deployment(model=builtin_model("llama-3-8b"), gpu="H100",
                        drafter="dspark:layers=5,block=7")  # fmt: skip
    built = build(dep)[0]
    truth = replace(built, step_ms=np.asarray(built.step_ms) * 1.3,
                    kv_read_us_per_ktoken=built.kv_read_us_per_ktoken * 1.3,
                    step_overhead_ms=0.6)  # fmt: skip
    files = []
    for c, in_flight in ((1, 0.98), (32, 31.4)):
        tpot = simulated_tpot(truth, BaselinePoint(c, 400.0, 200.0, 1.0, 1.0, None, "x"), seed=3)
        rep = _report(in_flight, 1000.0 * c / tpot, tpot)
        files.append(_write(tmp_path / f"c{c}.json", rep))
    assert [p.concurrency for f in files for p in read_baseline(f)] == [1, 32]
    out = tmp_path / "fitted.csv"
    assert main(["profile", "fit", *DEP, "--baseline", *files, "--out", str(out)]) == 0
    assert "GPU time (x the build)" in capsys.readouterr().out
    assert out.exists()
    assert main(["profile", "show", str(out)]) == 0
    assert "FITTED on your baseline" in capsys.readouterr().out

"""real-deployments: the report runs end to end on a tiny config and writes the issue's columns."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

TINY = {
    "kind": "real-deployments",
    "seed": 0,
    "trace_requests": 40,
    "min_requests": 24,
    "vllm_measured_profile": "vllm-v4-flash-tp4-b300",
    "vllm_src_model": "v4-flash", "vllm_src_gpu": "B300", "vllm_src_gpus": 4,
    "vllm_src_capture": 1024,
    "vllm_dst_model": "v4-pro", "vllm_dst_gpu": "B300", "vllm_dst_gpus": 8,
    "vllm_dst_capture": 4096,
    "vllm_max_running": 256, "vllm_max_batched_tokens": 8192, "vllm_kv_tokens": 2000000,
    "vllm_accept_profile": "chat", "vllm_auroc": 0.85,
    "vllm_prompt_median": 200, "vllm_prompt_sigma": 0.5,
    "vllm_output_median": 60, "vllm_output_sigma": 0.3,
    "vllm_concurrency": [1, 8],
    "vllm_arms": ["adaptive", "k3", "none"],
    "paper_gpus": ["H800"], "paper_capture": 512, "paper_concurrency": [1, 8, 32],
    "paper_max_running": 256, "paper_max_batched_tokens": 8192, "paper_kv_tokens": 2000000,
    "paper_accept_profile": "chat", "paper_auroc": 0.85, "paper_dspark_block": 5,
    "paper_mtp1_acceptance": 0.875, "paper_mtp_layers": 2,
    "paper_prompt_median": 200, "paper_prompt_sigma": 0.5,
    "paper_output_median": 60, "paper_output_sigma": 0.3,
}  # fmt: skip


def _toml(d: dict) -> str:
    def v(x: object) -> str:
        if isinstance(x, str):
            return f'"{x}"'
        if isinstance(x, list):
            return "[" + ", ".join(v(i) for i in x) + "]"
        return str(x)

    return "\n".join(f"{k} = {v(x)}" for k, x in d.items()) + "\n"


@pytest.mark.slow
def test_report_runs_on_a_tiny_config(tmp_path: Path) -> None:
    from specsim.analysis.report import run_report

    folder = tmp_path / "reports" / "rd"
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(_toml(TINY))
    readme = run_report("rd", root=folder.parent, workers=1)
    pred = pd.read_csv(folder / "predictions.csv")
    need = ["source", "model", "deployment", "arm", "concurrency", "throughput_tok_s",
            "interactivity_tok_s_user"]  # fmt: skip
    assert need == list(pred.columns[: len(need)])
    v = pred[pred["source"] == "vllm-adaptive-verification"]
    assert set(v["arm"]) == {"adaptive", "k3", "none"} and set(v["concurrency"]) == {1, 8}
    # the low table is the cheapest: never slower than the primary, which is never slower
    # than the high one (the same trace and seed on each)
    assert (v["throughput_tok_s_low"] >= v["throughput_tok_s"] * 0.999).all()
    assert (v["throughput_tok_s"] >= v["throughput_tok_s_high"] * 0.999).all()
    gains = pd.read_csv(folder / "paper_gains.csv")
    assert set(gains["model"]) == {"DeepSeek-V4-Flash", "DeepSeek-V4-Pro"}
    assert set(gains["table"]) == {"low", "primary", "high"}
    assert "DSpark paper production table" in readme.read_text()


@pytest.mark.slow
def test_the_scorecard_follows_from_the_shipped_run_and_the_published_table(tmp_path: Path):
    """scripts/score_real_deployments.py on the committed run gives the committed scorecard, and
    its gain score is (1 + predicted gain) / (1 + published gain) as pre-registered."""
    import shutil
    import sys

    root = Path(__file__).resolve().parents[1]
    shipped = root / "reports" / "real-deployments"
    for name in ("predictions.csv", "paper_gains.csv"):
        shutil.copy(shipped / name, tmp_path / name)
    sys.path.insert(0, str(root / "scripts"))
    try:
        import score_real_deployments as score
    finally:
        sys.path.pop(0)
    assert score.main([str(tmp_path)]) == 0
    got = pd.read_csv(tmp_path / "scorecard.csv")
    want = pd.read_csv(shipped / "scorecard.csv")
    pd.testing.assert_frame_equal(got, want)
    g = got[got["rule"] == "gain"]
    pred, pub = g["predicted"].astype(float), g["published"].astype(float)
    assert ((1 + pred) / (1 + pub) - g["score"].astype(float)).abs().max() < 1e-9
    assert (tmp_path / "vllm-pareto.png").stat().st_size > 10_000

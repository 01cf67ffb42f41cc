"""paper-check: the deployment facts stay in sync with their sources, and the report runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from specsim.errors import SpecsimError
from specsim.sim.deployments import (
    FLASH_DEPLOYMENT,
    FLASH_FIT,
    PRO_DEPLOYMENT,
    V4_FLASH,
    V4_PRO,
    transfer,
)
from specsim.sim.profiles import PROFILES, get_profile


def test_bytes_per_param_matches_download_over_params() -> None:
    # ~160 GB / 284B and ~865 GB / 1.6T: FP4 experts (~0.5 B) + FP8 rest (1 B), not FP8 (1.0)
    for m in (V4_FLASH, V4_PRO):
        bpp = m.download_bytes.value / m.total_params.value
        assert math.isclose(m.bytes_per_param, bpp)
        assert 0.5 < m.bytes_per_param < 0.6


def test_active_ratios_and_expert_share() -> None:
    assert math.isclose(V4_FLASH.active_params.value / V4_FLASH.total_params.value, 13 / 284)
    assert math.isclose(V4_PRO.active_params.value / V4_PRO.total_params.value, 49 / 1600)
    for m in (V4_FLASH, V4_PRO):
        s = m.expert_share
        p, k, e = m.total_params.value, m.top_k.value, m.routed_experts.value
        assert math.isclose((1 - s) * p + s * p * k / e, m.active_params.value, rel_tol=1e-9)
        assert 0.95 < s < 1.0


def test_pro_needs_more_than_one_node_flash_fits_one() -> None:
    node = FLASH_DEPLOYMENT.gpu.hbm_bytes.value * FLASH_DEPLOYMENT.gpu.per_node.value
    assert V4_PRO.download_bytes.value > node  # 865 GB > 8 x 96 GB
    assert PRO_DEPLOYMENT.gpus == 16
    assert FLASH_DEPLOYMENT.gpus == 8


def test_kv_is_a_tenth_of_v32() -> None:
    v32 = 61 * (512 + 64) * 2
    assert math.isclose(V4_PRO.kv_bytes_per_token, 0.1 * v32)
    assert math.isclose(V4_FLASH.kv_bytes_per_token, 0.1 * v32 * 43 / 61)


def test_every_fact_has_a_source() -> None:
    from dataclasses import fields

    from specsim.sim.deployments import Fact

    for obj in (V4_FLASH, V4_PRO, FLASH_DEPLOYMENT.gpu, FLASH_DEPLOYMENT):
        for f in fields(obj):
            v = getattr(obj, f.name)
            if isinstance(v, Fact):
                assert v.source.strip(), f.name


def test_all_to_all_is_derived_from_its_stated_sources() -> None:
    from specsim.sim.deployments import HGX_FABRIC, all_to_all

    f = HGX_FABRIC
    for fact in (f.nvlink_bw, f.nic_bw, f.dispatch_bytes, f.dispatch_scale_bytes, f.scale_block,
                 f.combine_bytes):  # fmt: skip
        assert fact.source.strip()
    # DeepSeek-V3 / DeepEP: dispatch FP8 with one FP32 scale per 128 values, combine BF16
    assert (f.dispatch_bytes.value, f.dispatch_scale_bytes.value) == (1, 4)
    assert (f.scale_block.value, f.combine_bytes.value) == (128, 2)
    # DeepEP's measured 2-node bottleneck (nominal CX7 400 Gb/s = 50 GB/s); H20 NVLink 900 / 2
    assert f.nic_bw.value == 43e9 and "43 GB/s" in f.nic_bw.source
    assert f.nvlink_bw.value == 450e9 and "900 GB/s" in f.nvlink_bw.source
    assert 5 < f.nvlink_bw.value / f.nic_bw.value < 20  # NICs ~10x slower than NVLink

    flash, pro = all_to_all(FLASH_DEPLOYMENT), all_to_all(PRO_DEPLOYMENT)
    assert flash.nic_share == 0 and flash.nic_us == 0  # one node: nothing crosses a NIC
    assert math.isclose(flash.nvlink_share, 7 / 8)
    assert (pro.nic_share, pro.nvlink_share) == (8 / 16, 7 / 16)  # 2 nodes of 8
    for m, a, dep in ((V4_FLASH, flash, FLASH_DEPLOYMENT), (V4_PRO, pro, PRO_DEPLOYMENT)):
        h = m.hidden.value
        assert a.bytes_per_copy == h * 1 + h / 128 * 4 + h * 2
        moved = m.top_k.value * a.bytes_per_copy * m.layers.value  # one token, all layers
        assert math.isclose(a.nvlink_us, 1e6 * moved * a.nvlink_share / (dep.gpus * 450e9))
        assert math.isclose(a.nic_us, 1e6 * moved * a.nic_share / (dep.gpus * 43e9))
    assert 5 < pro.nic_us < 7 and flash.total_us < 1  # microseconds per padded token


def test_paper_check_charges_the_all_to_all_per_padded_token() -> None:
    from specsim.analysis.reports.paper_check import Job, Variant, profile_for
    from specsim.sim.deployments import all_to_all

    def job(v: Variant) -> Job:
        return Job("v4-pro", 12.9, 60.0, v, (1.0,), 8, 8, 0)

    with_ = profile_for(job(Variant()))
    without = profile_for(job(Variant("a2a-x0", a2a_scale=0.0)))
    b = 512  # a CUDA-graph bucket: no padding
    extra_ms = (with_.step_time(b) - without.step_time(b)) * 1000
    assert math.isclose(extra_ms, all_to_all(PRO_DEPLOYMENT).total_us * b / 1000, rel_tol=1e-6)


def test_v4_pro_like_profile_is_built_from_the_facts() -> None:
    assert "v4-pro-like" in PROFILES
    p = get_profile("v4-pro-like")
    assert p.gpus == PRO_DEPLOYMENT.gpus
    assert "HF" in p.meta["total_params"] or "model card" in p.meta["total_params"]
    fit = transfer(FLASH_FIT, V4_PRO)
    assert p.meta["overhead_ms"].startswith(f"{fit.overhead_ms:g}")
    # Pro is slower than Flash at every batch (more active params, more layers)
    flash = get_profile("v4-flash-like")
    assert p.step_time(1) > flash.step_time(1)


def _tiny(tmp_path: Path, **extra: object) -> Path:
    folder = tmp_path / "reports" / "pc"
    folder.mkdir(parents=True)
    lines = [
        'kind = "paper-check"',
        "concurrency = [1, 4, 16]",
        "min_requests = 24",
        "trace_requests = 40",
        "fit_overhead_ms = [12.0]",
        "fit_per_token_us = [60.0]",
        "sensitivity = false",
    ]
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in extra.items()]
    (folder / "config.toml").write_text("\n".join(lines) + "\n")
    return folder


def test_report_runs_on_a_tiny_config(tmp_path: Path) -> None:
    from specsim.analysis.report import run_report

    folder = _tiny(tmp_path)
    readme = run_report("pc", root=folder.parent, workers=1)
    text = readme.read_text()
    assert "Predicted against published" in text
    assert (folder / "verified.png").is_file()
    assert (folder / "fit_grid.csv").is_file()


def test_report_refuses_an_unknown_key(tmp_path: Path) -> None:
    from specsim.analysis.report import run_report

    folder = _tiny(tmp_path, bogus=1)
    with pytest.raises(SpecsimError, match="unknown key 'bogus'"):
        run_report("pc", root=folder.parent, workers=1)

"""The deployment facts (specsim.sim.cost.deployments) stay in sync with their sources."""

from __future__ import annotations

import math

from specsim.sim.cost.deployments import FLASH_DEPLOYMENT, PRO_DEPLOYMENT, V4_FLASH, V4_PRO
from specsim.sim.cost.profiles import BUILT, PROFILES, build_line, get_profile


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

    from specsim.sim.cost.deployments import Fact

    for obj in (V4_FLASH, V4_PRO, FLASH_DEPLOYMENT.gpu, FLASH_DEPLOYMENT,
                FLASH_DEPLOYMENT.fabric, FLASH_DEPLOYMENT.fabric.ll_bench):  # fmt: skip
        for f in fields(obj):
            v = getattr(obj, f.name)
            if isinstance(v, Fact):
                assert v.source.strip(), f.name


def test_all_to_all_is_derived_from_its_stated_sources() -> None:
    from specsim.sim.cost.all_to_all import all_to_all
    from specsim.sim.cost.deployments import HGX_FABRIC

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


def test_latency_floor_is_deepeps_published_latency_less_its_transfer() -> None:
    # DeepEP docs/legacy.md, low-latency kernels: 128 tokens/GPU, hidden 7168, top-8;
    # dispatch / combine 77 / 114 us at EP 8, 118 / 195 us at EP 16 (H800, CX7 400 Gb/s)
    from specsim.sim.cost.all_to_all import all_to_all, latency_floor
    from specsim.sim.cost.deployments import HGX_FABRIC

    b = HGX_FABRIC.ll_bench
    assert (b.tokens_per_gpu.value, b.hidden.value, b.top_k.value) == (128, 7168, 8)
    assert (b.ep8_dispatch_us.value, b.ep8_combine_us.value) == (77, 114)
    assert (b.ep16_dispatch_us.value, b.ep16_combine_us.value) == (118, 195)
    for fact in (b.ep8_dispatch_us, b.ep16_dispatch_us, b.ep16_combine_us, b.tokens_per_gpu):
        assert "deepseek-ai/DeepEP" in fact.source and "128 tokens" in fact.source
    assert "118 us" in b.ep16_dispatch_us.source and "195 us" in b.ep16_combine_us.source
    assert b.nvlink_bw.value == 160e9 and "160 GB/s" in b.nvlink_bw.source

    fl = latency_floor(HGX_FABRIC)
    d_bytes = 128 * 8 * (7168 + 7168 / 128 * 4)  # FP8 + FP32 scales
    c_bytes = 128 * 8 * 7168 * 2  # BF16
    # EP 16 = 2 nodes of 8: half the copies cross the NICs (43 GB/s, DeepEP's measured)
    assert math.isclose(fl.dispatch_us, 118 - 1e6 * d_bytes / 2 / 43e9)
    assert math.isclose(fl.combine_us, 195 - 1e6 * c_bytes / 2 / 43e9)
    assert 25 < fl.dispatch_us < 35 and 20 < fl.combine_us < 30  # tens of us, not hundreds
    # EP 8 (one node): 7/8 of the copies over the benchmark's NVLink; the floor is no smaller
    assert math.isclose(fl.intranode_dispatch_us, 77 - 1e6 * d_bytes * 7 / 8 / 160e9)
    assert fl.intranode_dispatch_us + fl.intranode_combine_us >= fl.per_layer_us

    flash, pro = all_to_all(FLASH_DEPLOYMENT), all_to_all(PRO_DEPLOYMENT)
    assert flash.floor_us_per_layer == 0 and flash.floor_ms == 0  # one node: charged nowhere
    assert math.isclose(pro.floor_us_per_layer, fl.per_layer_us)
    assert pro.layers == V4_PRO.layers.value == 61
    assert math.isclose(pro.floor_ms, fl.per_layer_us * 61 / 1000)
    assert 3 < pro.floor_ms < 4


def test_v4_pro_16xh20_profile_is_built_from_the_facts() -> None:
    # The built V4-Pro (the retired roofline ``v4-pro-like`` and its FLASH_FIT transfer are
    # gone): the same deployment, priced by ``profile build`` from the same sourced facts.
    from specsim.sim.cost.models import model_arch

    assert "v4-pro-16xh20" in PROFILES
    p = get_profile("v4-pro-16xh20")
    assert p.gpus == PRO_DEPLOYMENT.gpus == 16
    assert p.meta["built_as"] == build_line(BUILT["v4-pro-16xh20"][1])
    arch = model_arch("deepseek-v4-pro")
    assert arch.layers == V4_PRO.layers.value and arch.hidden == V4_PRO.hidden.value
    assert "specsim/sim/cost/deployments.py" in p.meta["model_source"]
    assert "model card" in p.meta["model_source"]
    # Pro is slower than Flash at one token (more active params, more layers, two nodes)
    flash = get_profile("v4-flash-8xh20")
    assert flash.gpus == FLASH_DEPLOYMENT.gpus == 8
    assert p.step_time(1) > flash.step_time(1)

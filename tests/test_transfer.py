"""Carrying a measured table to another deployment (specsim.sim.cost.transfer) and the GPU facts.

- the fit never reads weights faster than the HBM's nominal bandwidth;
- carried to itself, the measured table comes back exactly at every measured size;
- each rule moves the term it names and nothing else (hand-checked factors);
- the range brackets the primary table at every size, step and draft;
- the accelerator facts agree with the deployments the paper check was built from.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.sim.cost.accelerators import ACCELERATORS, accelerator
from specsim.sim.cost.deployments import H20, H800, V4_FLASH, V4_PRO
from specsim.sim.cost.profiles import get_profile
from specsim.sim.cost.transfer import Layout, _carry, fit_step, transfer, transfer_range

MEASURED = get_profile("vllm-v4-flash-tp4-b300")
SRC = Layout(V4_FLASH, accelerator("B300"), 4, capture_max_tokens=1024)
DST = Layout(V4_PRO, accelerator("B300"), 8, capture_max_tokens=4096)


def test_fit_respects_the_nominal_bandwidth_and_fits_the_captured_sizes():
    fit = fit_step(MEASURED, SRC)
    assert fit.bandwidth_tb_s <= 8.0 + 1e-9
    b = MEASURED.batch_tokens[MEASURED.batch_tokens <= 1024]
    err = np.abs(fit.predict(SRC, b) / (MEASURED.step_time(b) * 1000) - 1)
    assert np.median(err) < 0.06  # three terms through 72 jagged points


def test_carried_to_itself_the_measured_table_comes_back_exactly():
    same = transfer(MEASURED, SRC, SRC)
    b = MEASURED.batch_tokens
    np.testing.assert_allclose(same.step_time(b), MEASURED.step_time(b), rtol=1e-12)
    r = np.array([x for x, _ in MEASURED.draft_curve])
    np.testing.assert_allclose(same.draft_ms(r, 7), MEASURED.draft_ms(r, 7), rtol=1e-9)


def test_each_rule_moves_its_own_term():
    fit = fit_step(MEASURED, SRC)
    c = _carry(fit, SRC, DST, "layers", "active")
    assert c.fixed_ms == pytest.approx(fit.fixed_ms * 61 / 43)
    assert c.ms_per_gb == pytest.approx(fit.ms_per_gb)  # same GPU, same bandwidth
    assert c.ms_per_token == pytest.approx(fit.ms_per_token * (49e9 / 8) / (13e9 / 4))
    assert _carry(fit, SRC, DST, "constant", "active").fixed_ms == fit.fixed_ms
    tp = _carry(fit, SRC, DST, "layers-tp", "active").fixed_ms
    assert tp == pytest.approx(fit.fixed_ms * 61 / 43 * (1 + math.log2(2) / 4))
    w = _carry(fit, SRC, DST, "layers", "width").ms_per_token
    assert w == pytest.approx(fit.ms_per_token * (61 * 7168 / 8) / (43 * 4096 / 4))
    h100 = replace(DST, gpu=accelerator("H100"))
    slow = _carry(fit, SRC, h100, "layers", "active")
    assert slow.ms_per_gb == pytest.approx(fit.ms_per_gb * 8e12 / 3.35e12)
    with pytest.raises(SpecsimError, match="unknown transfer rule"):
        _carry(fit, SRC, DST, "magic", "active")


def test_twice_the_gpus_read_half_the_weights_each():
    double = replace(SRC, gpus=8)
    np.testing.assert_allclose(double.weight_gb_per_gpu([1, 64, 4096]),
                               SRC.weight_gb_per_gpu([1, 64, 4096]) / 2)  # fmt: skip
    assert SRC.weight_gb_per_gpu(100_000) == pytest.approx(160.0 / 4, rel=1e-6)  # all experts


def test_the_range_brackets_the_primary_table():
    lo, prim, hi = transfer_range(MEASURED, SRC, DST, b_max=8192)
    b = np.arange(1, 8193)
    assert np.all(lo.step_time(b) <= prim.step_time(b) + 1e-15)
    assert np.all(prim.step_time(b) <= hi.step_time(b) + 1e-15)
    r = np.array([x for x, _ in prim.draft_curve])
    assert np.all(lo.draft_ms(r, 7) <= prim.draft_ms(r, 7) + 1e-12)
    assert np.all(prim.draft_ms(r, 7) <= hi.draft_ms(r, 7) + 1e-12)
    assert prim.gpus == 8 and prim.interpolation == "step" and prim.capture_max_tokens == 4096
    # a bigger model on twice the GPUs: every step costs more than the measured one inside the
    # graphs (more layers, 2.7x the weights per GPU, 1.9x the active parameters per GPU)
    small = b[b <= 1024]
    assert np.all(prim.step_time(small) > MEASURED.step_time(small))


def test_accelerator_facts_agree_with_the_paper_check_deployments():
    for gpu, name in ((H20, "H20"), (H800, "H800")):
        a = ACCELERATORS[name]
        assert float(a.hbm_bytes) == float(gpu.hbm_bytes)
        assert float(a.mem_bw) == float(gpu.mem_bw)
        assert a.flops("fp8") == float(gpu.flops)
    assert accelerator("b300").flops("fp4") == 13.5e15
    assert accelerator("h100").flops("fp4") == accelerator("h100").flops("fp8")  # no FP4 units
    assert accelerator("GB300").nvl_domain.value == 72
    with pytest.raises(SpecsimError, match="unknown GPU"):
        accelerator("A100")

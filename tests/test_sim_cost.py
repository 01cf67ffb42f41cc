"""The cost model: linear interpolation that keeps jags, extrapolation, CSV profiles, the built-in
profiles' shapes (CUDA-graph buckets, distinct experts)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specsim.errors import SpecsimError
from specsim.sim.cost.accelerators import accelerator
from specsim.sim.cost.build import distinct_experts
from specsim.sim.cost.graphs import cuda_graph_buckets
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.models import model_arch
from specsim.sim.cost.profiles import PROFILES, get_profile, read_profile_csv, write_profile_csv

JAGGED = CostModel("jagged", batch_tokens=np.array([1, 8, 9, 16]), step_ms=[5.0, 5.0, 9.0, 9.5])


def test_profiled_points_exact_and_linear_between():
    assert JAGGED.step_time(1) == pytest.approx(0.005)
    assert JAGGED.step_time(8) == pytest.approx(0.005)
    assert JAGGED.step_time(9) == pytest.approx(0.009)  # the jag survives: no smoothing
    # halfway between 9 and 16 (12.5 is not an integer: check 12 = 3/7 of the way)
    assert JAGGED.step_time(12) == pytest.approx((9.0 + 3 / 7 * 0.5) / 1000)


def test_extrapolates_linearly_beyond_and_holds_below():
    slope = (9.5 - 9.0) / (16 - 9) / 1000
    assert JAGGED.step_time(116) == pytest.approx(0.0095 + 100 * slope)
    assert JAGGED.step_time(0) == pytest.approx(0.005)  # held: never reaches zero
    assert JAGGED.b_max == 16


@given(st.lists(st.integers(0, 200), min_size=1, max_size=50))
def test_vectorised_equals_scalar(batches):
    arr = JAGGED.step_time(np.array(batches))
    assert arr.shape == (len(batches),)
    np.testing.assert_allclose(arr, [JAGGED.step_time(b) for b in batches], rtol=0, atol=1e-15)
    np.testing.assert_allclose(JAGGED.sps(np.array(batches)), 1.0 / arr)
    fn = JAGGED.step_time_fn()
    np.testing.assert_array_equal(fn(np.array(batches)), arr)


def test_draft_and_scheduler_costs():
    m = CostModel(
        "c",
        np.array([1, 2]),
        [1.0, 2.0],
        draft_base_ms=1.0,
        draft_per_request_ms=0.5,
        draft_per_token_ms=0.1,
        sched_base_us=10.0,
        sched_us_per_request=2.0,
    )
    assert m.draft_ms(4, 7) == pytest.approx(1.0 + 0.5 * 4 + 0.1 * 4 * 7)
    assert m.draft_ms(0, 7) == 0.0
    assert m.sched_s(5) == pytest.approx(20e-6)
    assert m.sched_s(0) == 0.0


def test_csv_round_trip(tmp_path):
    src = get_profile("llama-3-8b-h100")
    path = write_profile_csv(src, tmp_path / "p.csv")
    back = read_profile_csv(path)
    b = np.arange(0, 9000, 7)
    np.testing.assert_allclose(back.step_time(b), src.step_time(b), rtol=1e-5)
    assert back.scalars() == src.scalars()
    with pytest.raises(SpecsimError, match="exists"):
        write_profile_csv(src, path)


def test_csv_2d_interpolates_in_context(tmp_path):
    p = tmp_path / "twod.csv"
    p.write_text(
        "# sched_us_per_request: 3\n"
        "context_tokens,batch_tokens,step_ms\n"
        "1000,1,10\n1000,100,20\n3000,1,30\n3000,100,60\n"
    )
    m = get_profile(str(p))
    assert m.is_2d and m.sched_us_per_request == 3.0
    assert m.step_time(1, 1000) == pytest.approx(0.010)
    assert m.step_time(100, 2000) == pytest.approx(0.040)  # halfway in context
    assert m.step_time(1, 9000) == pytest.approx(0.030)  # clamped at the largest context


@pytest.mark.parametrize(
    "text, msg",
    [
        ("batch,ms\n1,2\n", "needs columns"),
        ("batch_tokens,step_ms\n1,2\n", "at least 2"),
        ("batch_tokens,step_ms\n1,2\n2,-1\n", "step_ms must be"),
        ("# kv_tokens: lots\nbatch_tokens,step_ms\n1,2\n2,3\n", "not a number"),
        ("batch_tokens,step_ms\n1,2\n1,3\n", "twice"),
    ],
)
def test_bad_csv_is_one_line_error(tmp_path, text, msg):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(SpecsimError, match=msg) as exc:
        get_profile(str(p))
    assert "\n" not in str(exc.value)


def test_unknown_profile_lists_names():
    with pytest.raises(SpecsimError, match="llama-3-8b-h100"):
        get_profile("llama-3-8b-h200")
    with pytest.raises(SpecsimError, match="does not exist"):
        get_profile("/nonexistent/p.csv")


def test_distinct_experts_limits():
    assert distinct_experts(1, 256, 8) == pytest.approx(8.0)
    assert distinct_experts(10_000, 256, 8) == pytest.approx(256.0)
    d = distinct_experts(np.arange(1, 500), 256, 8)
    assert np.all(np.diff(d) > 0)


def test_cuda_graph_buckets_are_vllms_capture_sizes():
    """1, 2, 4, then by 8 to 248, then by 16 to the capture limit (512 by default)."""
    want = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
    assert cuda_graph_buckets().tolist() == want
    assert cuda_graph_buckets(1024).tolist() == [*want, *range(528, 1025, 16)]


def test_a_captured_step_pays_its_bucket_and_an_eager_one_jumps():
    """The built profile reads its table as CUDA-graph steps up to the capture limit: a batch
    pays the next captured size (flat inside a bucket), and past the limit a step runs eager
    (the launches a graph hides come back: a jump)."""
    m = get_profile("llama-3-8b-h100")
    assert m.interpolation == "step" and m.capture_max_tokens == 512  # vLLM's on Hopper
    buckets = cuda_graph_buckets(m.capture_max_tokens)
    for lo, hi in zip(buckets[:-1], buckets[1:], strict=True):
        inside = m.step_time(np.arange(lo + 1, hi + 1))
        assert (inside == m.step_time(int(hi))).all(), (lo, hi)
    edge = m.step_time(np.array([512, 513])) * 1000
    assert edge[1] - edge[0] > 0.5


def test_builtin_profiles_have_their_hardwares_shape():
    """The built deployments (``specsim profile build`` from measured operator curves) against
    what their hardware implies; the retired hand-set roofline was checked against its own
    calibration targets instead (a production SLA regime), which the built ones are not
    tuned to."""
    h = get_profile("llama-3-8b-h100")
    arch, gpu = model_arch("llama-3-8b"), float(accelerator("H100").mem_bw)
    # memory-bound decode of bf16 weights: at least the non-embedding weights read once a
    # step, under 1.5 x reading every weight; still so at 64 tokens
    floor = (arch.total_params - arch.embedding_params) * 2 / gpu
    whole = arch.total_params * 2 / gpu
    assert floor < h.step_time(1) < 1.5 * whole
    assert floor < h.step_time(64) < 1.5 * whole
    # compute takes over: doubling B at 2048 nearly doubles the step
    assert h.step_time(4096) / h.step_time(2048) > 1.8
    v = get_profile("v4-flash-8xh20")
    # MoE: touching more experts makes small batches grow fast before compute takes over
    assert v.step_time(64) / v.step_time(1) > 1.5
    assert {"llama-3-8b-h100", "v4-flash-8xh20", "v4-pro-16xh20"} <= set(PROFILES.names())


def test_sched_scaled_profile_is_a_profile_name():
    """``NAME@sched-xS`` is parsed by get_profile itself (one place), so a sweep row's profile
    string replays on its own; a bad scale is a one-line error."""
    base = get_profile("v4-flash-8xh20")
    ten = get_profile("v4-flash-8xh20@sched-x10")
    assert ten.name == "v4-flash-8xh20@sched-x10"
    assert ten.sched_base_us == pytest.approx(10 * base.sched_base_us)
    assert ten.sched_us_per_request == pytest.approx(10 * base.sched_us_per_request)
    assert ten.step_time(64) == base.step_time(64)
    assert get_profile("v4-flash-8xh20@sched-x0").sched_s(64) == 0.0
    for bad in ("v4-flash-8xh20@sched-x", "v4-flash-8xh20@sched-x-1", "v4-flash-8xh20@sched-xinf"):
        with pytest.raises(SpecsimError, match="must be a scale >= 0"):
            get_profile(bad)


def test_a_verified_draft_token_pays_its_own_term(tmp_path):
    """``verify_draft_token_ms`` is charged once per verified draft token, accepted or not, and
    never to a run that drafts nothing; it survives the CSV round trip. Why: llama-server
    prices a draft token above another request's decode token (docs/llama-cpp.md)."""
    from dataclasses import replace

    from specsim.sim.simulate import replay

    base = CostModel(name="b", batch_tokens=np.array([1, 64]), step_ms=np.array([10.0, 40.0]),
                     emit_per_token_ms=0.01)  # fmt: skip
    extra = replace(base, name="x", verify_draft_token_ms=0.5)
    back = read_profile_csv(write_profile_csv(extra, tmp_path / "x.csv"))
    assert back.verify_draft_token_ms == 0.5 and back.scalars() == extra.scalars()
    trace = "chat-v3"  # a shipped trace by name
    kw = {"concurrency": 4, "requests": 12, "seed": 3, "serving": "v2", "record_tokens": False}
    a, b = (replay(trace, "full", profile=p, **kw) for p in (base, back))
    verified = a.summary["verified_draft_tokens"]
    assert verified > 0 and b.summary["verified_draft_tokens"] == verified
    busy = lambda r: float(r.steps["duration_s"].sum())  # noqa: E731
    assert busy(b) - busy(a) == pytest.approx(0.5e-3 * verified, rel=1e-9)
    ar = [replay(trace, "ar", profile=p, **kw) for p in (base, back)]
    assert busy(ar[1]) == busy(ar[0])

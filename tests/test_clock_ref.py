"""The reference clock (``--clock ref``): CPU time at the speed a probe had when the reference
was taken. A probe made to do twice the work stands for a machine twice as slow at that kind of
work: the clock must then count half. And the engine on the ref clock stays greedy-exact, keeps
the probes off its timeline, and reports its mean speed factor."""

from __future__ import annotations

import time

import numpy as np
import pytest
from record_tiny import tiny_model

torch = pytest.importorskip("torch")

from specsim.errors import SpecsimError  # noqa: E402
from specsim.policies import get_policy  # noqa: E402
from specsim.sim.cost.profiles import get_profile  # noqa: E402
from specsim.sim.workload import Workload  # noqa: E402
from specsim.torch_engine.clock import (  # noqa: E402
    EngineClock,
    SpeedRef,
    active_reference,
    ref_cpu_ms,
    use_reference,
)
from specsim.torch_engine.engine import EngineConfig, RealEngine  # noqa: E402
from specsim.torch_engine.proposers import NgramProposer  # noqa: E402


def burn(units: int) -> None:
    """Pure CPU work in fixed units (~8 ms each here), on this thread only: pure Python, so
    no BLAS helper thread can take part of it off the thread's CPU clock (a numpy matmul
    version read a doubled work as 0.99x in a CI run)."""
    acc = 0
    for i in range(units * 100_000):
        acc += i * i
    assert acc >= 0


def cpu_s(fn) -> float:  # type: ignore[no-untyped-def]
    c0 = time.thread_time()
    fn()
    return time.thread_time() - c0


def fake_probes(cpu: dict, work: dict, calls: dict | None = None) -> dict:
    """Probes that only advance a fake CPU clock (``cpu["s"]``) by ``work[phase]`` ms, read
    when called (so a test changes a kind of work's speed by editing ``work``), counting
    their calls in ``calls``."""

    def probe(phase: str):  # type: ignore[no-untyped-def]
        def run() -> None:
            if calls is not None:
                calls[phase] += 1
            cpu["s"] += work[phase] / 1000.0

        return run

    return {phase: probe(phase) for phase in work}


@pytest.mark.parametrize("kind", ["cold", "warm"])
def test_a_twice_slower_probe_halves_the_clock(monkeypatch, kind):
    """The factors' arithmetic on a CPU clock that only the probes advance (4 ms of work each,
    then 8 for the target): exact. On the real clock this VM's speed moved by up to 1.4x
    between a reference and calibrations a few hundred ms later, and a CI run read doubled
    numpy work as 0.99x, so the real clock is left to the marks below (each compared with
    the same interval timed around it) and to the engine tests."""
    import specsim.torch_engine.clock as clock_mod

    cpu = {"s": 0.0}
    work = {"target": 4.0, "draft": 4.0}
    calls = {"target": 0, "draft": 0}

    with monkeypatch.context() as m:
        m.setattr(clock_mod.time, "thread_time", lambda: cpu["s"])
        probes = fake_probes(cpu, work, calls)
        ref = SpeedRef(probes, every_s=1e9, window=5, probe=kind)
        assert ref.reference(repeats=5) == pytest.approx({"target": 4.0, "draft": 4.0})
        assert ref.speed("target") == 1.0 and ref.speed("anything else") == 1.0
        work["target"] = 8.0  # the target's kind of work is now "twice as slow"; drafting not
        before = dict(calls)
        ref.calibrate()
        per_probe = 1 if kind == "cold" else 2  # cold: one timed call; warm: a warm-up first
        assert {p: calls[p] - before[p] for p in calls} == {"target": per_probe, "draft": per_probe}
        assert ref.speed("target") == pytest.approx(2.0)
        assert ref.speed("draft") == pytest.approx(1.0)
        assert ref.speed("anything else") == pytest.approx(2.0)  # runs at the target's
        work["target"] = 12.0  # the median of the last 5: one outlier does not move it
        ref.calibrate()
        work["target"] = 8.0
        for _ in range(3):
            ref.calibrate()
        assert ref.speed("target") == pytest.approx(2.0)
    assert ref_cpu_ms(100.0, "target") == 100.0  # no active reference: unchanged
    clk = EngineClock("ref", ref)
    ref.calibrate = lambda phases=None: (0.0, 0.0)  # keep the factors just measured
    clk.start()
    t0 = clk.now()
    raw_t = cpu_s(lambda: burn(6))
    t1 = clk.mark("draft")
    raw_d = cpu_s(lambda: burn(6))
    t2 = clk.mark("target")
    assert (t1 - t0) == pytest.approx(raw_t / ref.speed("target"), rel=0.05)
    assert (t2 - t1) == pytest.approx(raw_d / ref.speed("draft"), rel=0.05)
    assert clk.raw_cpu_s == pytest.approx(raw_t + raw_d, rel=0.05)


def test_a_large_probe_times_large_forwards_at_its_own_speed(monkeypatch):
    """``--ref-large``: the large probe's factor over the small one's is carried between its
    (less frequent) re-timings, and a forward's factor is blended by its tokens in log space:
    4 tokens at the small probe's, 64 and more at the large one's, 16 half-way. Exact on a CPU
    clock that only the probes advance."""
    import math

    import specsim.torch_engine.clock as clock_mod
    from specsim.torch_engine.clock import LARGE

    cpu = {"s": 0.0}
    work = {"target": 4.0, LARGE: 40.0}
    calls = {"target": 0, LARGE: 0}

    with monkeypatch.context() as m:
        m.setattr(clock_mod.time, "thread_time", lambda: cpu["s"])
        probes = fake_probes(cpu, work, calls)
        sizes = {"target": 4, LARGE: 64}
        ref = SpeedRef(probes, every_s=1e9, probe="cold", sizes=sizes, large_every=2)
        ref.reference(repeats=3)
        work["target"], work[LARGE] = 8.0, 60.0  # small forwards 2x slower, large ones 1.5x
        before = dict(calls)
        ref.calibrate()  # calibration 0: both probes
        assert {p: calls[p] - before[p] for p in calls} == {"target": 1, LARGE: 1}
        assert ref.large_ratio == pytest.approx(0.75)
        assert ref.speed("target") == pytest.approx(2.0)  # no size: the small probe's
        assert ref.speed("target", 4) == pytest.approx(2.0)
        assert ref.speed("target", 1) == pytest.approx(2.0)  # clipped below
        assert ref.speed("target", 64) == pytest.approx(1.5)
        assert ref.speed("target", 300) == pytest.approx(1.5)  # clipped above
        assert ref.speed("target", 16) == pytest.approx(2.0 * math.sqrt(0.75))
        assert ref.factor[LARGE] == pytest.approx(1.5)
        work["target"], work[LARGE] = 4.0, 80.0  # the small probe back to 1x
        before = dict(calls)
        ref.calibrate()  # calibration 1: the small probe only; the ratio carries
        assert {p: calls[p] - before[p] for p in calls} == {"target": 1, LARGE: 0}
        assert ref.speed("target", 64) == pytest.approx(0.75)
        ref.calibrate()  # calibration 2: both again
        assert ref.speed("target", 64) == pytest.approx(2.0)
        assert ref.speed("draft:x", 64) == pytest.approx(1.0)  # other phases: no blend
    clk = EngineClock("ref", ref)
    ref.calibrate = lambda phases=None: (0.0, 0.0)  # keep the factors just measured
    clk.start()
    t0 = clk.mark("target", 64)
    raw_l = cpu_s(lambda: burn(6))
    t1 = clk.mark("target")
    raw_s = cpu_s(lambda: burn(6))
    t2 = clk.now()
    assert (t1 - t0) == pytest.approx(raw_l / 2.0, rel=0.05)
    assert (t2 - t1) == pytest.approx(raw_s / 1.0, rel=0.05)
    use_reference(ref)
    try:
        assert ref_cpu_ms(100.0, "target", 64) == pytest.approx(50.0)
        assert ref_cpu_ms(100.0, "target", 4) == pytest.approx(100.0)
    finally:
        use_reference(None)
    with pytest.raises(SpecsimError, match="sizes"):
        SpeedRef(probes, sizes={"target": 4, LARGE: 4})
    with pytest.raises(SpecsimError, match="large_every"):
        SpeedRef(probes, sizes=sizes, large_every=0)


def test_a_mid_probe_makes_the_blend_piecewise(monkeypatch):
    """``--ref-mid``: with probes at 4, 16 and 64 tokens the log ratio is interpolated
    piecewise in log tokens: exact at each probe's size, half-way at 8 and 32 tokens."""
    import math

    import specsim.torch_engine.clock as clock_mod
    from specsim.torch_engine.clock import LARGE, MID

    cpu = {"s": 0.0}
    work = {"target": 4.0, LARGE: 40.0, MID: 16.0}  # the large probe first

    with monkeypatch.context() as m:
        m.setattr(clock_mod.time, "thread_time", lambda: cpu["s"])
        probes = fake_probes(cpu, work)
        sizes = {"target": 4, MID: 16, LARGE: 64}
        ref = SpeedRef(probes, every_s=1e9, probe="cold", sizes=sizes, large_every=1)
        assert ref.sized == [MID, LARGE]  # by size, whatever the probes' order
        ref.reference(repeats=3)
        work["target"], work[MID], work[LARGE] = 8.0, 24.0, 80.0  # 2x, 1.5x, 2x slower
        ref.calibrate()
    assert ref.ratio == pytest.approx({MID: 0.75, LARGE: 1.0})
    assert ref.large_ratio == pytest.approx(1.0)
    assert ref.speed("target", 4) == pytest.approx(2.0)
    assert ref.speed("target", 16) == pytest.approx(1.5)
    assert ref.speed("target", 64) == pytest.approx(2.0)
    assert ref.speed("target", 8) == pytest.approx(2.0 * math.sqrt(0.75))
    assert ref.speed("target", 32) == pytest.approx(2.0 * math.sqrt(0.75))
    assert ref.speed("target", 1000) == pytest.approx(2.0)
    with pytest.raises(SpecsimError, match="sizes"):
        SpeedRef(probes, sizes={"target": 4, MID: 64, LARGE: 64})


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_sized_probes_on_a_real_model():
    """speed_reference with a mid and a large probe on a tiny real model: both timed at the
    reference and at the first calibration, their ratios finite and positive."""
    from specsim.torch_engine.clock import LARGE, MID
    from specsim.torch_engine.speed import speed_reference

    model = tiny_model(seed=3)
    ref = speed_reference(model, {}, context=16, probe="cold", large_tokens=32, mid_tokens=8)
    assert ref.sizes == {"target": 4, LARGE: 32, MID: 8} and ref.sized == [MID, LARGE]
    assert set(ref.ref_ms) == {"target", MID, LARGE} and min(ref.ref_ms.values()) > 0
    ref.calibrate()
    assert all(0 < r < 100 for r in ref.ratio.values())
    assert ref.speed("target", 8) == pytest.approx(ref.factor["target"] * ref.ratio[MID])


def test_an_adopted_reference_times_in_the_parents_units(monkeypatch):
    """A worker of ``validate --workers`` takes the parent's reference times instead of its
    own: on a core 1.5x slower than the parent's at the reference, its first calibration
    reads 1.5, not 1. A reference for other probes is refused."""
    import specsim.torch_engine.clock as clock_mod

    cpu = {"s": 0.0}
    work = {"target": 4.0, "draft": 2.0}
    with monkeypatch.context() as m:
        m.setattr(clock_mod.time, "thread_time", lambda: cpu["s"])
        parent = SpeedRef(fake_probes(cpu, work), probe="cold")
        parent.reference(repeats=3)
        work.update(target=6.0, draft=3.0)  # the worker's core
        worker = SpeedRef(fake_probes(cpu, work), probe="cold")
        worker.adopt(parent.ref_ms)
        assert worker.due() and worker.ref_ms == parent.ref_ms
        worker.calibrate()
        assert worker.speed("target") == pytest.approx(1.5)
        assert worker.speed("draft") == pytest.approx(1.5)
        with pytest.raises(SpecsimError, match="does not fit"):
            worker.adopt({"target": 4.0})


def test_a_reference_rebuilt_like_another_is_the_same_work():
    """``speed_reference(..., like=(ref_ms, repeat_k))`` on a tiny real model: the same probes,
    the cheap drafter's call count taken from the parent (not re-measured), its reference
    adopted, and its first calibration a factor near 1 on the same machine."""
    from specsim.torch_engine.clock import LARGE
    from specsim.torch_engine.speed import speed_reference

    model = tiny_model(seed=3)
    ngram = {"draft:ngram": NgramProposer(n=3, block_size=3)}
    parent = speed_reference(model, ngram, context=16, probe="cold", large_tokens=32)
    assert parent.repeat_k["draft:ngram"] >= 1
    k = {"draft:ngram": parent.repeat_k["draft:ngram"] + 5}  # a count the worker must take
    child = speed_reference(
        model, ngram, context=16, probe="cold", large_tokens=32, like=(parent.ref_ms, k)
    )
    assert child.ref_ms == parent.ref_ms and child.repeat_k == k
    assert set(child.probes) == {"target", LARGE, "draft:ngram"} and child.due()
    child.calibrate()
    assert 0.05 < child.speed("target") < 20  # the same machine: a factor, not a unit slip


def test_calibration_is_off_both_clocks():
    ref = SpeedRef({"target": lambda: burn(10)}, every_s=0.0)  # due at every tick
    ref.reference(repeats=1)
    clk = EngineClock("ref", ref)
    clk.start()
    before, w_before = clk.now(), clk.wall()
    spent = cpu_s(clk.tick)
    assert spent > 0.005 and clk.calibrations == 1
    assert clk.now() - before < 0.2 * spent  # the probes' seconds are not on the timeline
    assert clk.wall() - w_before < 0.2 * spent + 0.05
    use_reference(ref)
    try:
        assert active_reference() is ref
        assert ref_cpu_ms(100.0, "target") == pytest.approx(100.0 / ref.speed("target"))
    finally:
        use_reference(None)
    assert active_reference() is None


def test_refusals():
    with pytest.raises(SpecsimError, match="speed reference"):
        EngineClock("ref")
    with pytest.raises(SpecsimError, match="target"):
        SpeedRef({"draft": lambda: None})
    with pytest.raises(SpecsimError, match="probe kind"):
        SpeedRef({"target": lambda: None}, probe="hot")
    from specsim.torch_engine.clock import check_clock

    with pytest.raises(SpecsimError, match="GPU"):
        check_clock("ref", "cuda", 1)
    with pytest.raises(SpecsimError, match="--threads 1"):
        check_clock("ref", "cpu", 2)


def test_engine_on_the_ref_clock_is_exact_and_reports_its_speed():
    """The same closed-loop run on the cpu and the ref clock: identical tokens and steps; the
    ref run says its mean factor (raw CPU s over ref s) and its times are the cpu run's within
    the machine's drift (a loose bound: this test must not depend on a quiet machine)."""
    model = tiny_model(seed=3).double()
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 96, n).tolist() for n in (6, 9, 12, 8)]
    wl = Workload(
        kind="closed", describe="c2", arrival_s=None, trace_idx=np.arange(4),
        prompt_len=np.array([len(p) for p in prompts]), output_len=np.full(4, 24),
        concurrency=2, max_jobs=4,
    )  # fmt: skip
    out = {}
    for kind in ("cpu", "ref"):
        cfg = EngineConfig(max_running=2, warmup_steps=1, clock=kind)
        out[kind] = RealEngine(
            model, NgramProposer(2, 4), get_policy("full"), get_profile("h100-dense-8b"),
            prompts, wl, cfg,
        ).run()  # fmt: skip
    cpu, ref = out["cpu"], out["ref"]
    assert cpu.outputs == ref.outputs
    assert np.array_equal(cpu.steps["batch_tokens"], ref.steps["batch_tokens"])
    f = ref.config["speed_factor"]
    assert np.isfinite(f) and 0.3 < f < 3.0
    assert ref.config["raw_cpu_s"] > 0 and ref.config["speed_calibrations"] >= 0
    ratio = ref.summary["sim_time_s"] / cpu.summary["sim_time_s"]
    assert 0.3 < ratio < 3.0
    assert "speed_factor" not in cpu.config
    assert active_reference() is None  # the engine's own reference is not left behind

"""Policies: exact cases, invariants as properties, non-anticipation, and the registry."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from specsim.errors import SpecsimError
from specsim.policies import POLICIES, Policy, StepInput, check_lengths, get_policy
from specsim.policies.calibrate import apply_sts, calibrate_trace, ece_many, fit_sts
from specsim.policies.hw_aware import global_budget, ranked_candidates, throughput_curve
from specsim.trace.model import Trace

APPENDIX_A_MS = np.array([np.inf, 1000.0, 2000.0, 1000.0 / 0.45])  # SPS(1)=1, (2)=.5, (3)=.45


def table_step_time(ms: np.ndarray):
    """A step-time function from a dense table of milliseconds indexed by B (extended flat)."""

    def step_time(b):
        b = np.minimum(np.asarray(b), len(ms) - 1)
        return ms[b] / 1000.0

    return step_time


def linear_step_time(base_ms: float = 10.0, per_token_ms: float = 0.05):
    return lambda b: (base_ms + per_token_ms * np.asarray(b, dtype=np.float64)) / 1000.0


CONFIDENT_POLICIES = [
    "ar",
    "mtp1",
    "static:3",
    "full",
    "threshold:0.5",
    "cum-threshold:0.3",
    "hw-aware",
    "hw-aware-global",
    "zos",
    "goodput",
    "vllm-adaptive",
    "llama-dspark:0.5",
]


# ---------------------------------------------------------------- exact cases
def test_appendix_a_early_stop_verifies_nothing_global_verifies_two():
    st_fn = table_step_time(APPENDIX_A_MS)
    after_a = StepInput(conf=np.array([[0.8, 0.9]]), step_time=st_fn)
    after_b = StepInput(conf=np.array([[0.8, 0.0]]), step_time=st_fn)
    assert get_policy("hw-aware")(after_a).tolist() == [0]
    assert get_policy("hw-aware")(after_b).tolist() == [0]
    assert get_policy("hw-aware-global")(after_a).tolist() == [2]
    assert get_policy("hw-aware-global")(after_b).tolist() == [0]


def test_algorithm1_by_hand():
    # Two requests, linear cost 10 ms + 1 ms per token: Theta_0 = 2 / 12ms.
    conf = np.array([[0.9, 0.9, 0.1], [0.5, 0.2, 0.9]])
    inp = StepInput(conf=conf, step_time=linear_step_time(10.0, 1.0))
    # survivals: r0: .9 .81 .081; r1: .5 .1 .09 -> order .9(r0) .81(r0) .5(r1) .1(r1) .09 .081
    req, surv = ranked_candidates(conf)
    assert req.tolist() == [0, 0, 1, 1, 1, 0]
    np.testing.assert_allclose(surv, [0.9, 0.81, 0.5, 0.1, 0.09, 0.081])
    theta = throughput_curve(surv, 2, inp.step_time)
    tau = 2 + np.concatenate(([0], np.cumsum(surv)))
    np.testing.assert_allclose(theta, tau / ((10 + np.arange(2, 9)) / 1000))
    # marginal gain of a candidate = a > tau/(B+10)... admitted while theta increases
    expected = int(np.flatnonzero(np.diff(theta) <= 0)[0])
    lengths = get_policy("hw-aware")(inp)
    assert lengths.sum() == expected
    assert lengths.tolist() == np.bincount(req[:expected], minlength=2).tolist()


def test_thresholds_cut_at_first_failure():
    conf = np.array([[0.9, 0.4, 0.95], [0.3, 0.9, 0.9], [0.8, 0.8, 0.8]])
    inp = StepInput(conf=conf, step_time=linear_step_time())
    assert get_policy("threshold:0.5")(inp).tolist() == [1, 0, 3]
    # survivals: .9 .36 .342 | .3 .27 .243 | .8 .64 .512
    assert get_policy("cum-threshold:0.37")(inp).tolist() == [1, 0, 3]
    assert get_policy("cum-threshold:0.6")(inp).tolist() == [1, 0, 2]


def test_static_ar_full_mtp1():
    inp = StepInput(conf=np.full((4, 5), 0.5), step_time=linear_step_time())
    assert get_policy("ar")(inp).tolist() == [0] * 4
    assert get_policy("mtp1")(inp).tolist() == [1] * 4
    assert get_policy("static:3")(inp).tolist() == [3] * 4
    assert get_policy("static:9")(inp).tolist() == [5] * 4
    assert get_policy("full")(inp).tolist() == [5] * 4


def test_goodput_follows_the_cost_model():
    conf = np.full((8, 4), 0.5)
    flat = StepInput(
        conf=conf, step_time=lambda b: np.full(np.shape(b), 0.01), accept_rate=np.full(4, 0.8)
    )
    assert get_policy("goodput")(flat).tolist() == [4] * 8  # free tokens: verify everything
    steep = StepInput(conf=conf, step_time=linear_step_time(1.0, 10.0), accept_rate=np.full(4, 0.8))
    assert get_policy("goodput")(steep).tolist() == [0] * 8  # each token costs more than it gives


def test_zos_budget_from_lagged_then_top_k_on_current():
    rng = np.random.default_rng(3)
    conf = rng.uniform(0.2, 1.0, size=(6, 7))
    st_fn = linear_step_time(10.0, 0.3)
    same = StepInput(conf=conf, step_time=st_fn, lagged_conf=conf)
    np.testing.assert_array_equal(get_policy("zos")(same), get_policy("hw-aware-global")(same))
    lagged = np.clip(conf[::-1] * 0.5, 0, 1)
    inp = StepInput(conf=conf, step_time=st_fn, lagged_conf=lagged)
    lengths = get_policy("zos")(inp)
    assert lengths.sum() == global_budget(lagged, st_fn)
    req, _ = ranked_candidates(conf)  # the budget goes to the best CURRENT candidates
    assert lengths.tolist() == np.bincount(req[: lengths.sum()], minlength=6).tolist()
    assert get_policy("zos").zos and not get_policy("hw-aware").zos


def test_oracle_reads_the_truth_and_nothing_else_may():
    inp = StepInput(
        conf=np.full((3, 4), 0.5), step_time=linear_step_time(), accept_len=np.array([0, 4, 2])
    )
    assert get_policy("oracle")(inp).tolist() == [0, 4, 2]
    with pytest.raises(SpecsimError, match="accept_len"):
        get_policy("oracle")(StepInput(conf=np.full((1, 4), 0.5), step_time=linear_step_time()))
    assert not get_policy("oracle").lossless and not get_policy("hw-aware-global").lossless


# ---------------------------------------------------------------- properties
conf_arrays = st.integers(0, 12).flatmap(
    lambda r: st.integers(1, 7).flatmap(
        lambda g: hnp.arrays(np.float64, (r, g), elements=st.floats(0.0, 1.0))
    )
)
step_tables = hnp.arrays(np.float64, st.integers(2, 100), elements=st.floats(1.0, 50.0)).map(
    lambda a: np.concatenate(([np.inf], np.maximum.accumulate(a)))  # non-decreasing, jagged
)


@given(conf=conf_arrays, ms=step_tables, rate=st.floats(0.0, 1.0))
def test_lengths_valid_and_deterministic(conf, ms, rate):
    st_fn = table_step_time(ms)
    inp = StepInput(
        conf=conf,
        step_time=st_fn,
        lagged_conf=conf[::-1].copy(),
        accept_rate=np.full(conf.shape[1], rate),
        accept_len=np.zeros(conf.shape[0], dtype=int),
    )
    for name in [*CONFIDENT_POLICIES, "oracle"]:
        first = check_lengths(get_policy(name)(inp), inp, name)
        again = get_policy(name)(inp)
        np.testing.assert_array_equal(first, again)
        assert ((first >= 0) & (first <= conf.shape[1])).all()


@given(conf=conf_arrays, ms=step_tables)
def test_hw_aware_stops_at_the_first_non_improvement(conf, ms):
    inp = StepInput(conf=conf, step_time=table_step_time(ms))
    n = int(get_policy("hw-aware")(inp).sum())
    _, surv = ranked_candidates(conf)
    theta = throughput_curve(surv, conf.shape[0], inp.step_time)
    assert np.all(np.diff(theta[: n + 1]) > 0)  # every admission improved Theta
    if n < surv.shape[0]:
        assert theta[n + 1] <= theta[n]  # and the next one would not have


@given(conf=conf_arrays, ms=step_tables, data=st.data())
def test_non_anticipation(conf, ms, data):
    """Whether draft k of request r is verified must not depend on c_{r,k+1..}: perturb those
    and the event {l_r >= k} stays the same, for every lossless policy."""
    if conf.shape[0] == 0:
        return
    r = data.draw(st.integers(0, conf.shape[0] - 1))
    k = data.draw(st.integers(1, conf.shape[1]))
    tail = data.draw(hnp.arrays(np.float64, conf.shape[1] - k, elements=st.floats(0.0, 1.0)))
    other = conf.copy()
    other[r, k:] = tail
    st_fn = table_step_time(ms)
    lagged = np.full_like(conf, 0.6)
    for name in ["full", "static:2", "threshold:0.5", "cum-threshold:0.3", "hw-aware", "zos",
                 "vllm-adaptive"]:  # fmt: skip
        a = get_policy(name)(StepInput(conf=conf, step_time=st_fn, lagged_conf=lagged))
        b = get_policy(name)(StepInput(conf=other, step_time=st_fn, lagged_conf=lagged))
        assert (a[r] >= k) == (b[r] >= k), name


def test_global_search_is_anticipating():
    """The same property fails for hw-aware-global: Appendix A is a counterexample."""
    st_fn = table_step_time(APPENDIX_A_MS)
    a = get_policy("hw-aware-global")(StepInput(conf=np.array([[0.8, 0.9]]), step_time=st_fn))
    b = get_policy("hw-aware-global")(StepInput(conf=np.array([[0.8, 0.0]]), step_time=st_fn))
    assert (a[0] >= 1) != (b[0] >= 1)


# ---------------------------------------------------------------- registry
def test_unknown_policy_lists_names_and_suggests():
    with pytest.raises(SpecsimError) as err:
        get_policy("hw-awar")
    msg = str(err.value)
    assert "did you mean 'hw-aware'" in msg and "zos" in msg and "\n" not in msg


@pytest.mark.parametrize("spec", ["static", "static:x", "static:-1", "threshold:2", "full:3"])
def test_bad_policy_arguments(spec):
    with pytest.raises(SpecsimError):
        get_policy(spec)


def test_duplicate_registration_refused():
    with pytest.raises(ValueError, match="twice"):
        POLICIES.register("hw-aware")(lambda arg: None)


def test_user_policy_from_module_callable(tmp_path, monkeypatch):
    (tmp_path / "my_sched.py").write_text(
        textwrap.dedent("""
        import numpy as np
        from specsim.policies import Policy

        def two(inp):
            return np.full(inp.n_requests, 2)

        def make():
            return Policy(name="mine", schedule=two, zos=True)

        def bad(inp):
            return np.full(inp.n_requests + 1, 2)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    inp = StepInput(conf=np.full((3, 4), 0.5), step_time=linear_step_time())
    assert get_policy("my_sched:two")(inp).tolist() == [2, 2, 2]
    made = get_policy("my_sched:make")
    assert isinstance(made, Policy) and made.zos and made(inp).tolist() == [2, 2, 2]
    with pytest.raises(SpecsimError, match="shape"):
        check_lengths(get_policy("my_sched:bad")(inp), inp, "my_sched:bad")
    with pytest.raises(SpecsimError, match="cannot import module"):
        get_policy("no_such_module_xyz:f")
    with pytest.raises(SpecsimError, match="no attribute"):
        get_policy("my_sched:nope")
    sys.modules.pop("my_sched", None)


# ---------------------------------------------------------------- STS
def _overconfident_trace(n_req=400, gamma=4, seed=0, temp=2.5):
    """Rows whose true conditional acceptance is pi, with reported c = sigmoid(temp*logit pi)."""
    rng = np.random.default_rng(seed)
    rows = n_req * 20
    pi = rng.beta(2, 2, size=(rows, gamma))
    acc = rng.random((rows, gamma)) < pi
    accept_len = np.cumprod(acc, axis=1).sum(axis=1).astype(np.int16)
    logit = np.log(pi) - np.log1p(-pi)
    conf = (1 / (1 + np.exp(-temp * logit))).astype(np.float32)
    offsets = np.arange(0, rows + 1, 20, dtype=np.int64)
    n = np.full(n_req, 20, dtype=np.int32)
    return Trace(
        request_ids=np.arange(n_req),
        prompt_len=n,
        output_len=n,
        offsets=offsets,
        conf=conf,
        accept_len=accept_len,
    ), pi


def test_sts_recovers_temperature_and_lowers_ece():
    trace, _ = _overconfident_trace()
    temps = fit_sts(trace.conf, trace.accept_len)
    assert abs(temps[0] - 2.5) / 2.5 < 0.15  # position 1 sees the true conditional directly
    calibrated = apply_sts(trace.conf, temps)
    for k in range(trace.block_size):
        labels = (trace.accept_len >= k + 1).astype(float)
        raw = np.cumprod(trace.conf.astype(float), axis=1)[:, k]
        cal = np.cumprod(calibrated.astype(float), axis=1)[:, k]
        e_raw, e_cal = ece_many(np.stack([raw, cal]), labels)
        assert e_cal < e_raw and e_cal < 0.03, (k, e_raw, e_cal)
        # order-preserving within a position
        order = np.argsort(trace.conf[:, k], kind="stable")
        assert np.all(np.diff(calibrated[order, k]) >= 0)


def test_calibrate_trace_holds_out_requests():
    trace, _ = _overconfident_trace(n_req=50)
    rest, temps = calibrate_trace(trace, holdout=0.3, seed=1)
    assert rest.n_requests == 35 and temps.shape == (4,)
    again, temps2 = calibrate_trace(trace, holdout=0.3, seed=1)
    np.testing.assert_array_equal(rest.conf, again.conf)
    with pytest.raises(SpecsimError):
        calibrate_trace(trace, holdout=1.5)


# ---------------------------------------------------------------- the fast forms (issue #13)
# The simulator's speed work replaced hw-aware's full stable sort by a selection where it can,
# ZOS's top-K by a partition, and added ``Policy.solo`` (one request, many rows at once). These
# tests hold each fast form to the plain algorithm: the same lengths, exactly.


def _reference_lengths(name: str, inp: StepInput) -> np.ndarray:
    """The plain algorithms: full stable sort, the whole Theta curve."""
    from specsim.policies.hw_aware import early_stop_count, lengths_from_admitted

    r = inp.n_requests
    req, surv = ranked_candidates(inp.conf)
    if name == "hw-aware":
        n = early_stop_count(throughput_curve(surv, r, inp.step_time))
    else:  # zos: budget from the lagged rows; hw-aware-global: from the current ones
        lagged = inp.lagged_conf if name == "zos" else inp.conf
        n = global_budget(lagged, inp.step_time)
    return lengths_from_admitted(req, n, r)


def _tied_conf(rng: np.random.Generator, r: int, gamma: int) -> np.ndarray:
    """Confidences from a few levels (ties across requests), with zeros and ones."""
    levels = np.array([0.0, 0.25, 0.5, 0.8, 0.9, 1.0])
    return levels[rng.integers(0, levels.size, size=(r, gamma))]


STEP_TIMES = {
    "linear": linear_step_time(),
    "steep": linear_step_time(5.0, 0.5),
    "flat": linear_step_time(10.0, 0.0),
    "jagged": table_step_time(np.array([10.0] * 8 + [14.0] * 16 + [20.0] * 4096)),
}


@pytest.mark.parametrize("name", ["hw-aware", "zos", "hw-aware-global"])
@pytest.mark.parametrize("st_name", list(STEP_TIMES))
def test_fast_forms_match_the_plain_algorithm(name, st_name):
    """Many random batches (ties included), each decided by the policy and by the plain sort."""
    from specsim.policies import hw_aware

    rng = np.random.default_rng(13)
    pol = get_policy(name)
    st_fn = STEP_TIMES[st_name]
    for trial in range(300):
        r = int(rng.integers(1, 80))
        gamma = int(rng.integers(1, 9))
        make = _tied_conf if trial % 2 else (lambda g, a, b: g.uniform(0, 1, (a, b)))
        conf, lagged = make(rng, r, gamma), make(rng, r, gamma)
        if trial % 50 == 7:  # NaN never comes from a valid trace, but must not change answers
            conf[rng.integers(0, r), rng.integers(0, gamma)] = np.nan
        surv = np.cumprod(conf.astype(np.float64), axis=1)
        for given_surv in (None, surv):  # the engine passes precomputed survivals
            inp = StepInput(
                conf=conf,
                step_time=st_fn,
                lagged_conf=lagged,
                survival=given_surv,
                lagged_survival=None if given_surv is None else np.cumprod(lagged, axis=1),
            )
            want = _reference_lengths(name, inp)
            np.testing.assert_array_equal(pol.schedule(inp), want, err_msg=f"trial {trial}")
        # a wrong speed hint costs time, never a different answer
        hw_aware._STOP_HINT[0] = float(rng.choice([0.0, 0.5, 100.0]))


@pytest.mark.parametrize(
    "spec",
    ["hw-aware", "hw-aware-global", "zos", "ar", "mtp1", "static:3", "full", "threshold:0.5",
     "cum-threshold:0.3", "oracle"],
)  # fmt: skip
def test_solo_agrees_with_schedule(spec):
    """``Policy.solo`` over many rows == ``schedule`` of a lone request with each row."""
    pol = get_policy(spec)
    assert pol.solo is not None
    rng = np.random.default_rng(7)
    for st_fn in STEP_TIMES.values():
        for gamma in (1, 4, 7):
            conf = np.concatenate((_tied_conf(rng, 200, gamma), rng.uniform(0, 1, (200, gamma))))
            acc = rng.integers(0, gamma + 1, size=conf.shape[0])
            got = pol.solo(conf, acc, st_fn)
            for i in range(conf.shape[0]):
                row = conf[i : i + 1]
                inp = StepInput(
                    conf=row if not pol.solo_lagged else rng.uniform(0, 1, (1, gamma)),
                    step_time=st_fn,
                    lagged_conf=row if pol.solo_lagged else None,
                    accept_len=acc[i : i + 1],
                )
                assert got[i] == pol.schedule(inp)[0], (spec, gamma, i)


def test_solo_refuses_rows_outside_the_unit_interval():
    """A row whose survival rises (confidence > 1) breaks the lone-request order: ValueError,
    and the engine then schedules step by step."""
    conf = np.array([[0.5, 1.5, 0.9]])
    with pytest.raises(ValueError):
        get_policy("hw-aware").solo(conf, np.array([1]), linear_step_time())


@pytest.mark.parametrize("spec", ["ar", "mtp1", "static:3", "full", "threshold:0.5",
                                  "cum-threshold:0.3", "oracle"])  # fmt: skip
def test_rowwise_solo_holds_at_any_batch(spec):
    """``rowwise`` promises that ``solo`` row by row equals ``schedule`` over a whole batch."""
    pol = get_policy(spec)
    assert pol.rowwise
    rng = np.random.default_rng(11)
    for r in (2, 5, 40):
        conf = np.concatenate((_tied_conf(rng, r, 7), rng.uniform(0, 1, (r, 7))))
        acc = rng.integers(0, 8, size=2 * r)
        for st_fn in STEP_TIMES.values():
            inp = StepInput(conf=conf, step_time=st_fn, accept_len=acc)
            np.testing.assert_array_equal(pol.solo(conf, acc, st_fn), pol.schedule(inp))


def test_coupled_policies_are_not_rowwise():
    for spec in ("hw-aware", "hw-aware-global", "zos", "goodput"):
        assert not get_policy(spec).rowwise


def _goodput_arrays(inp: StepInput) -> int:
    """``goodput``'s choice as first written, in numpy arrays: the reference its Python-float
    form must match exactly (issue #13 made it faster, not different)."""
    r, gamma = inp.n_requests, inp.gamma
    rate = np.full(gamma, 0.5) if inp.accept_rate is None else inp.accept_rate
    survival = np.cumprod(np.clip(np.asarray(rate, dtype=np.float64)[:gamma], 0.0, 1.0))
    k = np.arange(gamma + 1)
    expected = r * (1.0 + np.concatenate(([0.0], np.cumsum(survival))))
    return int(np.argmax(expected / np.asarray(inp.step_time(r * (1 + k)), dtype=np.float64)))


def test_goodput_matches_the_array_form_exactly():
    rng = np.random.default_rng(11)

    def cliff(b):
        b = np.asarray(b, dtype=np.float64)
        return (8.0 + 0.02 * b) * (1 + 0.4 * (b > 64)) / 1000.0

    for trial in range(3000):
        g, r = int(rng.integers(1, 9)), int(rng.integers(1, 200))
        rate = None if trial % 7 == 0 else rng.random(g) ** rng.choice([0.2, 1.0, 3.0])
        if rate is not None and trial % 5 == 0:
            rate[int(rng.integers(0, g))] = rng.choice([np.nan, 1.0, 0.0, -0.0, 1.5])
        inp = StepInput(conf=np.zeros((r, g), np.float32), step_time=cliff, accept_rate=rate)
        assert get_policy("goodput")(inp).tolist() == [_goodput_arrays(inp)] * r


def test_the_engines_fast_step_input_is_the_same_object_as_the_dataclass():
    """``step_input`` (the hot loop's constructor) gives what ``StepInput(**fields)`` gives:
    every field, defaults included, frozen, and an unknown name refused."""
    import dataclasses

    from specsim.policies.base import step_input

    conf = np.full((3, 4), 0.5)
    kw = {"conf": conf, "step_time": lambda b: b * 1.0, "survival": np.cumprod(conf, axis=1)}
    fast, slow = step_input(**kw), StepInput(**kw)
    for f in dataclasses.fields(StepInput):
        assert getattr(fast, f.name) is getattr(slow, f.name), f.name
    assert (fast.n_requests, fast.gamma) == (3, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.conf = conf  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field 'confidence'"):
        step_input(confidence=conf, step_time=kw["step_time"])
    assert dataclasses.replace(fast, accept_rate=np.ones(4)).survival is kw["survival"]

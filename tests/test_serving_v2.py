"""Serving model v2 (specsim.sim.serving): each mechanism against an analytic expectation.

- chunked prefill: no decoding request waits longer than one step of a full token budget,
  however long a prompt arrives (a whole prompt in one step would stall them for all of it);
- paged KV admits at least as many requests as the clairvoyant reservation, and preempts only
  when its blocks run out; a preempted request is recomputed and still emits every token;
- drafting is charged by what is drafted: ``ar`` does not move when the drafter costs 100x;
  ``mtp1`` pays a one-token draft; a skipped draft costs nothing;
- a decode step at context 30,000 costs more than at 16 on every GPU profile;
- the lone request's walk gives the step path's tables bit for bit.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specsim.sim.serving as serving
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.profiles import get_profile
from specsim.sim.simulate import replay
from specsim.sim.toy import iid_trace

GPU_PROFILES = ("llama-3-8b-h100", "v4-flash-8xh20", "v4-pro-16xh20")


def _trace(n, out, gamma=4, alpha=0.8, prompt=64, seed=0):
    tr = iid_trace(n, out, gamma=gamma, alpha=alpha, seed=seed)
    tr.prompt_len[:] = prompt
    return tr


def _quiet(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return replay(**kw)


def test_chunked_prefill_bounds_every_decoders_wait():
    """Eight requests decode; one 64k-token prompt arrives. In v2 its prefill is cut into
    budget-sized chunks, so every step with decoders lasts at most one full-budget step (plus
    drafting and KV); a whole prompt in one step (the retired serving model v1) stalls them
    for all of it."""
    from specsim.sim.workload import make_workload

    prof = get_profile("llama-3-8b-h100")
    tr = _trace(9, 400, prompt=32)
    # the ninth job (it starts when the first of eight finishes) gets the long prompt
    tr.prompt_len[make_workload(tr, concurrency=8, requests=9).job(8)[0]] = 64_000
    budget = 2048
    kw = dict(
        trace=tr, policy="static:2", concurrency=8, requests=9, profile=prof,
        max_batched_tokens=budget, kv_tokens=200_000, record_tokens=False,
    )  # fmt: skip
    v2 = _quiet(**kw).steps
    dec = v2[v2["decoding"] > 0]
    worst_ctx = 9 * (64_000 + 400 + 8)
    # the built profile's engine terms too: per request and verified token (verify_s), the
    # drafter's context, and the longer of the KV read and attention's compute (3 queries)
    worst_kv = max(prof.kv_read_s(worst_ctx), prof.attn_us_per_qk_ktoken * 1e-9 * 3 * worst_ctx)
    step = prof.verify_s(budget, 0, 9, prof.step_time_fn(), draft_tokens=18)
    draft = prof.draft_ms(9, 2) * 1e-3 + prof.draft_context_s(np.array([worst_ctx]))
    bound = step + draft + worst_kv + 1e-12
    assert dec["duration_s"].max() <= bound
    assert (v2["prefill_tokens"] <= budget).all()
    assert prof.step_time(64_000 + 8 * 3) > 3 * bound  # the stall chunking removes


def test_chunked_prefill_emits_the_first_token_when_the_last_chunk_is_done():
    tr = _trace(1, 5, prompt=1000)
    res = _quiet(trace=tr, policy="ar", profile="llama-3-8b-h100", max_batched_tokens=256)
    steps = res.steps
    assert steps["prefill_tokens"].tolist()[:4] == [256, 256, 256, 232]
    first = res.requests["first_token_s"].iloc[0]
    assert first == pytest.approx(steps["time_s"].iloc[3] + steps["duration_s"].iloc[3])


@settings(max_examples=30)
@given(
    n=st.integers(2, 12),
    prompt=st.integers(1, 300),
    out=st.integers(2, 60),
    kv_mult=st.floats(1.0, 6.0),
    seed=st.integers(0, 10),
)
def test_paged_admits_at_least_what_the_reservation_admits(n, prompt, out, kv_mult, seed):
    """Closed loop with every request waiting at t = 0: the first step admits at least as many
    requests under paged KV (blocks for the first chunk) as under the reservation (blocks for
    prompt + whole output + gamma), for any capacity that fits one request."""
    tr = _trace(n, out, prompt=prompt, seed=seed)
    need = prompt + out + tr.block_size
    kv = int(need * kv_mult) + 16
    common = dict(trace=tr, policy="static:2", concurrency=n, profile="llama-3-8b-h100",
                  kv_tokens=kv, record_tokens=False)  # fmt: skip
    paged = _quiet(kv="paged", **common)
    reserve = _quiet(kv="reserve", **common)
    assert paged.steps["running"].iloc[0] >= reserve.steps["running"].iloc[0]
    assert paged.summary["requests_completed"] == reserve.summary["requests_completed"] == n
    assert paged.summary["output_tokens"] == reserve.summary["output_tokens"]


def test_paged_preempts_only_when_blocks_run_out():
    tr = _trace(16, 200, prompt=300, alpha=0.9)
    roomy = (300 + 200 + 4 + 16) * 16
    base = dict(trace=tr, policy="static:4", concurrency=16, profile="llama-3-8b-h100",
                record_tokens=True)  # fmt: skip
    a = _quiet(kv_tokens=roomy, **base)
    assert a.summary["preemptions"] == 0 and a.summary["recomputed_tokens"] == 0
    tight = _quiet(kv_tokens=3 * (300 + 200 + 4 + 16), **base)
    s = tight.summary
    assert s["preemptions"] > 0 and s["recomputed_tokens"] > 0
    # every request still emits its whole output, and a preemption shows as a stall
    assert s["requests_completed"] == 16
    assert s["output_tokens"] == a.summary["output_tokens"]
    assert s["itl_ms_max"] > a.summary["itl_ms_max"]
    # the steps never hold more KV than exists: blocks in use after each step fit
    assert (tight.steps["running"] >= 1).all()


def test_reserve_mode_never_preempts():
    tr = _trace(16, 200, prompt=300)
    s = _quiet(trace=tr, policy="static:4", concurrency=16, profile="llama-3-8b-h100",
               kv="reserve", kv_tokens=3 * 600, record_tokens=False).summary  # fmt: skip
    assert s["preemptions"] == 0 and s["requests_completed"] == 16


def _scaled_draft(prof: CostModel, x: float) -> CostModel:
    """Every drafting cost times ``x``: the terms and, on a built profile, the measured draft
    curves (which replace the base and per-request terms there) and the drafter's context."""
    return dataclasses.replace(
        prof,
        name=f"{prof.name}-draft-x{x:g}",
        draft_base_ms=prof.draft_base_ms * x,
        draft_per_request_ms=prof.draft_per_request_ms * x,
        draft_per_token_ms=prof.draft_per_token_ms * x,
        draft_prefill_us_per_token=prof.draft_prefill_us_per_token * x,
        draft_curve=tuple((r, ms * x) for r, ms in prof.draft_curve),
        draft_step_curve=tuple((r, ms * x) for r, ms in prof.draft_step_curve),
        draft_per_context_us=prof.draft_per_context_us * x,
    )


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_ar_does_not_pay_for_a_drafter(name):
    prof = get_profile(name)
    tr = _trace(48, 120, prompt=200)
    kw = dict(trace=tr, policy="ar", concurrency=16, record_tokens=False)
    a = _quiet(profile=prof, **kw).summary
    b = _quiet(profile=_scaled_draft(prof, 100.0), **kw).summary
    assert a["throughput_tok_s"] == b["throughput_tok_s"]
    # while a drafting policy does pay
    full = [_quiet(profile=p, **{**kw, "policy": "full"}).summary["throughput_tok_s"]
            for p in (prof, _scaled_draft(prof, 100.0))]  # fmt: skip
    assert full[1] < full[0]


def _mtp_flash() -> CostModel:
    """V4-Flash on 8 H20s as ``v4-flash-8xh20`` is built, but with a 7-token MTP drafter:
    a SEQUENTIAL drafter, whose call costs more for every token it drafts. Why not the
    built-in name: its DSpark drafter proposes the whole block in one forward, so a one-token
    draft costs what a block costs there and the difference mtp1 pays for is zero."""
    from specsim.sim.cost.build import Deployment
    from specsim.sim.cost.build_profile import build
    from specsim.sim.cost.models import model_arch

    dep = Deployment(model=model_arch("deepseek-v4-flash"), gpu="H20", tp=8, ep=8,
                     drafter="mtp:7")  # fmt: skip
    return build(dep)[0]


def test_mtp1_pays_a_one_token_draft():
    """mtp1 and static:1 verify alike; mtp1 drafts one token, so with a per-token draft cost
    it is charged draft_ms(R, 1), not a whole block. The built profile's engine terms are
    priced too: the drafter's context, the per-request and per-verified-token loop costs
    (``verify_s``) and the longer of the KV read and attention's compute."""
    prof = _mtp_flash()
    assert prof.draft_ms(1, 1) < prof.draft_ms(1, 7)  # the per-token draft cost exists
    tr = _trace(1, 40, gamma=7, prompt=50)
    steps = _quiet(trace=tr, policy="mtp1", profile=prof, record_tokens=False).steps
    dec = steps[(steps["decoding"] == 1) & (steps["prefill_tokens"] == 0)]
    row = dec.iloc[0]  # position 1: the prompt's 50 tokens cached, plus the anchor
    assert row["verified_drafts"] == 1
    # verify 2 tokens (the anchor and one draft) of one request at context 51
    rest = (
        prof.draft_context_s(np.array([50]))
        + prof.verify_s(2, 0, 1, prof.step_time_fn(), draft_tokens=1)
        + max(prof.kv_read_s(51), prof.attn_us_per_qk_ktoken * 1e-9 * 2 * 51)
    )
    expected = prof.draft_ms(1, 1) * 1e-3 + rest
    assert row["duration_s"] == pytest.approx(expected, rel=1e-12)
    block = prof.draft_ms(1, 7) * 1e-3 + rest
    assert row["duration_s"] < block


def test_a_plan_of_zero_skips_the_drafter():
    """goodput's k comes from the acceptance it has seen: on a trace that accepts nothing it
    settles on k = 0, and those steps cost no drafting."""
    tr = _trace(8, 200, alpha=0.0, prompt=50)
    prof = get_profile("v4-flash-8xh20")
    steps = _quiet(trace=tr, policy="goodput", concurrency=8, profile=prof,
                   record_tokens=False).steps  # fmt: skip
    late = steps[(steps["decoding"] == 8) & (steps["prefill_tokens"] == 0)].iloc[-5:]
    assert (late["verified_drafts"] == 0).all()
    # 8 requests verify one token each at contexts under 300: the built profile's engine
    # terms (verify_s) and the longer of KV read and attention's compute, and no draft
    ctx = 8 * 300
    attn = prof.attn_us_per_qk_ktoken * 1e-9 * ctx
    no_draft = (prof.verify_s(8, 0, 8, prof.step_time_fn()) + prof.sched_s(8)
                + max(prof.kv_read_s(ctx), attn))  # fmt: skip
    assert (late["duration_s"] <= no_draft + 1e-12).all()
    # the bound is tight enough to catch a draft: its slack is less than one draft call
    assert no_draft - late["duration_s"].min() < prof.draft_ms(8, 1) * 1e-3


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_long_context_costs_more_on_every_gpu_profile(name):
    prof = get_profile(name)
    tpot = []
    for prompt in (16, 30_000):
        tr = _trace(1, 20, prompt=prompt)
        r = _quiet(trace=tr, policy="ar", profile=prof, record_tokens=False)
        tpot.append(r.summary["tpot_ms_mean"])
    assert tpot[1] > tpot[0]
    assert prof.step_time(1) + prof.kv_read_s(30_000) > prof.step_time(1) + prof.kv_read_s(16)


def _table_only() -> CostModel:
    """llama-3-8b-h100 without its measured-engine terms and attention compute: its table,
    draft curve, drafter prefill, scheduler and KV read. The lone request's walk runs only on
    such a profile (``StepV2.walk_ok``), so the built profile itself never walks."""
    return dataclasses.replace(
        get_profile("llama-3-8b-h100"), name="llama-3-8b-h100-table", verify_per_request_ms=0.0,
        draft_per_context_us=0.0, accept_per_token_ms=0.0, mixed_step_ms=0.0,
        attn_us_per_qk_ktoken=0.0,
    )  # fmt: skip


@pytest.mark.parametrize("policy", ["hw-aware", "zos", "mtp1", "ar", "threshold:0.5", "oracle"])
@pytest.mark.parametrize("name", ["llama-3-8b-h100-table", "smollm2-135m-cpu"])
def test_the_walk_is_the_step_path(policy, name, monkeypatch):
    """The same tables with and without the walk. On the table profile the walk runs (but for
    zos, whose lagged decision under a KV term is not walked); smollm2-135m-cpu is 2-D, where it
    never runs: the switch must change nothing there either."""
    prof = _table_only() if name == "llama-3-8b-h100-table" else get_profile(name)
    tr = _trace(4, 150, gamma=5, alpha=0.7, prompt=40, seed=3)
    walk_fn = serving.Engine._solo_walk_v2
    walked = [0]

    def spy(self, *args, **kw):
        out = walk_fn(self, *args, **kw)
        walked[0] += len(out[0])
        return out

    monkeypatch.setattr(serving.Engine, "_solo_walk_v2", spy)
    runs = []
    for walk in (True, False):
        monkeypatch.setattr(serving, "WALK", walk)
        runs.append(_quiet(trace=tr, policy=policy, profile=prof))
    a, b = runs
    assert a.steps.equals(b.steps) and a.requests.equals(b.requests)
    assert a.tokens.equals(b.tokens)
    walks = prof.name == "llama-3-8b-h100-table" and policy != "zos"
    assert (walked[0] > 0) == walks


def test_a_measured_profile_refuses_far_beyond_its_range():
    from specsim.errors import SpecsimError

    tr = _trace(64, 30, prompt=20)
    with pytest.raises(SpecsimError, match="measured up to 128 tokens"):
        _quiet(trace=tr, policy="full", concurrency=64, profile="smollm2-135m-cpu",
               max_batched_tokens=4096, record_tokens=False)  # fmt: skip


def test_v2_summary_names_the_new_quantities():
    tr = _trace(8, 50)
    s = _quiet(trace=tr, policy="zos", concurrency=8, profile="v4-flash-8xh20").summary
    for key in ("preemptions", "recomputed_tokens", "itl_ms_max", "itl_ms_p99.9"):
        assert key in s and np.isfinite(s[key])

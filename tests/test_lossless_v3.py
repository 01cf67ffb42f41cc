"""Losslessness v3 (issue #36): the exact check proves the law of whole blocks (two of them,
bonus included, after prefixes of 0-8 tokens, and every block a generation starts), the sampler
draws blocks later in a generation, a world stops at its first LOSSY law, and the mutants of
each class the first two versions missed are caught."""

from __future__ import annotations

import importlib.util
import itertools
from collections import defaultdict

import numpy as np
import pytest

import specsim
from specsim.lossless import check as check_module
from specsim.lossless.check import (
    CROSS_CHECK,
    bank_of,
    check_pipeline,
    exact_check,
    standard_worlds,
    statistical_check,
)
from specsim.lossless.mutants import (
    bonus_temperature_v4,
    by_name,
    later,
    peeks_after_first_block,
    second_block_stale_ratio,
)
from specsim.lossless.oracle import BlockView, alone, length_law, output_law, policy_scheduler
from specsim.lossless.pipeline import Pipeline
from specsim.lossless.sampling import BlockSampler, horizon
from specsim.lossless.state import BlockState, bind, key_of, rule_key, scheduler_key
from specsim.lossless.stats import alpha_per_look, g_test, sequential_test
from specsim.lossless.toy import random_toy
from specsim.lossless.uniforms import block_law, truncated
from specsim.lossless.verdicts import summary, world_verdicts
from specsim.lossless.verifiers import (
    acceptance_ratio,
    final_law,
    first_rejection,
    rejection,
    sample_from,
)
from specsim.lossless.window import window_law
from specsim.lossless.worlds import World, world_prefixes

WORLDS = {w.name: w for w in standard_worlds(0)}


# --- an independent two-block law: dicts, one block at a time, nothing shared ----------------


def _target_after(toy, seq, length):
    law = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for s, w in law.items():
            p = toy.p((*seq, *s))
            for t in np.flatnonzero(p > 0):
                nxt[(*s, int(t))] = w * float(p[t])
        law = nxt
    return law


def brute_two_blocks(world: World, pipe: Pipeline, prefix: tuple) -> dict:
    """The law of the 2(gamma+1) tokens after ``prefix``: two blocks of the pipeline, each
    draft realisation enumerated and its verifier integrated on its own (block_law), then the
    target. Shares no code with specsim.lossless.blocks / window."""
    toy, gamma, width = world.toy, world.gamma, 2 * (world.gamma + 1)
    sched = policy_scheduler(pipe.scheduler) if isinstance(pipe.scheduler, str) else pipe.scheduler

    def one_block(y, state):
        out = defaultdict(float)  # (verified length, emitted tokens) -> probability
        for x in itertools.product(range(toy.vocab), repeat=gamma):
            qs = [toy.q((*y, *x[:k])) for k in range(gamma)]
            w = float(np.prod([qs[k][x[k]] for k in range(gamma)]))
            if w == 0:
                continue
            ps = np.stack([toy.p((*y, *x[:k])) for k in range(gamma + 1)])
            prev = [y[-1] if y else -1, *x[: gamma - 1]]
            conf = np.array([toy.conf(y, k + 1, prev[k]) for k in range(gamma)])
            xa = np.array(x)
            view = BlockView(conf, world.batch, xa, np.array([qs[k][x[k]] for k in
                                                             range(gamma)]), state)  # fmt: skip
            l_law = length_law(sched(view), gamma)
            rule = bind(pipe.rule, key_of(rule_key(pipe.rule), state))
            for length in np.flatnonzero(l_law > 0):
                law = block_law(rule, ps, np.stack(qs), xa, int(length))
                for n, t in zip(*np.nonzero(law > 0), strict=True):
                    out[(int(length), (*x[:n], int(t)))] += w * l_law[length] * law[n, t]
        return out

    start = BlockState(len(prefix))
    emitted = defaultdict(float)
    for (l1, e1), w1 in one_block(prefix, start).items():
        state2 = start.after(l1, len(e1) - 1)
        for (_, e2), w2 in one_block((*prefix, *e1), state2).items():
            emitted[(*e1, *e2)] += w1 * w2
    law = defaultdict(float)
    for e, w in emitted.items():
        for rest, wr in _target_after(toy, (*prefix, *e), width - len(e)).items():
            law[(*e, *rest)] += w * wr
    return law


def _dense(law: dict, vocab: int, width: int) -> np.ndarray:
    out = np.zeros(vocab**width)
    for seq, w in law.items():
        out[sum(t * vocab ** (width - 1 - i) for i, t in enumerate(seq))] += w
    return out


SMALL = World("V3-g2-small", random_toy(11, 3, context=1), 2, alone(2))
V4G1 = World("V4-g1", random_toy(12, 4, context=1), 1, alone(1))


@pytest.mark.parametrize(
    ("world", "pipe", "prefix"),
    [
        (V4G1, Pipeline(name="bonus", rule=truncated(bonus_temperature_v4)), ()),
        (V4G1, Pipeline(name="bonus", rule=truncated(bonus_temperature_v4)), (2, 1)),
        (SMALL, Pipeline(name="peeks", scheduler=peeks_after_first_block), ()),
        (SMALL, Pipeline(name="stale", rule=second_block_stale_ratio), (1,)),
        (SMALL, Pipeline(name="reference", scheduler="hw-aware"), (0, 2)),
    ],
    ids=["bonus-empty", "bonus-prefix", "peeks", "stale", "reference"],
)
def test_two_block_law_equals_an_independent_enumeration(world, pipe, prefix):
    got = window_law(bank_of(pipe, world), prefix, pipe.greedy)
    want = _dense(brute_two_blocks(world, pipe, prefix), world.toy.vocab, got.width)
    np.testing.assert_allclose(got.law, want, rtol=0, atol=1e-13)
    np.testing.assert_allclose(
        got.target,
        _dense(_target_after(world.toy, prefix, got.width), world.toy.vocab, got.width),
        atol=1e-15,
    )
    if pipe.name != "reference":
        assert got.tv > 1e-6  # each mutant is lossy in this window


# --- 1. "proven" covers whole blocks, bonus included, after non-empty prefixes --------------


@pytest.mark.slow
@pytest.mark.parametrize("world", list(WORLDS.values()), ids=list(WORLDS))
def test_every_world_proves_two_whole_blocks_after_non_empty_prefixes(world):
    prefixes = world_prefixes(world)
    assert [len(s) for s in prefixes] == list(range(9))
    vocab = world.toy.vocab
    assert {s[-1] for s in prefixes if s} == set(range(vocab))  # every context starts a window
    res = window_law(bank_of(Pipeline(name="r"), world), prefixes[3])
    assert res.width == 2 * (world.gamma + 1) and res.tv < 1e-12
    row = exact_check(Pipeline(name="r", scheduler="zos"), world)
    assert row["status"] == "proven", row
    assert f"2 blocks = {2 * (world.gamma + 1)} tokens (bonus incl.)" in row["law"]
    assert "after 9 prefixes of 0-8 tokens" in row["law"] and row["law"].startswith("zos:")


@pytest.fixture(scope="module")
def bonus_run():
    """The default run of the bonus-temperature mutant (every check, planned samples)."""
    return check_pipeline(by_name("bonus-temperature-v4").pipeline, progress=False)


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_the_old_window_missed_the_bonus_token_the_new_one_does_not(bonus_run):
    """Issue #36: in the V4 world (gamma 3) the first 2 tokens never hold the bonus token."""
    world = WORLDS["V4-g3-batch2-jagged"]
    pipe = by_name("bonus-temperature-v4").pipeline
    old = output_law(world.toy, 2, 3, "full", rule=pipe.rule, batch=world.batch)
    assert old.tv < 1e-12  # what v2 proved: "TV=1e-16 proven"
    row = bonus_run[(bonus_run["world"] == world.name) & (bonus_run["check"] == "exact")]
    assert row["status"].item() == "LOSSY" and 1e-4 < row["tv"].item() < 1e-2


def _bonus_from(law_fn):
    def verify(p, q, x, u, v):
        n = first_rejection(u < acceptance_ratio(p, q, x))
        law = final_law(p, q, n)
        bonus = n == x.shape[1]
        law[bonus] = law_fn(p, q, n, bonus)
        return n, sample_from(law, v)

    return truncated(verify)


def _from_q(p, q, n, bonus):
    rows = np.flatnonzero(bonus)
    k = np.minimum(n[rows], q.shape[1] - 1)
    return q[rows, k] if q.shape[1] else p[rows, 0]


def _top4(p, q, n, bonus):
    rows = np.flatnonzero(bonus)
    law = p[rows, n[rows]].copy()
    cut = np.sort(law, axis=1)[:, -4:-3] if law.shape[1] > 4 else np.zeros((len(rows), 1))
    law[law < cut] = 0.0
    return law / law.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("world", ["appendix-A", "V4-g3-batch2-jagged", "V2-g3-ties-batch4"])
def test_a_bonus_token_drawn_from_q_is_lossy_exactly(world):
    """The issue's bonus bugs printed "TV=1e-16 proven" in the worlds where m <= gamma."""
    row = exact_check(Pipeline(name="bonus from q", rule=_bonus_from(_from_q)), WORLDS[world])
    assert row["status"] == "LOSSY", row


@pytest.mark.parametrize(
    ("world", "status"), [("V5-g2-batch2-jagged", "LOSSY"), ("V3-g2-alone", "proven")]
)
def test_a_bonus_token_from_the_top_4_is_lossy_exactly_where_it_is_lossy(world, status):
    """At V <= 4 the top 4 tokens are every token: lossless there, and proven so."""
    row = exact_check(Pipeline(name="bonus top-4", rule=_bonus_from(_top4)), WORLDS[world])
    assert row["status"] == status, row


# --- the new mutants: lossless on the first block, lossy later; each caught ------------------


@pytest.mark.parametrize("name", ["peeks-after-first-block", "second-block-stale-ratio"])
def test_later_mutants_are_lossless_on_the_first_block_alone(name):
    pipe = by_name(name).pipeline
    world = WORLDS["V3-g2-alone"]
    first = window_law(bank_of(pipe, world), (), blocks=1)
    assert first.tv < 1e-12  # the law v2's sampler drew: one block after the empty prompt
    row = exact_check(pipe, world)
    assert row["status"] == "LOSSY" and row["tv"] > 1e-3, row


def test_state_keys_are_declared_and_read():
    assert scheduler_key(policy_scheduler("zos")) is None  # a StepInput carries no state
    assert scheduler_key(peeks_after_first_block)(BlockState(3)) is True
    assert rule_key(second_block_stale_ratio)(BlockState(0).after(2, 1)) is True
    assert scheduler_key(lambda view: 0)(BlockState(1)) == BlockState(1)  # undeclared: all


@pytest.mark.parametrize(
    ("name", "world", "n"),
    [("peeks-after-first-block", "V4-g3-batch2-jagged", 400_000),
     ("second-block-stale-ratio", "V3-g2-alone", 400_000)],
)  # fmt: skip
def test_the_sampler_draws_later_blocks_and_catches_them(name, world, n):
    pipe = by_name(name).pipeline
    row = statistical_check(pipe, WORLDS[world], n, seed=0, alpha_look=alpha_per_look(6))
    assert not row["lossless"] and row["p_value"] < 1e-30, row
    ref = statistical_check(Pipeline(name="r"), WORLDS[world], n, seed=0,
                            alpha_look=alpha_per_look(6))  # fmt: skip
    assert ref["lossless"], ref
    assert "positions 0-" in ref["law"] and "first two after any prefix of up to 8" in ref["law"]


def test_sampled_blocks_start_at_many_positions_in_their_contexts():
    world = WORLDS["V5-g2-batch2-jagged"]
    s = BlockSampler(world, Pipeline(name="r", scheduler="hw-aware"), seed=2)
    counts = s.counts(300_000)
    assert s.horizon == horizon(world.toy, world.gamma) == 8 + world.gamma + 1
    assert counts.shape == (len(s.strata), world.toy.vocab ** (world.gamma + 1))
    runs = counts[s.strata.index(())].sum()  # one first block per run
    assert 0.15 < runs / counts.sum() < 0.35  # the rest are later blocks
    assert (counts.sum(axis=1)[1:] > 0).all()  # every context is sampled
    np.testing.assert_allclose(s.probs.sum(axis=1), 1.0)


def test_a_model_without_a_finite_context_is_sampled_on_its_first_block_only():
    toy = random_toy(5, 3)  # context None: laws depend on the whole prefix
    world = World("full-context", toy, 2, WORLDS["V3-g2-alone"].batch)
    s = BlockSampler(world, Pipeline(name="r"), seed=0)
    assert s.horizon == 0 and s.strata == [()] and "first block" in s.law
    assert s.counts(50_000).sum() == 50_000


# --- 2. never a cross-check on a proof that does not cover the sampled law ----------------------


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_an_unproven_world_gets_its_full_plan(monkeypatch):
    """A verifier the integrator refuses: its world is sampled on the planned n (capped here
    to keep the test fast), not the cross-check a proof would buy."""

    def diagonal(p, q, x, u, v):
        w = np.mod(u[:, 0] + v, 1.0) if x.shape[1] else v
        n, _ = rejection(p, q, x, u, v)
        return rejection(p, q, x, u, np.where(n == 0, v, w))

    monkeypatch.setattr(check_module, "standard_worlds", lambda seed=0: [WORLDS["appendix-A"]])
    monkeypatch.setattr(check_module, "N_CAP", 3 * CROSS_CHECK)
    df = check_pipeline(Pipeline(name="diagonal", rule=truncated(diagonal)), progress=False)
    stat = df[df["check"] == "statistical"].iloc[0]
    assert df.loc[df["check"] == "exact", "status"].item() == "unproven"
    assert stat["n"] >= 3 * CROSS_CHECK and stat["status"] == "consistent"
    proven = check_pipeline(Pipeline(name="r"), progress=False)
    assert (proven.loc[proven["check"] == "statistical", "n"] == CROSS_CHECK).all()


# --- 3. a world stops at its first LOSSY law; the run skips what cannot change its verdict -----


@pytest.mark.slow
def test_a_lossy_verifier_stops_at_once(bonus_run):
    """Lossy only at V >= 4: LOSSY exactly there, and nothing statistical runs after that."""
    df = bonus_run
    stat = df[df["check"] == "statistical"]
    assert (stat["status"] == "skipped").all() and (stat["n"] == 0).all()
    lossy_worlds = set(df.loc[~df["lossless"], "world"])
    assert lossy_worlds == {"V4-g3-batch2-jagged", "V5-g2-batch2-jagged"}
    edge = df[(df["check"] == "edge") & df["world"].isin(lossy_worlds)]
    assert (edge["status"] == "skipped").all()  # a LOSSY world is not checked further
    text, found = summary(df)
    assert found and text.startswith("LOSSY in 2 of 6 worlds")
    v = world_verdicts(df).set_index("world")
    assert v.loc["V5-g2-batch2-jagged", "verdict"] == "LOSSY (exact)"
    assert v.loc["V3-g2-alone", "verdict"] == "proven (exact)"


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_verdicts_say_what_they_cover():
    df = check_pipeline(Pipeline(name="r + hw-aware", scheduler="hw-aware"), samples=20_000,
                        progress=False)  # fmt: skip
    v = world_verdicts(df)
    assert (v["verdict"] == "proven (exact)").all()
    assert v["covers"].str.contains("hw-aware: 2 blocks = ").all()
    tested = check_pipeline(Pipeline(name="rng", uniforms=False, sample_rule=_rng_rule),
                            samples=20_000, progress=False)  # fmt: skip
    v = world_verdicts(tested)
    assert v["verdict"].str.startswith("consistent (statistical, floor TV").all()
    assert v["covers"].str.contains("every block starting at positions 0-1").all()


def _rng_rule(p, q, x, length, rng):
    return rejection(p[:, : length + 1], q[:, :length], x[:, :length],
                     rng.random((x.shape[0], length)), rng.random(x.shape[0]))  # fmt: skip


# --- the stratified G-test ----------------------------------------------------------------------


def _strata_sampler(probs, weights, alt, seed):
    rng = np.random.default_rng(seed)
    state = {"n": 0, "c": np.zeros(probs.shape, dtype=np.int64)}

    def counts_at(n):
        k = n - state["n"]
        per = rng.multinomial(k, weights)
        state["c"] += np.stack([rng.multinomial(m, a) for m, a in zip(per, alt, strict=True)])
        state["n"] = n
        return state["c"].copy()

    return counts_at


def test_stratified_null_is_calibrated_and_never_rejects():
    rng = np.random.default_rng(4)
    probs = rng.dirichlet(np.ones(20), size=4)
    probs[1, :3] = 0.0
    probs /= probs.sum(axis=1, keepdims=True)
    weights = np.array([0.5, 0.3, 0.15, 0.05])
    alpha = alpha_per_look(6)
    res = [sequential_test(_strata_sampler(probs, weights, probs, s), probs, 200_000, alpha)
           for s in range(200)]  # fmt: skip
    assert all(r.passed for r in res)
    assert all(r.last.df == 4 * 19 - 3 for r in res)  # degrees of freedom add up over strata
    p = np.array([r.last.p_value for r in res])
    assert abs(np.mean(p < 0.1) - 0.1) < 0.08


def test_stratified_power_in_one_small_stratum():
    """A deviation confined to one stratum of weight 0.2 (joint TV 0.2 x 0.05 = 1e-2)."""
    probs = np.full((3, 10), 0.1)
    alt = probs.copy()
    alt[2, :5] += 0.01
    alt[2, 5:] -= 0.01
    res = [sequential_test(_strata_sampler(probs, [0.5, 0.3, 0.2], alt, s), probs, 100_000,
                           alpha_per_look(6)) for s in range(20)]  # fmt: skip
    assert not any(r.passed for r in res)


def test_stratified_zero_probability_hit_fails_at_once():
    probs = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    g = g_test(np.array([[50, 49, 1], [10, 20, 30]]), probs)
    assert g.zero_hits == 1 and not g.passed


# --- housekeeping: the notebook API lives in the lossless room ---------------------------------


def test_the_notebook_api_moved_into_the_lossless_room():
    assert specsim.check_lossless.__module__ == "specsim.lossless.api"
    assert specsim.is_lossless.__module__ == "specsim.lossless.api"
    assert specsim.mutant_table.__module__ == "specsim.lossless.api"
    assert importlib.util.find_spec("specsim.analysis.lossless") is None


def test_new_mutants_are_in_the_catalogue_with_their_checks():
    got = {m.name: m.caught_by for m in later()}
    assert got == {
        "bonus-temperature-v4": ("exact",),
        "peeks-after-first-block": ("exact", "statistical"),
        "second-block-stale-ratio": ("exact", "statistical"),
    }


@pytest.mark.slow
def test_statistical_check_alone_catches_the_bonus_temperature_mutant():
    """TV 7e-4 of the two-block law in the V4 world (1e-3 in the sampled block law there): the
    full plan of the statistical check finds it without the exact check (minutes)."""
    df = check_pipeline(by_name("bonus-temperature-v4").pipeline, checks=("statistical",),
                        stop_at_first_failure=True, progress=False)  # fmt: skip
    assert not df["lossless"].all(), df.to_dict("records")

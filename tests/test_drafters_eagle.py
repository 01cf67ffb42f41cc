"""Drafters a user weighs DSpark against (issue 67, first slice): EAGLE-1 / EAGLE-3 chains and
trees and DFlash, priced by their architecture; a tree's extra verified tokens carried into the
step; traces from a published acceptance length."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.sim.cost import build as bd
from specsim.sim.cost.build_profile import build
from specsim.sim.cost.drafters import draft_ms, parse_drafter
from specsim.sim.cost.models import builtin_model

M = builtin_model("llama-3-8b")


def _priced(spec: str, engine: str = "vllm"):  # noqa: ANN202
    p = bd.check(bd.Deployment(model=M, gpu="H100", engine=engine, drafter=spec))
    return p, p.drafter


def test_eagle_specs_take_the_engines_shapes_and_their_defaults():
    d = parse_drafter("eagle3", M.hidden, M.vocab, M.layers)
    assert (d.steps, d.topk, d.draft_tokens, d.vocab, d.features) == (3, 1, 4, 32_000, 3)
    assert d.drafts == 3 and d.tree_extra == 0  # a chain: root + 3 drafts verified
    tree = parse_drafter("eagle3:steps=5,topk=8", M.hidden, M.vocab, M.layers)
    assert tree.draft_tokens == 41 and tree.tree_extra == 41 - 1 - 5  # 1 + 5 x 8
    sglang = parse_drafter("eagle3:steps=5,topk=8,draft_tokens=64", M.hidden, M.vocab)
    assert sglang.draft_tokens == 64 and sglang.tree_extra == 64 - 1 - 5  # SGLang's own
    e1 = parse_drafter("eagle1:steps=4", M.hidden, M.vocab, M.layers)
    assert e1.vocab == M.vocab and e1.features == 1  # EAGLE-1: full vocabulary, last layer
    assert parse_drafter("dflash:layers=2,block=8", M.hidden, M.vocab).kind == "dflash"


@pytest.mark.parametrize(
    "spec, match",
    [("eagle3:steps=0", "steps"), ("eagle3:topk=99", "topk"), ("eagle3:steps=3,steps=4", "twice"),
     ("eagle3:draft_tokens=2", "must hold the root and the path"), ("eagle3:depth=3", "key=N"),
     ("eagle3:steps=3,topk=2,draft_tokens=12", "at most every candidate"),
     ("eagle2", "unknown --drafter")],
)  # fmt: skip
def test_a_bad_eagle_spec_is_one_line(spec, match):
    with pytest.raises(SpecsimError, match=match):
        parse_drafter(spec, M.hidden, M.vocab, M.layers)


def test_an_eagle_draft_step_is_a_small_layer_not_a_target_layer():
    """EAGLE-3's 3 steps of one layer over a 32k head cost less than MTP's 3 target-like
    layers over the full vocabulary (the stand-in the issue names), and grow with steps."""
    r = np.array([1, 16, 64])
    e3 = draft_ms(*_priced("eagle3"), r)
    mtp = draft_ms(*_priced("mtp:3"), r)
    assert np.all(e3 < mtp)
    e3_5 = draft_ms(*_priced("eagle3:steps=5"), r)
    assert np.all(e3_5 > e3)
    tree = draft_ms(*_priced("eagle3:steps=5,topk=8"), r)
    assert np.all(tree > e3_5)  # topk candidates a request at each later step


def test_a_trees_extra_tokens_are_in_the_profile_and_the_verify_step():
    from specsim.sim.simulate import replay

    chain = build(bd.Deployment(model=M, gpu="H100", engine="sglang", drafter="eagle3:steps=5"))[0]
    tree = build(bd.Deployment(model=M, gpu="H100", engine="sglang",
                               drafter="eagle3:steps=5,topk=8,draft_tokens=32"))[0]  # fmt: skip
    assert chain.tree_tokens_per_request == 0 and tree.tree_tokens_per_request == 26
    kw = dict(concurrency=16, requests=64, seed=0)
    a = replay("synthetic-chat", "static:5", profile=chain, **kw).summary
    b = replay("synthetic-chat", "static:5", profile=tree, **kw).summary
    assert b["mean_batch_tokens"] > a["mean_batch_tokens"] + 16  # the branches ride along
    assert b["sim_time_s"] > a["sim_time_s"] and b["tau"] == pytest.approx(a["tau"])


def test_the_bill_shows_a_trees_verify_width(capsys):
    assert main(["profile", "build", "--model", "llama-3-8b", "--gpu", "h100", "--engine",
                 "sglang", "--drafter", "eagle3:steps=5,topk=8,draft_tokens=32"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "1 req x 32 = 32 tok" in out and "drafter (eagle3)" in out


def test_a_trace_from_a_published_acceptance_length(tmp_path, capsys):
    from specsim.trace.io import read_trace
    from specsim.trace.synth import profile_from_al, profile_tau

    prof = profile_from_al(3.2, 3)
    assert profile_tau(prof) == pytest.approx(3.2, abs=1e-9) and len(set(prof)) == 1
    out = tmp_path / "al.parquet"
    assert main(["traces", "synth", "--al", "3.2", "--block-size", "3", "--requests", "60",
                 "--out", str(out)]) == 0  # fmt: skip
    assert read_trace(out).block_size == 3
    assert main(["traces", "synth", "--al", "5", "--block-size", "3", "--out",
                 str(tmp_path / "x.parquet")]) == 2  # fmt: skip
    assert "lies in [1, 4]" in capsys.readouterr().err
    assert main(["traces", "synth", "--al", "3", "--out", str(tmp_path / "y.parquet")]) == 2


# ---- a sequential drafter's call by the drafts it runs (issue 67): the engine may draft
# fewer than the drafter was built for (tune's k), and each step it skips is not paid
@pytest.mark.parametrize("spec", ["eagle3:layers=1,steps=3,topk=1,draft_tokens=4", "mtp:3",
                                  "eagle1:layers=1,steps=4,topk=2,draft_tokens=8"])  # fmt: skip
def test_a_sequential_drafter_pays_each_step_it_drafts(spec, tmp_path):
    from specsim.sim.cost.profile_csv import read_profile_csv, write_profile_csv

    model, p, drafter = build(bd.Deployment(model=builtin_model("llama-3-8b"), drafter=spec))
    k = drafter.drafts
    assert model.draft_step_curve
    for r in (1, 16, 64):
        full = float(draft_ms(p, drafter, [r])[0])
        assert float(model.draft_ms(r, k)) == pytest.approx(full, rel=1e-6)  # as built
        costs = [float(model.draft_ms(r, j)) for j in range(1, k + 1)]
        assert all(b > a for a, b in zip(costs, costs[1:], strict=False))  # each step paid
        steps = np.diff(costs)
        assert np.allclose(steps, steps[0])  # the same later step each time
    path = tmp_path / "p.csv"
    write_profile_csv(model, path)
    back = np.array(read_profile_csv(path).draft_step_curve)
    assert np.allclose(back, np.array(model.draft_step_curve), rtol=1e-5)


def test_a_block_drafter_pays_one_forward_whatever_k():
    model = build(bd.Deployment(model=builtin_model("llama-3-8b"),
                                drafter="dspark:layers=5,block=7"))[0]  # fmt: skip
    assert model.draft_step_curve == ()
    assert float(model.draft_ms(16, 2)) == float(model.draft_ms(16, 7))


def test_an_moe_trees_branches_touch_their_own_experts():
    """A tree's other branches are tokens of the step like any other: on an MoE target the
    step's distinct experts are counted over them too (uniform routing: sibling candidates are
    different tokens), so a tree's verify costs its experts as well as its attention."""
    v4 = builtin_model("deepseek-v4-flash")
    chain = build(bd.Deployment(model=v4, gpu="B300", tp=4,
                                drafter="eagle3:steps=3,topk=1"))[0]  # fmt: skip
    tree = build(bd.Deployment(model=v4, gpu="B300", tp=4, engine="sglang",
                               drafter="eagle3:steps=3,topk=4,draft_tokens=13"))[0]  # fmt: skip
    assert tree.tree_tokens_per_request == 13 - 1 - 3
    r = 8  # requests: a chain verifies 4 tokens each, the tree 13
    assert bd.distinct_experts(np.array([r * 13]), v4.experts, v4.top_k)[0] > (
        bd.distinct_experts(np.array([r * 4]), v4.experts, v4.top_k)[0])  # fmt: skip
    fn = tree.step_time_fn()
    assert tree.verify_s(r * 13, 0, r, fn, r * 3) > chain.verify_s(r * 4, 0, r, fn, r * 3)


def test_a_step_curve_alone_prices_the_full_block_too():
    """A profile with a draft step curve but no call curve: a full block costs what the cost
    model says (k steps), not the scalar terms alone."""
    from specsim.sim.cost.model import CostModel
    from specsim.sim.cost.price import StepPrice

    cm = CostModel("x", np.array([1, 64]), np.array([1.0, 2.0]), draft_base_ms=1.0,
                   draft_step_curve=((1, 0.5), (64, 1.0)))  # fmt: skip
    price = StepPrice(cm, 4)
    for n in (1, 16, 64):
        assert price.block_s(n) == pytest.approx(float(cm.draft_ms(n, 4)) * 1e-3)
    assert price.block_s(1) == pytest.approx((1.0 + 4 * 0.5) * 1e-3)

"""The greedy server audit (T = 0, specsim.serve.audit.greedy), the field's bug classes as proxy
mutants, and the sweep: the pieces without a server, then against a real llama-server (slow)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.serve.audit import greedy as gr
from specsim.serve.audit.client import StepReader
from specsim.serve.audit.margins import Margin
from specsim.serve.audit.proxy import MUTANTS


def test_step_places_read_the_running_draft_count() -> None:
    # plain, then a step drafting 3 (draft_n 3) emitting 2 tokens, a step drafting 4 (7)
    # emitting 3, a plain token, then a step drafting 2 (9) emitting 1
    plain = [True, False, False, False, False, False, True, False]
    draft_n = [0, 3, 3, 7, 7, 7, 7, 9]
    assert gr.step_places(plain, draft_n) == [
        (-1, 0), (0, 3), (1, 3), (0, 4), (1, 4), (2, 4), (-1, 0), (0, 2),
    ]  # fmt: skip


def test_step_reader_knows_the_drafts_of_the_step_before_its_tokens() -> None:
    r = StepReader()
    seen = []
    for plain, d in [(True, 0), (False, 3), (False, 3), (False, 7), (True, 7), (False, 9)]:
        r.push(plain, d)
        seen.append(r.step_drafted)
    assert seen == [0, 3, 3, 4, 0, 2]


def test_tau_is_twice_the_largest_path_difference_with_a_floor() -> None:
    assert gr.tau_from(np.array([0.01, 0.3, 0.2])) == pytest.approx(0.6)
    assert gr.tau_from(np.array([0.0, 0.001])) == gr.TAU_FLOOR
    assert gr.tau_from(np.zeros(0)) == gr.TAU_FLOOR


def test_margin_and_gap() -> None:
    m = Margin(np.array([5, 9, 2]), np.log(np.array([0.6, 0.3, 0.1])))
    assert m.argmax == 5
    assert m.margin == pytest.approx(math.log(2))
    assert m.gap(2) == pytest.approx(math.log(6))
    assert m.gap(77) == pytest.approx(math.log(6))  # past the top: at least the gap to its last


def _div(klass: str) -> gr.Divergence:
    return gr.Divergence(0, 0, 3, "step-later", 1, 7, 10, 11, 2.0, 2.0, 0.1, 11, klass)


def test_verdict_and_floors() -> None:
    assert gr.verdict_of([]) == "identical"
    assert gr.verdict_of([_div(gr.NEAR_TIE)]) == "near-ties only (numerics)"
    assert gr.verdict_of([_div(gr.NEAR_TIE), _div(gr.BUG)]) == "BUG"
    null = gr.Null(100, np.full(100, 0.1), np.r_[np.full(50, 0.01), np.full(50, 3.0)], 0.2)
    res = gr.GreedyResult("x", "identical", 460, 460 * 32, 2, [], 0, null.summary(), 1.0)
    req, pos = res.floors()
    assert req == pytest.approx(1 - 0.01 ** (1 / 460))  # 1.0%: 1 - (1 - q)^460 = 0.99
    assert pos == pytest.approx(1 - 0.01 ** (1 / (460 * 32 * 0.5)))
    assert "would catch" in res.text() and "tau 0.2" in res.text()


def test_divergence_row_keeps_the_reproducer() -> None:
    d = _div(gr.BUG)
    d.prefix = [1, 2, 3]
    row = d.row()
    assert row["prefix"] == [1, 2, 3] and row["prefix_len"] == 3
    assert row["expected"] == 10 and row["emitted"] == 11 and row["step_drafted"] == 7


@pytest.mark.parametrize(
    ("name", "inputs", "want"),
    [
        ("depth7-only", dict(drafted=7), True),
        ("depth7-only", dict(drafted=6), False),
        ("depth7-only", dict(drafted=0), False),  # plain
        ("batch-only", dict(inflight=1), False),
        ("batch-only", dict(inflight=2), True),
        ("after-rejection-beyond64", dict(role_after=True, position=63), False),
        ("after-rejection-beyond64", dict(role_after=True, position=64), True),
        ("after-rejection-beyond64", dict(role_after=False, position=90), False),
        ("near-ties-only", dict(margin=0.01), True),
        ("near-ties-only", dict(margin=0.5), False),
        ("requests-0.5pct", dict(), True),  # the request itself is chosen with p 0.005
    ],
)
def test_bug_class_triggers(name: str, inputs: dict, want: bool) -> None:
    base = dict(role_after=False, drafted=0, inflight=1, margin=math.inf, position=0)
    assert MUTANTS[name].eligible(**{**base, **inputs}) is want


def test_greedy_config_is_checked_before_any_connection() -> None:
    from specsim.serve.audit.config import AuditConfig

    AuditConfig(server="http://127.0.0.1:1", temperature=0.0)  # T = 0 is the greedy audit
    for bad in (dict(temperature=-1.0), dict(near_tie=0.0), dict(null_positions=4)):
        with pytest.raises(SpecsimError):
            AuditConfig(server="http://127.0.0.1:1", **bad)
    with pytest.raises(SpecsimError, match="prompt"):
        gr.GreedySpec("http://a", "http://b", ())


def test_sweep_grid_and_family_alpha() -> None:
    from specsim.serve.audit.sweep import Kind, SweepSpec

    k = Kind("draft-simple", ("--spec-type", "draft-simple"), "--spec-draft-n-max")
    off = Kind("none", ())
    s = SweepSpec(Path("m.gguf"), (k, off), depths=(1, 7), concurrencies=(1, 4),
                  temperatures=(0.0, 1.0))  # fmt: skip
    cells = list(s.cells())
    assert len(cells) == 2 * 2 * 2 + 1 * 2 * 2  # speculation off has no depth
    assert s.law_cells == 6
    assert k.args(7)[-2:] == ("--spec-draft-n-max", "7") and off.args(None) == ()
    with pytest.raises(SpecsimError):
        SweepSpec(Path("m.gguf"), (k,), temperatures=(-1.0,))


# ---- against a real llama-server (slow: CI runs them) --------------------------------------

from test_server_audit import MODEL, needs_llama  # noqa: E402

BASE = ("-c", "4096", "-t", "1", "--no-warmup")
DRAFT = ("--spec-type", "draft-simple", "-md", str(MODEL), "--spec-draft-p-min", "0", "-td", "1")


def _audit(server: str, **kw):  # noqa: ANN202
    from specsim.serve.audit.config import AuditConfig
    from specsim.serve.audit.greedy import run_greedy

    ref = "-c 4096 -t 1 --no-warmup"
    cfg = AuditConfig(server=server, reference_model=str(MODEL), temperature=0.0,
                      reference_args=ref, null_positions=32, **kw)  # fmt: skip
    return run_greedy(cfg)


@pytest.mark.slow
@needs_llama
def test_speculation_off_against_itself_is_never_a_bug() -> None:
    """The null's own setting: a speculation-off server with a batch mate (concurrency 2)
    against the reference: near-ties at most, no confident divergence."""
    from specsim.serve.llama_server import LlamaServer, ServerSpec

    with LlamaServer(ServerSpec(model=Path(MODEL), args=(*BASE, "-np", "2"))) as srv:
        res = _audit(srv.url, n_predict=24, tokens=24 * 8, concurrency=2)
    assert res.requests == 8 and res.positions == 8 * 24
    assert not res.lossy, res.text()
    assert res.null["null_positions"] == 32 and res.null["tau"] >= gr.TAU_FLOOR


@pytest.mark.slow
@needs_llama
def test_greedy_draft_server_is_identical_up_to_near_ties_and_depth_mutant_is_caught() -> None:
    """draft-simple drafting 7 (the model drafts for itself): no bug; the same server behind
    the depth7-only mutant: a confident divergence, in a step that drafted 7, with its
    reproducer."""
    from specsim.serve.audit.proxy import MutantProxy
    from specsim.serve.llama_server import LlamaServer, ServerSpec

    args = (*BASE, "-np", "1", *DRAFT, "--spec-draft-n-max", "7")
    with LlamaServer(ServerSpec(model=Path(MODEL), args=args)) as srv:
        clean = _audit(srv.url, n_predict=24, tokens=24 * 4)
        with MutantProxy(srv.url, "depth7-only") as px:
            bad = _audit(px.url, n_predict=24, tokens=24 * 4)
            assert px.summary()["perturbed"] > 0
    assert not clean.lossy, clean.text()
    assert bad.lossy, bad.text()
    assert all(d.step_drafted == 7 for d in bad.bugs)
    assert bad.bugs[0].prefix and bad.bugs[0].expected != bad.bugs[0].emitted

"""Cost model v5, the graph MODE (issue 63, item 1): a step inside the capture range is priced
by its shape. A uniform decode / verify batch replays a full graph; a batch holding prompt
tokens runs piecewise under vLLM v1's default (attention eager between the pieces) and without
graphs under SGLang's and TensorRT-LLM's assumed defaults; ``--graph-mode`` sets it."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.cli import main
from specsim.sim.cost import build as bd
from specsim.sim.cost.build_profile import bill, build
from specsim.sim.cost.eager import kernels, piecewise_kernels
from specsim.sim.cost.models import builtin_model

LAUNCH_MS = 15e-3  # the assumed mid launch time


def _dep(**kw):
    return bd.Deployment(model=builtin_model("llama-3-8b"), **kw)


def test_vllms_default_prices_a_mixed_step_piecewise_and_a_decode_step_whole():
    model, p, _ = build(_dep())
    m = builtin_model("llama-3-8b")
    assert p.eng.graph_mode == "full_and_piecewise"
    assert piecewise_kernels(m) == 32 * (2 + 1) + 1  # attention op + one piece a layer
    assert model.mixed_step_ms == pytest.approx(piecewise_kernels(m) * LAUNCH_MS)
    fn = model.step_time_fn()
    decode = model.verify_s(64, 0, 64, fn)
    mixed = model.verify_s(64, 128, 64, fn)
    plain = float(fn(64 + 128)) + model.overhead_ms(64) * 1e-3 + model.accept_per_token_ms * 64e-3
    assert decode == pytest.approx(float(fn(64)) + model.overhead_ms(64) * 1e-3
                                   + model.accept_per_token_ms * 64e-3)  # fmt: skip
    assert mixed == pytest.approx(plain + model.mixed_step_ms * 1e-3)
    past = model.verify_s(64, 4096, 64, fn)  # past the capture range: the table's eager price
    assert past == pytest.approx(float(fn(64 + 4096)) + model.overhead_ms(64) * 1e-3
                                 + model.accept_per_token_ms * 64e-3)  # fmt: skip


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_engines_whose_graphs_hold_decodes_only_run_a_mixed_step_eager(engine):
    model, p, _ = build(_dep(engine=engine))
    assert p.eng.graph_mode == "full_decode_only"
    assert model.mixed_step_ms == pytest.approx(kernels(builtin_model("llama-3-8b"), 1, 1)
                                                * LAUNCH_MS)  # fmt: skip


def test_piecewise_and_none_move_the_uniform_steps_too():
    full = build(_dep())[0]
    piece = build(_dep(graph_mode="piecewise"))[0]
    eager = build(_dep(graph_mode="none"))[0]
    m = builtin_model("llama-3-8b")
    inside = 256
    assert piece.mixed_step_ms == 0.0 and eager.mixed_step_ms == 0.0  # the table holds it
    assert piece.step_time(inside) - full.step_time(inside) == pytest.approx(
        piecewise_kernels(m) * LAUNCH_MS * 1e-3, rel=1e-6)  # fmt: skip
    assert eager.step_time(inside) - full.step_time(inside) == pytest.approx(
        kernels(m, 1, 1) * LAUNCH_MS * 1e-3, rel=1e-6)  # fmt: skip
    assert eager.interpolation == "linear"  # no graph a batch is padded to
    assert "CUDA graphs: none (--graph-mode none): every step runs eager" in bill(
        _dep(graph_mode="none"))[1]  # fmt: skip


def test_the_bill_says_the_mode_and_its_source():
    text = bill(_dep())[1]
    line = next(ln for ln in text.splitlines() if "graph mode" in ln)
    assert "full_and_piecewise (vLLM v1's default cudagraph_mode" in line
    assert "for a step holding prompt tokens (97 launches)" in line


def test_a_replay_with_arrivals_pays_the_mixed_steps():
    from dataclasses import replace as dc_replace

    from specsim.sim.simulate import replay

    model = build(_dep())[0]
    flat = dc_replace(model, mixed_step_ms=0.0)
    kw = dict(concurrency=16, requests=48, seed=0)
    with_mixed = replay("synthetic-chat", "static:3", profile=model, **kw).summary
    without = replay("synthetic-chat", "static:3", profile=flat, **kw).summary
    assert with_mixed["sim_time_s"] > without["sim_time_s"]


def test_the_profile_csv_keeps_the_term(tmp_path):
    from specsim.sim.cost.profile_csv import read_profile_csv, write_profile_csv

    model = build(_dep(engine="sglang"))[0]
    path = tmp_path / "p.csv"
    write_profile_csv(model, path)
    assert read_profile_csv(path).mixed_step_ms == pytest.approx(model.mixed_step_ms)


def test_an_unknown_mode_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["profile", "build", "--model", "llama-3-8b", "--graph-mode", "cudagraph"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(Exception, match="unknown --graph-mode 'x'"):
        build(_dep(graph_mode="x"))


def test_mla_launches_more_in_a_piece_than_gqa():
    assert piecewise_kernels(builtin_model("kimi-k2")) / builtin_model("kimi-k2").layers > 4
    assert np.isclose(piecewise_kernels(builtin_model("llama-3-70b")), 80 * 3 + 1)


# ---- ranges that can hold a gain (issue 63, item 4): a gain is a ratio of two steps, so the
# all-low and all-high corners move both together; each fact says which way its high end
# moves the gain, and the corners put every fact at the end that lowers / raises it
def test_each_assumed_fact_says_which_way_it_moves_a_gain():
    from specsim.sim.cost.assumed import Assumed

    a = Assumed(1.0, 2.0, 3.0, "per step", spec=+1)
    assert (a.at("favour"), a.at("against"), a.at("mid")) == (3.0, 1.0, 2.0)
    b = Assumed(1.0, 2.0, 3.0, "per verified token", spec=-1)
    assert (b.at("favour"), b.at("against")) == (1.0, 3.0)
    assert Assumed(1.0, 2.0, 3.0, "unknown").at("favour") == 2.0
    eng = bd.ENGINES["vllm"]
    assert eng.step_ms.spec == eng.per_request_us.spec == eng.launch_us.spec == 1
    assert eng.draft_launch_ms.spec == eng.draft_position_us.spec == bd.SAMPLING_PASSES.spec == -1


def test_the_corners_bracket_a_speculative_gain_wider_than_low_and_high():
    from specsim.sim.simulate import replay

    def gain(point: str) -> float:
        none = build(_dep(point=point))[0]
        spec = build(_dep(point=point, drafter="mtp:3"))[0]
        kw = dict(concurrency=8, requests=32, seed=0)
        t0 = replay("synthetic-chat", "static:0", profile=none, **kw).summary
        t1 = replay("synthetic-chat", "static:3", profile=spec, **kw).summary
        return t1["throughput_tok_s"] / t0["throughput_tok_s"]

    g = {pt: gain(pt) for pt in ("against", "low", "mid", "high", "favour")}
    assert g["against"] < g["mid"] < g["favour"]
    assert g["favour"] - g["against"] > abs(g["high"] - g["low"])
    text = bill(_dep(point="favour", drafter="mtp:3"))[1]
    assert "at the end of its range that raises the gain of speculation" in text

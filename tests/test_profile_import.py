"""Engine-measured step costs in and out (specsim.sim.cost.profile_import / profile_export).

- step-shaped interpolation: a batch pays the next captured size up to the capture limit, the
  eager points are continuous past it (hand-checked points);
- vLLM's published V4-Flash TP4 tables fed back: the profile charges exactly the table at every
  measured size, and a replay's decode steps cost verify + draft within 1% at every measured
  size a closed loop of static-length steps lands on;
- export -> import round trips (vLLM's two tables, the plain step table) give the same costs;
- bench results without speculation become a step table; a run with speculation is refused;
- the CLI: ``profile import|export|show`` and the older ``profile --out`` spelling; bad input is
  one line and exit 2.
"""

from __future__ import annotations

import json
import warnings
from importlib import resources

import numpy as np
import pandas as pd
import pytest

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.profile_export import engine_step_ms, to_table, to_vllm_adaptive
from specsim.sim.cost.profile_import import from_bench, from_table, from_vllm_adaptive
from specsim.sim.cost.profiles import get_profile
from specsim.sim.cost.tables import dense_lookup

VLLM = resources.files("specsim") / "data" / "published" / "vllm-adaptive-verification"


def _vllm_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    return pd.read_csv(str(VLLM / "verify_cost.csv")), pd.read_csv(str(VLLM / "draft_cost.csv"))


def test_step_interpolation_pays_the_next_captured_size_then_is_continuous():
    b = np.array([1, 8, 16, 1024, 1536, 2048])
    ms = np.array([5.0, 5.3, 5.6, 20.6, 104.0, 110.0])
    lut = dense_lookup(b, ms, "step", 1024) * 1000
    assert lut[1] == 5.0 and lut[2] == lut[8] == 5.3 and lut[9] == lut[16] == 5.6
    assert lut[17] == lut[1024] == 20.6  # padded to the 1,024-token graph
    assert lut[1025] == 104.0  # eager: never a blend of a graph and an eager step
    assert lut[1792] == pytest.approx(107.0)  # linear between eager points
    lin = dense_lookup(b, ms) * 1000
    assert lin[12] == pytest.approx(5.45)
    whole = dense_lookup(b, ms, "step", 0) * 1000  # 0: the staircase covers the whole table
    assert whole[1025] == 104.0 and whole[1537] == 110.0


def test_bad_interpolation_is_refused():
    with pytest.raises(SpecsimError, match="interpolation"):
        CostModel("x", np.array([1, 2]), np.array([1.0, 2.0]), interpolation="cubic")
    with pytest.raises(SpecsimError, match="capture_max_tokens"):
        CostModel("x", np.array([1, 2]), np.array([1.0, 2.0]), capture_max_tokens=-1)


def test_vllm_tables_fed_back_are_charged_exactly_at_every_measured_size():
    verify, draft = _vllm_tables()
    prof = get_profile("vllm-v4-flash-tp4-b300")
    assert prof.interpolation == "step" and prof.capture_max_tokens == 1024
    got = prof.step_time(verify["tokens"].to_numpy()) * 1000
    np.testing.assert_allclose(got, verify["table_ms"], rtol=1e-12)
    np.testing.assert_allclose(prof.draft_ms(draft["requests"].to_numpy(), 7), draft["table_ms"])
    # vLLM's table is the running maximum of the medians (the file's own table_ms column)
    np.testing.assert_allclose(np.maximum.accumulate(verify["ms"]), verify["table_ms"])


def _split(tokens: int, max_running: int = 256, gamma: int = 7) -> tuple[int, int] | None:
    """(C, K) with C (K + 1) = tokens, C <= max_running, the deepest K first."""
    for k in range(gamma, -1, -1):
        if tokens % (k + 1) == 0 and tokens // (k + 1) <= max_running:
            return tokens // (k + 1), k
    return None


def test_replay_decode_steps_reproduce_the_measured_tables_within_one_percent():
    """For every measured verify size T a closed loop can reach (T = C (K + 1), C <= 256
    requests, K <= 7 drafts): closed loops of static:K at concurrency C; each decode step of C
    requests verifies T tokens and must cost verify[T] + draft[C'] (C' the next measured
    request count; no other term is in an imported profile), within 1%."""
    from specsim.sim.simulate import replay
    from specsim.sim.toy import iid_trace

    verify, draft = _vllm_tables()
    r_meas, d_meas = draft["requests"].to_numpy(), draft["table_ms"].to_numpy()
    prof = get_profile("vllm-v4-flash-tp4-b300")
    checked = 0
    for t, v_ms in zip(verify["tokens"], verify["table_ms"], strict=True):
        ck = _split(int(t))
        if ck is None:
            continue
        c, k = ck
        tr = iid_trace(2 * c, 24, gamma=7, alpha=0.7, seed=1)
        tr.prompt_len[:] = 8
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            steps = replay(tr, f"static:{k}", concurrency=c, requests=2 * c, profile=prof).steps
        full = steps[(steps["prefill_tokens"] == 0) & (steps["decoding"] == c)]
        assert len(full) > 0 and set(full["batch_tokens"]) == {t}
        d_ms = d_meas[np.searchsorted(r_meas, c)]  # the drafter's captured size at or above C
        want = (v_ms + (d_ms if k else 0.0)) / 1000
        np.testing.assert_allclose(full["duration_s"], want, rtol=0.01)
        checked += 1
    assert checked >= 80  # of the 88 measured sizes (4,096 and up need more than 256 requests)


def test_vllm_export_import_round_trip(tmp_path):
    prof = get_profile("v4-pro-16xh20")
    paths = to_vllm_adaptive(prof, tmp_path / "t", context_tokens=2048, tokens_per_request=4)
    assert [p.name for p in paths] == ["verify_cost.csv", "draft_cost.csv"]
    back = from_vllm_adaptive(paths[0], paths[1], monotonic=False)
    t = back.batch_tokens
    want = engine_step_ms(prof, t, 2048, 4)
    np.testing.assert_allclose(back.step_time(t) * 1000, want, rtol=1e-4)
    assert back.capture_max_tokens == 1024  # from the region column
    r = np.array([x for x, _ in back.draft_curve])
    np.testing.assert_allclose(back.draft_ms(r, 7), prof.draft_ms(r, 7), rtol=1e-4)
    with pytest.raises(SpecsimError, match="already exists"):
        to_vllm_adaptive(prof, tmp_path / "t")


def test_table_export_import_round_trip_in_two_dimensions(tmp_path):
    prof = get_profile("llama-3-8b-h100")
    out = to_table(prof, tmp_path / "s.csv", contexts=[512, 4096], tokens_per_request=2)
    back = from_table(out)
    assert back.is_2d and back.context_tokens.tolist() == [512.0, 4096.0]
    for ctx in (512, 4096):
        np.testing.assert_allclose(
            back.step_time(back.batch_tokens, ctx) * 1000,
            engine_step_ms(prof, back.batch_tokens, ctx, 2),
            rtol=1e-5,
        )
    one = from_table(to_table(prof, tmp_path / "one.csv", contexts=[1024]))
    assert not one.is_2d and one.meta["context_tokens"] == "1024"


def test_table_import_reads_engine_column_names_and_units(tmp_path):
    p = tmp_path / "steps.csv"
    p.write_text("num_tokens,latency_us\n1,5000\n16,5600\n64,7900\n")
    m = from_table(p, monotonic=True)
    assert m.step_time(16) == pytest.approx(5.6e-3)
    j = tmp_path / "steps.json"
    j.write_text(json.dumps([{"tokens": 1, "ms": 2.0}, {"tokens": 8, "ms": 3.0}]))
    assert from_table(j).step_time(8) == pytest.approx(3e-3)
    bad = tmp_path / "bad.csv"
    bad.write_text("size,seconds\n1,2\n2,3\n")
    with pytest.raises(SpecsimError, match="needs a token column"):
        from_table(bad)


def test_flat_json_mapping_is_microseconds(tmp_path):
    v = tmp_path / "verify.json"
    v.write_text(json.dumps({"1": 5109.0, "8": 5345.0, "16": 5592.0}))
    d = tmp_path / "draft.json"
    d.write_text(json.dumps({"1": 883.0, "16": 1317.0}))
    m = from_vllm_adaptive(v, d)
    assert m.step_time(8) == pytest.approx(5.345e-3) and m.draft_ms(16, 7) == pytest.approx(1.317)


def _vllm_bench(path, c, itl, **extra):
    path.write_text(json.dumps({"max_concurrency": c, "median_itl_ms": itl, **extra}))
    return path


def test_bench_runs_without_speculation_become_a_step_table(tmp_path):
    files = [_vllm_bench(tmp_path / f"c{c}.json", c, itl) for c, itl in ((1, 9.0), (8, 10.0))]
    s = tmp_path / "specsim.json"
    s.write_text(json.dumps({"summary": {"itl_ms_p50": 14.0}, "config": {"concurrency": 32}}))
    m = from_bench([*files, s])
    assert m.batch_tokens.tolist() == [1, 8, 32] and m.step_time(8) == pytest.approx(0.010)
    assert "specsim bench + vllm bench" in m.meta["source"]
    spec = _vllm_bench(tmp_path / "spec.json", 4, 9.0, spec_decode_num_drafts=100)
    with pytest.raises(SpecsimError, match="ran with speculation"):
        from_bench([files[0], spec])


def test_cli_import_show_export_and_the_older_measure_spelling(tmp_path, capsys):
    out = tmp_path / "flash.csv"
    argv = ["profile", "import", "vllm-adaptive", str(VLLM / "verify_cost.csv"),
            str(VLLM / "draft_cost.csv"), "--out", str(out), "--max-running", "128"]  # fmt: skip
    assert main(argv) == 0
    m = get_profile(str(out))  # --profile FILE takes the result
    assert m.interpolation == "step" and m.max_running == 128 and m.capture_max_tokens == 1024
    assert main(argv) == 2  # never overwritten without --force
    assert "already exists" in capsys.readouterr().err
    assert main(["profile", "show", str(out), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["step_ms"]["1024"] == pytest.approx(20.634)
    assert main(["profile", "export", "v4-flash-8xh20", "--out", str(tmp_path / "ex")]) == 0
    assert (tmp_path / "ex" / "draft_cost.csv").exists()
    capsys.readouterr()
    assert main(["profile", "import", "table", str(tmp_path / "nope.csv"), "--out",
                 str(tmp_path / "x.csv")]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a file" in err[0]
    from specsim.commands.profile import legacy_argv

    assert legacy_argv(["profile", "--out", "p.csv"]) == ["profile", "measure", "--out", "p.csv"]
    assert legacy_argv(["profile", "show", "x"]) == ["profile", "show", "x"]


@pytest.mark.parametrize("fmt", ["trtllm", "sglang"])
def test_trtllm_and_sglang_tables_round_trip_term_for_term(tmp_path, fmt):
    """Exported as ``f(tokens) + g(batch size)`` and read back, a decode step of R requests
    verifying T tokens at the exported context costs what the simulator charges it."""
    from specsim.sim.cost.profile_export import to_sglang, to_trtllm
    from specsim.sim.cost.profile_import import from_sglang, from_trtllm

    prof = get_profile("smollm2-135m-cpu")  # a measured profile with engine terms
    write, read = (to_trtllm, from_trtllm) if fmt == "trtllm" else (to_sglang, from_sglang)
    back = read(write(prof, tmp_path / "t.json", context_tokens=300))
    for r, t in ((1, 1), (2, 8), (4, 16), (8, 32), (16, 64)):
        want = prof.verify_s(t, 0, r, prof.step_time_fn(300.0)) + prof.kv_read_s(300.0 * r)
        got = back.verify_s(t, 0, r, back.step_time_fn(None))
        assert got == pytest.approx(want, rel=1e-5)


def test_sglang_steps_per_second_form_and_trtllm_schema_v2(tmp_path):
    from specsim.sim.cost.profile_import import from_sglang, from_trtllm

    p = tmp_path / "sps.json"
    p.write_text(json.dumps({"sample_batch_tokens": [1, 64], "sample_steps_per_sec": [200, 100],
                             "max_batch_tokens": 64}))  # fmt: skip
    assert from_sglang(p).step_time(64) == pytest.approx(0.01)
    v2 = tmp_path / "v2.json"
    v2.write_text(json.dumps({"schema_version": 2, "cost_tables": {}}))
    with pytest.raises(SpecsimError, match="schema v2"):
        from_trtllm(v2)

"""Golden regression for serving model v2 (issue #33's model: chunked prefill, paged KV with
preemption, drafting charged by what is drafted, KV read per sequence; the one serving model
since v1 was retired at commit 77e1490, with its tables): the tables of a set of scenarios
against the ones committed when the model was written (``tests/data/golden-v2/``), integers
exactly, floats to 1e-9 (tests/compare.py). The lean run (``record_steps=False``) is compared
with the full run of the same process bit for bit: there bit-identity is the point (the same
arithmetic in the same order).

Regenerate only when a change of v2's results is intended, and say why in the commit:

    python tests/test_sim_golden_v2.py --write
"""

from __future__ import annotations

import functools
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
from compare import assert_frames_close

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "data" / "golden-v2"
KINDS = ("summary", "requests", "steps", "tokens")
WALL_KEYS = ("wall_time_s", "sim_tokens_per_wall_s")


def scenarios() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for p in ("ar", "mtp1", "hw-aware", "zos", "auto"):
        out[f"c1-chat-v4-{p}"] = dict(
            trace="chat", policy=p, concurrency=1, requests=6, profile="v4-flash-8xh20"
        )
    for p in ("ar", "mtp1", "static:3", "hw-aware", "zos", "auto", "goodput", "oracle"):
        out[f"c16-synchat-h100-{p}"] = dict(
            trace="synthetic-chat", policy=p, concurrency=16, requests=48,
            profile="llama-3-8b-h100",
        )  # fmt: skip
    for p in ("zos", "auto", "mtp1"):
        out[f"c64-syncode-v4-{p}"] = dict(
            trace="synthetic-code", policy=p, concurrency=64, requests=192,
            profile="v4-flash-8xh20", seed=3,
        )  # fmt: skip
    out["poisson-chat-h100-auto"] = dict(
        trace="chat", policy="auto", rate=30.0, requests=120, profile="llama-3-8b-h100", seed=2
    )
    for p in ("static:3", "zos"):  # a small cache: paged preemption and recompute
        out[f"paged-tight-synmath-h100-{p}"] = dict(
            trace="synthetic-math", policy=p, concurrency=24, requests=72,
            profile="llama-3-8b-h100", kv_tokens=6000,
        )  # fmt: skip
    out["reserve-tight-synmath-h100-zos"] = dict(
        trace="synthetic-math", policy="zos", concurrency=24, requests=72,
        profile="llama-3-8b-h100", kv_tokens=6000, kv="reserve",
    )  # fmt: skip
    out["chunked-code-cpu-hw-aware"] = dict(
        trace="code", policy="hw-aware", concurrency=8, requests=24,
        profile="smollm2-135m-cpu", max_batched_tokens=64,
    )  # fmt: skip
    return out


@functools.cache
def _trace(name: str):
    from specsim.trace.io import read_trace

    return read_trace(str(ROOT / "traces" / f"{name}.parquet"))


@functools.cache
def run_scenario(name: str):
    from specsim.sim.simulate import replay

    kw = dict(scenarios()[name])
    tr = _trace(kw.pop("trace"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return replay(tr, kw.pop("policy"), **kw)


def tables(name: str, res) -> dict[str, pd.DataFrame]:
    summary = {k: v for k, v in res.summary.items() if k not in WALL_KEYS}
    out = {
        "summary": pd.DataFrame([summary]),
        "requests": res.requests,
        "steps": res.steps,
        "tokens": res.tokens,
    }
    for k, df in list(out.items()):
        df = df.copy()
        df.insert(0, "scenario", name)
        out[k] = df
    return out


@pytest.fixture(scope="module")
def golden() -> dict[str, dict[str, pd.DataFrame]]:
    out: dict[str, dict[str, pd.DataFrame]] = {}
    for kind in KINDS:
        df = pd.read_parquet(GOLDEN / f"{kind}.parquet")
        for name, part in df.groupby("scenario", sort=False):
            out.setdefault(str(name), {})[kind] = part.reset_index(drop=True)
    return out


def test_golden_covers_every_scenario(golden):
    assert sorted(golden) == sorted(scenarios())


@pytest.mark.parametrize("name", list(scenarios()))
def test_golden_v2(name, golden):
    got = tables(name, run_scenario(name))
    for kind in KINDS:
        want = golden[name][kind]
        have = got[kind].reset_index(drop=True)
        if kind == "summary":
            have = have[list(want.columns)].astype(want.dtypes.to_dict())
        assert_frames_close(have, want, obj=f"{name}/{kind}")


@pytest.mark.parametrize("name", list(scenarios()))
def test_golden_summary_without_step_log(name):
    """``record_steps=False`` (what sweeps run) keeps only running sums and the per-step
    values the summary's floating-point sums need: the same summary and requests as the full
    run of this process, bit for bit, and no step or token tables. (Ported from serving
    model v1's golden test.)"""
    from specsim.sim.simulate import replay

    kw = dict(scenarios()[name], record_steps=False, record_tokens=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = replay(_trace(kw.pop("trace")), kw.pop("policy"), **kw)
    assert res.steps is None and res.tokens is None
    full = tables(name, run_scenario(name))
    want = full["summary"].reset_index(drop=True)
    have = pd.DataFrame([{k: v for k, v in res.summary.items() if k not in WALL_KEYS}])
    have = have.assign(scenario=name)[list(want.columns)]
    pd.testing.assert_frame_equal(have, want, check_exact=True, obj=f"{name}/summary (lean)")
    pd.testing.assert_frame_equal(
        res.requests.reset_index(drop=True),
        full["requests"].drop(columns="scenario").reset_index(drop=True),
        check_exact=True,
        obj=f"{name}/requests (lean)",
    )


def test_trace_changed_in_place_is_not_served_from_the_cache():
    """The engine caches a per-trace row table; a trace whose arrays were edited in place must
    replay as a fresh trace with those values would, not from the stale table. (Ported from
    serving model v1's golden test.)"""
    import dataclasses

    import numpy as np

    from specsim.sim.simulate import replay
    from specsim.trace.io import read_trace

    base = read_trace(str(ROOT / "traces" / "chat.parquet"))  # read-only: writeable copies
    tr = dataclasses.replace(base, conf=base.conf.copy(), accept_len=base.accept_len.copy())
    fresh = dataclasses.replace(base, conf=base.conf.copy(), accept_len=base.accept_len.copy())
    replay(tr, "hw-aware", concurrency=4, requests=20, record_tokens=False)  # fills the cache
    for t in (tr, fresh):
        t.conf[:] = np.sqrt(t.conf)  # more confident drafts: more verified
    got = replay(tr, "hw-aware", concurrency=4, requests=20, record_tokens=False).summary
    want = replay(fresh, "hw-aware", concurrency=4, requests=20, record_tokens=False).summary
    assert got["verified_draft_tokens"] == want["verified_draft_tokens"]
    assert got["sim_time_s"] == want["sim_time_s"]


def test_the_tight_scenarios_preempt_and_the_reserve_one_does_not():
    assert run_scenario("paged-tight-synmath-h100-zos").summary["preemptions"] > 0
    assert run_scenario("reserve-tight-synmath-h100-zos").summary["preemptions"] == 0
    steps = run_scenario("chunked-code-cpu-hw-aware").steps
    assert steps["prefill_tokens"].max() <= 64


def write() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    parts: dict[str, list[pd.DataFrame]] = {k: [] for k in KINDS}
    for name in scenarios():
        got = tables(name, run_scenario(name))
        for kind in KINDS:
            parts[kind].append(got[kind])
        print(name, len(got["steps"]), "steps", flush=True)
    for kind in KINDS:
        pd.concat(parts[kind], ignore_index=True).to_parquet(
            GOLDEN / f"{kind}.parquet", compression="zstd", index=False
        )


if __name__ == "__main__":
    if "--write" not in sys.argv[1:]:
        raise SystemExit("usage: python tests/test_sim_golden_v2.py --write")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    write()

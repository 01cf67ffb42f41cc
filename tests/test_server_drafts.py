"""A setting's trace from its own server's step log (specsim.fidelity.llama.server_drafts),
end to end against a running llama-server: four requests in flight, matched back to their
prompts, each position the exact n-gram port's; and the draft-dspark trace it gives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specsim.fidelity.llama.config import LlamaValidationConfig, SpecSetting


def _ids(cfg: LlamaValidationConfig, n: int) -> list[list[int]]:
    """n copy-edit prompts in the server's chat template, as token ids."""
    from specsim.fidelity.llama.servers import start_server
    from specsim.prompts import load_prompts
    from specsim.serve.llama_tokens import chat_prompt_ids

    texts = [p.text for p in load_prompts(f"copy-edit[0:{n}]")]
    with start_server(cfg, SpecSetting("none")) as srv:
        return chat_prompt_ids(srv, texts)


@pytest.mark.slow  # fast suite under 5 min: 5 s (CI runs it)
@pytest.mark.real_server
def test_the_server_walk_of_an_ngram_setting_is_the_exact_port(tmp_path):
    """ngram:3 at four in flight: each request's trace from the server's log is a walk (from
    position 1, accepted + 1 a step) and equals the exact port's drafts and accepted
    prefixes along it, over the output the server gave in that run."""
    from specsim.fidelity.llama.server_drafts import server_positions
    from specsim.fidelity.llama.servers import drafter_of
    from specsim.serve.ngram import positions, server_path

    cfg = LlamaValidationConfig(prompts=("copy-edit",), specs=("none", "ngram:3"), parallel=4,
                                concurrency=(4,), calib_concurrency=(4,), threads=1,
                                target_type="Q4_0-pure", out=tmp_path)  # fmt: skip
    s = SpecSetting.parse("ngram:3")
    ids = _ids(cfg, 8)
    lengths = [40] * len(ids)
    got, served = server_positions(cfg, s, ids, lengths, 0.0)
    d = drafter_of(cfg, s)
    assert [len(o) for o in served] == lengths
    for p, o, pos in zip(ids, served, got, strict=True):
        assert server_path(pos)[:2] == (int(pos.drafted.sum()), int(pos.accepted.sum()))
        port = positions(d, p, o)
        walk = np.flatnonzero(pos.drafted)
        assert np.array_equal(port.drafted[walk], pos.drafted[walk])
        assert np.array_equal(port.accepted[walk], pos.accepted[walk])
        assert server_path(port) == server_path(pos)  # the port walks the same steps
    assert sum(int(q.accepted.sum()) for q in got) > 0  # copying: the n-grams were accepted
    kept = tmp_path / "logs" / "steps" / "steps-ngram-3-t0.parquet"  # the log, tidy
    steps = pd.read_parquet(kept)
    assert steps.task.nunique() == len(ids)
    assert len(steps) == sum(server_path(pos)[2] for pos in got)  # a row a step
    assert not list(kept.parent.glob("*.log"))  # the raw debug log is not kept


@pytest.mark.slow
@pytest.mark.record
@pytest.mark.real_server(converter=True)
def test_a_dspark_trace_from_the_server_is_its_walk_with_its_totals(tmp_path):
    """dspark:7:0.3 (drafter v3 as the server runs it): steps the confidence cut left without
    drafts are in the walk, and each request's trace walks its whole output; the grid's trace
    built from it carries where its drafts came from."""
    from specsim.fidelity.llama.server_drafts import server_positions
    from specsim.fidelity.llama.traces import GridInputs, dspark_traces
    from specsim.serve.ngram import server_path

    cfg = LlamaValidationConfig(prompts=("copy-edit",), specs=("none", "dspark:7:0.3"),
                                parallel=4, concurrency=(4,), calib_concurrency=(4,),
                                threads=1, target_type="Q4_0-pure", dspark_trace="server",
                                temperatures=(0.0,), out=tmp_path)  # fmt: skip
    s = SpecSetting.parse("dspark:7:0.3")
    ids = _ids(cfg, 4)
    lengths = [32] * len(ids)
    got, served = server_positions(cfg, s, ids, lengths, 0.0)
    for pos, n in zip(got, lengths, strict=True):
        drafted, accepted, steps = server_path(pos)
        assert (drafted, accepted) == (int(pos.drafted.sum()), int(pos.accepted.sum()))
        assert 1 + accepted + steps == n  # the prefill's token, then accepted + 1 a step
        assert np.all(pos.drafted <= 7)
    inputs = GridInputs(ids, lengths, {0.0: served}, [], [])
    tr = dspark_traces(cfg, [s], inputs, (0.0,))[(s.name, 0.0)]
    assert tr.meta["drafts_from"] == "server"
    assert "Q4_0-pure" in tr.meta["target"]


@pytest.mark.slow
@pytest.mark.real_server
def test_an_output_streamed_short_is_taken_again_whole():
    """llama-server streams no event for a token that ends inside a UTF-8 character, so a
    streamed answer in Japanese lacks ids; the grid's outputs take such answers again,
    unstreamed, in full (traces.whole_output)."""
    from specsim.fidelity.llama.servers import send, start_server
    from specsim.fidelity.llama.traces import whole_output
    from specsim.serve.llama_tokens import chat_prompt_ids

    cfg = LlamaValidationConfig(concurrency=(1,), calib_concurrency=(1,), parallel=1)
    text = "Repeat this line exactly, three times: 日本語のテキスト、漢字とひらがな。"
    with start_server(cfg, SpecSetting("none")) as srv:
        (ids,) = chat_prompt_ids(srv, [text])
        _, (res,), _ = send(srv, [ids], [24], temperature=0.0, seed=0, concurrency=1, requests=1)
        whole = whole_output(srv, ids, 24, 0.0, 0)
    assert res.output_tokens == 24 and len(res.tokens) < 24  # the stream lost some ids
    assert len(whole) == 24
    assert set(res.tokens) <= set(whole)


def test_a_request_without_draft_counts_drafted_nothing_but_a_server_without_any_fails():
    """llama-server leaves ``draft_n`` out of the timings of a request it drafted nothing for
    (an n-gram setting with no match in the answer): the recording takes it as zero drafts.
    A failed request, or a run with no counts at all (a server not speculating), is refused."""
    from types import SimpleNamespace as R

    from specsim.errors import SpecsimError
    from specsim.fidelity.llama.server_drafts import check_draft_counts

    ok = [R(error=None, draft_n=12), R(error=None, draft_n=None), R(error=None, draft_n=0)]
    check_draft_counts("ngram:3", ok, "out")
    with pytest.raises(SpecsimError, match="1 requests failed \\(first: timeout\\)"):
        check_draft_counts("ngram:3", [*ok, R(error="timeout", draft_n=None)], "out")
    with pytest.raises(SpecsimError, match="did not speculate"):
        check_draft_counts("ngram:3", [R(error=None, draft_n=None)] * 3, "out")

"""llama-server's steps from its own log (specsim.serve.log_steps): iterations told apart by the
slots' order, launches and ends; against a running server, the decode steps add up to the
server's own generation time and the prefills to its prompt time."""

from __future__ import annotations

import pytest

from specsim.serve import spec_log
from specsim.serve.log_steps import server_steps
from specsim.sim.ubatch import pass_sizes

# two slots: task 1 launches alone and is prefilled; then task 2 launches while 1 decodes (one
# iteration); both decode (slot 0 drafts 2, accepts 1); task 1 ends; slot 1 decodes alone; task
# 2 ends; the server idles; task 3 launches and is prefilled, decodes once and ends
LOG = """\
0.01.000.000 I slot launch_slot_: id  0 | task 1 | processing task, is_child = 0
0.01.010.000 D slot handle_last_: id  0 | task 1 | slot decode token, id=4, n_ctx = 512, n_tokens = 10, truncated = 0
0.01.020.000 I slot launch_slot_: id  1 | task 2 | processing task, is_child = 0
0.01.020.010 D slot handle_last_: id  0 | task 1 | generate_draft: id=9, #tokens=11, #draft=2, pos_next=11
0.01.040.000 I slot   operator(): id  0 | task 1 | accepted  1/ 2 draft tokens
0.01.040.100 D slot handle_last_: id  0 | task 1 | slot decode token, id=4, n_ctx = 512, n_tokens = 13, truncated = 0
0.01.040.110 D slot handle_last_: id  1 | task 2 | slot decode token, id=4, n_ctx = 512, n_tokens = 20, truncated = 0
0.01.050.000 I slot print_timing: id  0 | task 1 | prompt eval time =      10.00 ms /    10 tokens (    1.00 ms per token,  1000.00 tokens per second)
0.01.050.010 I slot print_timing: id  0 | task 1 |        eval time =      40.00 ms /     5 tokens (    8.00 ms per token,   125.00 tokens per second)
0.01.050.100 D slot handle_last_: id  1 | task 2 | slot decode token, id=4, n_ctx = 512, n_tokens = 21, truncated = 0
0.01.056.000 I slot print_timing: id  1 | task 2 | prompt eval time =      20.00 ms /    20 tokens (    1.00 ms per token,  1000.00 tokens per second)
0.01.056.010 I slot print_timing: id  1 | task 2 |        eval time =      16.00 ms /     3 tokens (    5.33 ms per token,   187.50 tokens per second)
0.02.000.000 I slot launch_slot_: id  0 | task 3 | processing task, is_child = 0
0.02.008.000 D slot handle_last_: id  0 | task 3 | slot decode token, id=4, n_ctx = 512, n_tokens = 8, truncated = 0
0.02.012.000 I slot print_timing: id  0 | task 3 | prompt eval time =       8.00 ms /     8 tokens (    1.00 ms per token,  1000.00 tokens per second)
0.02.012.010 I slot print_timing: id  0 | task 3 |        eval time =       4.00 ms /     2 tokens (    2.00 ms per token,   500.00 tokens per second)
"""  # noqa: E501


def test_iterations_are_told_apart_and_idle_time_is_no_steps():
    st = server_steps(spec_log.parse(LOG))
    ms = (st["duration_s"] * 1000).round(3).tolist()
    # prefill 1 | decode 1 | launch 2 with 1's draft (one iteration) | both | 2 alone | idle |
    # prefill 3 | decode 3
    assert st["decoding"].tolist() == [0, 1, 1, 2, 1, 0, 1]
    assert st["prefill_tokens"].tolist() == [10, 0, 20, 0, 0, 8, 0]
    assert st["batch_tokens"].tolist() == [0, 1, 3, 2, 1, 0, 1]
    assert st["emitted"].tolist() == [0, 1, 2, 2, 1, 0, 1]
    assert st["ctx_mean"].tolist() == [0.0, 10.0, 11.0, 16.5, 21.0, 0.0, 8.0]
    # the forward passes by slot: slots 0 and 1 adjacent, one token each, make one pass
    assert st["passes"].tolist() == ["", "1", "3", "2", "1", "", "1"]
    # the last step before the idle gap ends at task 2's timings line, not at task 3's launch
    assert ms == pytest.approx([10.0, 10.0, 20.1, 10.0, 5.91, 8.0, 4.01], abs=0.01)


@pytest.mark.slow
@pytest.mark.real_server
def test_the_servers_steps_add_up_to_its_own_timings():
    """Four requests, two at a time, on an ngram-simple server: every decode step of the log
    adds up to the requests' ``predicted_ms`` and the prefills to their ``prompt_ms``."""
    from concurrent.futures import ThreadPoolExecutor

    from specsim.record.models import cache_dir, smollm2_gguf
    from specsim.record.requant import requantized
    from specsim.serve.llama_server import LlamaServer, ServerSpec
    from specsim.serve.llama_tokens import chat_prompt_ids
    from specsim.serve.ngram import NgramSimple

    model = requantized(smollm2_gguf(), "Q4_0-pure", cache_dir() / "targets")
    args = ("-np", "2", "-c", "4096", "-t", "1", *NgramSimple(2, 3).server_args(), *spec_log.ARGS)
    texts = ["List the days of the week, twice.", "Count from 1 to 20.", "Write a haiku.",
             "Repeat after me: the cat sat on the mat."]  # fmt: skip
    with LlamaServer(ServerSpec(model=model, args=args, env=spec_log.ENV)) as srv:
        ids = chat_prompt_ids(srv, texts)
        body = {"n_predict": 40, "temperature": 0.0, "ignore_eos": True, "cache_prompt": False}
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda p: srv.completion({**body, "prompt": p}), ids))
        text = srv.log_text()
    st = server_steps(spec_log.parse(text))
    cut = [pass_sizes(p) for p in st["passes"]]  # each step's passes hold its tokens
    assert [sum(c) for c in cut] == st["batch_tokens"].tolist()
    assert all(len(c) <= d for c, d in zip(cut, st["decoding"], strict=True))
    gen = sum(a["timings"]["predicted_ms"] for a in answers)
    steps = sum(a["timings"]["predicted_n"] - 1 - a["timings"]["draft_n_accepted"] for a in answers)
    assert st["emitted"].sum() == sum(a["timings"]["predicted_n"] - 1 for a in answers)
    assert (st["decoding"]).sum() == steps
    assert st["prefill_tokens"].sum() == sum(a["timings"]["prompt_n"] for a in answers)
    # at two in flight a step serves both, so the requests' times overlap: each request's
    # generation time is the sum of the steps it decoded in
    per_task = {}
    for k in spec_log.parse(text):
        in_it = (st["end_s"] > k.t_s[0] + 1e-9) & (st["start_s"] < k.ended_s)  # its steps
        per_task[k.prompt_n, k.generated, *k.totals] = st.loc[in_it, "duration_s"].sum() * 1e3
    assert len(per_task) == len(answers)
    for a in answers:
        t = a["timings"]
        key = (t["prompt_n"], t["predicted_n"], t["draft_n"], t["draft_n_accepted"])
        assert per_task[key] == pytest.approx(t["predicted_ms"], rel=0.02)
    assert gen > 0

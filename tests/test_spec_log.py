"""llama-server's own step log (specsim.serve.spec_log): parsed from its lines, matched to the
client's requests, and, against a running server, equal at every step to the exact n-gram port."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.serve import spec_log

# the lines a -lv 5, LLAMA_TRACE=1 llama-server (b11434) writes for one request of prompt 5:
# a draft of 3 (2 accepted), a step with no draft, a draft of 2 (all accepted), then the end
LOG = """\
0.00.500.000 I slot launch_slot_: id  1 | task 7 | processing task, is_child = 0
0.00.600.000 D slot handle_last_: id  1 | task 7 | generate_draft: id=9, #tokens=5, #draft=3, pos_next=5
0.00.606.000 I slot   operator(): id  1 | task 7 | accepted  2/ 3 draft tokens
0.00.606.010 D slot   operator(): id  1 | task 7 | accepted 2/3 draft tokens, new n_tokens = 8
0.00.606.100 D slot handle_last_: id  1 | task 7 | slot decode token, id=4, n_ctx = 1024, n_tokens = 8, truncated = 0
0.00.610.500 D slot handle_last_: id  1 | task 7 | generate_draft: id=3, #tokens=9, #draft=2, pos_next=9
0.00.617.000 I slot   operator(): id  1 | task 7 | accepted  2/ 2 draft tokens
0.00.617.100 I slot print_timing: id  1 | task 7 | prompt eval time =      99.00 ms /     5 tokens (   19.80 ms per token,    50.51 tokens per second)
0.00.617.110 I slot print_timing: id  1 | task 7 |        eval time =      17.00 ms /     8 tokens (    2.13 ms per token,   470.59 tokens per second)
"""  # noqa: E501


def test_parse_reads_every_step_with_its_position_drafts_and_clock():
    (task,) = spec_log.parse(LOG)
    assert (task.task, task.slot, task.prompt_n, task.generated) == (7, 1, 5, 8)
    assert task.n_tokens == [5, 8, 9]
    assert task.drafted == [3, 0, 2]
    assert task.accepted == [2, 0, 2]
    assert task.totals == (5, 4)
    assert task.t_s == pytest.approx([0.6, 0.6061, 0.6105])
    drafted, accepted = spec_log.positions(task, prompt_len=5, length=8)
    assert drafted.tolist() == [0, 3, 0, 0, 0, 2, 0, 0]  # positions 1, 4, 5: the server's walk
    assert accepted.tolist() == [0, 2, 0, 0, 0, 2, 0, 0]
    # the walk covers the output: the prefill's token, then accepted + 1 a step
    assert 1 + sum(a + 1 for a in task.accepted) == task.generated


def test_table_has_a_row_a_step():
    t = spec_log.table(spec_log.parse(LOG))
    assert t[["n_tokens", "drafted", "accepted"]].to_numpy().tolist() == [
        [5, 3, 2],
        [8, 0, 0],
        [9, 2, 2],
    ]
    assert set(t.task) == {7} and set(t.generated) == {8}


def test_match_takes_the_task_that_agrees_and_names_a_request_that_has_none():
    (task,) = spec_log.parse(LOG)
    assert spec_log.match([task], [5], [(8, 5, 4)]) == [task]
    with pytest.raises(
        SpecsimError, match=r"request 0 \(prompt 5, 8 generated, 5 drafted, 3 accepted"
    ):
        spec_log.match([task], [5], [(8, 5, 3)])


def test_a_log_without_step_lines_or_out_of_order_is_refused():
    info_only = "\n".join(line for line in LOG.splitlines() if " D " not in line)
    with pytest.raises(SpecsimError, match="-lv 5"):
        spec_log.parse(info_only)
    (task,) = spec_log.parse(LOG)
    with pytest.raises(SpecsimError, match="outside its request's output"):
        spec_log.positions(task, prompt_len=5, length=5)


@pytest.mark.slow
@pytest.mark.real_server
def test_the_server_logs_the_exact_ngram_walk_at_every_step():
    """A llama-server (ngram-simple n=2 m=3, the Q4_0-pure target) logs, for each of three
    requests at T = 0 and at T = 1 (seeded), a step at every position the exact port's walk
    visits, with the port's draft and accepted prefix there, and totals equal its timings."""
    from specsim.record.models import cache_dir, smollm2_gguf
    from specsim.record.requant import requantized
    from specsim.serve.llama_server import LlamaServer, ServerSpec
    from specsim.serve.llama_tokens import chat_prompt_ids
    from specsim.serve.ngram import NgramSimple, positions, server_path

    model = requantized(smollm2_gguf(), "Q4_0-pure", cache_dir() / "targets")
    d = NgramSimple(2, 3)
    args = ("-np", "2", "-c", "4096", "-t", "1", *d.server_args(), *spec_log.ARGS)
    texts = ["List the days of the week, twice.", "Count from 1 to 20.", "Write a haiku."]
    sent, answers = [], []
    with LlamaServer(ServerSpec(model=model, args=args, env=spec_log.ENV)) as srv:
        for p in chat_prompt_ids(srv, texts):
            for temp in (0.0, 1.0):
                ans = srv.completion({"prompt": p, "n_predict": 48, "temperature": temp,
                                      "seed": 5, "ignore_eos": True, "cache_prompt": False,
                                      "return_tokens": True})  # fmt: skip
                sent.append(p)
                answers.append(ans)
        text = srv.log_text()
    results = [
        (a["timings"]["predicted_n"], a["timings"]["draft_n"], a["timings"]["draft_n_accepted"])
        for a in answers
    ]
    tasks = spec_log.match(spec_log.parse(text), [len(p) for p in sent], results)
    assert len({t.task for t in tasks}) == len(sent)
    for p, ans, task in zip(sent, answers, tasks, strict=True):
        out = ans["tokens"]
        port = positions(d, p, out)
        visited = np.asarray(task.n_tokens) - len(p) + 1
        assert visited[0] == 1 and np.all(np.diff(visited) == np.asarray(task.accepted[:-1]) + 1)
        assert port.drafted[visited].tolist() == task.drafted
        assert port.accepted[visited].tolist() == task.accepted
        assert server_path(port)[2] == len(task.n_tokens)  # as many steps as the port walks
        assert np.all(np.diff(task.t_s) > 0)  # the server's clock runs forward


class _LateLog:
    """A server whose log thread writes a run's last timings line a few reads after the run."""

    def __init__(self, lines: list[str], late: int) -> None:
        self.lines, self.reads, self.late = lines, 0, late

    def log_text(self) -> str:
        self.reads += 1
        shown = self.lines if self.reads > self.late else self.lines[:-1]
        return "".join(shown) + "half a line"


def test_the_log_is_read_once_every_task_has_its_timings_line():
    line = "I slot print_timing: id  {} | task {} |        eval time =  10.0 ms /  4 tokens\n"
    srv = _LateLog([line.format(i, i) for i in range(3)], late=3)
    text, end = spec_log.settled_text(srv, 0, 3, timeout_s=5.0)
    assert srv.reads == 4 and text.count("eval time") == 3 and end == len(text)
    assert not text.endswith("half a line")  # whole lines only
    never = _LateLog([line.format(0, 0)], late=10**9)
    text, _ = spec_log.settled_text(never, 0, 1, timeout_s=0.1)
    assert "eval time" not in text  # gives up; the caller's matching names what is missing

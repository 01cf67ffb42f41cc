"""llama.cpp's ngram-simple drafter as ported in specsim.serve.ngram, and the trace built from it.

The port vectorises the backward scan of ``common_ngram_simple_draft``; it is compared here
with a line-by-line transcription of the C++ loop on random and repetitive histories. The
check against a running llama-server (exact draft_n / draft_n_accepted per request) is the
slow test at the end.
"""

from __future__ import annotations

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.serve.llama_trace import VERIFY_AS_SERVER, build_trace, path_counts
from specsim.serve.ngram import NgramSimple, positions, server_path


def c_loop(tokens: list[int], sampled: int, n: int, m: int) -> list[int]:
    """common/ngram-map.cpp, common_ngram_simple_draft, transcribed literally."""
    cur_len = len(tokens)
    if cur_len <= n + m + 1:
        return []
    pattern = [tokens[j] for j in range(cur_len - n + 1, cur_len)] + [sampled]
    match_pos = 0
    j = cur_len - n - 1
    while j > 0:
        if all(tokens[j + k] == pattern[k] for k in range(len(pattern))):
            match_pos = j
            break
        j -= 1
    if match_pos == 0:
        return []
    copy_max = min(m, cur_len - (match_pos + n))
    if copy_max < n:
        return []
    return [tokens[match_pos + n + j] for j in range(copy_max)]


@pytest.mark.parametrize("n,m", [(1, 1), (2, 3), (3, 3), (2, 7), (12, 48)])
def test_draft_equals_the_c_loop(n, m):
    rng = np.random.default_rng(n * 100 + m)
    d = NgramSimple(n, m)
    for trial in range(300):
        vocab = int(rng.integers(2, 6)) if trial % 2 else 50
        length = int(rng.integers(0, 90))
        toks = rng.integers(0, vocab, size=length).tolist()
        if trial % 3 == 0 and length > 8:  # repetitive: the pattern recurs
            toks = (toks[:7] * 20)[:length]
        sampled = int(rng.integers(0, vocab))
        got = d.draft(np.asarray(toks, dtype=np.int64), sampled).tolist()
        assert got == c_loop(toks, sampled, n, m), (toks, sampled)


def test_sizes_that_never_draft_are_refused():
    with pytest.raises(SpecsimError, match="never drafts"):
        NgramSimple(size_n=4, size_m=3)
    assert NgramSimple(2, 3).server_args()[-1] == "3"


def test_positions_cut_at_remaining_and_accept_the_leading_matches():
    d = NgramSimple(1, 3)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5]
    out = [6, 7, 8, 5, 6, 9, 9, 9]
    pos = positions(d, prompt, out)
    length = len(out)
    assert pos.drafted[0] == 0  # the prefill never drafts
    for n in range(1, length):
        assert pos.drafted[n] <= max(length - n - 1, 0)
        k = int(pos.drafted[n])
        hist = prompt + out[: n - 1]
        want = c_loop(hist, out[n - 1], 1, 3)[: max(length - n - 1, 0)]
        assert pos.tokens[n, :k].tolist() == want
        lead = 0
        while lead < k and want[lead] == out[n + lead]:
            lead += 1
        assert pos.accepted[n] == lead
    drafted, accepted, steps = server_path(pos)
    assert 0 < accepted <= drafted and steps < length


def test_trace_replays_the_server_path():
    rng = np.random.default_rng(3)
    d = NgramSimple(2, 3)
    prompts, outs, poss = [], [], []
    for _ in range(6):
        base = rng.integers(0, 9, size=12).tolist()
        prompts.append(base * 3)
        outs.append((base * 6)[: int(rng.integers(5, 40))])
        poss.append(positions(d, prompts[-1], outs[-1]))
    tr = build_trace(
        [len(p) for p in prompts],
        [len(o) for o in outs],
        [p.drafted for p in poss],
        [p.accepted for p in poss],
        [p.tokens for p in poss],
        block=3,
        meta={"temperature": "0", "drafter": "ngram-simple:2:3"},
    )
    want = np.array([server_path(p)[:2] for p in poss])
    got = np.stack(path_counts(tr), axis=1)
    assert (got == want).all()
    from specsim.sim.simulate import replay

    res = replay(tr, VERIFY_AS_SERVER, concurrency=2, requests=6, profile="llama-3-8b-h100")
    s = res.summary
    assert s["verified_draft_tokens"] == want[:, 0].sum()
    assert s["accepted_draft_tokens"] == want[:, 1].sum()


@pytest.mark.slow
@pytest.mark.real_server
def test_reconstruction_equals_llama_server_counts_per_request():
    """Against a running llama-server (ngram-simple n=2 m=3): every request's draft_n and
    draft_n_accepted, at T=0 and at T=1 (seeded), equal the walk over its own output."""
    from specsim.record.models import smollm2_gguf
    from specsim.serve.llama_server import LlamaServer, ServerSpec
    from specsim.serve.llama_tokens import chat_prompt_ids

    model = smollm2_gguf()
    d = NgramSimple(2, 3)
    args = ("-np", "2", "-c", "4096", "-t", "1", *d.server_args())
    texts = ["List the days of the week, twice.", "Count from 1 to 20.", "Write a haiku."]
    with LlamaServer(ServerSpec(model=model, args=args)) as srv:
        for p in chat_prompt_ids(srv, texts):
            for temp in (0.0, 1.0):
                ans = srv.completion({"prompt": p, "n_predict": 48, "temperature": temp,
                                      "seed": 5, "ignore_eos": True, "cache_prompt": False,
                                      "return_tokens": True})  # fmt: skip
                t = ans["timings"]
                got = (t.get("draft_n", 0), t.get("draft_n_accepted", 0))
                assert server_path(positions(d, p, ans["tokens"]))[:2] == got, (temp, p)

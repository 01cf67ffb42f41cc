"""The server audit's two stages (specsim.serve.audit.pipeline, issue 46): generators and scorers
with their own requests in flight, without a server (fake stages that sleep), then the audit
through them against a stand-in server, and the reference's law with batch mates against a
real llama-server (slow). Why: the stages decide the audit's positions per minute, and must
neither lose, repeat nor reorder what is counted, nor change the law a position is scored on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from specsim.errors import SpecsimError
from specsim.serve.audit.config import AuditConfig
from specsim.serve.audit.law import scorers
from specsim.serve.audit.pipeline import Busy, Stages, run_pipeline


class Fake:
    """Stages that sleep ``gen_s`` / ``score_s`` a request and record what ran where."""

    def __init__(self, jobs: int, gen_s: float = 0.0, score_s: float = 0.0,
                 fail_at: int | None = None, stop_after: int | None = None) -> None:  # fmt: skip
        self.jobs, self.gen_s, self.score_s = jobs, gen_s, score_s
        self.fail_at, self.stop_after = fail_at, stop_after
        self.next = 0
        self.absorbed: list[int] = []
        self.slots: dict[int, int] = {}  # job -> the scorer (slot) that scored it
        self.in_gen = self.in_score = self.max_gen = self.max_score = 0
        self.ahead = 0  # most jobs generated and not yet absorbed

    def claim(self) -> int | None:
        if self.next >= self.jobs:
            return None
        self.next += 1
        return self.next - 1

    async def generate(self, _w: int, j: int) -> int:
        self.in_gen += 1
        self.max_gen = max(self.max_gen, self.in_gen)
        await asyncio.sleep(self.gen_s)
        self.in_gen -= 1
        return j * 10

    async def score(self, s: int, j: int, g: int) -> int:
        assert g == j * 10  # each job's own generation
        self.in_score += 1
        self.max_score = max(self.max_score, self.in_score)
        await asyncio.sleep(self.score_s)
        self.in_score -= 1
        if j == self.fail_at:
            raise SpecsimError(f"the reference failed at job {j}")
        self.slots[j] = s
        return j

    def absorb(self, j: int, _g: int, sc: int) -> None:
        assert sc == j
        self.absorbed.append(j)
        self.ahead = max(self.ahead, self.next - len(self.absorbed))

    def stop(self) -> bool:
        return self.stop_after is not None and len(self.absorbed) >= self.stop_after

    def stages(self) -> Stages:
        return Stages(self.claim, self.generate, self.score, self.absorb, self.stop)


def _run(f: Fake, n_gen: int, n_score: int) -> Busy:
    return asyncio.run(run_pipeline(f.stages(), Busy(n_gen=n_gen, n_score=n_score)))


def test_every_job_is_scored_once_by_one_scorer_with_both_stages_full() -> None:
    f = Fake(40, gen_s=0.002, score_s=0.01)  # scoring slower: its 4 requests all in flight
    _run(f, n_gen=3, n_score=4)
    assert sorted(f.absorbed) == list(range(40))  # none lost, none twice
    assert set(f.slots.values()) <= set(range(4))
    assert f.max_gen == 3 and f.max_score == 4  # each stage kept its requests in flight


def test_generation_runs_ahead_of_scoring_by_a_bounded_number_of_jobs() -> None:
    """A slow reference: generators wait on the queue (n_score deep) instead of running away
    (the budget counts every job in flight, so the audit never overshoots by more)."""
    f = Fake(30, gen_s=0.0, score_s=0.005)
    busy = _run(f, n_gen=2, n_score=2)
    assert sorted(f.absorbed) == list(range(30))
    assert f.ahead <= 2 + 2 + 2  # in generation, in the queue, in scoring
    g, s = busy.shares()
    assert s > 0.8 and g < 0.5  # the reference set the rate: its stage was busy


def test_a_slow_audited_server_shows_as_the_busy_stage() -> None:
    f = Fake(12, gen_s=0.01, score_s=0.0)
    busy = _run(f, n_gen=2, n_score=4)
    g, s = busy.shares()
    assert g > 0.8 and s < 0.3
    assert "audited server" in busy.text() and "2 generator(s)" in busy.text()


def test_a_verdict_stops_scoring_and_starting() -> None:
    f = Fake(1000, gen_s=0.001, score_s=0.001, stop_after=5)
    _run(f, n_gen=2, n_score=2)
    assert 5 <= len(f.absorbed) <= 6  # scorers already scoring finish; nothing more is scored
    assert f.next < 20  # and generators stopped claiming


def test_the_first_failure_is_raised_and_the_other_workers_are_cancelled() -> None:
    f = Fake(1000, gen_s=0.001, score_s=0.001, fail_at=7)

    async def go() -> None:
        await run_pipeline(f.stages(), Busy(n_gen=3, n_score=3))
        raise AssertionError("no failure")

    async def main() -> list[asyncio.Task]:
        with pytest.raises(SpecsimError, match="job 7"):
            await go()
        await asyncio.sleep(0)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run(main()) == []  # no worker left running
    assert f.next < 1000


def test_a_pipeline_needs_both_stages() -> None:
    with pytest.raises(ValueError, match="generator and scorer"):
        _run(Fake(1), n_gen=1, n_score=0)


@pytest.mark.parametrize(("given", "slots", "want"), [(0, 4, 4), (2, 4, 2), (8, 4, 4), (0, 1, 1)])
def test_scorers_never_share_a_reference_slot(given: int, slots: int, want: int) -> None:
    """0: one per slot; never more than the slots (two requests on one slot would evict each
    other's cached prefix: every position a whole-prefix batch instead of a one-token decode)."""
    cfg = AuditConfig(server="http://127.0.0.1:9", reference_concurrency=given)
    assert scorers(cfg, slots) == want


def test_reference_concurrency_is_checked_and_kept_out_of_the_state() -> None:
    for bad in (-1, 65):
        with pytest.raises(SpecsimError, match="--reference-concurrency"):
            AuditConfig(server="http://127.0.0.1:9", reference_concurrency=bad)
    a = AuditConfig(server="http://127.0.0.1:9", reference_concurrency=4)
    b = AuditConfig(server="http://127.0.0.1:9")
    assert a.fingerprint() == b.fingerprint()  # a state resumes at another scoring load


# ---- the audit through the stages, against a stand-in server ---------------------------------

from test_hostile_audit_v3 import BASE, fake, ref_url  # noqa: E402


@pytest.mark.slow  # fast suite under 5 min: over 2.5 s alone (CI runs it)
def test_the_audit_prints_its_rate_and_where_the_time_went(capsys) -> None:
    from specsim.cli import main

    ref_conc = "2"  # the stand-in has 2 slots

    with fake() as url:
        code = main(["check-lossless", "--server", url, "--reference", ref_url(url), *BASE,
                     "--n-predict", "64", "--concurrency", "3",
                     "--reference-concurrency", ref_conc])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1 and "LOSSY" in out, out  # the stand-in always emits token 0
    assert "1,024 positions tested" in out
    assert "positions scored" in out and "reference" in out
    assert f"of {ref_conc} scorer(s)" in out and "of 3 generator(s)" in out


# ---- the reference's law with batch mates (real llama-server, slow) --------------------------

from test_server_audit import MODEL, needs_llama  # noqa: E402


@pytest.mark.slow
@needs_llama
def test_batch_mates_do_not_change_the_reference_law() -> None:
    """The same 4 x 24 positions scored one request at a time on one slot, and 4 at once on 4
    slots (3 batch mates in every decode): the same top-40 ids and probabilities (Q4_1 on the
    CPU backend: each row's dot products do not depend on the batch). What lets the audit
    score in parallel with the null unchanged."""
    import httpx
    import numpy as np

    from specsim.serve.audit.client import Sampling, chat_prompt, score, tokenize
    from specsim.serve.audit.config import CONTEXTS
    from specsim.serve.llama_server import LlamaServer, ServerSpec

    samp = Sampling(1.0)

    async def go(url: str) -> tuple[list, list]:
        async with httpx.AsyncClient(timeout=120) as c:
            prompts = [await tokenize(c, url, await chat_prompt(c, url, m)) for m in CONTEXTS[:4]]
            seqs = []
            for i, p in enumerate(prompts):
                body = {"prompt": p, "n_predict": 24, "seed": i, "return_tokens": True,
                        "cache_prompt": False, **samp.body()}  # fmt: skip
                seqs.append((await c.post(url + "/completion", json=body)).json()["tokens"])
            pairs = list(zip(prompts, seqs, strict=True))
            alone = [await score(c, url, p, s, samp, 0, 40) for p, s in pairs]
            mates = await asyncio.gather(
                *(score(c, url, p, s, samp, i, 40) for i, (p, s) in enumerate(pairs))
            )
        return alone, mates

    args = ("-np", "4", "-c", "4096", "-t", "1", "--no-warmup")
    with LlamaServer(ServerSpec(model=Path(MODEL), args=args)) as srv:
        alone, mates = asyncio.run(go(srv.url))
    for a, m in zip(alone, mates, strict=True):
        for x, y in zip(a, m, strict=True):
            assert np.array_equal(x.ids, y.ids)
            np.testing.assert_array_equal(x.probs, y.probs)


def test_a_bounded_call_that_finishes_as_it_is_cancelled_is_still_cancelled():
    """The hang the pipeline had in about 1 run of 4 (a malformed reference, the run never
    ended): on Python 3.11 ``asyncio.wait_for`` returned the result when the cancellation came
    as the call finished, so a generator that gather_all cancelled ran on and waited forever
    on the queue to scorers that were gone. ``within`` keeps that cancellation."""
    from specsim.serve.audit.client import within

    async def main() -> str:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        ran_on: list[int] = []

        async def worker() -> None:
            ran_on.append(await within(fut, 10.0))

        t = asyncio.ensure_future(worker())
        await asyncio.sleep(0)  # the worker now waits on fut
        fut.set_result(1)  # the call finishes ...
        t.cancel()  # ... in the same turn of the loop as the cancellation
        try:
            await t
        except asyncio.CancelledError:
            return "cancelled"
        return f"ran on with {ran_on}"

    assert asyncio.run(main()) == "cancelled"


def test_within_still_times_out():
    from specsim.serve.audit.client import within

    with pytest.raises(TimeoutError):
        asyncio.run(within(asyncio.sleep(5), 0.05))

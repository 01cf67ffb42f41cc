"""What a speculative setting's own llama-server drafted and accepted at every step of the
grid's outputs: the trace of ``dspark:N[:P]`` from the drafter the server runs
(``--dspark-trace server``), and of ``ngram:M`` over the server's own outputs
(``--ngram-trace server``).

Why: the torch drafter (fp32) next to the server's outputs is not the drafter the server runs
(its GGUF), and on the v3 held-out grid their acceptance differed by up to 8.9%. Here the
setting's server itself takes the grid's prompts once (the outputs' run: their lengths,
``ignore_eos``, the grid's seed, closed loop at 4) with its step log on
(:mod:`specsim.serve.spec_log`), and each request's steps become its trace: at every position
the server's walk visited, the drafts it verified and the prefix it accepted. The run's
outputs come back too: the caller counts those that differ from the plain server's (on the
Q4_0 target a batch of one token and a batch of several take different kernels, so a greedy
near-tie can flip; an output streamed short, a token ending inside a UTF-8 character, counts
as different too), as the grid reports it for every setting.
"""

from __future__ import annotations

import numpy as np

from specsim.errors import SpecsimError
from specsim.fidelity.llama.config import LlamaValidationConfig, SpecSetting
from specsim.fidelity.llama.servers import send, start_server
from specsim.serve import spec_log
from specsim.serve.ngram import Positions

RECORD_CONCURRENCY = 4  # as the plain server's outputs' run (traces.TRACE_CONCURRENCY)


def server_positions(
    cfg: LlamaValidationConfig,
    s: SpecSetting,
    ids: list[list[int]],
    lengths: list[int],
    temperature: float,
    draw: int = 0,
) -> tuple[list[Positions], list[list[int]]]:
    """Each request's positions as setting ``s``'s server walked them, and its outputs in
    that run (the caller compares them with the plain server's); ``draw``: which of
    ``--trace-draws`` recording runs (its seed: ``cfg.draw_seed``)."""
    folder = cfg.out / "logs" / "steps"
    with start_server(cfg, s, folder, steps=True) as srv:
        _, res, _ = send(srv, ids, lengths, temperature=temperature, seed=cfg.draw_seed(draw),
                         concurrency=RECORD_CONCURRENCY, requests=len(ids))  # fmt: skip
        text = spec_log.settled_text(srv, 0, len(ids))[0]
        raw = srv.log_path
    check_draft_counts(s.name, res, cfg.out)
    order = sorted(res, key=lambda r: r.sent_s)  # the server launches them in this order
    tag = f"-d{draw}" if draw else ""
    parsed = spec_log.keep_table(
        text, raw, folder / f"steps-{s.slug}-t{temperature:g}{tag}.parquet"
    )
    tasks = spec_log.match(
        parsed,
        [len(ids[r.trace_id]) for r in order],
        [(r.output_tokens, r.draft_n or 0, r.draft_accepted or 0) for r in order],
    )
    found: dict[int, Positions] = {}
    for r, task in zip(order, tasks, strict=True):
        i = r.trace_id
        drafted, accepted = spec_log.positions(task, len(ids[i]), lengths[i])
        unknown_ids = np.zeros((lengths[i], s.n_max), dtype=np.int64)  # the log has counts only
        found[i] = Positions(drafted=drafted, accepted=accepted, tokens=unknown_ids)
    outs = {r.trace_id: list(r.tokens) for r in res}
    return [found[i] for i in range(len(ids))], [outs[i] for i in range(len(ids))]


def check_draft_counts(name: str, res: list, out: object) -> None:
    """Refuse a recording run with a failed request, or whose server sent no draft counts at
    all (a server that did not speculate). llama-server leaves ``draft_n`` out of a request's
    timings when it drafted nothing for it (``n_draft_tokens > 0``, server-common.cpp, b11434):
    an n-gram setting finds no match in some answers, so one request without the counts is a
    request with zero drafts, not a failure (the fifth held-out grid's first start stopped
    there)."""
    failed = [r for r in res if r.error]
    if failed:
        raise SpecsimError(
            f"{name} recording run: {len(failed)} requests failed (first: {failed[0].error}); "
            f"see its log in {out}/logs"
        )
    if res and all(r.draft_n is None for r in res):
        raise SpecsimError(
            f"{name} recording run: the server sent no draft counts (timings.draft_n) for any "
            f"request: it did not speculate; see its log in {out}/logs"
        )

"""Calibration runs: closed loops on other prompts at other concurrencies than the grid's, each
rebuilt into the server's steps (:mod:`specsim.serve.llama_steps`) for the profile fit.

Why closed loops of the real workload rather than a kernel benchmark: a step of llama-server
is more than its ``llama_decode`` (the per-slot loop, sampling row by row, streaming each token
to the HTTP threads, the client on the other core), and all of it is on the wall clock the grid
is scored on. The drafts and acceptances of each request come from its own output
(reconstruction exact at any temperature: the n-gram port, or for draft-dspark the torch
drafter over the target's teacher-forced pass, ``traces.request_positions``), so every step's
make-up is known. A setting's runs are all sent first and rebuilt after, so the drafter's
model is loaded once per setting and never runs beside a measured run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from specsim.fidelity.llama.config import LlamaValidationConfig, SpecSetting
from specsim.fidelity.llama.servers import send, start_server
from specsim.fidelity.llama.traces import request_positions
from specsim.serve.bench_config import Job, Result
from specsim.serve.llama_steps import align, request_groups, step_table
from specsim.serve.ngram import Positions


def run_steps(
    cfg: LlamaValidationConfig,
    s: SpecSetting,
    jobs: Sequence[Job],
    results: Sequence[Result],
    found: Sequence[Positions] | None = None,
) -> tuple[pd.DataFrame, dict[str, float]]:
    """The steps of one run, and how well they were rebuilt (requests whose predicted draft
    counts equal the server's, the alignment's worst misfit). ``found``: each request's
    positions when the caller has them (else rebuilt here)."""
    if found is None:
        pairs = [(j.prompt, r.tokens) for j, r in zip(jobs, results, strict=True)]
        found = request_positions(cfg, s, pairs)
    groups, exact, checked = [], 0, 0
    for i, (job, res) in enumerate(zip(jobs, results, strict=True)):
        drafted = accepted = None
        if found is not None and res.tokens:
            pos = found[i]
            drafted, accepted = pos.drafted, pos.accepted
            if not res.error:
                checked += 1
                exact += int(_path_drafted(pos) == (res.draft_n or 0, res.draft_accepted or 0))
        gs = request_groups(i, res, len(job.prompt), drafted, accepted)
        if gs is not None:
            groups.append(gs)
    steps, worst = align(groups)
    sent = {i: r.sent_s for i, r in enumerate(results)}
    table = step_table(steps, sent)
    info = {"requests_exact": exact, "requests_checked": checked, "align_worst": worst,
            "requests_unusable": len(results) - len(groups)}  # fmt: skip
    return table, info


def _path_drafted(pos) -> tuple[int, int]:  # noqa: ANN001
    from specsim.serve.ngram import server_path

    drafted, accepted, _ = server_path(pos)
    return drafted, accepted


class Calibration:
    """The calibration runs of setting ``s`` on ``srv``, sent in one go (:func:`calibrate`)
    or a pass of every load at a time between a grid's rounds (``--calib-schedule rounds``):
    :meth:`warm` once, :meth:`run_loads` once per pass, :meth:`finish` once after the last.
    Every run's server-clock steps are read off the log as it goes; the drafts are rebuilt
    for all runs at once in :meth:`finish` (draft-dspark: one model load, never beside a
    measured run)."""

    def __init__(
        self,
        cfg: LlamaValidationConfig,
        s: SpecSetting,
        srv,  # noqa: ANN001 - a started LlamaServer
        ids: list[list[int]],
        lengths: list[int],
        log: Callable[[str], None],
    ) -> None:
        self.cfg, self.s, self.srv, self.log = cfg, s, srv, log
        self.ids, self.lengths = ids, lengths
        self.frames: list[pd.DataFrame] = []
        self.runs: list[tuple] = []
        self.at = 0  # where the next run's lines start in the server's log

    def warm(self) -> None:
        """A first request, unmeasured: a server's first request after loading runs up to five
        times slower (PLAN.md step 2c)."""
        cfg, ids, lengths = self.cfg, self.ids, self.lengths
        send(self.srv, ids[:1], [min(lengths[0], 16)], temperature=0.0, seed=cfg.seed,
             concurrency=1)  # fmt: skip
        self.at = _logged_steps(self.srv, 0, 1)[1] if cfg.step_clock == "server" else 0

    def run_loads(self, rnd: int | None = None) -> None:
        """One run at every temperature and calibration load (``rnd``: the grid's round it
        followed, None before the grid), each the same draw of jobs in every pass."""
        cfg, s = self.cfg, self.s
        for t in cfg.temperatures:
            for c in cfg.calib_concurrency:
                n = int(np.ceil(cfg.calib_requests * c))
                jobs, res, summary = send(self.srv, self.ids, self.lengths, temperature=t,
                                          seed=cfg.seed + 1, concurrency=c,
                                          requests=n)  # fmt: skip
                if cfg.step_clock == "server":
                    table, self.at = _logged_steps(self.srv, self.at, n)
                    self.frames.append(table.assign(spec=s.name, temperature=float(t),
                                                    concurrency=c, clock="server",
                                                    round=rnd))  # fmt: skip
                failed = [r.error for r in res if r.error]
                if failed:  # a profile fitted on the steps of the requests that survived is wrong
                    from specsim.errors import RunFailed

                    raise RunFailed(
                        f"{len(failed)} of {n} calibration requests failed ({s.name}, T={t:g}, "
                        f"C={c}); first error: {failed[0]}"
                    )
                self.runs.append((t, c, n, jobs, res, summary, rnd))

    def finish(self) -> tuple[pd.DataFrame, list[dict]]:
        """Every run's steps (one frame, a ``clock`` column: ``client`` rebuilt, and
        ``server`` where the server logs its steps; ``round``) and a row of run-level numbers
        each."""
        cfg, s, frames, rows = self.cfg, self.s, list(self.frames), []
        pairs = [(j.prompt, r.tokens) for *_, jobs, res, _, _ in self.runs
                 for j, r in zip(jobs, res, strict=True)]  # fmt: skip
        found = request_positions(cfg, s, pairs)
        at = 0
        for t, c, n, jobs, res, summary, rnd in self.runs:
            mine = None if found is None else found[at : at + len(jobs)]
            at += len(jobs)
            table, info = run_steps(cfg, s, jobs, res, mine)
            table["spec"], table["temperature"], table["concurrency"] = s.name, float(t), c
            table["clock"], table["round"] = "client", rnd
            frames.append(table)
            rows.append({"spec": s.name, "temperature": t, "concurrency": c, "requests": n,
                         "throughput_tok_s": summary["throughput_tok_s"],
                         "tpot_ms_mean": summary["tpot_ms_mean"], "steps": len(table),
                         "round": rnd, **info})  # fmt: skip
            when = "" if rnd is None else f" (after round {rnd})"
            self.log(f"  calibration {s.name} T={t:g} C={c}{when}: "
                     f"{summary['throughput_tok_s']:.1f} tok/s, {len(table)} steps, align "
                     f"{info['align_worst']:.2f}, drafts exact "
                     f"{info['requests_exact']}/{info['requests_checked']}")  # fmt: skip
        return pd.concat(frames, ignore_index=True), rows


def calibrate(
    cfg: LlamaValidationConfig,
    s: SpecSetting,
    srv,  # noqa: ANN001 - a started LlamaServer
    ids: list[list[int]],
    lengths: list[int],
    log: Callable[[str], None],
) -> tuple[pd.DataFrame, list[dict]]:
    """Every calibration run of setting ``s`` on ``srv``, in one go before the grid: their
    steps (one frame, a ``clock`` column: ``client`` rebuilt, and ``server`` where ``srv``
    logs its steps) and a row of run-level numbers each. A first request warms the server
    up, unmeasured."""
    cal = Calibration(cfg, s, srv, ids, lengths, log)
    cal.warm()
    cal.run_loads()
    return cal.finish()


def _logged_steps(srv, at: int, requests: int) -> tuple[pd.DataFrame, int]:  # noqa: ANN001
    """The steps of the run whose log starts at offset ``at`` of ``srv``'s log, on the server's
    clock, and where the next run's starts (once every request's timings line is in it)."""
    from specsim.serve import spec_log
    from specsim.serve.log_steps import server_steps

    text, end = spec_log.settled_text(srv, at, requests)
    return server_steps(spec_log.parse(text[at:end])), end


def calibration_server(cfg: LlamaValidationConfig, s: SpecSetting, out: Path):  # noqa: ANN201
    """The server the calibration runs of ``s`` go to: with ``--step-clock server`` one of its
    own that logs every step (the log costs time, so the grid's cells never run on it; its
    steps are kept as ``logs/steps/calibration-<setting>.parquet``, the raw log removed),
    else None (the grid's server calibrates)."""
    if cfg.step_clock != "server":
        return None
    return start_server(cfg, s, out / "logs" / "calibration", steps=True)


def keep_calibration_log(s: SpecSetting, out: Path) -> None:
    """The logging calibration server's log, as its tidy step table (megabytes of text
    otherwise)."""
    from specsim.serve import spec_log

    raw = out / "logs" / "calibration" / f"server-{s.slug}.log"
    if raw.exists():
        dest = out / "logs" / "steps" / f"calibration-{s.slug}.parquet"
        spec_log.keep_table(raw.read_text(errors="replace"), raw, dest)

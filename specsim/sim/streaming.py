"""Streaming results: a replay's request-level summary accumulated as requests finish.

Why: a day of traffic is millions of requests, and the summary needs none of them once counted.
:class:`StreamingSummary` takes finished requests in batches (numpy arrays) and keeps

- counts, token totals, SLA and SLO counts exactly (integers), so ``sla_attainment``,
  ``slo_attainment``, ``goodput_req_s``, ``request_throughput`` and the token throughputs are
  the whole-run summary's to the bit;
- means exactly: the exactly rounded sum of the finite values (:class:`ExactSum`), which is what
  :func:`specsim.sim.metrics.summarize` divides by the count too, so they are bit-identical in
  any order of completion and any batching;
- percentiles exactly (``np.percentile`` of the kept values) while at most
  ``StreamConfig.exact_rows`` requests have finished, and from a :class:`DDSketch`
  (relative error ``alpha``, :mod:`specsim.sim.sketch`) beyond: the kept values are then
  dropped, so memory stops growing with the run;
- the steady window's two request times: the C-th completion and the last admission.

:class:`RequestSink` is what the engine hands its finished jobs to (``Engine(sink=...)``): it
buffers job ids and gathers their fields in bulk every ``flush_rows`` completions, feeding the
summary and, if asked, a :class:`ParquetRows` writer of the per-request table in row groups
(rows in completion order, the columns of :func:`specsim.sim.metrics.request_frame`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specsim.sim.metrics import SLO_KEYS, _pct, tpot_of
from specsim.sim.sketch import DEFAULT_ALPHA, DDSketch

METRICS = ("ttft", "tpot", "e2e", "tps")


@dataclass(frozen=True)
class StreamConfig:
    """How a streamed summary trades memory for exactness.

    ``exact_rows``: percentiles are exact (numpy's, as the whole-run summary) while at most this
    many requests have finished (32 bytes a request kept); ``alpha``: the sketch's relative
    error beyond; ``flush_rows``: finished requests buffered before one vectorised gather;
    ``row_group``: rows per Parquet row group of the per-request table."""

    exact_rows: int = 100_000
    alpha: float = DEFAULT_ALPHA
    flush_rows: int = 8192
    row_group: int = 65_536

    def __post_init__(self) -> None:
        if self.exact_rows < 0 or self.flush_rows < 1 or self.row_group < 1:
            raise ValueError(f"bad StreamConfig {self}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"StreamConfig alpha must be in (0, 1), got {self.alpha}")


class ExactSum:
    """The exact sum of float64 values, added in batches; ``value`` is it correctly rounded.

    Held as a few non-overlapping doubles whose exact sum is the sum so far: each batch is
    folded in by ``math.fsum`` (exact, then rounded once) and the rounding's remainder is
    recovered by fsum again until it is zero, so nothing is lost between batches. The rounded
    value is then ``math.fsum`` of every value ever added, whatever the order or batching."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[float] = []

    def add(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        terms = self.parts + values.tolist()
        parts: list[float] = []
        while True:
            p = math.fsum(terms + [-q for q in parts])
            if p == 0.0:
                break
            parts.append(p)
        self.parts = parts

    @property
    def value(self) -> float:
        return self.parts[0] if self.parts else 0.0


@dataclass(frozen=True, eq=False)
class Finished:
    """A batch of finished requests: one entry per request in every array (``stall_s`` may be
    None when the engine does not track preemption stalls)."""

    job: np.ndarray  # job id (the per-request table's ``id``)
    trace_index: np.ndarray
    arrival_s: np.ndarray
    admitted_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    emitted: np.ndarray
    steps: np.ndarray
    verified: np.ndarray
    accepted: np.ndarray
    stall_s: np.ndarray | None = None

    def metrics(self) -> dict[str, np.ndarray]:
        """ttft/tpot/e2e in ms and per-user tok/s, by the whole-run summary's arithmetic."""
        tpot = tpot_of(self.first_token_s, self.finish_s, self.output_len)
        with np.errstate(invalid="ignore", divide="ignore"):
            tps = 1.0 / tpot
        return {
            "ttft": (self.first_token_s - self.arrival_s) * 1000.0,
            "tpot": tpot * 1000.0,
            "e2e": (self.finish_s - self.arrival_s) * 1000.0,
            "tps": tps,
        }


class StreamingSummary:
    """Request-level statistics accumulated batch by batch (see the module docstring).

    Offers what :func:`specsim.sim.metrics.summarize` reads (the interface of
    :class:`specsim.sim.metrics.ExactRequests`): pass it as ``summarize(..., requests=it)``
    with the same ``sla_tps`` and ``slo``. ``concurrency``: the closed loop's C (the steady
    window starts at the C-th completion); None for open loops."""

    def __init__(
        self,
        sla_tps: float | None = None,
        slo: dict[str, float] | None = None,
        concurrency: int | None = None,
        config: StreamConfig | None = None,
    ) -> None:
        self.config = config if config is not None else StreamConfig()
        self.sla_tps = sla_tps
        self.slo = dict(slo) if slo else None
        self.concurrency = concurrency
        self.n_done = 0
        self.output_tokens = 0
        self.input_tokens = 0
        self._sla_ok = 0
        self._slo_ok = 0
        self._sums = {m: ExactSum() for m in METRICS}
        self._finite = dict.fromkeys(METRICS, 0)
        self.sketches = {m: DDSketch(self.config.alpha) for m in METRICS}
        self._kept: dict[str, list[np.ndarray]] | None = {m: [] for m in METRICS}
        self._first_fin = np.zeros(0)  # the C smallest finish times so far, sorted
        self.max_admitted = math.nan
        self.max_stall = math.nan

    # ------------------------------------------------------------------ add

    def add(self, batch: Finished) -> None:
        """Count a batch of finished requests."""
        n = int(batch.finish_s.shape[0])
        if n == 0:
            return
        self.n_done += n
        self.output_tokens += int(batch.emitted.sum())
        self.input_tokens += int(batch.prompt_len.sum())
        vals = batch.metrics()
        for m in METRICS:
            x = vals[m]
            fin = x[np.isfinite(x)]
            self._sums[m].add(fin)
            self._finite[m] += fin.size
            self.sketches[m].add(fin)
        if self._kept is not None:
            if self.n_done <= self.config.exact_rows:
                for m in METRICS:
                    self._kept[m].append(vals[m])
            else:  # past the threshold: the sketches hold everything from the first request
                self._kept = None
        if self.sla_tps is not None:
            tps = vals["tps"]
            self._sla_ok += int(
                np.count_nonzero(np.where(np.isnan(tps), True, tps >= self.sla_tps))
            )
        if self.slo:
            ok = np.ones(n, dtype=bool)
            for key in SLO_KEYS:
                if key in self.slo:
                    x = vals[key]
                    ok &= np.where(np.isnan(x), True, x <= self.slo[key])
            self._slo_ok += int(np.count_nonzero(ok))
        self._note_times(batch)

    def _note_times(self, batch: Finished) -> None:
        adm = batch.admitted_s[np.isfinite(batch.admitted_s)]
        if adm.size:
            self.max_admitted = float(np.fmax(self.max_admitted, adm.max()))
        if batch.stall_s is not None and batch.stall_s.size:
            st = batch.stall_s[~np.isnan(batch.stall_s)]
            if st.size:
                self.max_stall = float(np.fmax(self.max_stall, st.max()))
        c = self.concurrency
        if c is None:
            return
        kept = self._first_fin
        f = batch.finish_s[np.isfinite(batch.finish_s)]
        if kept.shape[0] >= c and (f.size == 0 or f.min() >= kept[-1]):
            return  # completions come in time order: nothing earlier than the C-th
        self._first_fin = np.sort(np.concatenate((kept, f)))[:c]

    def merge(self, other: StreamingSummary) -> None:
        """Add another summary of the same thresholds (a shard of the same run)."""
        if (self.sla_tps, self.slo, self.concurrency) != (
            other.sla_tps, other.slo, other.concurrency
        ):  # fmt: skip
            raise ValueError("cannot merge streaming summaries of different SLAs or loads")
        if other.config.alpha != self.config.alpha:
            raise ValueError("cannot merge streaming summaries of different sketch alpha")
        self.n_done += other.n_done
        self.output_tokens += other.output_tokens
        self.input_tokens += other.input_tokens
        self._sla_ok += other._sla_ok
        self._slo_ok += other._slo_ok
        for m in METRICS:
            s = self._sums[m]
            for part in other._sums[m].parts:
                s.add(np.array([part]))
            self._finite[m] += other._finite[m]
            self.sketches[m].merge(other.sketches[m])
        if (
            self._kept is not None
            and other._kept is not None
            and self.n_done <= self.config.exact_rows
        ):
            for m in METRICS:
                self._kept[m].extend(other._kept[m])
        else:
            self._kept = None
        self.max_admitted = float(np.fmax(self.max_admitted, other.max_admitted))
        self.max_stall = float(np.fmax(self.max_stall, other.max_stall))
        if self.concurrency is not None:
            both = np.concatenate((self._first_fin, other._first_fin))
            self._first_fin = np.sort(both)[: self.concurrency]

    # ------------------------------------------------------------------ read (ExactRequests')

    @property
    def exact(self) -> bool:
        """True while percentiles are numpy's exact ones (the rows are still kept)."""
        return self._kept is not None

    def mean(self, name: str) -> float:
        k = self._finite[name]
        return self._sums[name].value / k if k else math.nan

    def pct(self, name: str, q: float) -> float:
        if self._kept is not None:
            parts = self._kept[name]
            return _pct(np.concatenate(parts) if parts else np.zeros(0), q)
        return self.sketches[name].percentile(q)

    @property
    def sla_attainment(self) -> float:
        if self.sla_tps is None or self.n_done == 0:
            return math.nan
        return self._sla_ok / self.n_done

    @property
    def slo_ok(self) -> int | None:
        return self._slo_ok if self.slo else None

    def kth_finish(self, c: int) -> float:
        if c != self.concurrency:
            raise ValueError(f"this summary tracks the {self.concurrency}-th completion, not {c}")
        f = self._first_fin
        return float(f[c - 1]) if f.shape[0] >= c else math.nan

    def describe(self) -> dict[str, object]:
        """How the percentiles were computed (for a result's ``config``)."""
        return {
            "percentiles": "exact" if self.exact else f"ddsketch(alpha={self.config.alpha})",
            "exact_rows": self.config.exact_rows,
        }


class ParquetRows:
    """The per-request table written in row groups as requests finish, never held whole.

    Writes to ``path`` (a temporary name the caller renames into place: see
    :func:`specsim.outputs.writing`); ``trace_ids`` / ``category``: the trace's request ids
    and classes, indexed by each row's ``trace_index``."""

    def __init__(
        self,
        path: str | Path,
        trace_ids: np.ndarray,
        category: np.ndarray | None,
        row_group: int = StreamConfig.row_group,
    ) -> None:
        self.path = Path(path)
        self.trace_ids = trace_ids
        self.category = category
        self.row_group = int(row_group)
        self._writer = None
        self._schema = None
        self._pending: list[object] = []  # pandas frames not yet written
        self._rows = 0

    def add(self, batch: Finished) -> None:
        from specsim.sim.metrics import request_columns

        frame = request_columns(batch, self.trace_ids, self.category)
        self._pending.append(frame)
        self._rows += len(frame)
        if self._rows >= self.row_group:
            self._write()

    def _write(self) -> None:
        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._pending:
            return
        frame = pd.concat(self._pending, ignore_index=True)
        self._pending, self._rows = [], 0
        table = pa.Table.from_pandas(frame, schema=self._schema, preserve_index=False)
        if self._writer is None:
            self._schema = table.schema
            self._writer = pq.ParquetWriter(self.path, self._schema)
        for start in range(0, table.num_rows, self.row_group):
            self._writer.write_table(table.slice(start, self.row_group))

    def close(self) -> None:
        """Write what is left and the file's footer (an empty table if no request finished)."""
        self._write()
        if self._writer is None:  # nothing finished: an empty table with the columns
            import pyarrow as pa
            import pyarrow.parquet as pq

            from specsim.sim.metrics import request_columns

            empty = _empty_finished()
            table = pa.Table.from_pandas(
                request_columns(empty, self.trace_ids, self.category), preserve_index=False
            )
            pq.write_table(table, self.path)
            return
        self._writer.close()
        self._writer = None

    def abort(self) -> None:
        """Close an open writer without finishing the table (a failed run's file is removed)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _empty_finished() -> Finished:
    i, f = np.zeros(0, np.int64), np.zeros(0)
    return Finished(i, i, f, f, f, f, i, i, i, i, i, i, f)


class RequestSink:
    """What the engine hands finished jobs to (``Engine(sink=...)``).

    ``finished(jobs, ids)`` is called in the step that finishes them, after their counters were
    written back to ``jobs`` (:class:`specsim.sim.jobs.Jobs`); ids are buffered and gathered
    from ``jobs`` in bulk every ``flush_rows`` (a per-step gather would cost more than the
    summary), then released for reuse (``Jobs.recycle``), and ``close(jobs)`` gathers the rest
    at the end of the run."""

    def __init__(self, summary: StreamingSummary, rows: ParquetRows | None = None) -> None:
        self.summary = summary
        self.rows = rows
        self.flush_rows = summary.config.flush_rows
        self._ids: list[np.ndarray] = []
        self._n = 0

    def finished(self, jobs, ids: np.ndarray) -> None:  # noqa: ANN001 - sim.jobs.Jobs
        self._ids.append(np.array(ids, dtype=np.int64))
        self._n += ids.shape[0]
        if self._n >= self.flush_rows:
            self.flush(jobs)

    def flush(self, jobs) -> None:  # noqa: ANN001
        if not self._ids:
            return
        from specsim.sim.jobs import ACC, OUT, STEPS, VER

        j = np.concatenate(self._ids)
        self._ids, self._n = [], 0
        cols = jobs.cols[:, j]
        batch = Finished(
            job=jobs.seq[j],
            trace_index=jobs.trace[j],
            arrival_s=jobs.arrival[j],
            admitted_s=jobs.admitted[j],
            first_token_s=jobs.first[j],
            finish_s=jobs.finish[j],
            prompt_len=jobs.prompt[j],
            output_len=jobs.out[j],
            emitted=cols[OUT],
            steps=cols[STEPS],
            verified=cols[VER],
            accepted=cols[ACC],
            stall_s=jobs.stall[j],
        )
        self.summary.add(batch)
        if self.rows is not None:
            self.rows.add(batch)
        jobs.release(j)  # a closed loop's slots are reused (Jobs.recycle)

    def close(self, jobs) -> None:  # noqa: ANN001
        self.flush(jobs)
        if self.rows is not None:
            self.rows.close()

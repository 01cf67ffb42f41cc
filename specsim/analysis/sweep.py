"""Run a grid of replays in parallel (local processes or a Dask cluster), resumably.

Output: one tidy table, one row per cell (trace x policy x load x replicate), every knob a
column, then every number of :attr:`ReplayResult.summary`. Rows come back in grid order whatever
order the cells finish in, so local, Dask and resumed runs give the same table (all but
``wall_time_s``, the one column that measures this machine rather than the simulation).

Resuming: with ``out=`` each finished cell is written at once, atomically, to
``<out>.parts/<hash>.parquet``. A re-run with the same arguments reads those (and the rows of a
previous complete ``out``) and runs only the missing cells. The table itself is written to a
temporary name and renamed, so ``out`` is either absent, the previous complete file, or the new
complete file: never half-written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from specsim.analysis.cell_warnings import KEY, Tally, recording
from specsim.analysis.grid import Cell, file_digest, make_grid
from specsim.errors import SpecsimError
from specsim.limits import MAX_CELLS_ENV, max_cells
from specsim.outputs import NAME_MAX, check_out, lock, write_table
from specsim.progress import Progress

SWEEP_META_KEY = b"specsim.sweep"
# Columns that measure the machine, not the simulation: excluded from equality checks.
NONDETERMINISTIC = ("wall_time_s", "sim_tokens_per_wall_s")


@lru_cache(maxsize=8)
def _load_trace(path: str):  # noqa: ANN202 - Trace, imported lazily
    from specsim.trace.io import read_trace

    return read_trace(path)


@lru_cache(maxsize=16)
def _builtin_profile(spec: str):  # noqa: ANN202 - CostModel, imported lazily
    """A built-in profile (a name, not a file) once per worker: a measured one is read from
    its CSV (~5 ms) on every call otherwise. Profiles are frozen; files are re-read."""
    from specsim.sim.cost.profiles import get_profile

    return get_profile(spec)


def _profile(spec: str):  # noqa: ANN202 - CostModel
    from specsim.sim.cost.profiles import get_profile

    if spec.endswith(".csv") or os.sep in spec or Path(spec).exists():
        return get_profile(spec)
    return _builtin_profile(spec)


def run_cell(cell: Cell) -> dict[str, Any]:
    """Replay one cell and return its row (knobs + summary). Top-level so it pickles."""
    from specsim.sim.simulate import replay
    from specsim.sim.workload import UnsteadyWarning

    trace = _load_trace(cell.trace)
    kwargs = cell.replay_kwargs()
    kwargs["profile"] = _profile(cell.profile)
    # a sweep keeps the summary only: no per-token or per-step logs (same numbers, less memory),
    # and the requests are counted into it as they finish (specsim.sim.streaming: the same
    # counts, means and shares; percentiles exact up to stream_exact_rows requests a cell,
    # within the sketch's 0.5% beyond)
    kwargs.setdefault("stream", True)
    # build_cells said UnsteadyWarning once already; the rest go back with the row (Tally)
    with recording(UnsteadyWarning) as said:
        result = replay(trace, cell.policy, record_tokens=False, record_steps=False, **kwargs)
    row = cell.knobs()
    row.update((k, v) for k, v in result.summary.items() if k not in row)
    if said:
        row[KEY] = said
    return row


def sweep(
    traces: str | Path | Iterable[str | Path],
    policies: str | Iterable[str],
    *,
    concurrency: Iterable[float] | None = None,
    rates: Iterable[float] | None = None,
    seeds: int = 1,
    profile: str = "llama-3-8b-h100",
    seed: int = 0,
    requests: int | None = None,
    duration: float | None = None,
    out: str | Path | None = None,
    workers: int | None = None,
    dask: Any = None,
    force: bool = False,
    progress: bool | None = None,
    requests_per_concurrency: float | None = None,
    **replay_options: Any,
) -> pd.DataFrame:
    """Replay every (trace, policy, load, replicate) and return the tidy table.

    ``concurrency`` (closed loop, requests in flight) or ``rates`` (open loop, requests/s): give
    exactly one. ``dask``: a scheduler address ``"tcp://host:port"`` or a
    ``distributed.Client``; otherwise local processes (``workers``, default ``os.cpu_count()``;
    1 runs in this process). Other keyword arguments go to every replay (``sla_tps=``, ...).
    ``out``: write the table there (Parquet), resuming a previous interrupted run.
    """
    cells = build_cells(
        traces,
        policies,
        concurrency=concurrency,
        rates=rates,
        seeds=seeds,
        profile=profile,
        seed=seed,
        requests=requests,
        duration=duration,
        options=replay_options,
        requests_per_concurrency=requests_per_concurrency,
    )
    return run_cells(cells, out=out, workers=workers, dask=dask, force=force, progress=progress)


def _check_steady(traces: list[str], c_max: float, requests: int | None, options: dict) -> None:
    """The closed-loop rule of ``replay`` (``check_steady_window``), once for the whole grid
    at its highest concurrency, so a refused grid is refused before any cell runs and an
    allowed short one warns once, not once per cell."""
    from specsim.sim.workload import check_steady_window
    from specsim.trace.io import read_trace

    jobs = requests
    if jobs is None:
        jobs = min(read_trace(t).n_requests for t in traces)
    check_steady_window(int(c_max), int(jobs), requests, bool(options.get("require_steady")))


def build_cells(
    traces: str | Path | Iterable[str | Path],
    policies: str | Iterable[str],
    *,
    concurrency: Iterable[float] | None = None,
    rates: Iterable[float] | None = None,
    seeds: int = 1,
    profile: str = "llama-3-8b-h100",
    seed: int = 0,
    requests: int | None = None,
    duration: float | None = None,
    options: dict[str, Any] | None = None,
    requests_per_concurrency: float | None = None,
) -> list[Cell]:
    """The grid :func:`sweep` runs (checks the traces exist). ``requests_per_concurrency``
    = k: a closed-loop cell at C runs max(requests, ceil(k C)) requests."""
    from specsim.trace.io import resolve_trace

    names = [traces] if isinstance(traces, str | Path) else list(traces)
    # a shipped name (chat, traces/chat.parquet) becomes its file here, once, as replay does:
    # every later step (digest, workers, the table's trace_path) reads that file
    trace_list = [str(resolve_trace(t)) for t in names]
    from specsim.options import split_items

    pol_list = split_items(policies, "policies") if isinstance(policies, str) else list(policies)
    arrivals = (options or {}).get("arrivals")
    if arrivals is not None:
        if concurrency is not None or rates is not None:
            raise SpecsimError(
                "--arrivals sets the load (its arrival times); drop --concurrency/--rates"
            )
        kind, loads = "arrivals", [1.0]
    elif (concurrency is None) == (rates is None):
        raise SpecsimError(
            "give exactly one load: --concurrency, --rates or --arrivals (concurrency=, rates= "
            "or options={'arrivals': ...})"
        )
    else:
        kind, loads = ("concurrency", concurrency) if concurrency is not None else ("rate", rates)
        loads = list(loads)  # type: ignore[arg-type]
        from specsim.sim.config import ReplayConfig

        for x in loads:  # each load as a replay would take it: a clear error before any cell
            ReplayConfig(**{kind: x})
        ReplayConfig(requests=requests, duration=duration)
    n_cells = len(trace_list) * len(pol_list) * len(list(loads)) * int(seeds)  # type: ignore[arg-type]
    if n_cells > max_cells():
        raise SpecsimError(
            f"this grid has {n_cells:,} cells, more than the limit of {max_cells():,}; sweep "
            f"fewer seeds, loads or policies, or raise the limit with {MAX_CELLS_ENV}=N"
        )
    if kind == "rate" and duration is not None:
        from specsim.sim.workload import check_request_count

        for x in loads:  # type: ignore[union-attr]
            check_request_count(float(x) * float(duration), f"--rates {x:g} for {duration:g} s")
    if kind == "concurrency" and duration is not None:
        pass  # bounded by time: each replay checks its own request count
    elif kind == "concurrency":
        c_max = max(float(x) for x in loads)  # type: ignore[union-attr]
        at_max = requests  # the largest load's cell runs the most requests
        if requests_per_concurrency is not None:
            at_max = max(int(requests or 0), int(np.ceil(requests_per_concurrency * c_max)))
        _check_steady(trace_list, c_max, at_max, options or {})
    digests = {t: file_digest(t) for t in trace_list}
    seen: dict[tuple[str, str], str] = {}
    for t, d in digests.items():  # a cell is known by its file's name and content
        other = seen.setdefault((Path(t).name, d), t)
        if other != t:
            raise SpecsimError(
                f"traces {other!r} and {t!r} are the same file content under the same name; "
                "list it once"
            )
    return make_grid(
        trace_list,
        pol_list,
        [float(x) for x in loads],  # type: ignore[union-attr]
        load_kind=kind,
        seeds=int(seeds),
        profile=profile,
        base_seed=int(seed),
        requests=requests,
        duration=duration,
        # the closed-loop rule was applied above, to the whole grid: it is not a cell's input
        options={
            k: v for k, v in (options or {}).items() if v is not None and k != "require_steady"
        },
        digests=digests,
        requests_per_concurrency=requests_per_concurrency,
    )


def run_cells(
    cells: list[Cell],
    *,
    out: str | Path | None = None,
    workers: int | None = None,
    dask: Any = None,
    force: bool = False,
    progress: bool | None = None,
    runner: Callable[[Cell], dict[str, Any]] = run_cell,
) -> pd.DataFrame:
    """Run the cells not already done and return the table in grid order.

    The returned frame's ``attrs`` say ``cells_total``, ``cells_run`` and ``cells_reused``.
    """
    check_workers(workers)
    store = _Store(Path(out)) if out is not None else None
    with lock(store.out) if store is not None else contextlib.nullcontext():
        table, n_run = _run_locked(cells, store, workers, dask, force, progress, runner)
    table.attrs.update(cells_total=len(cells), cells_run=n_run, cells_reused=len(cells) - n_run)
    return table


def check_workers(workers: int | None) -> None:
    if workers is not None and int(workers) < 1:
        raise SpecsimError(f"--workers must be at least 1 (default: one per CPU), got {workers}")


def cell_cost(cell: Cell) -> float:
    """A relative estimate of a cell's CPU time, to start the longest cells first.

    ``specsim.sim.cost.estimate.replay_cost_estimate`` (steps x cost of a step, per policy kind): at
    one request in flight a token costs ~20x what it costs at 256, so the low-load cells are the
    long ones. A rate's concurrency is unknown before the run; the rate stands in for it.
    """
    from specsim.sim.cost.estimate import replay_cost_estimate

    requests = cell.requests or 100
    load = float(cell.load) if cell.load_kind != "arrivals" else 16.0
    return replay_cost_estimate(cell.policy, int(requests), 200.0, max(load, 1.0))


def _run_locked(
    cells: list[Cell],
    store: _Store | None,
    workers: int | None,
    dask: Any,
    force: bool,
    progress: bool | None,
    runner: Callable[[Cell], dict[str, Any]],
) -> tuple[pd.DataFrame, int]:
    keys = [c.key for c in cells]
    done: dict[str, pd.DataFrame] = {}
    if store is not None:
        done = store.load_done(set(keys), force=force)
    todo = sorted((c for c in cells if c.key not in done), key=cell_cost, reverse=True)
    tally = Tally()  # the cells' warnings, said once each after the progress
    with Progress(len(cells), "sweep", " cells", enabled=progress) as bar:
        bar.update(len(cells) - len(todo))
        if len(cells) > len(todo):
            bar.note(f"{len(cells) - len(todo)} cached")
        for cell, row in _execute(todo, workers=workers, dask=dask, runner=runner):
            tally.add(row)  # takes the warnings out of the row
            frame = _row_frame(row)  # the dtypes a resumed run reads back from its part
            if store is not None:
                store.save_part(cell, frame)
            done[cell.key] = frame
            bar.update(1)
    table = _concat([done[k] for k in keys])
    if store is not None:
        store.finish(table)
    tally.warn()
    return table, len(todo)


def _die_with_parent() -> None:
    """Worker initializer: the kernel kills this worker when the sweep's process dies.

    Without it, ``kill -9`` (or an unhandled SIGTERM) of a sweep leaves its workers computing
    for minutes. Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``; elsewhere a no-op.
    """
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _execute(
    todo: list[Cell],
    *,
    workers: int | None,
    dask: Any,
    runner: Callable[[Cell], dict[str, Any]],
) -> Iterable[tuple[Cell, dict[str, Any]]]:
    """Yield (cell, row) as cells finish: in this process, in local processes, or on Dask."""
    if not todo:
        return
    if dask is not None:
        yield from _execute_dask(todo, dask, runner)
        return
    n = int(workers) if workers is not None else (os.cpu_count() or 1)
    if n == 1 or len(todo) == 1:
        for cell in todo:
            yield cell, runner(cell)
        return
    with ProcessPoolExecutor(max_workers=min(n, len(todo)), initializer=_die_with_parent) as pool:
        futures = {pool.submit(runner, cell): cell for cell in todo}
        try:
            for fut in as_completed(futures):
                yield futures[fut], fut.result()
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise


def dask_client(dask: Any) -> tuple[Any, bool]:
    """(client, owned): a ``distributed.Client`` as given, or a new one for an address."""
    try:
        from distributed import Client
    except ImportError:
        raise SpecsimError(
            "--dask needs dask.distributed; install it with pip install 'specsim[dask]'"
        ) from None
    if isinstance(dask, Client):
        return dask, False
    import re

    if not re.fullmatch(r"(tcp|tls|ucx)://[^\s:/]+:\d{1,5}|inproc://\S+", str(dask)):
        raise SpecsimError(
            f"--dask {dask!r} is not a scheduler address; give tcp://host:port (the address "
            "'dask scheduler' prints)"
        )
    try:
        return Client(str(dask), timeout="10s", set_as_default=False), True
    except (OSError, ValueError, TimeoutError) as exc:
        raise SpecsimError(
            f"cannot reach the Dask scheduler at {dask!r} ({exc}); check the address "
            "(tcp://host:port) and that the scheduler is running"
        ) from None


def _execute_dask(
    todo: list[Cell], dask: Any, runner: Callable[[Cell], dict[str, Any]]
) -> Iterable[tuple[Cell, dict[str, Any]]]:
    from distributed import as_completed as dask_completed

    client, own = dask_client(dask)
    try:
        futures = [
            client.submit(runner, cell, key=f"specsim-cell-{cell.key_hash}", pure=False)
            for cell in todo
        ]
        by_key = {f.key: cell for f, cell in zip(futures, todo, strict=True)}
        for fut in dask_completed(futures, loop=client.loop):
            yield by_key[fut.key], fut.result()
    finally:
        if own:
            client.close()


def _row_frame(row: dict[str, Any]) -> pd.DataFrame:
    """One row through Arrow, so in-memory rows have exactly the dtypes a Parquet part has
    (the sweep tests compare resumed tables, read from parts, with fresh ones). Straight from
    the dict: ~1 ms a cell where a DataFrame first took ~4.5 and reading the part back ~3.4,
    in the process that also feeds the workers."""
    return pa.Table.from_pylist([row]).to_pandas()


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


class _Store:
    """The output file and its ``.parts`` folder of finished cells."""

    def __init__(self, out: Path) -> None:
        # resuming an existing table is the default, so an existing file is not refused here
        self.out = check_out(out, force=True, suffixes=(".parquet",))
        if len(os.fsencode(out.name + ".parts")) > NAME_MAX:
            raise SpecsimError(
                f"--out {out.name[:40]!r}...: the name leaves no room for its '.parts' folder of "
                f"finished cells ({NAME_MAX} bytes at most with it); choose a shorter name"
            )
        self.parts = out.with_name(out.name + ".parts")
        if self.parts.exists() and not self.parts.is_dir():
            raise SpecsimError(
                f"{self.parts} is a file, but a sweep keeps its finished cells in a folder of "
                "that name; move the file away"
            )

    def load_done(self, keys: set[str], *, force: bool) -> dict[str, pd.DataFrame]:
        """Rows already computed for this grid (from a complete ``out`` and from parts)."""
        done: dict[str, pd.DataFrame] = {}
        if force:
            if self.parts.exists():
                shutil.rmtree(self.parts)
            return done
        if self.out.exists():
            old = self._read_existing()
            extra = sorted(set(old["cell_key"]) - keys)
            if extra:
                raise SpecsimError(
                    f"{self.out} holds {len(extra)} cells that are not in this sweep (another "
                    "grid); pass --force to replace it, or choose another --out"
                )
            for key, grp in old.groupby("cell_key", sort=False):
                done[str(key)] = grp.reset_index(drop=True)
        if self.parts.is_dir():
            for f in sorted(self.parts.glob("*.parquet")):
                try:
                    frame = pd.read_parquet(f)
                except Exception:  # noqa: BLE001 - a damaged part is simply re-run
                    continue
                if len(frame) == 1 and frame["cell_key"].iloc[0] in keys:
                    done.setdefault(str(frame["cell_key"].iloc[0]), frame)
        return done

    def _read_existing(self) -> pd.DataFrame:
        try:
            meta = pq.read_schema(self.out).metadata or {}
        except Exception:  # noqa: BLE001
            meta = {}
        if SWEEP_META_KEY not in meta:
            raise SpecsimError(
                f"{self.out} exists and is not a specsim sweep table; pass --force to "
                "overwrite it, or choose another --out"
            )
        try:
            old = pd.read_parquet(self.out)
        except Exception as exc:  # noqa: BLE001 - any damage to the file
            raise SpecsimError(
                f"{self.out} is marked as a sweep table but cannot be read "
                f"({type(exc).__name__}); pass --force to replace it"
            ) from None
        if "cell_key" not in old.columns:
            raise SpecsimError(
                f"{self.out} is marked as a sweep table but has no cell_key column (edited by "
                "hand?); pass --force to replace it, or choose another --out"
            )
        return old

    def _part_path(self, cell: Cell) -> Path:
        return self.parts / f"{cell.key_hash}.parquet"

    def save_part(self, cell: Cell, frame: pd.DataFrame) -> None:
        self.parts.mkdir(exist_ok=True)
        write_table(frame, self._part_path(cell))

    def finish(self, table: pd.DataFrame) -> None:
        write_table(table, self.out, meta={SWEEP_META_KEY: b"1"})
        if self.parts.exists():
            shutil.rmtree(self.parts)


def deterministic_columns(table: pd.DataFrame) -> list[str]:
    """The columns two runs of the same grid must agree on, bit for bit."""
    return [c for c in table.columns if c not in NONDETERMINISTIC]

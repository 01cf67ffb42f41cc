"""``specsim report NAME``: regenerate ``reports/NAME/`` from the config committed beside it.

A report folder holds ``config.toml`` (small, hand-written, committed), and what this module
writes from it: ``README.md`` (tables, figures, the exact command and the versions that made
them), the PNG figures, and ``results.parquet`` (the tidy table behind them). The config's
``kind`` picks the builder (``schedulers-under-load``, ``zos``, ``lossless``), so a user can make
their own study by copying a folder and editing its config.

Paths in a config are relative to the config's folder. A trace entry may be a list of
candidates, the first that exists wins: ``["../../traces/chat.parquet",
"../../traces/synthetic-chat.parquet"]`` uses the recorded trace once it is there and the
synthetic one until then, so regenerating with real traces is the same single command.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from specsim.errors import SpecsimError
from specsim.outputs import write_table, write_text

# kind -> the module whose ``build(ctx)`` makes it. A table, not a decorator registry, so that this
# plumbing never imports the reports (they import it) and ``--help`` stays cheap.
KINDS: dict[str, str] = {
    "schedulers-under-load": "specsim.analysis.reports.schedulers_under_load",
    "zos": "specsim.analysis.reports.zos",
    "lossless": "specsim.analysis.reports.lossless",
    "real-deployments": "specsim.analysis.reports.real_deployments",
}


def builder(kind: str) -> Callable[[ReportContext], None]:
    """The ``build`` function of a report kind."""
    import importlib

    return importlib.import_module(KINDS[kind]).build


@dataclass
class ReportContext:
    """What a builder gets: the config, its folder, and a README being assembled."""

    name: str
    folder: Path
    config: dict[str, Any]
    workers: int | None = None
    progress: bool | None = None
    resume: bool = False  # reuse results.parquet rows (only when the code has not changed)
    lines: list[str] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # for the footer (e.g. reused cells)
    # the footer's account of the sweeps (reports.common.count_cells)
    cells_total: int = 0
    cells_reused: int = 0
    cell_seconds: float = 0.0  # replay wall seconds of every cell, as computed
    load_before: float = 0.0  # the 1-minute load when the run began (the footer states it)

    # ---- config access with one-line errors
    def get(self, key: str, default: Any = ..., kind: type | tuple[type, ...] | None = None) -> Any:
        if key not in self.config:
            if default is ...:
                raise SpecsimError(
                    f"{self.folder / 'config.toml'} has no {key!r}; add it (the keys of each "
                    "kind are listed in docs/api.md, Report configs)"
                )
            return default
        value = self.config[key]
        if kind is None and default is not ... and default is not None:
            # the default's type is the key's type: a string where a number belongs is refused
            # here in one line, not as a ValueError in the middle of a report
            if isinstance(default, bool):
                kind = bool
            elif isinstance(default, int | float):
                kind = (int, float)
            elif isinstance(default, list | str | dict):
                kind = type(default)
        if kind is not None and (
            not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind))
        ):
            raise SpecsimError(
                f"{self.folder / 'config.toml'}: {key!r} must be {_kind_name(kind)}, "
                f"got {type(value).__name__}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            # TOML spells inf and nan; no report input means either (a sigma of inf, a load of
            # nan): refused here, for every key, rather than as a NaN table or a hang later
            raise SpecsimError(
                f"{self.folder / 'config.toml'}: {key!r} is {value}; give a finite number"
            )
        return value

    def choice(self, key: str, choices: Any, default: Any = ...) -> str:
        """A word from a fixed set (an accept profile, a model name), refused in one line."""
        value = self.get(key, default, kind=str)
        if value not in choices:
            raise SpecsimError(
                f"{self.folder / 'config.toml'}: {key!r} is {value!r}; use one of "
                f"{', '.join(map(str, choices))}"
            )
        return value

    def choices(self, key: str, choices: Any, default: Any = ...) -> list[str]:
        """A non-empty list of words from a fixed set (a report's arms)."""
        values = self.get(key, default, kind=list)
        bad = [v for v in values if not isinstance(v, str) or v not in choices]
        if not values or bad:
            what = f"holds {bad[0]!r}" if bad else "is empty"
            raise SpecsimError(
                f"{self.folder / 'config.toml'}: {key!r} {what}; list one or more of "
                f"{', '.join(map(str, choices))}"
            )
        return list(values)

    def counts(self, key: str, default: Any = ...) -> list[int]:
        """A non-empty list of whole numbers >= 1 (concurrencies, GPU counts)."""
        values = self.numbers(key, default)
        bad = [v for v in values if v < 1 or v != int(v) or v > 2**31]
        if bad:
            raise SpecsimError(
                f"{self.folder / 'config.toml'}: {key!r} holds {bad[0]:g}; list whole numbers "
                "from 1 to 2**31, as [1, 16, 64]"
            )
        return [int(v) for v in values]

    def count(self, key: str, default: Any = ..., least: int = 1, most: int = 2**31) -> int:
        """A whole number from ``least`` (1: requests, GPUs, a block size; 0: a seed) to
        ``most`` (2**31, or what the key can use: a block no longer than its acceptance
        profile, since a longer one would silently be cut to it)."""
        value = self.get(key, default, kind=int)
        if not least <= value <= most:
            upto = "2**31" if most == 2**31 else f"{most}"
            raise SpecsimError(
                f"{self.folder / 'config.toml'}: {key!r} is {value}; give a whole number from "
                f"{least} to {upto}"
            )
        return int(value)

    def positive(
        self, key: str, default: Any = ..., most: float = math.inf, least: float = 0.0
    ) -> float:
        """A finite number > 0 (and >= ``least`` when that is given), at most ``most``: a
        median length (in whole tokens: ``least=1``), a sigma, an AUROC."""
        value = self.get(key, default, kind=(int, float))
        if not (0 < value <= most and value >= least):
            low = f"from {least:g}" if least > 0 else "> 0"
            upto = f" and at most {most:g}" if math.isfinite(most) else ""
            raise SpecsimError(
                f"{self.folder / 'config.toml'}: {key!r} is {value}; give a number {low}{upto}"
            )
        return float(value)

    def numbers(self, key: str, default: Any = ..., allow_empty: bool = False) -> list[float]:
        """A list of numbers from the config (``concurrency = [1, 2, 4]``), checked element by
        element (and not empty, unless ``allow_empty``)."""
        values = self.get(key, default, kind=list)
        if not values and not allow_empty:
            raise SpecsimError(
                f"{self.folder / 'config.toml'}: {key!r} is empty; list at least one number"
            )
        bad = [
            v
            for v in values
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
        ]
        if bad:
            raise SpecsimError(
                f"{self.folder / 'config.toml'}: {key!r} must list finite numbers, but holds "
                f"{bad[0]!r}; write it as [1, 2, 4]"
            )
        return [float(v) for v in values]

    def path(self, entry: str | list[str]) -> Path:
        """Resolve a config path (or the first existing of a list of candidates)."""
        candidates = [entry] if isinstance(entry, str) else list(entry)
        for c in candidates:
            p = Path(os.path.abspath(self.folder / c))  # keeps the `traces` link's name in READMEs
            if p.exists():
                return p
        raise SpecsimError(
            f"{self.folder / 'config.toml'}: none of {candidates} exists (paths are relative "
            "to the config's folder); create the file or fix the path"
        )

    def rel(self, p: Path) -> str:
        """A path as the README shows it: relative to the repository (the cwd) if possible."""
        try:
            return os.path.relpath(p, Path.cwd())
        except ValueError:
            return str(p)

    # ---- README assembly
    def md(self, *text: str) -> None:
        self.lines.extend(text)

    def figure(self, fig: Any, filename: str, caption: str) -> None:
        from specsim.analysis.figures import save_figure

        out = self.folder / filename
        save_figure(fig, out, force=True)
        import matplotlib.pyplot as plt

        plt.close(fig)
        self.written.append(out)
        self.md(f"![{caption}]({filename})", "", f"*{caption}*", "")

    def table(self, frame: pd.DataFrame, floatfmt: str = "{:,.1f}") -> None:
        self.md(markdown_table(frame, floatfmt), "")

    def save_results(self, frame: pd.DataFrame, filename: str = "results.parquet") -> Path:
        out = self.folder / filename
        write_table(frame, out)
        self.written.append(out)
        return out


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def markdown_table(frame: pd.DataFrame, floatfmt: str = "{:,.1f}") -> str:
    """A GitHub-flavoured Markdown table (tabulate, as pandas ``to_markdown``); NaN is n/a.

    ``floatfmt`` is a ``str.format`` field (``"{:,.1f}"``), the form the report builders use.
    """
    from tabulate import tabulate

    def cell(v: Any) -> Any:
        if isinstance(v, float) and v != v:
            return None
        return v.replace("|", "\\|") if isinstance(v, str) else v

    rows = [[cell(v) for v in row] for row in frame.astype(object).itertuples(index=False)]
    spec = floatfmt.strip("{}").lstrip(":")
    return tabulate(
        rows, headers=[str(c) for c in frame.columns], tablefmt="github", floatfmt=spec,
        missingval="n/a",
    )  # fmt: skip


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.toml"
    made_by = _made_by_command(folder)
    if not path.is_file() and made_by:
        raise SpecsimError(
            f"report folder {str(folder)!r} is made by another command, not by specsim report; "
            f"regenerate it with: {made_by}"
        )
    if not path.is_file():
        raise SpecsimError(
            f"report folder {str(folder)!r} has no config.toml; create one or pick one of: "
            f"{', '.join(list_reports(folder.parent)) or '(none)'}"
        )
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise SpecsimError(f"{path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise SpecsimError(f"{path} is not UTF-8 text; save it as UTF-8") from None


def _made_by_command(folder: Path) -> str | None:
    """The command a report's README says made it (``specsim validate`` writes such a README)."""
    readme = folder / "README.md"
    if not readme.is_file():
        return None
    lines = readme.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Made by") and i + 3 < len(lines) and lines[i + 2] == "```":
            return lines[i + 3].strip() or None
    return None


def list_reports(root: Path) -> list[str]:
    """Report folders under ``root``: those with a config.toml, and those another command made."""
    if not root.is_dir():
        raise SpecsimError(f"--root {str(root)!r} is not a folder of reports; check the path")
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and ((p / "config.toml").is_file() or _made_by_command(p))
    )


def versions() -> dict[str, str]:
    """Versions of what made the numbers, and the git revision of the code."""
    out = {"python": platform.python_version()}
    for pkg in ("specsim", "numpy", "pandas", "scipy", "simpy", "matplotlib", "pyarrow"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    out["git"] = _git_rev()
    return out


def _git_rev() -> str:
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--", str(here.parent)],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return rev + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"


def run_report(
    name: str,
    root: str | Path = "reports",
    *,
    workers: int | None = None,
    progress: bool | None = None,
    resume: bool = False,
) -> Path:
    """Regenerate ``root/name/`` (README.md, figures, results) and return the README path.

    ``resume``: reuse the rows of ``results.parquet`` whose cells are unchanged. Off by default:
    a cell's key names its inputs, not the code that simulated it, so after a change to the
    simulator or a profile only a full run is honest.
    """
    folder = Path(root) / name
    if not folder.is_dir():
        known = list_reports(Path(root))
        raise SpecsimError(
            f"no report folder {str(folder)!r}; known reports: {', '.join(known) or '(none)'}"
        )
    config = read_config(folder)
    kind = config.get("kind", name)
    if kind not in KINDS:
        raise SpecsimError(
            f"{folder / 'config.toml'}: unknown kind {kind!r}; choose one of "
            f"{', '.join(sorted(KINDS))}"
        )
    ctx = ReportContext(
        name=name, folder=folder, config=config, workers=workers, progress=progress, resume=resume
    )
    title = config.get("title", name)
    ctx.md(f"# {title}", "")
    if "summary" in config:
        ctx.md(str(config["summary"]).strip(), "")
    started = _dt.datetime.now(_dt.UTC)
    ctx.load_before = os.getloadavg()[0]
    builder(kind)(ctx)
    if "changes" in config:  # what moved since the last version (the config says, by hand)
        ctx.md("## What changed since the last version", "", str(config["changes"]).strip(), "")
    took = (_dt.datetime.now(_dt.UTC) - started).total_seconds()
    _footer(ctx, took)
    readme = folder / "README.md"
    write_text("\n".join(ctx.lines).rstrip() + "\n", readme)
    return readme


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} minutes"


def _regeneration_time(ctx: ReportContext, took_s: float) -> list[str]:
    """What regenerating from scratch costs, when this run reused cells: their replays' own
    seconds (measured when each cell ran) one after another, and the floor that many idle
    workers would reach (a busy machine, or a worker's start-up, lands between the two)."""
    if not ctx.cells_reused:
        return []
    workers = max(1, int(ctx.workers or os.cpu_count() or 1))
    serial = ctx.cell_seconds + took_s
    floor = ctx.cell_seconds / workers + took_s
    return [
        f"From scratch (no `--resume`, or a changed cell): about {_duration(serial)} on one "
        f"worker, {_duration(floor)} at best on {workers} idle workers: the "
        f"{ctx.cells_total:,} cells' replays took {ctx.cell_seconds:,.0f} s when they were "
        "computed. `--resume` reuses the unchanged cells of this folder's tables, as this run "
        "did.",
        "",
    ]


def _footer(ctx: ReportContext, took_s: float) -> None:
    v = versions()
    cmd = f"specsim report {ctx.name}"
    if ctx.folder.parent.resolve() != (Path.cwd() / "reports").resolve():
        cmd += f" --root {ctx.rel(ctx.folder.parent)}"
    ctx.md(
        "## How this was made",
        "",
        "Regenerate everything in this folder (figures, tables, `results.parquet`) with:",
        "",
        "```",
        cmd,
        "```",
        "",
        f"from `config.toml` beside this file (run from the repository root; {took_s:.0f} s "
        f"on {os.cpu_count()} CPU cores here, 1-minute load {ctx.load_before:.2f} before and "
        f"{os.getloadavg()[0]:.2f} after" + "".join(f"; {n}" for n in ctx.notes) + ").",
        "",
        *_regeneration_time(ctx, took_s),
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        "",
        f"Python {sys.version.split()[0]} on {platform.system()} {platform.machine()}.",
        "",
    )

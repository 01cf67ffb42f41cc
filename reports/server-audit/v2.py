"""Audit v2 against llama.cpp b11434 (issue 46): the sweep, and the bug classes as mutants.

    python reports/server-audit/v2.py sweep    # the lossless grid: sweep.csv (+ divergences)
    python reports/server-audit/v2.py mutants  # bug-class proxies: mutants.csv (+ divergences)

``sweep``: SmolLM2-135M-Instruct Q4_1 served by llama-server with speculation off, ngram-simple,
draft-simple (the model drafts for itself; greedy draft sampling at T = 0, probabilistic at
T = 1) and draft-dspark (specsim's drafter v3), depths 1-7 (one server per depth), concurrency
1, 2 and 4, temperature 0 (greedy identity with triage) at every cell and temperature 1 (the
output law) at depth 7. One reference (speculation off), one numerics null for the sweep.
``mutants``: the same audits of servers behind the proxy's bug-class mutants.
The numbers are what the run printed; run.log is its own output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pandas as pd

from specsim.record.models import smollm2_gguf
from specsim.serve.audit.sweep import (
    Kind,
    SweepSpec,
    divergence_table,
    run_sweep,
    verdict_table,
)

HERE = Path(__file__).resolve().parent
MODEL = smollm2_gguf()
THREADS = ("-td", "1")


def dspark_gguf(out: Path) -> Path:
    """Drafter v3 exported (DeepSpec layout) and converted by llama.cpp's own converter."""
    gguf = out / "dspark-v3.gguf"
    if gguf.is_file():
        return gguf
    from specsim.record.api import load_drafter_spec
    from specsim.record.dspark_export import convert_to_gguf, export_deepspec, target_model_dir
    from specsim.record.models import load_target

    target = load_target("smollm2")
    drafter, _ = load_drafter_spec("dspark-v3", target, None)
    tdir = target_model_dir(target)
    ckpt = export_deepspec(drafter.float().eval(), out / ".deepspec", tdir, force=True)
    return convert_to_gguf(ckpt, tdir, gguf)


def kinds(dspark: Path, sampling: str) -> tuple[Kind, ...]:
    m = str(MODEL)
    return (
        Kind("none", ()),
        Kind(
            "ngram-simple",
            ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3"),
            "--spec-ngram-simple-size-m",
        ),  # fmt: skip
        Kind(
            f"draft-simple-{sampling}",
            (
                "--spec-type",
                "draft-simple",
                "-md",
                m,
                "--spec-draft-p-min",
                "0",
                "--spec-draft-sampling",
                sampling,
                *THREADS,
            ),
            "--spec-draft-n-max",
        ),  # fmt: skip
        Kind(
            "draft-dspark",
            (
                "--spec-type",
                "draft-dspark",
                "-md",
                str(dspark),
                "--spec-draft-p-min",
                "0",
                *THREADS,
            ),
            "--spec-draft-n-max",
        ),  # fmt: skip
    )


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _writer(name: str):  # noqa: ANN202
    """Append each finished cell to NAME.partial.csv and its divergences to a JSONL file, so a
    run that dies keeps what it measured."""
    csv, js = HERE / f"{name}.partial.csv", HERE / f"{name}.partial_divergences.jsonl"
    for f in (csv, js):
        f.unlink(missing_ok=True)

    def on_row(r) -> None:  # noqa: ANN001
        row = verdict_table([r])
        row.to_csv(csv, mode="a", header=not csv.exists(), index=False)
        with open(js, "a") as fh:
            for d in r.detail.get("divergence_rows", []):
                fh.write(json.dumps({"kind": r.kind, "depth": r.depth or 0,
                                     "concurrency": r.concurrency, **d}) + "\n")  # fmt: skip

    return on_row


def sweep(args: argparse.Namespace) -> None:
    dspark = dspark_gguf(args.work)
    base = dict(model=MODEL, n_predict=32, greedy_requests=args.requests, law_tokens=1024,
                null_positions=128, minutes=args.cell_minutes)  # fmt: skip
    rows = run_sweep(SweepSpec(kinds=kinds(dspark, "greedy"), depths=tuple(range(1, 8)),
                               concurrencies=(1, 2, 4), temperatures=(0.0,), **base),
                     progress=_say, on_row=_writer("sweep"))  # fmt: skip
    (HERE / "null.json").write_text(json.dumps(rows[0].detail.get("null", {}), indent=1))
    law = run_sweep(SweepSpec(kinds=kinds(dspark, "probabilistic"), depths=(7,),
                              concurrencies=(4,), temperatures=(1.0,), **base),
                    progress=_say, null=rows[0].detail["null_object"],
                    on_row=_writer("sweep_law"))  # fmt: skip
    table = verdict_table(rows + law)
    table.to_csv(HERE / "sweep.csv", index=False)
    divergence_table(rows).to_parquet(HERE / "sweep_divergences.parquet", index=False)
    _say(f"wrote {len(table)} cells")


MUTANT_RUNS = (
    # (mutant, kind index, depths, concurrencies, n_predict, requests, minutes, stop on bug)
    ("depth7-only", 2, tuple(range(1, 8)), (1,), 32, 8, None, False),
    ("batch-only", 2, (4,), (1, 2), 32, 12, None, False),
    ("after-rejection-beyond64", 3, (7,), (1,), 96, 8, None, False),
    ("near-ties-only", 0, (1,), (1,), 32, 24, None, False),
    ("requests-0.5pct", 2, (4,), (4,), 16, 100_000, 10.0, True),
)


def mutants(args: argparse.Namespace) -> None:
    dspark = dspark_gguf(args.work)
    ks = kinds(dspark, "greedy")
    tables, divs = [], []
    null = None
    for name, ki, depths, concs, n, reqs, minutes, stop in MUTANT_RUNS:
        if args.only and name not in args.only:
            continue
        spec = SweepSpec(model=MODEL, kinds=(ks[ki],), depths=depths, concurrencies=concs,
                         temperatures=(0.0,), n_predict=n, greedy_requests=reqs,
                         minutes=minutes, mutant=name, null_positions=128,
                         stop_on_bug=stop)  # fmt: skip
        rows = run_sweep(spec, progress=_say, null=null, on_row=_writer(f"mutant_{name}"))
        null = rows[0].detail["null_object"] if rows else null
        t = verdict_table(rows)
        t.insert(0, "mutant", name)
        tables.append(t)
        d = divergence_table(rows)
        if len(d):
            d.insert(0, "mutant", name)
            divs.append(d)
    out = pd.concat(tables, ignore_index=True)
    path = HERE / "mutants.csv"
    if args.only and path.exists():  # upsert the rows of the mutants run now
        old = pd.read_csv(path)
        out = pd.concat([old[~old["mutant"].isin(args.only)], out], ignore_index=True)
    out.to_csv(path, index=False)
    if divs:
        pd.concat(divs, ignore_index=True).to_parquet(HERE / "mutant_divergences.parquet",
                                                      index=False)  # fmt: skip
    _say(f"wrote {len(out)} mutant cells")


def tables(args: argparse.Namespace) -> None:
    """The README's tables from sweep.csv, mutants.csv and the divergences (markdown)."""
    sw = pd.read_csv(HERE / "sweep.csv")
    short = {"identical": "=", "near-ties only (numerics)": "n", "BUG": "BUG",
             "no evidence of loss": "ok", "LOSSY": "LOSSY"}  # fmt: skip
    g = sw[sw["temperature"] == 0].copy()
    g["cell"] = g["verdict"].map(short) + " (" + g["divergences"].astype(int).astype(str) + ")"
    grid = g.pivot_table(index=["kind", "concurrency"], columns="depth", values="cell",
                         aggfunc="first")  # fmt: skip
    print(grid.fillna("").to_markdown())
    print()
    law = sw[sw["temperature"] > 0]
    cols = ["kind", "depth", "concurrency", "verdict", "positions", "rank_p", "pit_p", "top1_p",
            "tv_floor_99", "top1_floor_99", "alpha_run", "minutes"]  # fmt: skip
    print(law[[c for c in cols if c in law]].to_markdown(index=False, floatfmt=".3g"))
    print()
    d = pd.read_parquet(HERE / "sweep_divergences.parquet")
    if len(d):
        d["spec"] = d["kind"].ne("none")
        by = d.groupby(["kind", "klass"]).size().unstack(fill_value=0)
        pos = g.groupby("kind")["positions"].sum()
        by["positions"] = pos
        by["per_1000"] = 1000 * by.drop(columns="positions").sum(axis=1) / by["positions"]
        print(by.to_markdown(floatfmt=".3g"))
        print()
        print(d.groupby("role")["emitted_gap"].describe().to_markdown(floatfmt=".3g"))
    mp = HERE / "mutants.csv"
    if mp.exists():
        m = pd.read_csv(mp)
        cols = ["mutant", "kind", "depth", "concurrency", "verdict", "requests", "positions",
                "divergences", "bugs", "near_ties", "minutes", "evidence"]  # fmt: skip
        print()
        print(m[[c for c in cols if c in m]].to_markdown(index=False, floatfmt=".3g"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("sweep", "mutants", "tables"))
    p.add_argument("--requests", type=int, default=8, help="requests per T = 0 cell")
    p.add_argument("--cell-minutes", type=float, default=None, help="cap per cell")
    p.add_argument("--only", nargs="*", default=None, help="mutants to run")
    p.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "audit-v2")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    _say(f"load {os.getloadavg()}; {json.dumps(vars(args), default=str)}")
    {"sweep": sweep, "mutants": mutants, "tables": tables}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

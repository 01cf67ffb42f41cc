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


def sweep(args: argparse.Namespace) -> None:
    dspark = dspark_gguf(args.work)
    base = dict(model=MODEL, n_predict=32, greedy_requests=args.requests, law_tokens=1024,
                null_positions=128, minutes=args.cell_minutes)  # fmt: skip
    rows = run_sweep(SweepSpec(kinds=kinds(dspark, "greedy"), depths=tuple(range(1, 8)),
                               concurrencies=(1, 2, 4), temperatures=(0.0,), **base),
                     progress=_say)  # fmt: skip
    (HERE / "null.json").write_text(json.dumps(rows[0].detail.get("null", {}), indent=1))
    law = run_sweep(SweepSpec(kinds=kinds(dspark, "probabilistic"), depths=(7,),
                              concurrencies=(4,), temperatures=(1.0,), **base),
                    progress=_say)  # fmt: skip
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
        rows = run_sweep(spec, progress=_say, null=null)
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("sweep", "mutants"))
    p.add_argument("--requests", type=int, default=8, help="requests per T = 0 cell")
    p.add_argument("--cell-minutes", type=float, default=None, help="cap per cell")
    p.add_argument("--only", nargs="*", default=None, help="mutants to run")
    p.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "audit-v2")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    _say(f"load {os.getloadavg()}; {json.dumps(vars(args), default=str)}")
    (sweep if args.what == "sweep" else mutants)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Prove that a verifier or a prefix scheduler keeps the target's law (check-lossless).

Runs the exact checks (when the verifier accepts injected uniforms), the edge-uniform check and
the sequential G-tests over the standard worlds, prints one line per check and one verdict per
world ("proven (exact)", "consistent (statistical, floor TV X)" or "LOSSY"), each with the law
it covers, and exits 1 when anything is lossy (checks after the first LOSSY one are skipped: the
verdict is known), 0 when there is no evidence of loss (a proof only for the proven worlds, and
only for the law printed), 2 on a bad callable or argument. ``--mutants`` runs the built-in
catalogue of broken implementations instead and exits 0 only when every one is caught.

``--server URL`` audits a running server instead (``specsim.serve.audit``): what it emits with
speculation on, scored token by token against a reference server with speculation off, under
sequential G-tests at a family-wise false-alarm rate of 1e-6; exit 1 when LOSSY, 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for annotations: --help must not import pandas
    import pandas as pd

from specsim.errors import SpecsimError

MUTANT_COLUMNS = [
    "mutant", "expected", "exact_tv", "edge_caught", "stat_p_value", "stat_detectable_tv", "caught",
]  # fmt: skip


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "check-lossless",
        help="check that a verifier / prefix scheduler is lossless (exactly and statistically)",
        description=__doc__.split("\n")[0],
    )
    p.add_argument(
        "--verifier",
        metavar="MODULE:CALLABLE",
        help="your verifier: verify(p, q, x, u, v) -> (n_accepted, token), or "
        "verify(p, q, x, rng) (statistical checks only); default: the reference rejection sampler",
    )
    p.add_argument(
        "--multi",
        action="store_true",
        help="the verifier is multi-draft: verify(p, q, xs, u, v) -> token",
    )
    p.add_argument(
        "--policy",
        metavar="NAME|MODULE:CALLABLE",
        help="prefix scheduler from the registry (e.g. hw-aware, zos, threshold:0.5) or your "
        "own; default: full",
    )
    p.add_argument(
        "--model",
        metavar="MODULE:CALLABLE",
        help="your tiny table LM (a ToyLM factory) instead of the built-in random tables",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the worlds and samples")
    p.add_argument(
        "--samples",
        type=int,
        default=None,
        help="planned sampled blocks per statistical check (default: per world, enough to "
        "detect TV 1e-3 with 99%% power where the exact check did not prove it, 1e6 where it did)",
    )
    p.add_argument(
        "--checks",
        default="exact,edge,statistical",
        help="comma-separated subset of exact,edge,statistical",
    )
    p.add_argument("--mutants", action="store_true", help="run the catalogue of broken mutants")
    p.add_argument("--out", metavar="FILE.parquet", help="also write the tidy result table")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    from specsim.options import add_options
    from specsim.serve.audit.config import AuditConfig

    audit = p.add_argument_group(
        "server audit", "with --server URL: audit a running server against a reference with "
        "speculation off (docs/losslessness.md, 'Auditing a running server')",
    )  # fmt: skip
    add_options(audit, AuditConfig)
    p.set_defaults(func=run)


def _checks(text: str) -> tuple[str, ...]:
    from specsim.options import split_items

    names = tuple(split_items(text, "--checks"))
    bad = [c for c in names if c not in ("exact", "edge", "statistical")]
    if bad or not names:
        raise SpecsimError(
            f"--checks {text!r}: use a comma-separated subset of exact,edge,statistical"
        )
    return names


def _write(df: pd.DataFrame, path: str, force: bool) -> None:
    from specsim.outputs import check_out, write_table

    write_table(df, check_out(path, force=force))


def verdict_table(df: pd.DataFrame) -> str:
    """One line per check: case, check, TV or p-value, status; the case column as wide as the
    longest case (a plug-in's name is never cut)."""
    cases = [f"{r.pipeline} @ {r.world}" for r in df.itertuples()]
    w = max([len("case"), *map(len, cases)])
    lines = [f"{'case':<{w}} {'check':<11} {'TV / p-value':<30} status"]
    for case, r in zip(cases, df.itertuples(), strict=True):
        if r.status == "skipped":
            stat = "-"
        elif r.check == "statistical":
            stat = f"p={r.p_value:.3g} n={r.n:.2g} floor {r.detectable_tv:.1e}"
        elif r.check == "exact":
            stat = "cannot prove" if r.status == "unproven" else f"TV={r.tv:.3g}"
        else:
            stat = f"{r.n} zero-p outputs"
        lines.append(f"{case:<{w}} {r.check:<11} {stat:<30} {r.status}")
    return "\n".join(lines)


def world_table(df: pd.DataFrame) -> str:
    """One verdict per world, and the law it covers."""
    from specsim.lossless.verdicts import world_verdicts

    v = world_verdicts(df)
    lines = [f"{'world':<28} {'verdict':<44} covers"]
    lines += [f"{r.world:<28} {r.verdict:<44} {r.covers}" for r in v.itertuples()]
    return "\n".join(lines)


def run_server_audit(args: argparse.Namespace) -> int:
    """``--server URL``: the black-box audit of a running server."""
    from specsim.options import from_args
    from specsim.serve.audit.config import AuditConfig
    from specsim.serve.audit.law import run_audit

    other = [f for f in ("verifier", "policy", "model", "multi", "mutants") if getattr(args, f)]
    if other:
        flags = ", ".join("--" + f for f in other)
        raise SpecsimError(f"--server audits a running server; it does not take {flags}")
    cfg = from_args(AuditConfig, args)  # checks the URLs (check_url), before any connection
    out = None
    if args.out:
        from specsim.outputs import check_out

        out = check_out(args.out, force=args.force)
        if cfg.state and Path(cfg.state).resolve() == Path(out).resolve():
            raise SpecsimError(
                f"--out {args.out} is the --state file: the verdict would replace the run's "
                "resume state; give --out another name"
            )
        if cfg.temperature == 0:  # the reproducers go beside it: refused up front as well
            check_out(_beside(out, "divergences"), force=args.force)

    def progress(run, divs=None) -> None:  # noqa: ANN001
        if divs is not None:  # the greedy audit (T = 0)
            bugs = sum(d.klass.startswith("confident") for d in divs)
            sys.stderr.write(
                f"\r{run['done']:,} requests, {run['positions']:,} positions; divergences "
                f"{len(divs)} ({bugs} confident)  "
            )
            return
        last = run.history[-1] if run.history else None
        at = f"; look {last['k']} at {last['n']:,}: rank p={last['rank_p']:.3g}" if last else ""
        sys.stderr.write(f"\r{run.counts.positions:,} positions, {run.minutes():.1f} min{at}  ")

    from specsim.errors import Interrupted, RunFailed
    from specsim.serve.stoppable import AuditInterrupted

    try:
        if cfg.temperature == 0:  # greedy identity, token for token
            from specsim.serve.audit.greedy import run_greedy

            res = run_greedy(cfg, progress=progress)
        else:
            res = run_audit(cfg, progress=progress)
    except AuditInterrupted as stop:  # SIGINT / SIGTERM: keep what was measured, as bench does
        sys.stderr.write("\n")
        kept = ""
        if stop.result is not None:
            sys.stdout.write(stop.result.text() + "\n")
            if out is not None:
                _write_audit(stop.result, out, partial=True)
                kept = f"; what it measured is in {out} (marked partial)"
        state = f"; --state {cfg.state} resumes it" if cfg.state else ""
        raise Interrupted(f"{stop}{kept}{state}", stop.signum) from None
    sys.stderr.write("\n")
    if res.positions == 0 or res.verdict == "too few positions":  # tested nothing: no verdict
        budget = "--tokens" if cfg.temperature == 0 else "--tokens; the first look needs 1,024"
        raise RunFailed(
            f"too few positions to give a verdict: {res.positions:,} tested; run longer "
            f"(--minutes, {budget})"
        )
    sys.stdout.write(res.text() + "\n")
    if out is not None:
        _write_audit(res, out, partial=False)
    return 1 if res.lossy else 0


def _write_audit(res, out, partial: bool) -> None:  # noqa: ANN001
    """The verdict row (``partial``: a signal stopped the run) and, for the greedy audit, its
    reproducers beside it."""
    import pandas as pd

    from specsim.outputs import write_table

    write_table(pd.DataFrame([{**res.row(), "partial": partial}]), out)
    divs = getattr(res, "divergences", None)
    if divs:  # the greedy audit's reproducers, beside the verdict row
        write_table(pd.DataFrame([d.row() for d in divs]), _beside(out, "divergences"))


def _beside(path, what: str):  # noqa: ANN001, ANN202
    """``out.parquet`` -> ``out.divergences.parquet`` (same folder and format)."""

    p = Path(path)
    return p.with_name(f"{p.stem}.{what}{p.suffix}")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "server", None):
        return run_server_audit(args)
    from specsim.lossless.check import check_pipeline
    from specsim.lossless.pipeline import Pipeline
    from specsim.lossless.user import validated_model, verifier_pipeline

    checks = _checks(args.checks)
    if args.samples is not None and args.samples < 1000:
        raise SpecsimError(f"--samples {args.samples}: use at least 1000 (default: planned)")
    if args.mutants:
        from specsim.lossless.report import mutant_table

        table = mutant_table(seed=args.seed, samples=args.samples, checks=checks,
                             stop_early=True)  # fmt: skip
        show = [c for c in MUTANT_COLUMNS if c in table.columns]
        sys.stdout.write(table[show].to_string(index=False, float_format="{:.3g}".format) + "\n")
        caught = int(table["caught"].sum())
        sys.stdout.write(f"caught {caught} of {len(table)} mutants (checks: {args.checks})\n")
        if args.out:
            _write(table, args.out, args.force)
        return 0 if table["caught"].all() else 1
    policy = args.policy or "full"
    if args.verifier:
        pipe = verifier_pipeline(args.verifier, policy, multi=args.multi)
    else:
        if args.multi:
            raise SpecsimError("--multi needs --verifier MODULE:CALLABLE")
        from specsim.lossless.oracle import policy_scheduler

        policy_scheduler(policy)  # resolve now: a bad name is a one-line error
        pipe = Pipeline(name=f"rejection + {policy}", scheduler=policy)
    model = validated_model(args.model) if args.model else None
    df = check_pipeline(pipe, seed=args.seed, samples=args.samples, checks=checks, model=model)
    from specsim.lossless.verdicts import summary

    sys.stdout.write(verdict_table(df) + "\n\n" + world_table(df) + "\n")
    lossy = df[~df["lossless"]].drop_duplicates("world")  # one per lossy world, every world
    for r in lossy.itertuples():
        sys.stdout.write(f"counterexample ({r.world}, {r.check}): {r.detail}\n")
    text, found = summary(df)
    sys.stdout.write(f"verdict: {text}\n")
    if args.out:
        _write(df, args.out, args.force)
    return 1 if found else 0

"""``lossless``: the verdict of every built-in policy and verifier, and the mutant table."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from specsim.analysis.report import ReportContext
from specsim.errors import SpecsimError

POLICY_SPECS = (
    "ar", "mtp1", "static:3", "full", "threshold:0.5", "cum-threshold:0.3",
    "hw-aware", "hw-aware-global", "zos", "goodput", "oracle",
)  # fmt: skip


def _verdict_row(name: str, kind: str, claim: str, df: pd.DataFrame | None, note: str = "") -> dict:
    """One subject's row: the run's verdict and what it rests on (worlds proven exactly, worlds
    only tested statistically with their floor), as ``specsim check-lossless`` states it."""
    from specsim.lossless.verdicts import world_verdicts

    if df is None:
        return {"kind": kind, "name": name, "claims": claim, "verdict": "not checkable",
                "worlds": "", "checks": 0, "max exact TV": math.nan, "min G-test p": math.nan,
                "detail": note}  # fmt: skip
    lossy = df[~df["lossless"]]
    exact = df.loc[df["check"] == "exact", "tv"]
    stat = df.loc[df["check"] == "statistical", "p_value"]
    v = world_verdicts(df)
    proven = int((v["verdict"] == "proven (exact)").sum())
    tested = int(v["verdict"].str.startswith("consistent").sum())
    worlds = f"{proven} of {len(v)} proven" + (f", {tested} only tested" if tested else "")
    if len(lossy):
        worlds = f"LOSSY in {int(v['verdict'].str.startswith('LOSSY').sum())} of {len(v)}"
    detail = note or (f"{lossy.iloc[0]['world']}: {lossy.iloc[0]['detail']}" if len(lossy) else "")
    return {
        "kind": kind,
        "name": name,
        "claims": claim,
        "verdict": "LOSSY" if len(lossy) else "lossless",
        "worlds": worlds,
        "checks": len(df),
        "max exact TV": float(exact.max()) if len(exact) else math.nan,
        "min G-test p": float(stat.min()) if len(stat) else math.nan,
        "detail": str(detail)[:160],
    }


def build(ctx: ReportContext) -> None:
    """The losslessness verdict of every built-in policy and verifier, and the mutant table
    (every known way to break losslessness, and which check catches it)."""
    from specsim.lossless.check import check_pipeline
    from specsim.lossless.mutants import catalogue, correct_pipelines
    from specsim.lossless.pipeline import Pipeline
    from specsim.lossless.report import mutant_row
    from specsim.lossless.uniforms import truncated
    from specsim.lossless.verifiers import greedy, thresholded, typical
    from specsim.policies.base import get_policy
    from specsim.progress import Progress

    seed = int(ctx.get("seed", 0))
    samples = int(ctx.get("samples", 50_000))
    policies = [str(p) for p in ctx.get("policies", list(POLICY_SPECS), kind=list)]

    jobs: list[tuple[str, str, str, Any]] = []  # (kind, name, claim, pipeline or error)
    for spec in policies:
        pol = get_policy(spec)
        claim = "lossless" if pol.lossless else "not lossless"
        if "accept_len" in pol.needs:
            jobs.append(("policy", spec, claim, "reads the true acceptance length (an upper "
                         "bound, not a scheduler): nothing to check"))  # fmt: skip
            continue
        jobs.append(("policy", spec, claim, Pipeline(name=f"rejection + {spec}", scheduler=spec)))
    correct = {p.name: p for p in correct_pipelines()}
    verifiers = [
        ("rejection sampling", "lossless", correct["rejection + full"]),
        ("greedy (temperature 0)", "lossless", correct["greedy + full"]),
        ("specinfer (i.i.d. multi-draft)", "lossless", correct["specinfer (i.i.d. drafts)"]),
        ("recursive rejection, without replacement", "lossless",
         correct["rrs without replacement"]),
        ("typical acceptance (Medusa)", "not lossless", Pipeline(name="typical",
                                                                rule=truncated(typical))),
        ("thresholded acceptance", "not lossless", Pipeline(name="thresholded",
                                                           rule=truncated(thresholded))),
    ]  # fmt: skip
    del greedy
    jobs += [("verifier", n, c, p) for n, c, p in verifiers]
    rows, frames = [], []
    with Progress(len(jobs), "lossless", enabled=ctx.progress) as bar:
        for kind, name, claim, pipe in jobs:
            if isinstance(pipe, str):
                rows.append(_verdict_row(name, kind, claim, None, pipe))
            else:
                df = check_pipeline(pipe, seed=seed, samples=samples, progress=False)
                df.insert(0, "subject", name)
                frames.append(df)
                rows.append(_verdict_row(name, kind, claim, df))
            bar.update()
    verdicts = pd.DataFrame(rows)
    verdicts["as claimed"] = [
        "" if v == "not checkable" else ("yes" if (v == "lossless") == (c == "lossless") else "NO")
        for v, c in zip(verdicts["verdict"], verdicts["claims"], strict=True)
    ]
    ctx.md(
        "## Verdicts",
        "",
        "Each policy is checked as the prefix scheduler of reference rejection sampling; each "
        "verifier with full verification. Checks (specsim.lossless, `specsim check-lossless`): "
        "`exact` enumerates every draft realisation of tiny worlds and compares, with the "
        "target's, the law of two whole blocks (2(gamma+1) tokens, bonus included) after a "
        "prefix of each length 0-8 and of every block a generation starts (lossless iff TV <= "
        "1e-9); `edge` feeds uniforms at 0 and 1 - 2^-53; `statistical` is a sequential "
        "G-test of every block of sampled generations up to position 8 + gamma + 1, by context "
        "(family-wise false-alarm rate <= 1e-6 per run; "
        f"{samples:,} planned blocks per world). A world found LOSSY is not checked further, "
        "and a run with a LOSSY world runs no statistical check. 'lossless' means no evidence "
        "of loss; 'worlds' says in how many worlds that is a proof (exact) and in how many only "
        "a test. 'as claimed' compares the verdict with what the policy or verifier declares.",
        "",
    )
    ctx.table(verdicts, "{:.3g}")
    ctx.md("## Mutants: every known way to break it, and what catches it", "")
    mutants = catalogue()
    wanted = ctx.get("mutants", "all", kind=(str, list))
    if wanted != "all":
        known = {m.name for m in mutants}
        bad = [w for w in wanted if w not in known]
        if bad:
            raise SpecsimError(
                f"{ctx.folder / 'config.toml'}: unknown mutant {bad[0]!r}; known: "
                f"{', '.join(sorted(known))}"
            )
        mutants = [m for m in mutants if m.name in wanted]
    mrows = []
    with Progress(len(mutants), "mutants", enabled=ctx.progress) as bar:
        for m in mutants:
            mrows.append(mutant_row(m, seed, samples))
            bar.update()
    mt = pd.DataFrame(mrows)
    mt["caught by"] = [_caught_by(r) for r in mt.to_dict("records")]
    cols = ("mutant", "source", "expected", "caught by", "exact_tv", "exact_caught")
    cols += ("edge_caught", "statistical_caught", "stat_p_value", "caught")
    keep = [c for c in cols if c in mt.columns]
    ctx.table(mt[keep], "{:.3g}")
    ctx.figure(
        _mutant_figure(mt, verdicts),
        "lossless.png",
        "Exact total variation from the target law (lossless pipelines: the largest over every "
        "law proven, at rounding error; LOSSY ones: the largest over worlds of the first law "
        "found to differ). Right of each bar: the verdict, or the checks that caught the "
        "mutant (the edge-only one sits at rounding error: its bug has measure zero)",
    )
    caught = int(mt["caught"].sum())
    ok = verdicts[verdicts["verdict"] != "not checkable"]
    ctx.md(
        f"{caught} of {len(mt)} mutants are caught by every check expected to catch them; "
        f"{int((ok['as claimed'] == 'yes').sum())} of {len(ok)} checkable policies and "
        "verifiers behave as they claim.",
        "",
        "Notes: `hw-aware-global` appears twice on purpose: as a registered policy that declares "
        "itself not lossless (the global search on current confidences of Appendix A) and as a "
        "mutant. `zos` runs the same global search, but on lagged confidences, and passes.",
        "",
    )
    if frames:
        ctx.save_results(pd.concat(frames, ignore_index=True), "results.parquet")


def _caught_by(row: dict) -> str:
    """The checks that caught a mutant in this run, e.g. "exact + statistical"."""
    got = [c for c in ("exact", "edge", "statistical") if row.get(f"{c}_caught") is True]
    return " + ".join(got) if got else "NOT CAUGHT"


CATCH_COLOURS = {  # mutant bars, by the checks that caught them
    "exact": "orange", "exact + statistical": "vermillion", "edge": "reddish_purple",
    "exact + edge": "yellow", "exact + edge + statistical": "bluish_green",
}  # fmt: skip


def _mutant_figure(mt: pd.DataFrame, verdicts: pd.DataFrame):
    """Horizontal bars, log scale: the max exact TV of each checked subject and mutant; each
    mutant's bar coloured and labelled by the checks that caught it."""
    import matplotlib.pyplot as plt

    from specsim.analysis.palette import OKABE_ITO

    floor = 1e-18  # TV 0 cannot sit on a log axis; shown at the floor
    subj = verdicts[verdicts["verdict"] != "not checkable"]
    names = [f"{k}: {n}" for k, n in zip(subj["kind"], subj["name"], strict=True)]
    tvs = subj["max exact TV"].fillna(floor).clip(lower=floor).to_numpy()
    lossy = (subj["verdict"] == "LOSSY").to_numpy()
    m_names = [f"mutant: {n}" for n in mt["mutant"]]
    m_tvs = mt["exact_tv"].fillna(floor).clip(lower=floor).to_numpy()
    labels = names + m_names
    values = np.concatenate([tvs, m_tvs])
    colors = [OKABE_ITO["grey"] if x else OKABE_ITO["blue"] for x in lossy]
    caught = [_caught_by(r) for r in mt.to_dict("records")]
    colors += [OKABE_ITO[CATCH_COLOURS.get(c, "black")] for c in caught]
    fig, ax = plt.subplots(figsize=(10, 0.24 * len(labels) + 1.8))
    y = np.arange(len(labels))[::-1]
    ax.barh(y, values, color=colors, height=0.7)
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_ylim(-0.8, len(labels) - 0.2)
    right = ax.twinx()  # what each row's verdict is: the checks that caught a mutant
    right.set_ylim(ax.get_ylim())
    verdict = ["LOSSY (as declared)" if x else "lossless" for x in lossy]
    right.set_yticks(y, verdict + [f"caught by {c}" for c in caught], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlim(floor, 2.0)
    ax.axvline(1e-9, color="k", linestyle="--", linewidth=1)
    ax.set_xlabel("max exact total variation from the target law (probability, log scale)")
    ax.grid(True, axis="x", alpha=0.3)
    from matplotlib.patches import Patch

    handles = [
        Patch(color=OKABE_ITO["blue"], label="built-in, lossless"),
        Patch(color=OKABE_ITO["grey"], label="built-in, lossy (as it declares)"),
    ]
    handles += [Patch(color=OKABE_ITO[CATCH_COLOURS[c]], label=f"mutant caught by {c}")
                for c in CATCH_COLOURS if c in caught]  # fmt: skip
    handles.append(plt.Line2D([], [], color="k", linestyle="--", label="lossless threshold 1e-9"))
    fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=3, frameon=False)
    ax.set_title("losslessness: exact checks of every policy, verifier and mutant, and the "
                 "checks that caught each mutant", fontsize=9)  # fmt: skip
    fig.tight_layout(rect=(0, 1.0 / (0.24 * len(labels) + 1.8), 1, 1))
    return fig

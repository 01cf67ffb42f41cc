"""How right is `auto`'s plan about the drafts it pays for? (torch-free; replays, no timing.)

Before the drafter runs, `auto`'s plan (``calibrated_zos_plan``) chooses a draft depth k and a
budget K from LAGGED rows (a request's block from two steps earlier) re-calibrated by the
verification history; a request that did not draft two steps earlier has no lagged row and is
stood in for by the history's pooled acceptance rates. After drafting, the schedule verifies the
K current candidates with the highest calibrated survival. This replays `auto` at one point of
reports/schedulers-under-load where it loses to `ar` and compares, summed over the steps that
drafted:

- the accepted drafts the PLAN expected (the sum of its top-K lagged calibrated survivals at its
  chosen depth), split by whether the request had a real lagged row;
- the accepted drafts the SCHEDULE expected (the calibrated survivals of what it verified);
- the accepted drafts the replay realised.

Lossless bookkeeping only: the instrumented functions return what the originals return.

    python studies/auto_plan_optimism.py
    python studies/auto_plan_optimism.py --trace stress-decaying --profile v4-pro-like
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

import specsim.policies.calibrated as cz
from specsim.policies.hw_aware import _step_times
from specsim.sim.simulate import replay


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="code")
    ap.add_argument("--profile", default="v4-flash-like")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    plan_exp = {"known": 0.0, "stand-in": 0.0}
    sched_exp = [0.0]
    plan_fn, sched_fn = cz.calibrated_zos_plan, cz.calibrated_zos_lengths

    def plan(inp):  # noqa: ANN001, ANN202
        k = plan_fn(inp)
        r, gamma = inp.n_requests, inp.gamma
        if r <= cz.SMALL_BATCH or k == 0:
            return k
        depth = gamma if k is None else k
        table = None if inp.accept_hist is None else cz.calibration_table(inp.accept_hist)
        surv = cz._calibrated_survival(inp.conf, inp, table).reshape(r, gamma).copy()
        known = np.ones(r, bool) if inp.lag_known is None else np.asarray(inp.lag_known, bool)
        surv[~known] = np.cumprod(cz.history_rates(inp.accept_hist, gamma))
        flat, who = surv[:, :depth].ravel(), np.repeat(known, depth)
        order = np.argsort(-flat, kind="stable")
        t = np.asarray(_step_times(inp.step_time, r, flat.shape[0] + 1), dtype=np.float64)
        tok = r + np.concatenate(([0.0], np.cumsum(flat[order])))
        d = float(inp.draft_time(depth)) if inp.draft_time is not None else 0.0
        budget = int(np.argmax(tok / np.concatenate(([t[0]], t[1:] + d))))
        top = order[:budget]
        plan_exp["known"] += float(flat[top][who[top]].sum())
        plan_exp["stand-in"] += float(flat[top][~who[top]].sum())
        return k

    def schedule(inp):  # noqa: ANN001, ANN202
        lens = sched_fn(inp)
        r, gamma = inp.n_requests, inp.gamma
        table = None if inp.accept_hist is None else cz.calibration_table(inp.accept_hist)
        surv = cz._calibrated_survival(inp.conf, inp, table).reshape(r, gamma)
        sched_exp[0] += float(sum(surv[i, : lens[i]].sum() for i in range(r)))
        return lens

    pol = dataclasses.replace(cz.calibrated_zos(), plan=plan, schedule=schedule)
    res = replay(
        args.trace, pol, profile=args.profile, concurrency=args.concurrency,
        requests=args.requests, seed=args.seed,
    )  # fmt: skip
    steps = res.steps
    drafted = steps[steps["verified_drafts"] > 0]
    print(
        f"{args.trace} on {args.profile}, {args.concurrency} in flight, {args.requests} requests, "
        f"seed {args.seed}: {len(drafted)} of {len(steps)} steps drafted"
    )
    print(
        f"accepted drafts expected by the plan: {sum(plan_exp.values()):,.0f} "
        f"({plan_exp['known']:,.0f} from lagged rows, {plan_exp['stand-in']:,.0f} from the "
        "history's stand-in for requests without one)"
    )
    print(f"accepted drafts expected by the schedule: {sched_exp[0]:,.0f}")
    print(f"accepted drafts realised: {int(drafted['accepted_drafts'].sum()):,}")
    print(f"steady throughput: {res.summary['steady_throughput_tok_s']:,.0f} tok/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

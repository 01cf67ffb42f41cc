"""The bound: a bare numpy loop doing the simulator's accounting, without SimPy or logs.

Issue #13 asks the simulator to stay within 1.5x of "a bare numpy loop doing the same
accounting". This is that loop: the same workload, the same policy function, the same replay
rule, FIFO admission with the same capacity limits, prefill sharing the step, the same step
time (dense lookup), draft and serial scheduler cost; one Python iteration per engine step.
It keeps no step log, no per-request timing and no SimPy events, so it is what the engine's
bookkeeping costs are measured against. It returns (output tokens, engine steps, simulated
seconds) so the benchmark can check it simulated exactly what the engine did.

ZOS scheduler overlap and 2-D profiles are left out (the benchmark runs ``hw-aware`` on a 1-D
profile); ``goodput``'s online acceptance estimate is included because it is cheap.
"""

from __future__ import annotations

import numpy as np


def bound_loop(trace, policy, cost, wl, max_running: int, kv_tokens: int, budget0: int):
    """Replay ``wl`` (a :class:`specsim.sim.workload.Workload`) with ``policy``; see module doc."""
    from specsim.policies.base import StepInput

    gamma = trace.block_size
    conf_all = trace.conf
    acc_all = trace.accept_len.astype(np.int64)
    offsets = trace.offsets.astype(np.int64)
    lut = cost.lut_seconds(None)
    step_fn = cost.step_time_fn(None)
    d_base, d_req = cost.draft_base_ms * 1e-3, cost.draft_per_request_ms * 1e-3
    d_tok = cost.draft_per_token_ms * 1e-3 * gamma
    schedule = policy.schedule
    need_rate = "accept_rate" in policy.needs
    need_acc = "accept_len" in policy.needs
    trials = np.zeros(gamma + 1, np.int64)
    succ = np.zeros(gamma + 1, np.int64)
    if wl.open_loop:
        arr = wl.arrival_s
        j_trace, j_prompt, j_out = wl.trace_idx, wl.prompt_len, wl.output_len
        n_jobs = arr.shape[0]
    else:
        n_jobs = wl.max_jobs
        t_idx = np.array([wl.job(i)[0] for i in range(n_jobs)], np.int64)
        j_trace, j_prompt, j_out = t_idx, wl.prompt_len[t_idx], wl.output_len[t_idx]
        arr = None
    base = np.zeros(0, np.int64)
    pos = np.zeros(0, np.int64)
    out = np.zeros(0, np.int64)
    prompt = np.zeros(0, np.int64)
    queue_head = 0  # next job to admit
    arrived = 0 if arr is not None else min(wl.concurrency, n_jobs)
    kv = 0
    now = 0.0
    steps = tokens = 0
    while True:
        if arr is not None:
            arrived = int(np.searchsorted(arr, now, side="right"))
        # FIFO admission
        adm = []
        budget = budget0
        while queue_head < arrived and pos.shape[0] + len(adm) < max_running:
            j = queue_head
            res = int(j_prompt[j]) + int(j_out[j]) + gamma
            if kv + res > kv_tokens or (adm and j_prompt[j] > budget):
                break
            kv += res
            budget -= int(j_prompt[j])
            adm.append(j)
            queue_head += 1
        n_dec = pos.shape[0]
        n_new = len(adm)
        if n_dec + n_new == 0:
            if arr is not None and arrived < n_jobs:
                now = float(arr[arrived])
                continue
            return tokens, steps, now
        prefill = int(j_prompt[adm].sum()) if n_new else 0
        n_ver = 0
        draft_s = sched_s = 0.0
        if n_dec:
            rows = base + pos
            conf, acc = conf_all[rows], acc_all[rows]
            fn = step_fn if not n_new else (lambda b, e=prefill: step_fn(np.asarray(b) + e))
            rate = None
            if need_rate:
                rate = (succ[1:] + 1.0) / (trials[1:].astype(np.float64) + 2.0)
            lens = schedule(
                StepInput(conf, fn, accept_rate=rate, accept_len=acc if need_acc else None)
            )
            a_ok = np.minimum(lens, acc)
            emit = np.minimum(a_ok + 1, out - pos)
            n_ver = int(lens.sum())
            if need_rate:
                reach = np.minimum(a_ok + 1, lens)
                trials += np.bincount(reach, minlength=gamma + 1)[::-1].cumsum()[::-1]
                succ += np.bincount(a_ok, minlength=gamma + 1)[::-1].cumsum()[::-1]
            draft_s = d_base + (d_req + d_tok) * n_dec
            sched_s = cost.sched_s(n_dec)
            pos = pos + emit
            tokens += int(emit.sum())
        batch = n_dec + n_ver + prefill
        now += draft_s + sched_s + float(lut[batch] if batch < lut.shape[0] else step_fn(batch))
        steps += 1
        if n_new:
            a = np.asarray(adm, np.int64)
            base = np.concatenate((base, offsets[j_trace[a]]))
            pos = np.concatenate((pos, np.ones(n_new, np.int64)))
            out = np.concatenate((out, j_out[a]))
            prompt = np.concatenate((prompt, j_prompt[a]))
            tokens += n_new
        done = pos >= out
        if done.any():
            kv -= int((prompt[done] + out[done]).sum()) + gamma * int(done.sum())
            keep = ~done
            base, pos, out, prompt = base[keep], pos[keep], out[keep], prompt[keep]
            if arr is None:
                arrived = min(arrived + int(done.sum()), n_jobs)


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(
        description="The bare numpy loop bench_replay.py measures the simulator against; "
        "run `python benchmarks/bench_replay.py` to use it."
    ).parse_args()

"""The bound: a bare numpy loop doing the simulator's accounting, without SimPy or logs.

Issue #13 asks the simulator to stay within 1.5x of "a bare numpy loop doing the same
accounting". This is that loop: the same workload, the same policy function, the same replay
rule, FIFO admission with the same capacity limits, prefill sharing the step, the same step
time (dense lookup), draft and serial scheduler cost; one Python iteration per engine step.
It keeps no step log, no per-request timing and no SimPy events, so it is what the engine's
bookkeeping costs are measured against. It returns (output tokens, engine steps, simulated
seconds) so the benchmark can check it simulated exactly what the engine did.

``bound_loop_v2`` does the serving model's accounting (serving model v2: chunked prefill under
a token budget, paged KV blocks, drafting, the drafter's prefill, the KV read per sequence).
ZOS scheduler overlap, preemption and 2-D profiles are left out (the benchmark runs
``hw-aware`` on a 1-D profile with a roomy cache). tests/test_numpy_bound.py checks it against
the engine. (``bound_loop``, serving model v1's, was retired with it: commit 77e1490.)
"""

from __future__ import annotations

import numpy as np


def bound_loop_v2(trace, policy, cost, wl):  # noqa: C901, PLR0912, PLR0915 - one loop
    """Serving model v2's accounting (:mod:`specsim.sim.serving`) as a bare loop: decode
    first, prompt chunks fill the rest of the token budget (oldest prefill first, then FIFO
    admissions while a slot, budget and KV blocks are left), paged KV counted in blocks,
    drafting of the whole block, the drafter's prefill, the scheduler, the table step, the
    KV read per sequence and the per-token emit cost; the policy sees the table shifted by the
    prefill it expects and offset by the KV read, as the engine's ``TableStepTime``.

    Left out (it raises): preemption (the benchmark's cache is roomy), ``zos``, plans and
    fixed draft lengths, 2-D and measured-engine profiles. Returns (output tokens, engine
    steps, simulated seconds)."""
    from specsim.policies.base import StepInput, TableStepTime

    if policy.zos or policy.plan is not None or policy.draft_len is not None:
        raise NotImplementedError("bound_loop_v2: full-block, non-ZOS policies only")
    if cost.is_2d or cost.has_engine_terms or cost.prefill_token_ms:
        raise NotImplementedError("bound_loop_v2: 1-D table profiles only")
    gamma = trace.block_size
    conf_all = trace.conf
    acc_all = trace.accept_len.astype(np.int64)
    offsets = trace.offsets.astype(np.int64)
    lut = cost.lut_seconds(None)
    n_lut = lut.shape[0]
    step_fn = cost.step_time_fn(None)
    d_base = cost.draft_base_ms * 1e-3
    d_rt = cost.draft_per_request_ms * 1e-3 + cost.draft_per_token_ms * 1e-3 * gamma
    d_lut = None
    if cost.draft_curve:
        n_max = min(int(cost.max_running), 1 << 16)
        d_lut = (cost.draft_ms(np.arange(n_max + 1), gamma) * 1e-3).tolist()
    dpre = cost.draft_prefill_us_per_token * 1e-6
    kv_coef = cost.kv_read_us_per_ktoken * 1e-9
    emit_coef = cost.emit_per_token_ms * 1e-3
    s_base, s_per = cost.sched_base_us, cost.sched_us_per_request
    decides = bool(policy.decides)
    schedule = policy.schedule
    need_rate = "accept_rate" in policy.needs
    need_acc = "accept_len" in policy.needs
    trials = np.zeros(gamma + 1, np.int64)
    succ = np.zeros(gamma + 1, np.int64)
    max_run, budget, blk = int(cost.max_running), int(cost.max_batched_tokens), 16
    total_blocks = int(cost.kv_tokens) // blk
    if wl.open_loop:
        arr = wl.arrival_s
        j_trace, j_prompt, j_out = wl.trace_idx, wl.prompt_len, wl.output_len
        n_jobs = arr.shape[0]
    else:
        arr = None
        n_jobs = wl.max_jobs
        t_idx = np.array([wl.job(i)[0] for i in range(n_jobs)], np.int64)
        j_trace, j_prompt, j_out = t_idx, wl.prompt_len[t_idx], wl.output_len[t_idx]
    j_tgt = np.maximum(j_prompt, 1).tolist()
    # the running requests, decoders first, then the prefilling ones (admission order)
    base = pos = out = kv = pre = tgt = np.zeros(0, np.int64)
    n_pref = 0
    head = 0  # the queue is jobs head..arrived-1
    arrived = 0 if arr is not None else min(wl.concurrency, n_jobs)
    now = 0.0
    steps = tokens = 0
    while True:
        if arr is not None and arrived < n_jobs and arr[arrived] <= now:
            arrived = int(np.searchsorted(arr, now, side="right"))
        n_run = pos.shape[0]
        if n_run == 0 and head == arrived:
            if arr is not None and arrived < n_jobs:
                now = float(arr[arrived])
                continue
            return tokens, steps, now
        n_dec = n_run - n_pref
        pend = tgt[n_dec:] - pre[n_dec:]
        pend_total = int(pend.sum())
        pre_ctx = int(kv[n_dec:].sum())
        p_est = 0
        if n_pref or head < arrived:
            queued = 0
            for i, j in enumerate(range(head, arrived)):  # the engine's estimate
                if i >= max(max_run - n_run, 0) or queued >= budget:
                    break
                queued += j_tgt[j]
            p_est = min(max(budget - n_dec, 0), pend_total + queued)
        ctx_dec = int(kv[:n_dec].sum()) + n_dec if n_dec else 0
        kv_est = kv_coef * (ctx_dec + pre_ctx)
        n_ver = emitted = 0
        lens = None
        if n_dec:
            rows = base[:n_dec] + pos[:n_dec]
            acc = acc_all[rows]
            rate = None
            if need_rate:
                rate = (succ[1:] + 1.0) / (trials[1:].astype(np.float64) + 2.0)
            inp = StepInput(
                conf_all[rows],
                TableStepTime(step_fn, lut, p_est, kv_est),
                accept_rate=rate,
                accept_len=acc if need_acc else None,
            )
            lens = schedule(inp)
            a_ok = np.minimum(lens, acc)
            emit = np.minimum(a_ok + 1, out[:n_dec] - pos[:n_dec])
            n_ver, emitted = int(lens.sum()), int(emit.sum())
            if need_rate:
                reach = np.minimum(a_ok + 1, lens)
                trials += np.bincount(reach, minlength=gamma + 1)[::-1].cumsum()[::-1]
                succ += np.bincount(a_ok, minlength=gamma + 1)[::-1].cumsum()[::-1]
        left = max(budget - n_dec - n_ver, 0)
        chunk = np.clip(left - (np.cumsum(pend) - pend), 0, pend)
        left -= int(chunk.sum())
        # KV blocks: the engine's quick upper bound, or the exact count
        need = (ctx_dec + n_ver + pre_ctx + int(chunk.sum())) // blk + n_run
        if n_run and need > total_blocks:
            need = int((-(-(kv[:n_dec] + 1 + lens) // blk)).sum()) if n_dec else 0
            need += int((-(-(kv[n_dec:] + chunk) // blk)).sum())
            if need > total_blocks:
                raise NotImplementedError("bound_loop_v2: preemption is not modelled")
        free = total_blocks - need if n_run else total_blocks
        adm, adm_chunk = [], []
        while head < arrived and n_run + len(adm) < max_run and left > 0:
            c = min(j_tgt[head], left)
            b = -(-c // blk)
            if b > free:
                break
            free -= b
            adm.append(head)
            adm_chunk.append(c)
            left -= c
            head += 1
        if adm:
            a = np.asarray(adm, np.int64)
            base = np.concatenate((base, offsets[j_trace[a]]))
            pos = np.concatenate((pos, np.zeros(a.shape[0], np.int64)))
            out = np.concatenate((out, j_out[a]))
            kv = np.concatenate((kv, np.zeros(a.shape[0], np.int64)))
            pre = np.concatenate((pre, np.zeros(a.shape[0], np.int64)))
            tgt = np.concatenate((tgt, np.maximum(j_prompt[a], 1)))
            chunk = np.concatenate((chunk, np.asarray(adm_chunk, np.int64)))
            n_pref += a.shape[0]
        prefill = int(chunk.sum())
        batch = n_dec + n_ver + prefill
        draft_s = 0.0
        if n_dec:
            if d_lut is None:
                draft_s = d_base + d_rt * n_dec
            else:
                draft_s = d_lut[n_dec] if n_dec < len(d_lut) else float(
                    cost.draft_ms(n_dec, gamma)
                ) * 1e-3  # fmt: skip
        sched_s = (s_base + s_per * n_dec) * 1e-6 if (n_dec and decides) else 0.0
        verify_s = float(lut[batch]) if batch < n_lut else float(cost.step_time(batch))
        kv_s = kv_coef * (ctx_dec + pre_ctx) if kv_coef else 0.0
        duration = draft_s + dpre * prefill + sched_s + verify_s + kv_s
        if emit_coef and n_dec:
            duration += emit_coef * emitted
        now += duration
        steps += 1
        if n_dec:
            pos[:n_dec] += emit
            kv[:n_dec] += emit
            tokens += emitted
        if n_pref:
            pre[n_dec:] += chunk
            kv[n_dec:] += chunk
            n_first = int(np.count_nonzero((pre[n_dec:] >= tgt[n_dec:]) & (chunk > 0)))
            pos[n_dec : n_dec + n_first] += 1  # the prefill's first token
            n_pref -= n_first
            tokens += n_first
        done = pos >= out
        n_fin = int(np.count_nonzero(done))
        if n_fin:
            keep = ~done
            base, pos, out, kv, pre, tgt = (x[keep] for x in (base, pos, out, kv, pre, tgt))
            if arr is None:
                arrived = min(arrived + n_fin, n_jobs)


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(
        description="The bare numpy loop bench_replay.py measures the simulator against; "
        "run `python benchmarks/bench_replay.py` to use it."
    ).parse_args()

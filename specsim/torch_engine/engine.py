"""A real speculative-decoding server: continuous batching over a torch target and drafter.

Each engine step is the simulator's step (:mod:`specsim.sim.engine`) done for real, timed on the
wall clock or (``EngineConfig.clock = "cpu"``) on a virtual clock of the thread's CPU time
(:mod:`specsim.torch_engine.clock`); the two share admission rules, workloads and metric code so
that they can be compared:

1. Admission: open-loop arrivals up to now join a FIFO queue; queued requests are admitted while
   a slot is free (``max_running``), their KV reservation fits (``kv_tokens``) and their prompt
   fits the step's ``prefill_budget`` (the first admitted request always goes).
2. Draft: the proposer drafts a block of gamma tokens for every decoding request (batched).
3. Schedule: the policy (the SAME registry the simulator uses) picks each request's verification
   length l_r from the real confidences; ``step_time`` comes from the measured SPS profile.
4. Verify: ONE target forward over every request's ``[anchor, d_1..d_l]`` plus the prompts of the
   requests admitted this step (chunked-prefill style); flattened (default) or padded.
5. Accept: greedy (T = 0: a draft is accepted iff it equals the target's argmax, then the argmax
   at the first mismatch, or the bonus token, is emitted) or rejection sampling (T > 0: accept
   x with probability min(1, p(x)/q(x)); on rejection sample norm(max(p - q, 0)); after a fully
   accepted prefix sample the bonus token from p). Tokens stream out at the step's end.

At T = 0 the output of every request is, token for token, the target's plain greedy decoding
(``tests/test_engine_greedy.py`` checks it for every policy).

Metrics are derived by the simulator's own functions (:mod:`specsim.sim.metrics`) from the same
raw arrays, so TTFT, TPOT, tau, throughput mean the same thing on both sides.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specsim.errors import SpecsimError
from specsim.policies.base import Policy, StepInput, check_lengths
from specsim.sim.admission import fits, reservation
from specsim.sim.cost.model import CostModel
from specsim.sim.steplog import RawLog
from specsim.sim.workload import Workload
from specsim.torch_engine.clock import EngineClock
from specsim.torch_engine.proposers import Proposer
from specsim.torch_engine.records import EngineResult, JobTable, Req, engine_result
from specsim.torch_engine.target import FlatTarget

PRIOR_RATE = 0.5  # the simulator's online acceptance prior (specsim.sim.step)
PRIOR_WEIGHT = 2.0


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs (the load comes from the :class:`Workload`)."""

    temperature: float = 0.0
    seed: int = 0
    layout: str = "flat"
    max_running: int = 256
    kv_tokens: int = 1 << 20
    prefill_budget: int = 16384
    eos_ids: tuple[int, ...] = ()
    warmup_steps: int = 2  # untimed forwards before the clock starts (allocator, thread pools)
    clock: str = "wall"  # "cpu": a virtual clock of the thread's CPU time; "ref": that at a
    # reference speed (clock.py)
    draft_phase: str = "draft"  # the speed reference's probe that times this drafter (ref)


class RealEngine:
    """Serves ``prompts`` (token ids per trace request) under ``workload``. Call :meth:`run`."""

    def __init__(
        self,
        target_model: Any,
        proposer: Proposer,
        policy: Policy,
        cost: CostModel,
        prompts: list[list[int]],
        workload: Workload,
        cfg: EngineConfig,
        progress: Any = None,
    ) -> None:
        if policy.needs & {"accept_len"}:
            raise SpecsimError(
                f"policy {policy.name!r} reads the true acceptance (an oracle); a real engine "
                "cannot run it"
            )
        if cfg.temperature < 0 or not np.isfinite(cfg.temperature):
            raise SpecsimError(f"--temperature must be >= 0, got {cfg.temperature}")
        self.model = target_model
        self.proposer = proposer
        self.policy = policy
        self.cost = cost
        self.prompts = prompts
        self.wl = workload
        self.cfg = cfg
        self.progress = progress
        self.gamma = int(proposer.gamma)
        longest = max(len(p) for p in prompts) + int(np.max(workload.output_len)) + self.gamma + 2
        if workload.open_loop:
            slots = min(cfg.max_running, int(workload.arrival_s.shape[0]))
        else:
            slots = min(cfg.max_running, int(workload.concurrency))
        self.slots = max(1, slots)
        self.cap = longest
        self.target = FlatTarget(
            target_model, self.slots, self.cap, proposer.feature_layers, cfg.layout
        )
        n_feat = len(proposer.feature_layers) * int(target_model.config.hidden_size)
        dev = self.target.device  # buffers live with the model (CUDA: on the GPU)
        self.seq_buf = torch.zeros((self.slots, self.cap), dtype=torch.long, device=dev)
        self.feat_buf = torch.zeros(
            (self.slots, self.cap, max(n_feat, 1)), dtype=torch.float16, device=dev
        )
        self.gen = torch.Generator().manual_seed(int(cfg.seed))
        self.policy_rng = np.random.default_rng([int(cfg.seed), 0x9E3779B9])  # StepInput.rng
        self.eos = frozenset(int(e) for e in cfg.eos_ids)

    # ------------------------------------------------------------------ verification
    def _accept(
        self, logits: torch.Tensor, drafts: np.ndarray, q: torch.Tensor | None
    ) -> tuple[int, list[int]]:
        """Accepted draft count and emitted tokens for one request's verified rows.

        logits: [l+1, V] target logits at the anchor and after each verified draft; drafts (l,).
        """
        l_r = drafts.shape[0]
        t = self.cfg.temperature
        logits = logits.float().cpu()  # at most gamma + 1 rows; sampling uses a CPU generator
        q = q.cpu() if q is not None else None
        if t == 0:
            pred = logits.argmax(-1).numpy()
            m = 0
            while m < l_r and drafts[m] == pred[m]:
                m += 1
            return m, [int(x) for x in drafts[:m]] + [int(pred[m])]
        p = torch.softmax(logits / t, -1)
        u = torch.rand(l_r, generator=self.gen, dtype=torch.float64) if l_r else None
        for k in range(l_r):
            x = int(drafts[k])
            px, qx = float(p[k, x]), float(q[k, x])  # type: ignore[index]
            if qx <= 0 or float(u[k]) * qx >= px:  # type: ignore[index]  # reject (u >= p/q)
                resid = torch.clamp(p[k] - q[k], min=0)  # type: ignore[index]
                s = float(resid.sum())
                dist = resid / s if s > 0 else p[k]
                y = int(torch.multinomial(dist, 1, generator=self.gen))
                return k, [int(v) for v in drafts[:k]] + [y]
        y = int(torch.multinomial(p[l_r], 1, generator=self.gen))
        return l_r, [int(v) for v in drafts] + [y]

    # ------------------------------------------------------------------ run
    def _warmup(self) -> None:
        """A few throwaway forwards so that the first timed step pays no one-off costs."""
        for _ in range(self.cfg.warmup_steps):
            tok = [int(t) for t in self.prompts[0][:8]] or [0]
            self.target.forward([0], [tok])
            self.target.reset(0)
            if self.target.feature_layers and len(tok) > 1:
                self.feat_buf[0, : len(tok)] = 0
                self.seq_buf[0, : len(tok)] = torch.tensor(tok)
                self.proposer.propose(
                    np.array([0]),
                    np.array([len(tok) - 1]),
                    self.seq_buf,
                    self.feat_buf,
                    self.cfg.temperature,
                    torch.Generator().manual_seed(0),
                )

    def _speed_ref(self):  # type: ignore[no-untyped-def]
        """The process's speed reference, or one of this engine's own (taken now)."""
        from specsim.torch_engine.clock import active_reference
        from specsim.torch_engine.speed import speed_reference

        ref = active_reference()
        if ref is None:
            ref = speed_reference(self.model, {self.cfg.draft_phase: self.proposer})
        return ref

    def run(self) -> EngineResult:
        """Serve the workload step by step: admit, draft and schedule, verify, accept and emit,
        retire; then the raw log the simulator's metric functions read."""
        self._warmup()
        wl, cfg = self.wl, self.cfg
        jobs = JobTable(self.prompts)
        self.jobs = jobs
        self.queue: deque[int] = deque()
        self.n_started = 0
        if wl.open_loop:
            for i in range(wl.arrival_s.shape[0]):
                jobs.add(int(wl.trace_idx[i]), float(wl.arrival_s[i]), int(wl.output_len[i]))
            n_arrived = 0
        else:
            for _ in range(
                wl.concurrency if wl.max_jobs is None else min(wl.concurrency, wl.max_jobs)
            ):
                self._spawn(0.0)
        self.running: list[Req] = []
        self.free = list(range(self.slots - 1, -1, -1))
        self.kv_used = 0
        self.trials = np.zeros(self.gamma + 1, dtype=np.int64)
        self.succ = np.zeros(self.gamma + 1, dtype=np.int64)
        log: list[tuple] = []
        timing: list[tuple] = []
        self.tok_job: list[int] = []
        self.tok_time: list[float] = []
        self.tok_cnt: list[int] = []
        self.max_b = 0
        self.step_fn = self.cost.step_time_fn(None)
        ref = self._speed_ref() if cfg.clock == "ref" else None
        eclock = EngineClock(cfg.clock, ref, (cfg.draft_phase,))
        self.eclock = eclock
        eclock.start()
        clock, wall = eclock.now, eclock.wall

        while True:
            eclock.tick()  # ref clock: re-time the speed probes when due, off both clocks
            now = clock()
            w_start = wall()
            if wl.open_loop:
                while n_arrived < wl.arrival_s.shape[0] and wl.arrival_s[n_arrived] <= now:
                    self.queue.append(n_arrived)
                    n_arrived += 1
            new = self._admit(now)
            if not self.running and not new:
                if wl.open_loop and n_arrived < wl.arrival_s.shape[0]:
                    eclock.wait_until(float(wl.arrival_s[n_arrived]))
                    continue
                if self.queue:
                    raise SpecsimError("a request does not fit --kv-tokens even alone")
                break
            dec = self.running
            t_adm = clock()
            lens, prop, t_draft = self._draft_and_schedule(dec, new, t_adm)
            t_sched = clock()
            out, ctx_mean = self._verify(dec, new, lens, prop)
            t_ver = eclock.mark("target")
            n_ver, n_acc, emitted = self._accept_and_emit(dec, new, lens, prop, out)
            end = clock()
            n_fin = self._retire(dec, new, end)
            prefill_tokens = sum(jobs.prompt_len[r.job] for r in new)
            batch = int(out.offsets[-1])
            log.append(
                (
                    now, end - now, batch, len(dec) + len(new), len(dec), len(new),
                    len(self.queue), prefill_tokens, n_ver, n_acc, emitted, 0.0, n_fin,
                )
            )  # fmt: skip
            timing.append(
                (
                    t_adm - now, t_draft - t_adm, t_sched - t_draft, t_ver - t_sched,
                    end - t_ver, ctx_mean, w_start, wall(),
                )
            )  # fmt: skip
            if not wl.open_loop:
                for _ in range(n_fin):
                    self._spawn(end)
        raw = jobs.raw_log(log, self.tok_job, self.tok_time, self.tok_cnt, self.max_b)
        t_end = eclock.mark("target")
        res = self._result(raw, jobs.outputs, timing, t_end)
        if eclock.ref is not None:  # the run's raw CPU seconds: its mean slowdown vs reference
            res.config["raw_cpu_s"] = eclock.raw_cpu_s
            res.config["speed_factor"] = eclock.raw_cpu_s / max(t_end - eclock.skew, 1e-12)
            res.config["speed_calibrations"] = eclock.calibrations
        return res

    # ------------------------------------------------------------------ the step's phases
    def _spawn(self, now: float) -> None:
        """Closed loop: the next job arrives now (if the bounds allow)."""
        wl = self.wl
        if wl.max_jobs is not None and self.n_started >= wl.max_jobs:
            return
        if wl.duration is not None and now > wl.duration:
            return
        t_idx, _p, o = wl.job(self.n_started)
        self.n_started += 1
        self.queue.append(self.jobs.add(t_idx, now, o))

    def _admit(self, now: float) -> list[Req]:
        """FIFO admission under the simulator's rule (:mod:`specsim.sim.admission`): a free
        slot, the KV reservation and the step's prefill budget."""
        cfg, jobs, queue = self.cfg, self.jobs, self.queue
        new: list[Req] = []
        budget = cfg.prefill_budget
        while queue and len(self.running) + len(new) < min(cfg.max_running, self.slots):
            j = queue[0]
            p = jobs.prompt_len[j]
            res = reservation(p, jobs.out_len[j], self.gamma)
            if not fits(self.kv_used, res, cfg.kv_tokens, bool(new), p, budget):
                break
            queue.popleft()
            self.kv_used += res
            budget -= p
            jobs.admitted[j] = now
            req = Req(j, self.free.pop(), jobs.out_len[j], res)
            self.target.reset(req.slot)
            new.append(req)
        return new

    def _draft_and_schedule(self, dec: list[Req], new: list[Req], t_adm: float):  # type: ignore[no-untyped-def]
        """The proposer drafts a block for every decoding request; the policy picks each
        request's verification length from the real confidences."""
        cfg, jobs, eclock = self.cfg, self.jobs, self.eclock
        if not dec:
            return np.zeros(0, dtype=np.int64), None, t_adm
        slots = np.array([r.slot for r in dec], dtype=np.int64)
        anchors = np.array([len(self.prompts[jobs.trace[r.job]]) + r.n - 1 for r in dec])
        eclock.mark(cfg.draft_phase)
        prop = self.proposer.propose(
            slots, anchors, self.seq_buf, self.feat_buf, cfg.temperature, self.gen
        )
        t_draft = eclock.mark("target")
        ctx_now = float(np.mean(anchors + 1))
        fn = self.cost.step_time_fn(ctx_now) if self.cost.is_2d else self.step_fn
        pre = sum(jobs.prompt_len[r.job] for r in new)
        lag = None
        if "lagged_conf" in self.policy.needs:
            lag = np.stack([r.h2 if r.h2 is not None else prop.conf[i] for i, r in enumerate(dec)])
        rate = None
        if "accept_rate" in self.policy.needs:
            rate = (self.succ[1:] + PRIOR_RATE * PRIOR_WEIGHT) / (
                self.trials[1:].astype(np.float64) + PRIOR_WEIGHT
            )
        known = draft_time = None
        if "lag_known" in self.policy.needs:
            known = np.array([r.h2 is not None for r in dec], dtype=bool)
        if "draft_time" in self.policy.needs:  # the policy prices drafting from the profile
            n_dec, cost = len(dec), self.cost

            def draft_time(k: int) -> float:
                return float(cost.draft_ms(n_dec, k)) * 1e-3 if k > 0 else 0.0

        inp = StepInput(
            conf=prop.conf,
            step_time=self.cost.policy_step_fn(fn, pre),
            lagged_conf=lag,
            accept_rate=rate,
            rng=self.policy_rng,
            lag_known=known,
            draft_time=draft_time,
        )
        lens = check_lengths(self.policy.schedule(inp), inp, self.policy.name)
        return lens, prop, t_draft

    def _verify(self, dec: list[Req], new: list[Req], lens: np.ndarray, prop: Any):  # type: ignore[no-untyped-def]
        """ONE target forward over every decoding request's ``[anchor, d_1..d_l]`` and the new
        requests' prompts; returns the forward's output and the mean cached context before it."""
        jobs = self.jobs
        slots_f: list[int] = []
        toks_f: list[list[int]] = []
        for i, r in enumerate(dec):
            a = len(self.prompts[jobs.trace[r.job]]) + r.n - 1
            toks_f.append([int(self.seq_buf[r.slot, a])] + prop.tokens[i, : lens[i]].tolist())
            slots_f.append(r.slot)
        for r in new:
            p_ids = self.prompts[jobs.trace[r.job]]
            self.seq_buf[r.slot, : len(p_ids)] = torch.as_tensor(p_ids)
            toks_f.append(list(p_ids))
            slots_f.append(r.slot)
        ctx_mean = float(np.mean(self.target.lengths[np.asarray(slots_f)]))  # before the step
        # logits where the engine samples: every verified row, a prompt's last token only
        n_logits = [len(t) for t in toks_f[: len(dec)]] + [1] * len(new)
        self.eclock.mark("target", sum(len(t) for t in toks_f))  # ref: the forward's own speed
        out = self.target.forward(slots_f, toks_f, n_logits)
        self.max_b = max(self.max_b, int(out.offsets[-1]))
        return out, ctx_mean

    def _accept_and_emit(self, dec, new, lens, prop, out) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
        """Accept each request's drafts (greedy or rejection sampling), commit the accepted
        tokens' features and cache, stream the emitted tokens (cut at the cap and EOS).
        Returns (verified drafts, accepted drafts, emitted tokens)."""
        jobs = self.jobs
        n_dec = len(dec)
        n_ver = int(lens.sum()) if n_dec else 0
        n_acc = 0
        emitted_total = 0
        feats = out.feats
        for i, r in enumerate(dec + new):
            lo = int(out.offsets[i])
            p_len = len(self.prompts[jobs.trace[r.job]])
            if i < n_dec:
                l_r = int(lens[i])
                q = prop.q[i] if prop.q is not None else None
                m, emit = self._accept(out.logits_of(i), prop.tokens[i, :l_r], q)
                a = p_len + r.n - 1
                keep = m + 1  # anchor + accepted drafts stay in the cache
                n_acc += m
                jobs.steps[r.job] += 1
                jobs.verified[r.job] += l_r
                jobs.accepted[r.job] += m
                if "accept_rate" in self.policy.needs:
                    reach = min(m + 1, l_r)
                    self.trials[: reach + 1] += 1
                    self.succ[: m + 1] += 1
                r.h2, r.h1 = r.h1, prop.conf[i]
            else:
                m, emit = self._accept(out.logits_of(i), np.zeros(0, np.int64), None)
                a = 0
                keep = p_len
                r.prefilled = True
            if feats is not None:
                self.feat_buf[r.slot, a : a + keep] = feats[lo : lo + keep].to(torch.float16)
            self.target.truncate(r.slot, a + keep)
            emit = emit[: r.cap - r.n]
            for k, tok in enumerate(emit):
                if tok in self.eos:
                    emit = emit[: k + 1]
                    break
            base = p_len + r.n
            self.seq_buf[r.slot, base : base + len(emit)] = torch.as_tensor(emit)
            r.out.extend(emit)
            r.n += len(emit)
            emitted_total += len(emit)
            self.tok_job.append(r.job)
            self.tok_cnt.append(len(emit))
            if i < n_dec:
                cut = m - min(m, len(emit) - 1)  # drafts cut by the cap/EOS
                jobs.accepted[r.job] -= cut
                n_acc -= cut
            if r.n >= r.cap or (emit and emit[-1] in self.eos):
                r.cap = r.n  # done
        return n_ver, n_acc, emitted_total

    def _retire(self, dec: list[Req], new: list[Req], end: float) -> int:
        """Stamp the step's end on its emissions and first tokens; finished requests free
        their slot and reservation. Returns how many finished."""
        jobs = self.jobs
        self.tok_time.extend([end] * (len(dec) + len(new)))
        for r in new:
            jobs.first[r.job] = end
        still: list[Req] = []
        n_fin = 0
        for r in dec + new:
            if r.n >= r.cap:
                jobs.finish[r.job] = end
                jobs.outputs[r.job] = r.out
                jobs.out_len[r.job] = r.n
                self.kv_used -= r.res
                self.free.append(r.slot)
                n_fin += 1
                if self.progress is not None:
                    self.progress.update(1)
            else:
                still.append(r)
        self.running = still
        return n_fin

    def _result(self, raw: RawLog, outputs, timing, t_end: float) -> EngineResult:
        """Metrics (the simulator's own functions), frames and config of a finished run."""
        config = {
            "policy": self.policy.name,
            "load": self.wl.describe,
            "temperature": self.cfg.temperature,
            "layout": self.cfg.layout,
            "seed": self.cfg.seed,
            "block_size": self.gamma,
            "profile": self.cost.name,
            "max_running": self.cfg.max_running,
            "prefill_budget": self.cfg.prefill_budget,
            "torch_threads": torch.get_num_threads(),
            "clock": self.cfg.clock,
        }
        return engine_result(raw, outputs, timing, t_end, len(self.prompts), config)

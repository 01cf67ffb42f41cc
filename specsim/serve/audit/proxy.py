"""A proxy between an audit client and llama-server that perturbs the served law (mutants).

Why: a server audit must show it catches real loss, and a lossy server is hard to come by. The
proxy is one: it relays ``/completion`` from an upstream llama-server (speculation on) and, at
positions its mutant picks, replaces the emitted token. It keeps the law honest everywhere
else: after a replaced token it cancels the upstream stream and asks again with the prompt
extended by everything emitted so far, so every later token is the upstream's own sample given
the perturbed history. The auditor is told nothing: streamed chunks keep the upstream's shape
(the replaced token carries the metadata of the one it replaced), and the log of what was
perturbed (position, TV of the law there) goes to a file the audit never reads.

Mutants (``MUTANTS``): ``swap2-after-rejection`` (with probability 0.02, the first token after a
speculative step that ended on a rejected draft becomes the reference's second most likely one:
TV 0.02 (1 - p2) there), ``temp0.9-one-in-ten`` (each position with probability 0.1 re-sampled
at temperature 0.9), the same rules ten times as often (``swap2-after-rejection-p0.2``,
``temp0.9-every-position``: the audit's cost scales as 1 / rate^2), and two lossless controls:
``passthrough`` and ``restart-one-in-ten`` (cancel and re-ask at 10% of positions without
changing the token: the machinery alone). The law at a replaced position is asked of the
upstream after its stream is shut (its one slot is then free).
The field's bug classes (issue 46), each a trigger decided before the token is drawn:
``depth7-only`` (tokens of a step that drafted exactly 7, the block size: SGLang #33800),
``requests-0.5pct`` (0.5% of whole requests, a quarter of their positions: SGLang #34959),
``batch-only`` (only while two or more requests are in flight: a batched kernel that differs),
``after-rejection-beyond64`` (after a rejection, only past position 64: a verifier-state rewrite
window), and ``near-ties-only`` (the second token wherever the upstream's margin is below 0.02
nats: numerics, which the greedy audit must class as near-ties, never as a bug).
Steps and rejections are read from the upstream's stream (``timings_per_token``: its running
``draft_n``; ``n_probs``: only tokens sampled outside a step carry probabilities).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.serve.audit.client import StepReader


@dataclass(frozen=True)
class Mutant:
    """Where (``after-rejection`` or ``any`` position) and how often a token is replaced, and by
    what (``second``: the second most likely; ``temperature``: a draw at ``temperature``;
    ``same``: itself, a lossless control that still cancels and re-asks)."""

    name: str
    rate: float
    where: str  # any | after-rejection | depth | batch | near-tie
    how: str
    temperature: float = 0.9
    depth: int = 0  # where == "depth": only tokens of a step that drafted exactly this many
    share: float = 1.0  # the share of requests the mutant touches at all (chosen per request)
    beyond: int = 0  # only positions >= this
    eps: float = 0.0  # where == "near-tie": only where log p1 - log p2 < eps (nats)

    def eligible(self, role_after: bool, drafted: int, inflight: int, margin: float,
                 position: int) -> bool:  # fmt: skip
        """Whether this position may be perturbed (each input is known before the draw)."""
        if position < self.beyond:
            return False
        if self.where == "after-rejection":
            return role_after
        if self.where == "depth":
            return drafted == self.depth
        if self.where == "batch":
            return inflight >= 2
        if self.where == "near-tie":
            return margin < self.eps
        return True


MUTANTS = {
    m.name: m
    for m in (
        Mutant("swap2-after-rejection", 0.02, "after-rejection", "second"),
        Mutant("temp0.9-one-in-ten", 0.1, "any", "temperature", 0.9),
        # the same rules ten times as often: what the audit costs scales as 1 / rate^2
        Mutant("swap2-after-rejection-p0.2", 0.2, "after-rejection", "second"),
        Mutant("temp0.9-every-position", 1.0, "any", "temperature", 0.9),
        # the field's bug classes (issue 46)
        Mutant("depth7-only", 0.5, "depth", "second", depth=7),
        Mutant("requests-0.5pct", 0.25, "any", "second", share=0.005),
        Mutant("batch-only", 0.05, "batch", "second"),
        Mutant("after-rejection-beyond64", 0.5, "after-rejection", "second", beyond=64),
        Mutant("near-ties-only", 1.0, "near-tie", "second", eps=0.02),
        Mutant("passthrough", 0.0, "any", "same"),
        Mutant("restart-one-in-ten", 0.1, "any", "same"),
    )
}


def _law(client, upstream: str, prompt: list[int], body: dict[str, Any], temperature: float,
         n_probs: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip  # noqa: ANN001
    q = {k: body[k] for k in ("top_k", "top_p", "min_p", "ignore_eos", "logit_bias") if k in body}
    q.update(prompt=prompt, n_predict=1, n_probs=n_probs, post_sampling_probs=True,
             cache_prompt=True, temperature=temperature)  # fmt: skip
    r = client.post(upstream + "/completion", json=q)
    top = r.json()["completion_probabilities"][0]["top_probs"]
    return (np.array([int(e["id"]) for e in top]), np.array([float(e["prob"]) for e in top]))


def _law_query(body: dict[str, Any]) -> bool:
    return (
        int(body.get("n_predict", 16)) == 1
        and int(body.get("n_probs", 0)) > 0
        and not bool(body.get("stream"))
    )


def _margin(top: list[dict[str, Any]]) -> float:
    """log p1 - log p2 of a streamed top (inf when fewer than two are reported)."""
    if len(top) < 2:
        return float("inf")
    p = [float(t["prob"]) if "prob" in t else float(np.exp(t["logprob"])) for t in top[:2]]
    return float(np.log(max(p[0], 1e-300)) - np.log(max(p[1], 1e-300)))


class _Handler(BaseHTTPRequestHandler):
    server: _ProxyServer

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _relay(self, method: str) -> None:
        p = self.server.proxy
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
        if method == "POST" and self.path.rstrip("/") == "/completion":
            body = json.loads(data or b"{}")
            if not _law_query(body):  # a one-token law query is relayed: laws are not mutated
                self._completion(body)
                return
        r = p.client.request(method, p.upstream + self.path, content=data,
                             headers={"Content-Type": "application/json"})  # fmt: skip
        self.send_response(r.status_code)
        self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(r.content)))
        self.end_headers()
        self.wfile.write(r.content)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._relay("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._relay("POST")

    def _send_event(self, d: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(d).encode() + b"\n\n")
        self.wfile.flush()

    def _completion(self, body: dict[str, Any]) -> None:
        p = self.server.proxy
        stream = bool(body.get("stream"))
        if stream:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
        out = p.generate(body, self._send_event if stream else None)
        if not stream:
            raw = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    proxy: MutantProxy


class MutantProxy:
    """``with MutantProxy(upstream_url, "swap2-after-rejection", log="p.jsonl") as px:``, then
    audit ``px.url``. Upstream and proxy listen on 127.0.0.1 only."""

    def __init__(self, upstream: str, mutant: str, seed: int = 0, log: str | None = None) -> None:
        if mutant not in MUTANTS:
            raise SpecsimError(f"unknown proxy mutant {mutant!r}; one of {sorted(MUTANTS)}")
        import httpx

        self.upstream = upstream.rstrip("/")
        self.mutant = MUTANTS[mutant]
        self.seed = seed
        self.log_path = Path(log) if log else None
        # a new connection per upstream request (localhost: cheap): with 8 generations in
        # flight a kept-alive connection that llama-server had closed was reused ("Server
        # disconnected without sending a response", then "Bad file descriptor" in another
        # handler thread), and the auditor saw a stream with no token
        self.client = httpx.Client(timeout=httpx.Timeout(600.0, connect=30.0),
                                   limits=httpx.Limits(max_keepalive_connections=0))  # fmt: skip
        self._lock = threading.Lock()
        self.passed = 0  # positions relayed (perturbed or not)
        self.perturbed = 0
        self.eligible = 0  # positions the mutant's rule could pick
        self.tv_event_sum = 0.0  # TV between the rule's law and the reference, per replacement
        self.inflight = 0  # generations being served now (the batch-only trigger)
        self._srv = _ProxyServer(("127.0.0.1", 0), _Handler)
        self._srv.proxy = self
        self._thread = threading.Thread(target=self._srv.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._srv.server_address[1]}"

    def __enter__(self) -> MutantProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._srv.shutdown()
        self._srv.server_close()
        self.client.close()

    def summary(self) -> dict[str, Any]:
        """What the proxy did (for reports; never shown to the auditor)."""
        with self._lock:
            return {
                "mutant": self.mutant.name, "positions": self.passed, "eligible": self.eligible,
                "perturbed": self.perturbed, "rate": self.mutant.rate,
                "mean_tv_replaced": self.tv_event_sum / max(self.perturbed, 1),
                "mean_tv_eligible": self.mutant.rate * self.tv_event_sum / max(self.perturbed, 1),
            }  # fmt: skip

    def _note(self, rec: dict[str, Any]) -> None:
        with self._lock:
            if self.log_path is not None:
                with open(self.log_path, "a") as fh:
                    fh.write(json.dumps(rec) + "\n")

    def _replace(self, prompt: list[int], body: dict[str, Any], tok: int,
                 rng: np.random.Generator) -> tuple[int, float]:  # fmt: skip
        """The token that replaces ``tok`` after ``prompt``, and the TV between the law it is
        drawn from and the reference's there (at an eligible position the law moves by ``rate``
        times that)."""
        m = self.mutant
        t = float(body.get("temperature", 0.8))
        t = t if t > 0 else 1.0  # greedy: the ranking is the law's at T = 1
        k = max(40, int(body.get("top_k") or 0))
        if m.how == "same":
            return tok, 0.0
        ids, pr = _law(self.client, self.upstream, prompt, body, t, k)
        if m.how == "second":
            if ids.size < 2:
                return tok, 0.0
            return int(ids[1]), 1.0 - float(pr[1]) / max(float(pr.sum()), 1e-12)
        ids2, pr2 = _law(self.client, self.upstream, prompt, body, m.temperature, k)
        new = int(rng.choice(ids2, p=pr2 / pr2.sum()))
        a = dict(zip(ids.tolist(), (pr / pr.sum()).tolist(), strict=True))
        b = dict(zip(ids2.tolist(), (pr2 / pr2.sum()).tolist(), strict=True))
        tv = 0.5 * sum(abs(a.get(i, 0.0) - b.get(i, 0.0)) for i in set(a) | set(b))
        return new, tv

    def generate(self, body: dict[str, Any], send: Any) -> dict[str, Any]:
        """Serve one /completion: relay upstream, perturb where the mutant says, re-ask after."""
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and all(isinstance(x, int) for x in prompt)):
            raise SpecsimError("the mutant proxy takes token-id prompts")
        n = int(body.get("n_predict", 16))
        rng = np.random.default_rng([self.seed, int(body.get("seed", 0)) & 0x7FFFFFFF, 99])
        chosen = self.mutant.share >= 1.0 or rng.random() < self.mutant.share
        want_probs = int(body.get("n_probs", 0)) > 0
        with self._lock:
            self.inflight += 1
        try:
            return self._generate(body, send, prompt, n, rng, chosen, want_probs)
        finally:
            with self._lock:
                self.inflight -= 1

    def _generate(  # noqa: PLR0913
        self, body: dict[str, Any], send: Any, prompt: list[int], n: int,
        rng: np.random.Generator, chosen: bool, want_probs: bool,
    ) -> dict[str, Any]:  # fmt: skip
        near = self.mutant.where == "near-tie"
        emitted: list[int] = []
        text = []
        d_offset = a_offset = 0
        final: dict[str, Any] = {}
        restarts = 0

        def emit(d: dict[str, Any], tm: dict[str, Any], tok: int, d_off: int) -> None:
            """Pass one token on, in the upstream's chunk shape (draft counts made running)."""
            emitted.append(tok)
            text.append(d.get("content", ""))
            if send is None:
                return
            ev = {k: v for k, v in d.items() if k not in ("timings", "stop")}
            ev.update(tokens=[tok], stop=False)
            if tm:
                ev["timings"] = {**tm, "draft_n": d_off + int(tm.get("draft_n", 0))}
            if not want_probs:
                ev.pop("completion_probabilities", None)
            send(ev)

        while len(emitted) < n:
            up = {**body, "prompt": prompt + emitted, "n_predict": n - len(emitted),
                  "stream": True, "return_tokens": True, "timings_per_token": True,
                  "n_probs": max(2 if near else 1, int(body.get("n_probs", 0))),
                  "post_sampling_probs": False if near else body.get("post_sampling_probs", False),
                  "cache_prompt": True,
                  "seed": (int(body.get("seed", 0)) + 7919 * restarts) & 0x7FFFFFFF}  # fmt: skip
            restarts += 1
            steps = StepReader()
            hit: tuple[dict[str, Any], dict[str, Any], int] | None = None
            last_tm: dict[str, Any] = {}
            with self.client.stream("POST", self.upstream + "/completion", json=up) as r:
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    d = json.loads(line[5:])
                    tm = d.get("timings") or {}
                    if tm:
                        last_tm = tm
                    for i, tok in enumerate(d.get("tokens") or []):
                        probs = d.get("completion_probabilities") or []
                        e = probs[i] if i < len(probs) else {}
                        top = e.get("top_probs") or e.get("top_logprobs") or []
                        plain = bool(top)
                        _, after = steps.push(plain, int(tm.get("draft_n", 0)))
                        with self._lock:
                            inflight = self.inflight
                        eligible = chosen and self.mutant.eligible(
                            after,
                            0 if plain else steps.step_drafted,
                            inflight,
                            _margin(top),
                            len(emitted),
                        )
                        with self._lock:
                            self.passed += 1
                            self.eligible += int(eligible)
                        if eligible and self.mutant.rate > 0 and rng.random() < self.mutant.rate:
                            hit = (d, tm, int(tok))  # replaced once the upstream stream is shut
                            break
                        emit(d, tm, int(tok), d_offset)
                    if hit is not None:
                        break
                    if d.get("stop"):
                        final = d
            if hit is not None:  # the upstream's slot is free again: ask it for the law here
                d, tm, tok = hit
                new, tv = self._replace(prompt + emitted, body, tok, rng)
                with self._lock:
                    self.perturbed += 1
                    self.tv_event_sum += tv
                self._note({"position": len(emitted), "old": tok, "new": new, "tv": tv})
                emit({**d, "content": ""} if new != tok else d, tm, new, d_offset)
            d_offset += int(last_tm.get("draft_n", 0))
            a_offset += int(last_tm.get("draft_n_accepted", 0))
            if hit is None:
                break  # the upstream finished (all n tokens, or an end of generation)
        tm = {**(final.get("timings") or {}), "draft_n": d_offset, "draft_n_accepted": a_offset,
              "predicted_n": len(emitted)}  # fmt: skip
        out = {"content": "".join(text), "tokens": emitted, "stop": True, "timings": tm,
               "generation_settings": final.get("generation_settings", {})}  # fmt: skip
        if send is not None:  # like llama-server: the last chunk repeats no token
            send({**out, "tokens": [], "content": "", "tokens_predicted": len(emitted)})
        return out

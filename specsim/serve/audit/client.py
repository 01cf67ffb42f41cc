"""The HTTP side of a server audit: generate from the audited server, score on the reference.

Why these requests: the audit needs, for every emitted token, the token id (not its text: two
tokenisations of one string are different samples) and the reference's law at that position.

- Generation (``api="llama"``): llama-server's native ``/completion`` with token-id prompts,
  streamed, with ``timings_per_token`` and ``n_probs: 1``. Each streamed token then carries the
  server's running ``draft_n`` (tokens drafted so far) and, only when it was sampled outside a
  speculative step, its probabilities: so the audit knows each position's place in a step
  (plain, first of a step, later in a step, first after a step that rejected a draft), which is
  decided before that token is drawn and is therefore a valid stratum. The stream keeps only
  the last piece of a character split over several tokens, so both servers get the same
  ``logit_bias`` banning tokens that are not UTF-8 alone (``vocab``), and a stream that
  still loses a token (``tokens_predicted`` ahead of the tokens seen) stops the audit.
  ``api="completions"``: OpenAI ``/v1/completions`` with token-id prompts and ``logprobs: 1``,
  ids read from llama-server's ``logprobs.content[].id`` or vLLM's ``"token_id:N"`` tokens
  (``return_tokens_as_token_ids``); no step information.
- Scoring: llama-server's ``/completion`` on the reference (speculation off) with the prompt
  extended by the emitted prefix, ``n_predict: 1``, ``n_probs: K`` and ``post_sampling_probs``:
  the top-K probabilities of the sampler chain at that position (after top-k, top-p, min-p and
  temperature), the law the reference would sample from. One request per position; the
  worker's slot is pinned (``id_slot``) so the prompt cache makes each one a single-token decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.serve.sse import StreamError, sse_json

APIS = ("llama", "completions")


@dataclass(frozen=True)
class Sampling:
    """The sampler settings sent to both servers (everything else stays at llama-server's
    defaults, which keep penalties, DRY, XTC and typical sampling off)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    ignore_eos: bool = True
    banned: tuple[int, ...] = ()  # token ids banned on both servers (audit.vocab)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "ignore_eos": self.ignore_eos,
        }
        if self.banned:
            out["logit_bias"] = [[i, False] for i in self.banned]
        return out

    def describe(self) -> str:
        parts = [f"temperature {self.temperature:g}"]
        parts.append(f"top-k {self.top_k}" if self.top_k > 0 else "top-k off")
        parts.append(f"top-p {self.top_p:g}" if self.top_p < 1 else "top-p off")
        parts.append(f"min-p {self.min_p:g}" if self.min_p > 0 else "min-p off")
        if self.banned:
            parts.append(f"{len(self.banned)} tokens that are not UTF-8 alone banned")
        return ", ".join(parts)


@dataclass
class Generation:
    """One request to the audited server: what it emitted and what it says about speculation."""

    job: int
    tokens: list[int] = field(default_factory=list)
    roles: list[int] = field(default_factory=list)  # stats.ROLES index per token
    plain: list[bool] = field(default_factory=list)  # sampled outside a speculative step
    draft_n: list[int] = field(default_factory=list)  # the server's running draft count
    drafted: int | None = None
    accepted: int | None = None
    spec_types: str = ""
    error: str = ""


@dataclass(frozen=True)
class Scored:
    """The reference's law at one position: reported ids and probabilities (descending), and
    whether they are the whole support (fewer than K returned, or mass ~1)."""

    ids: np.ndarray
    probs: np.ndarray
    complete: bool


class StepReader:
    """Speculative steps of one llama-server stream, as its chunks reveal them.

    A token with probabilities (``n_probs``) was sampled outside a speculative step (plain).
    The others were emitted by a verification step; tokens of one step share the server's
    running ``draft_n`` and two steps never do (each drafts at least one token). A step that
    drafted d tokens and emitted m ended on a rejection when m - 1 < d. Each token's place is
    known before it is drawn, so it is a valid stratum (and the proxy mutants' trigger)."""

    def __init__(self) -> None:
        self.prev: tuple[bool, int] | None = None  # (plain, draft_n) of the last token
        self.d_before = 0  # draft_n before the current speculative step
        self.m = 0  # tokens of the current step so far
        self.step_drafted = 0  # drafts of the current speculative step (0 while plain)

    def push(self, plain: bool, draft_n: int) -> tuple[int, bool]:
        """Record a token: its role (ROLES index: plain 0, step-first 1, step-later 2) and
        whether it is the first token after a step that rejected a draft."""
        key = (plain, draft_n)
        after_rejection = False
        new_step = plain or self.prev is None or key != self.prev
        if new_step and self.prev is not None and not self.prev[0]:
            after_rejection = self.m - 1 < self.prev[1] - self.d_before
            self.d_before = self.prev[1]
        self.m = 1 if new_step else self.m + 1
        if new_step:
            self.step_drafted = 0 if plain else draft_n - self.d_before
        self.prev = key
        return (0 if plain else 1 if new_step else 2), after_rejection


AFTER_REJECTION = 3  # stats.ROLES index: first token after a step that rejected a draft


def _roles(has_probs: list[bool], drafted: list[int | None]) -> list[int]:
    """Place of each token (stats.ROLES index) from what the stream said (0: unknown)."""
    if not any(d is not None for d in drafted):
        return [0] * len(has_probs)
    steps = StepReader()
    out = []
    for hp, d in zip(has_probs, drafted, strict=True):
        role, after = steps.push(hp, int(d or 0))
        out.append(AFTER_REJECTION if after else role)
    return out


async def generate_llama(client, url: str, job: int, prompt: list[int], n: int,
                         sampling: Sampling, seed: int) -> Generation:  # fmt: skip  # noqa: ANN001
    body = {
        "prompt": prompt, "n_predict": n, "seed": seed, "stream": True, "cache_prompt": False,
        "return_tokens": True, "timings_per_token": True, "n_probs": 1, **sampling.body(),
    }  # fmt: skip
    g = Generation(job)
    has_probs: list[bool] = []
    drafted: list[int | None] = []
    predicted = 0
    async with client.stream("POST", url.rstrip("/") + "/completion", json=body) as r:
        if r.status_code != 200:
            g.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}"
            return g
        try:
            async for d in sse_json(r):
                toks = d.get("tokens") or []
                tm = d.get("timings") or {}
                probs = d.get("completion_probabilities") or []
                predicted = max(predicted, int(d.get("tokens_predicted") or 0))
                for i, t in enumerate(toks):
                    g.tokens.append(int(t))
                    e = probs[i] if i < len(probs) else {}
                    has_probs.append(bool(e.get("top_probs") or e.get("top_logprobs")))
                    drafted.append(tm.get("draft_n"))
                if d.get("stop"):
                    if "draft_n" in tm:
                        g.drafted = int(tm["draft_n"])
                        g.accepted = int(tm.get("draft_n_accepted", 0))
                    gs = d.get("generation_settings") or {}
                    g.spec_types = str(gs.get("speculative.types", ""))
        except (StreamError, TypeError, ValueError, AttributeError) as exc:  # not its stream
            g.error = f"a stream that is not llama-server's ({str(exc)[:200]})"
            return g
    if not g.tokens and sampling.ignore_eos:  # asked for n tokens whatever the text: none came
        g.error = f"a stream with no token (asked for {n} with ignore_eos)"
        return g
    g.roles = _roles(has_probs, drafted)
    g.plain = has_probs
    g.draft_n = [int(d or 0) for d in drafted]
    if predicted > len(g.tokens):
        g.error = (
            f"the stream lost {predicted - len(g.tokens)} of {predicted} tokens (llama-server "
            "streams a character split over several tokens as its last piece only; keep "
            "--ban-fragments on)"
        )
    return g


def _oai_ids(choice: dict[str, Any]) -> list[int]:
    lp = choice.get("logprobs") or {}
    if lp.get("content"):
        return [int(c["id"]) for c in lp["content"]]
    toks = lp.get("tokens") or []
    if toks and all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
        return [int(t.split(":", 1)[1]) for t in toks]
    raise SpecsimError(
        "the server's /v1/completions answer has no token ids; llama-server gives them with "
        "logprobs, vLLM with return_tokens_as_token_ids (use --api llama for llama-server)"
    )


async def generate_completions(client, url: str, job: int, prompt: list[int], n: int,
                               sampling: Sampling, seed: int) -> Generation:  # fmt: skip  # noqa: ANN001
    body = {
        "model": "default", "prompt": prompt, "max_tokens": n, "seed": seed, "logprobs": 1,
        "return_tokens_as_token_ids": True, **sampling.body(),
    }  # fmt: skip
    g = Generation(job)
    r = await client.post(url.rstrip("/") + "/v1/completions", json=body)
    if r.status_code != 200:
        g.error = f"HTTP {r.status_code}: {r.text[:300]}"
        return g
    d = _json(r, "the server")
    try:
        g.tokens = _oai_ids(d["choices"][0])
    except (KeyError, IndexError, TypeError, ValueError):
        g.error = f"an answer with no choices ({r.text[:200]!r})"
        return g
    g.roles = [0] * len(g.tokens)
    tm = d.get("timings") or {}
    if "draft_n" in tm:
        g.drafted, g.accepted = int(tm["draft_n"]), int(tm.get("draft_n_accepted", 0))
    return g


def _json(r: Any, who: str) -> Any:
    """The JSON body of an answer, or one line naming who sent something else (a proxy's
    error page, a server that is not llama-server)."""
    try:
        data = r.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise SpecsimError(
            f"{who} answered {r.request.url.path} with something that is not a JSON object "
            f"({r.text[:80]!r}); is it a llama-server?"
        )
    return data


async def _law_at(client, url: str, body: dict[str, Any]) -> dict[str, Any]:  # noqa: ANN001
    """One position's report. llama-server withholds the probabilities when the token it drew
    there is an incomplete UTF-8 piece; the law does not depend on the draw, so draw again."""
    for attempt in range(RETRIES):
        r = await client.post(url.rstrip("/") + "/completion",
                              json={**body, "seed": body["seed"] + 65_537 * attempt})  # fmt: skip
        if r.status_code != 200:
            raise SpecsimError(f"the reference answered HTTP {r.status_code}: {r.text[:200]}")
        probs = _json(r, "the reference").get("completion_probabilities")
        if probs:
            return probs[0]
    raise SpecsimError(
        f"the reference reported no probabilities in {RETRIES} draws at one position (it "
        "withholds them after an incomplete UTF-8 token)"
    )


RETRIES = 32


async def score(client, url: str, prompt: list[int], tokens: list[int], sampling: Sampling,
                slot: int, top_n: int) -> list[Scored]:  # fmt: skip  # noqa: ANN001
    """The reference's law at every position of ``tokens`` after ``prompt``."""
    out = []
    for t in range(len(tokens)):
        body = {
            "prompt": prompt + tokens[:t], "n_predict": 1, "n_probs": top_n, "seed": t,
            "post_sampling_probs": True, "cache_prompt": True, "id_slot": slot,
            **sampling.body(),
        }  # fmt: skip
        top = (await _law_at(client, url, body))["top_probs"]
        ids = np.array([int(e["id"]) for e in top], dtype=np.int64)
        probs = np.array([float(e["prob"]) for e in top], dtype=np.float64)
        complete = len(top) < top_n or float(probs.sum()) >= 1.0 - 1e-6
        out.append(Scored(ids, probs, complete))
    return out


@dataclass(frozen=True)
class Margin:
    """The reference's top of the law at one position, in log-probabilities (descending): the
    greedy audit's triage reads the margin (top-1 minus top-2) and the emitted token's gap."""

    ids: np.ndarray
    logprobs: np.ndarray

    @property
    def argmax(self) -> int:
        return int(self.ids[0])

    @property
    def margin(self) -> float:
        return float(self.logprobs[0] - self.logprobs[1]) if self.ids.size > 1 else np.inf

    def gap(self, token: int) -> float:
        """log p(top-1) - log p(token); past the reported top, at least the gap to its last."""
        hit = np.flatnonzero(self.ids == token)
        i = int(hit[0]) if hit.size else self.ids.size - 1
        return float(self.logprobs[0] - self.logprobs[i])


MARGIN_TOP = 8  # log-probabilities a margin request asks for


async def margin_at(client, url: str, prefix: list[int], banned: tuple[int, ...], slot: int | None,
                    cache: bool = True) -> Margin:  # fmt: skip  # noqa: ANN001
    """The law's top at ``prefix`` on ``url``, as its greedy sampler ranks it (bans applied).

    Asked at temperature 1 with no truncation and ``post_sampling_probs``: the sampler chain's
    probabilities are then the softmax of the biased logits, so log-probability differences are
    logit differences, and a banned token never ranks. ``cache=False`` recomputes the whole
    prefix as one batch (the prompt path) instead of one decode after the cached prefix."""
    body: dict[str, Any] = {
        "prompt": prefix, "n_predict": 1, "n_probs": MARGIN_TOP, "seed": 0,
        "post_sampling_probs": True, "cache_prompt": cache,
        **Sampling(temperature=1.0, banned=banned).body(),
    }  # fmt: skip
    if slot is not None:
        body["id_slot"] = slot
    top = (await _law_at(client, url, body))["top_probs"]
    ids = np.array([int(e["id"]) for e in top], dtype=np.int64)
    lp = np.log(np.maximum(np.array([float(e["prob"]) for e in top], dtype=np.float64), 1e-300))
    return Margin(ids, lp)


async def greedy_tokens(client, url: str, prefix: list[int], n: int, banned: tuple[int, ...],
                        slot: int | None) -> list[int]:  # fmt: skip  # noqa: ANN001
    """``n`` greedy tokens after ``prefix`` on ``url`` (speculation off there: the reference's
    argmax at every prefix, by its decode path)."""
    body: dict[str, Any] = {
        "prompt": prefix, "n_predict": n, "seed": 0, "return_tokens": True,
        "cache_prompt": True, **Sampling(temperature=0.0, banned=banned).body(),
    }  # fmt: skip
    if slot is not None:
        body["id_slot"] = slot
    r = await client.post(url.rstrip("/") + "/completion", json=body)
    if r.status_code != 200:
        raise SpecsimError(f"the reference answered HTTP {r.status_code}: {r.text[:200]}")
    return [int(t) for t in _json(r, "the reference").get("tokens") or []]


async def tokenize(client, url: str, text: str) -> list[int]:  # noqa: ANN001
    """Token ids of a prompt (special tokens parsed, BOS as the model adds it)."""
    body = {"content": text, "add_special": True, "parse_special": True}
    r = await client.post(url.rstrip("/") + "/tokenize", json=body)
    if r.status_code != 200:
        raise SpecsimError(f"the reference's /tokenize answered HTTP {r.status_code}")
    tokens = _json(r, "the reference").get("tokens")
    if not isinstance(tokens, list):
        raise SpecsimError(
            "the reference's /tokenize answer has no token list; is it llama-server?"
        )
    return [int(t) for t in tokens]


async def slots(client, url: str) -> int:  # noqa: ANN001
    """How many parallel slots the reference has (1 when /props does not say)."""
    try:
        r = await client.get(url.rstrip("/") + "/props")
        return max(1, int(r.json().get("total_slots", 1)))
    except Exception:  # noqa: BLE001 - a server without /props: assume one slot
        return 1


async def chat_prompt(client, url: str, message: str) -> str:  # noqa: ANN001
    """The prompt the reference's chat template makes of one user message."""
    r = await client.post(url.rstrip("/") + "/apply-template",
                          json={"messages": [{"role": "user", "content": message}]})  # fmt: skip
    if r.status_code != 200:
        return message  # no chat template: the message is the prompt
    return str(_json(r, "the reference").get("prompt", message))


async def banned_tokens(client, cfg: Any, ref: str) -> tuple[int, ...]:  # noqa: ANN001
    """The tokens banned on both servers (``vocab``), from the reference's GGUF."""
    if not cfg.ban_fragments:
        return ()
    from pathlib import Path

    from specsim.serve.audit.vocab import fragment_tokens

    path = cfg.reference_model
    if path is None:
        r = await client.get(ref.rstrip("/") + "/props")
        path = (_json(r, "the reference") if r.status_code == 200 else {}).get("model_path")
    if not path:
        raise SpecsimError(
            f"the reference at {ref} does not say its model file (/props model_path): pass "
            "--reference-model GGUF, or --no-ban-fragments if its stream keeps every token"
        )
    return fragment_tokens(str(Path(path).expanduser()))

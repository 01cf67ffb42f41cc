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

import asyncio
import math
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from specsim.errors import SpecsimError
from specsim.serve.sse import StreamError, sse_json
from specsim.serve.wire import as_count, as_token_id

T = TypeVar("T")

APIS = ("llama", "completions")
PROB_SLACK = 1e-4  # float32 rounding a server's probabilities (and their sum) may carry


def _bad(who: str, endpoint: str, what: str) -> SpecsimError:
    """The one line for a malformed answer: who sent it, on which endpoint, which field."""
    return SpecsimError(f"{who} answered {endpoint} with {what}; is it a llama-server?")


def token_id(v: Any, who: str, endpoint: str, name: str) -> int:
    """A token id as JSON must carry it (:func:`specsim.serve.wire.as_token_id`)."""
    t = as_token_id(v)
    if t is None:
        raise _bad(who, endpoint, f"{name} {str(v)[:40]!r} (not a token id)")
    return t


def count_field(v: Any, who: str, endpoint: str, name: str) -> int:
    """A non-negative count (``draft_n``, ``tokens_predicted``), as
    :func:`specsim.serve.wire.as_count` defines one."""
    n = as_count(v)
    if n is None:
        raise _bad(who, endpoint, f"{name} {str(v)[:40]!r} (not a count)")
    return n


def parse_top(entry: Any, who: str, endpoint: str) -> tuple[np.ndarray, np.ndarray]:
    """One position's ``top_probs`` as (ids, probs): the single place a reported law is read.

    Returned ranked, most probable first. Refused (one line naming the server, the endpoint and
    the field): anything not a non-empty list of ``{id, prob}``, ids that are not distinct token
    ids, probabilities that are not finite numbers in [0, 1], or that sum past 1. Whatever
    passes is a law the checks can use; a garbage report must not reach them, where it would
    read as the audited server's loss."""
    top = entry.get("top_probs") if isinstance(entry, dict) else None
    if not isinstance(top, list) or not top or not all(isinstance(e, dict) for e in top):
        raise _bad(who, endpoint, f"top_probs {str(top)[:60]!r} (not a list of {{id, prob}})")
    ids = [token_id(e.get("id"), who, endpoint, "top_probs id") for e in top]
    probs = []
    for e in top:
        p = e.get("prob")
        ok = isinstance(p, (int, float)) and not isinstance(p, bool)
        if not ok or not (math.isfinite(p) and -PROB_SLACK <= p <= 1.0 + PROB_SLACK):
            raise _bad(who, endpoint, f"top_probs prob {str(p)[:40]!r} (not a probability)")
        probs.append(min(max(float(p), 0.0), 1.0))
    if len(set(ids)) != len(ids):
        raise _bad(who, endpoint, "top_probs listing one token id twice")
    if sum(probs) > 1.0 + PROB_SLACK:
        raise _bad(who, endpoint, f"top_probs summing to {sum(probs):.4g} (> 1)")
    # ranked here, by probability, whatever order the server listed them in: every reader (the
    # greedy audit's argmax and margin, the rank check) takes position 0 as the top, and a
    # report listed ascending would otherwise make a lossy server look identical. A stable
    # sort keeps the server's own order among exact ties (its sampler's tie-break).
    order = np.argsort(-np.asarray(probs), kind="stable")
    return np.array(ids, dtype=np.int64)[order], np.array(probs, dtype=np.float64)[order]


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


def _opt_count(d: dict[str, Any], key: str, endpoint: str) -> int:
    """A count the server may leave out (0 then), refused when present and not a count."""
    v = d.get(key)
    return 0 if v is None else count_field(v, "the server", endpoint, key)


def _chunk(d: Any, g: Generation, has_probs: list[bool], drafted: list[int | None]) -> None:
    """Read one streamed chunk of the audited server into ``g``: every field typed here."""
    if not isinstance(d, dict):
        raise TypeError(f"a chunk that is not a JSON object: {str(d)[:60]!r}")
    toks = d.get("tokens") or []
    tm = d.get("timings") or {}
    probs = d.get("completion_probabilities") or []
    if not isinstance(toks, list) or not isinstance(tm, dict) or not isinstance(probs, list):
        raise _bad("the server", "/completion", "tokens, timings or completion_probabilities "
                   "of the wrong type")  # fmt: skip
    draft_n = None if tm.get("draft_n") is None else _opt_count(tm, "draft_n", "/completion")
    for i, t in enumerate(toks):
        g.tokens.append(token_id(t, "the server", "/completion", "tokens"))
        e = probs[i] if i < len(probs) else {}
        if not isinstance(e, dict):
            raise _bad("the server", "/completion", "a completion_probabilities entry that is "
                       "not an object")  # fmt: skip
        has_probs.append(bool(e.get("top_probs") or e.get("top_logprobs")))
        drafted.append(draft_n)
    if d.get("stop"):
        if draft_n is not None:
            g.drafted = draft_n
            g.accepted = _opt_count(tm, "draft_n_accepted", "/completion")
        gs = d.get("generation_settings") or {}
        g.spec_types = str(gs.get("speculative.types", ""))


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
                _chunk(d, g, has_probs, drafted)
                predicted = max(predicted, _opt_count(d, "tokens_predicted", "/completion"))
        except (StreamError, TypeError, ValueError, AttributeError) as exc:  # not its stream
            g.error = f"a stream that is not llama-server's ({str(exc)[:200]})"
            return g
        except SpecsimError as exc:  # a field of the wrong type: named by _chunk
            g.error = str(exc).removeprefix("the server answered ")
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
        return [token_id(c["id"], "the server", "/v1/completions", "id") for c in lp["content"]]
    toks = lp.get("tokens") or []
    if toks and all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
        return [token_id(int(t.split(":", 1)[1]), "the server", "/v1/completions", "token")
                for t in toks]  # fmt: skip
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
    d = _json(r, f"the server at {url}")
    try:
        g.tokens = _oai_ids(d["choices"][0])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        g.error = f"an answer with no choices ({r.text[:200]!r})"
        return g
    g.roles = [0] * len(g.tokens)
    tm = d.get("timings") or {}
    if not isinstance(tm, dict):
        raise _bad(f"the server at {url}", "/v1/completions", "timings that are not an object")
    if tm.get("draft_n") is not None:
        who = f"the server at {url}"
        g.drafted = count_field(tm["draft_n"], who, "/v1/completions", "timings.draft_n")
        acc = tm.get("draft_n_accepted", 0)
        g.accepted = count_field(acc, who, "/v1/completions", "timings.draft_n_accepted")
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


async def within(aw: Awaitable[T], limit: float | None) -> T:
    """``aw``'s result, or TimeoutError once ``limit`` seconds have passed (None: no limit).

    Not ``asyncio.wait_for``: on Python 3.11 it returns the result when a cancellation arrives
    just as the awaited call finishes, so the cancellation is lost (CPython issue gh-86296) and
    a worker that was told to stop runs on; in the audit's pipeline such a generator then
    waited forever to hand its job to scorers that were gone. ``asyncio.timeout`` tells its
    own cancellation from one sent from outside."""
    if limit is None:
        return await aw
    async with asyncio.timeout(limit):
        return await aw


async def _request(client, method: str, url: str, path: str, who: str,
                   body: Any = None) -> Any:  # fmt: skip  # noqa: ANN001
    """One non-streamed request, bounded as a whole by the client's read timeout (the run's
    --timeout-s): httpx bounds each read only, so a server that trickles a byte at a time
    would otherwise hold the audit forever."""
    limit = client.timeout.read
    send = client.request(method, url.rstrip("/") + path, json=body)
    try:
        return await within(send, limit)
    except TimeoutError:
        raise SpecsimError(
            f"{who} at {url} did not finish answering {path} within {limit:g} s (--timeout-s)"
        ) from None


async def _law_at(client, url: str, body: dict[str, Any],
                  who: str = "the reference") -> tuple[np.ndarray, np.ndarray]:  # fmt: skip  # noqa: ANN001
    """One position's report, parsed (``parse_top``). llama-server withholds the probabilities
    when the token it drew there is an incomplete UTF-8 piece; the law does not depend on the
    draw, so draw again."""
    name = f"{who} at {url}"
    for attempt in range(RETRIES):
        r = await _request(client, "POST", url, "/completion", who,
                           {**body, "seed": body["seed"] + 65_537 * attempt})  # fmt: skip
        if r.status_code != 200:
            raise SpecsimError(f"{name} answered HTTP {r.status_code}: {r.text[:200]}")
        probs = _json(r, name).get("completion_probabilities")
        if probs is None or probs == []:
            continue
        if not isinstance(probs, list):
            raise _bad(name, "/completion", f"completion_probabilities {str(probs)[:40]!r} "
                       "(not a list)")  # fmt: skip
        return parse_top(probs[0], name, "/completion")
    raise SpecsimError(
        f"{name} reported no probabilities in {RETRIES} draws at one position (it "
        "withholds them after an incomplete UTF-8 token)"
    )


RETRIES = 32


async def score(client, url: str, prompt: list[int], tokens: list[int], sampling: Sampling,
                slot: int, top_n: int) -> list[Scored]:  # fmt: skip  # noqa: ANN001
    """The reference's law at every position of ``tokens`` after ``prompt``.

    A report of fewer than ``top_n`` tokens is the whole support (the sampler chain cut the
    rest), so its mass must be 1: a short report that is not is refused, since counting it
    as complete would score a truncated law and call the audited server lossy."""
    out = []
    for t in range(len(tokens)):
        body = {
            "prompt": prompt + tokens[:t], "n_predict": 1, "n_probs": top_n, "seed": t,
            "post_sampling_probs": True, "cache_prompt": True, "id_slot": slot,
            **sampling.body(),
        }  # fmt: skip
        ids, probs = await _law_at(client, url, body)
        mass = float(probs.sum())
        if len(ids) > top_n:
            raise _bad(f"the reference at {url}", "/completion",
                       f"{len(ids)} top_probs where n_probs was {top_n}")  # fmt: skip
        if len(ids) < top_n and mass < 1.0 - SHORT_SLACK:
            raise _bad(f"the reference at {url}", "/completion",
                       f"{len(ids)} of {top_n} top_probs summing to {mass:.3g} (a short report "
                       "is the whole support: its mass must be 1)")  # fmt: skip
        complete = len(ids) < top_n or mass >= 1.0 - 1e-6
        out.append(Scored(ids, probs, complete))
    return out


SHORT_SLACK = 1e-3  # a whole support's float32 probabilities sum to 1 within this


async def tokenize(client, url: str, text: str) -> list[int]:  # noqa: ANN001
    """Token ids of a prompt (special tokens parsed, BOS as the model adds it)."""
    body = {"content": text, "add_special": True, "parse_special": True}
    name = f"the reference at {url}"
    r = await _request(client, "POST", url, "/tokenize", "the reference", body)
    if r.status_code != 200:
        raise SpecsimError(f"the reference's /tokenize answered HTTP {r.status_code}")
    tokens = _json(r, name).get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise _bad(name, "/tokenize", f"tokens {str(tokens)[:60]!r} (no token list)")
    return [token_id(t, name, "/tokenize", "tokens") for t in tokens]


async def slots(client, url: str) -> int:  # noqa: ANN001
    """How many parallel slots the reference has (1 when /props does not say)."""
    r = await _request(client, "GET", url, "/props", "the reference")
    try:
        n = r.json().get("total_slots", 1)
    except Exception:  # noqa: BLE001 - a server without /props: assume one slot
        return 1
    return max(1, min(n, 1024)) if isinstance(n, int) and not isinstance(n, bool) else 1


async def chat_prompt(client, url: str, message: str) -> str:  # noqa: ANN001
    """The prompt the reference's chat template makes of one user message."""
    r = await _request(client, "POST", url, "/apply-template", "the reference",
                       {"messages": [{"role": "user", "content": message}]})  # fmt: skip
    if r.status_code != 200:
        return message  # no chat template: the message is the prompt
    return str(_json(r, f"the reference at {url}").get("prompt", message))


async def banned_tokens(client, cfg: Any, ref: str) -> tuple[int, ...]:  # noqa: ANN001
    """The tokens banned on both servers (``vocab``), from the reference's GGUF."""
    if not cfg.ban_fragments:
        return ()
    from pathlib import Path

    from specsim.serve.audit.vocab import fragment_tokens

    path = cfg.reference_model
    if path is None:
        r = await _request(client, "GET", ref, "/props", "the reference")
        path = (_json(r, f"the reference at {ref}") if r.status_code == 200 else {}).get(
            "model_path"
        )
        if path is not None and not isinstance(path, str):
            raise _bad(f"the reference at {ref}", "/props", "a model_path that is not a string")
    if not path:
        raise SpecsimError(
            f"the reference at {ref} does not say its model file (/props model_path): pass "
            "--reference-model GGUF, or --no-ban-fragments if its stream keeps every token"
        )
    return fragment_tokens(str(Path(path).expanduser()))

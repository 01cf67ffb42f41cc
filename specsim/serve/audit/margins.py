"""The reference's greedy top at a prefix: what the T = 0 audit asks the reference.

Why apart from :mod:`specsim.serve.audit.client` (the requests both audits send): only the
greedy audit reads a margin (top-1 minus top-2) or asks for the reference's own greedy tokens,
and its triage rests on how these two are asked (the sampler chain's probabilities at T = 1,
bans applied, from the cached decode path or the prompt path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.serve.audit.client import Sampling, _bad, _json, _law_at, _request, token_id


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
                    cache: bool = True, who: str = "the reference") -> Margin:  # fmt: skip  # noqa: ANN001
    """The law's top at ``prefix`` on ``url``, as its greedy sampler ranks it (bans applied).

    Asked at temperature 1 with no truncation and ``post_sampling_probs``: the sampler chain's
    probabilities are then the softmax of the biased logits, so log-probability differences are
    logit differences, and a banned token never ranks. ``cache=False`` recomputes the whole
    prefix as one batch (the prompt path) instead of one decode after the cached prefix.
    Nothing truncates that law, so a report of fewer than two tokens cannot be a true one, and
    the triage (a margin, the gap to a token past the top) cannot rest on it: refused."""
    body: dict[str, Any] = {
        "prompt": prefix, "n_predict": 1, "n_probs": MARGIN_TOP, "seed": 0,
        "post_sampling_probs": True, "cache_prompt": cache,
        **Sampling(temperature=1.0, banned=banned).body(),
    }  # fmt: skip
    if slot is not None:
        body["id_slot"] = slot
    ids, probs = await _law_at(client, url, body, who)
    if ids.size < 2:
        raise _bad(f"{who} at {url}", "/completion",
                   f"{ids.size} top_probs where n_probs was {MARGIN_TOP} (the greedy triage "
                   "reads a margin: it needs at least 2)")  # fmt: skip
    return Margin(ids, np.log(np.maximum(probs, 1e-300)))


async def greedy_tokens(client, url: str, prefix: list[int], n: int, banned: tuple[int, ...],
                        slot: int | None) -> list[int]:  # fmt: skip  # noqa: ANN001
    """``n`` greedy tokens after ``prefix`` on ``url`` (speculation off there: the reference's
    argmax at every prefix, by its decode path). Asked with ignore_eos, so fewer than ``n``
    is refused: positions past a short answer would otherwise be compared with nothing."""
    body: dict[str, Any] = {
        "prompt": prefix, "n_predict": n, "seed": 0, "return_tokens": True,
        "cache_prompt": True, **Sampling(temperature=0.0, banned=banned).body(),
    }  # fmt: skip
    if slot is not None:
        body["id_slot"] = slot
    name = f"the reference at {url}"
    r = await _request(client, "POST", url, "/completion", "the reference", body)
    if r.status_code != 200:
        raise SpecsimError(f"{name} answered HTTP {r.status_code}: {r.text[:200]}")
    toks = _json(r, name).get("tokens")
    if not isinstance(toks, list) or len(toks) < n:
        raise _bad(name, "/completion", f"tokens {str(toks)[:60]!r} where {n} were asked for "
                   "with ignore_eos")  # fmt: skip
    return [token_id(t, name, "/completion", "tokens") for t in toks[:n]]

"""What a server audit is run with (``AuditConfig``: the ``check-lossless --server`` flags and the
saved config), its default contexts, and its state file (what makes a run resumable).

Kept apart from the runner so that ``specsim --help`` imports neither numpy nor httpx.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError
from specsim.options import option

# Contexts whose continuations are mostly low-entropy and repeat earlier text: n-gram drafters
# only draft when the text repeats, and a rank-cell test has the most power where the law is
# peaked. A few open questions keep the higher-entropy strata populated.
CONTEXTS = (
    "Repeat this list exactly three times, one item per line: apple, banana, cherry, grape, "
    "lemon, mango, orange, peach.",
    "Copy the following sentence five times: The quick brown fox jumps over the lazy dog.",
    "Count from 1 to 60, separated by commas.",
    "Write the English alphabet in capital letters separated by spaces, three times.",
    "List the days of the week, then the same list again in reverse order, then forwards again.",
    "List the twelve months of the year, one per line, twice.",
    "Rewrite this Python function with a docstring and type hints, then write it again "
    "unchanged:\ndef add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b",
    'Here is a JSON object: {"name": "Ada", "age": 36, "city": "London"}. Write it '
    "three times, changing only the age each time.",
    "Write a multiplication table for 7, from 7 x 1 to 7 x 12.",
    "Repeat the word 'hello' twenty times, separated by spaces.",
    "Write a Python for loop that prints the numbers 1 to 10, then the same loop for 11 to 20, "
    "then for 21 to 30.",
    "Copy this text exactly: Roses are red, violets are blue, sugar is sweet, and so are you. "
    "Then copy it again.",
    "Write the first ten prime numbers, then their squares, then their cubes.",
    "Convert these to uppercase, one per line: cat, dog, bird, fish, horse, sheep, goat, cow.",
    "Write an HTML list with eight items: item 1, item 2, up to item 8.",
    "Give me a shopping list with ten items, then the same list sorted alphabetically.",
    "What is the capital of France? Answer in one sentence, then repeat the answer.",
    "Explain in two sentences what a prime number is.",
    "Write a short poem about the sea.",
    "Tell me a fun fact about cats.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "Write a SQL query that selects all columns from a table named users, then one that "
    "selects only the name column, then one that counts the rows.",
    "Spell the word 'banana' letter by letter, then 'apple', then 'cherry'.",
    "Write the numbers from 100 down to 70, separated by spaces.",
)


@dataclass(frozen=True)
class AuditConfig:
    """How a running server is audited (the ``check-lossless --server`` flags)."""

    server: str | None = option(None, "URL of the server to audit (speculation on)", type=str)
    reference: str | None = option(
        None, "URL of a llama-server running the same model with speculation off", type=str
    )
    reference_model: str | None = option(
        None, "GGUF model: start the reference llama-server (speculation off) here", type=str
    )
    reference_args: str = option(
        "-c 8192 --no-warmup", "extra llama-server flags of a started reference (-np is added)"
    )
    api: str = option("llama", "how to generate: llama (/completion) or completions (/v1)",
                      choices=("llama", "completions"))  # fmt: skip
    temperature: float = option(1.0, "sampling temperature (both servers)")
    top_k: int = option(0, "top-k sampling, 0 = off (both servers)")
    top_p: float = option(1.0, "top-p sampling, 1 = off (both servers)")
    min_p: float = option(0.0, "min-p sampling, 0 = off (both servers)")
    ignore_eos: bool = option(True, "generate exactly --n-predict tokens per request")
    ban_fragments: bool = option(
        True, "ban, on both servers, tokens that are not UTF-8 alone (llama-server's stream "
        "loses them; needs the reference's GGUF: --reference-model or its /props model_path)"
    )  # fmt: skip
    n_predict: int = option(128, "tokens generated per request")
    tokens: int = option(32768, "budget: positions tested in all (resumed runs included)")
    minutes: float | None = option(None, "budget: minutes of this run (stops starting requests)",
                                   type=float)  # fmt: skip
    concurrency: int = option(2, "requests in flight (the reference needs as many slots)")
    n_probs: int = option(40, "probabilities the reference reports per position")
    prompts: str | None = option(
        None,
        "prompt set (bundled name or JSONL), default: the audit's own low-entropy contexts",
        type=str,
    )
    state: str | None = option(None, "state file: resume the run it holds and save to it",
                               type=str)  # fmt: skip
    label: str = option("", "name of the configuration, for the verdict and reports")
    near_tie: float | None = option(
        None, "T = 0: margin (nats) below which a divergence is numerics, default: measured "
        "(twice the largest difference of the reference's own two paths)", type=float,
    )  # fmt: skip
    null_positions: int = option(128, "T = 0: positions the numerics null reads both paths at")
    timeout_s: float = option(
        600.0, "seconds one request may take, and one read within it may wait (a server "
        "that stalls is an error naming it, not a wait)"
    )  # fmt: skip
    seed: int = option(0, "seed of the requests and of the PIT", cli=False)
    # this audit's share of a family-wise false-alarm rate (a sweep of m audits: 1e-6 / m)
    alpha_run: float = option(1e-6, "family-wise false-alarm rate of this audit", cli=False)

    def __post_init__(self) -> None:
        if self.server is not None and not self.server.startswith(("http://", "https://")):
            raise SpecsimError(f"--server {self.server!r} must start with http:// or https://")
        if self.reference and self.reference_model:
            raise SpecsimError("give --reference URL or --reference-model GGUF, not both")
        if self.reference and not self.reference.startswith(("http://", "https://")):
            raise SpecsimError(f"--reference {self.reference!r} must start with http://")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SpecsimError(
                f"--temperature {self.temperature}: use 0 (greedy identity, token for token) "
                "or T > 0 (the output law)"
            )
        if self.near_tie is not None and not (math.isfinite(self.near_tie) and self.near_tie > 0):
            raise SpecsimError(f"--near-tie {self.near_tie}: a margin in nats > 0, or leave it out")
        if self.null_positions < 16:
            raise SpecsimError(f"--null-positions {self.null_positions}: use >= 16")
        if not (0 < self.top_p <= 1) or not (0 <= self.min_p < 1) or self.top_k < 0:
            raise SpecsimError("--top-p must be in (0, 1], --min-p in [0, 1), --top-k >= 0")
        first = 1024 if self.temperature > 0 else self.n_predict  # T > 0: the first look
        if self.n_predict < 2 or self.tokens < first or self.concurrency < 1:
            raise SpecsimError(
                f"--n-predict must be >= 2, --tokens >= {first} (T > 0: the first look; T = 0: "
                "one request), --concurrency >= 1"
            )
        if self.top_k > self.n_probs:
            raise SpecsimError(f"--n-probs must be >= --top-k ({self.top_k}) to see the support")
        if not (math.isfinite(self.timeout_s) and 0 < self.timeout_s <= 86_400):
            raise SpecsimError(f"--timeout-s must be seconds in (0, 86,400], got {self.timeout_s}")
        if self.minutes is not None and not self.minutes > 0:
            raise SpecsimError(f"--minutes must be positive, got {self.minutes}")

    def fingerprint(self) -> dict[str, Any]:
        """What must not change between a run and its resumption (URLs may: ports change)."""
        keys = ("api", "temperature", "top_k", "top_p", "min_p", "ignore_eos", "n_predict",
                "n_probs", "prompts", "seed", "ban_fragments", "alpha_run")  # fmt: skip
        return {k: getattr(self, k) for k in keys}


def contexts_of(cfg: AuditConfig) -> list[str]:
    """The user messages the audit prompts with (a chat template is applied by the reference)."""
    if cfg.prompts is None:
        return list(CONTEXTS)
    from specsim.prompts import load_many

    return [p.text for p in load_many([cfg.prompts])]


STATE_VERSION = 2  # 2: the top-1 check (its variance sums; alpha split three ways)


def load_state(path: str | None, cfg: AuditConfig) -> dict[str, Any] | None:
    """The saved run to resume (None: start fresh); refuses a state of another configuration."""
    if path is None or not Path(path).exists():
        return None
    try:
        st = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SpecsimError(f"--state {path}: not a readable audit state ({exc})") from None
    if st.get("version") != STATE_VERSION or st.get("fingerprint") != cfg.fingerprint():
        raise SpecsimError(
            f"--state {path} holds an audit with other settings "
            f"({st.get('fingerprint')}); use a new state file or the same settings"
        )
    return st


def save_state(path: str | None, st: dict[str, Any]) -> None:
    """Write atomically: a run killed while saving keeps its previous state."""
    if path is None:
        return
    tmp = f"{path}.tmp{os.getpid()}"
    Path(tmp).write_text(json.dumps(st, indent=1, sort_keys=True))
    os.replace(tmp, path)


def config_dict(cfg: AuditConfig) -> dict[str, Any]:
    return asdict(cfg)

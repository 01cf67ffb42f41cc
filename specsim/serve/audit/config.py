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


MAX_CONCURRENCY = 256  # requests in flight: far above any reference's slots, and bounded
MAX_REFERENCE_CONCURRENCY = 64  # scoring requests in flight: far above a useful batch of decodes
MIN_N_PROBS = 11  # the rank cells reach rank 11 (stats.RANK_EDGES): fewer cannot fill them
MAX_TEMPERATURE = 100.0  # as bench: a larger T is a uniform law, nothing left to audit
# --near-tie's ceiling (nats): the reference's two paths differ by ~0.3 nats on a quantized CPU
# target (tau = 2x that); a gap of 1 nat is a top-1 e = 2.7 times as likely as the emitted
# token, which no rounding flips. Wider would let a lossy server's divergences pass as numerics.
MAX_NEAR_TIE = 1.0


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
    concurrency: int = option(
        2, "requests in flight on the audited server (T = 0: the reference needs as many slots)"
    )
    reference_concurrency: int = option(
        0, "T > 0: scoring requests in flight on the reference, each on its own slot (0: one "
        "per slot it has; a reference started here gets max(this, --concurrency) slots)"
    )  # fmt: skip
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
    first_byte_timeout_s: float = option(
        30.0, "seconds each server may take to answer a first request (GET /health, before "
        "the audit): one that accepts connections but never answers is an error naming it"
    )  # fmt: skip
    seed: int = option(0, "seed of the requests and of the PIT", cli=False)
    # this audit's share of a family-wise false-alarm rate (a sweep of m audits: 1e-6 / m)
    alpha_run: float = option(1e-6, "family-wise false-alarm rate of this audit", cli=False)

    def __post_init__(self) -> None:
        from specsim.serve.bench_config import check_url

        for flag, url in (("--server", self.server), ("--reference", self.reference)):
            if url is not None:
                check_url(url, flag)  # the one URL rule (bench's --url too), before any parse
        if not 0 <= self.seed < 2**32:
            raise SpecsimError(f"--seed {self.seed}: use an integer in 0..{2**32 - 1}")
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise SpecsimError(
                f"--concurrency {self.concurrency}: use 1..{MAX_CONCURRENCY} (requests in "
                "flight; the reference needs as many slots)"
            )
        if not 0 <= self.reference_concurrency <= MAX_REFERENCE_CONCURRENCY:
            raise SpecsimError(
                f"--reference-concurrency {self.reference_concurrency}: use "
                f"0..{MAX_REFERENCE_CONCURRENCY} (0: one scoring request per reference slot)"
            )
        if self.n_probs < MIN_N_PROBS:
            raise SpecsimError(
                f"--n-probs {self.n_probs}: use >= {MIN_N_PROBS} (the rank check's cells reach "
                "rank 11; fewer reported tokens leave the checks without power)"
            )
        if self.temperature > MAX_TEMPERATURE:
            raise SpecsimError(
                f"--temperature {self.temperature}: use a number in [0, {MAX_TEMPERATURE:g}]"
            )
        if self.reference and self.reference_model:
            raise SpecsimError("give --reference URL or --reference-model GGUF, not both")
        if self.server and self.reference and _same_server(self.server, self.reference):
            raise SpecsimError(
                f"--server and --reference name one server ({self.server}): an audit against "
                "itself finds nothing; give a reference with speculation off"
            )
        if self.state is not None and self.temperature == 0:
            raise SpecsimError(
                "--state resumes the T > 0 audit only (the greedy audit at --temperature 0 "
                "saves no state); drop --state, or audit at T > 0"
            )
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SpecsimError(
                f"--temperature {self.temperature}: use 0 (greedy identity, token for token) "
                "or T > 0 (the output law)"
            )
        if self.near_tie is not None and not 0 < self.near_tie <= MAX_NEAR_TIE:  # nan too
            raise SpecsimError(
                f"--near-tie {self.near_tie}: give a margin in nats in (0, {MAX_NEAR_TIE:g}] (a "
                "wider one would call confident divergences numerics), or leave it out to "
                "measure it"
            )
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
        for flag, value in (("--timeout-s", self.timeout_s),
                            ("--first-byte-timeout-s", self.first_byte_timeout_s)):  # fmt: skip
            if not (math.isfinite(value) and 0 < value <= 86_400):
                raise SpecsimError(f"{flag} must be seconds in (0, 86,400], got {value}")
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


def _same_server(a: str, b: str) -> bool:
    """Whether two URLs reach one server: scheme, host (localhost = 127.0.0.1 = [::1]) and port
    alike, whatever the path or a trailing slash."""
    from urllib.parse import urlsplit

    def key(url: str) -> tuple[str, str, int | None]:
        u = urlsplit(url.strip())
        host = (u.hostname or "").lower()
        host = "127.0.0.1" if host in ("localhost", "::1", "127.0.0.1") else host
        try:
            port = u.port or {"http": 80, "https": 443}.get(u.scheme.lower())
        except ValueError:  # a port out of range: check_url names it later
            port = None
        return u.scheme.lower(), host, port

    return key(a) == key(b)


MAX_STATE_BYTES = 64 << 20  # a state file is kilobytes; anything far larger is not one


def check_state_path(path: str) -> None:
    """Refuse, before any request, a --state the run could not read or could not save to: a
    FIFO or device (it would block or never end), a directory, or a folder that does not
    exist (the run would fail at its first save, its results lost)."""
    p = Path(path)
    if p.exists() and not p.is_file():
        raise SpecsimError(
            f"--state {path} is not a regular file (a FIFO, device or directory); give a "
            "JSON file path"
        )
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise SpecsimError(
            f"--state {path}: the folder {parent} does not exist or is not writable; create "
            "it or give another path"
        )


def load_state(path: str | None, cfg: AuditConfig) -> dict[str, Any] | None:
    """The saved run to resume (None: start fresh); refuses a state of another configuration
    and one whose contents are not what a run saves (``validate_state``)."""
    if path is None:
        return None
    check_state_path(path)
    if not Path(path).exists():
        return None
    try:
        if Path(path).stat().st_size > MAX_STATE_BYTES:
            raise ValueError(f"larger than {MAX_STATE_BYTES >> 20} MiB")
        st = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SpecsimError(f"--state {path}: not a readable audit state ({exc})") from None
    if not isinstance(st, dict):
        raise SpecsimError(f"--state {path}: not an audit state (not a JSON object); "
                           "use a new state file")  # fmt: skip
    if st.get("version") != STATE_VERSION or st.get("fingerprint") != cfg.fingerprint():
        raise SpecsimError(
            f"--state {path} holds an audit with other settings "
            f"({st.get('fingerprint')}); use a new state file or the same settings"
        )
    bad = validate_state(st)
    if bad:
        raise SpecsimError(
            f"--state {path}: not an audit state this version wrote ({bad}); use a new state file"
        )
    return st


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate_state(st: dict[str, Any]) -> str:
    """What is wrong with a state's contents ('' when nothing): the types and shapes ``_Run``
    and the checks read, so a hand-edited or corrupted file is one line, not a crash."""
    import numpy as np

    from specsim.serve.audit import stats

    c = st.get("counts")
    if not isinstance(c, dict):
        return "counts is not an object"
    cells = (stats.N_STRATA, stats.N_CELLS)
    shapes = {"observed": cells, "expected": cells, "pit_bins": (stats.PIT_BINS,),
              "top1_var": (stats.N_STRATA,)}  # fmt: skip
    for key, shape in shapes.items():
        try:
            a = np.asarray(c.get(key), dtype=np.float64)
        except (TypeError, ValueError):
            return f"counts.{key} is not numbers"
        if a.shape != shape or not np.all(np.isfinite(a)) or np.any(a < 0):
            return f"counts.{key} is not {shape} finite counts"
    for key in ("positions", "outside_support"):
        if not _count(c.get(key)):
            return f"counts.{key} is not a count"
    for key in ("jobs_done", "drafted", "accepted", "generated"):
        if not _count(st.get(key, 0)):
            return f"{key} is not a count"
    if not (_real(st.get("minutes", 0.0)) and st.get("minutes", 0.0) >= 0):
        return "minutes is not a number of minutes"
    roles = st.get("roles", [0] * len(stats.ROLES))
    if not (isinstance(roles, list) and len(roles) == len(stats.ROLES)
            and all(_count(r) for r in roles)):  # fmt: skip
        return f"roles is not {len(stats.ROLES)} counts"
    hist = st.get("history", [])
    keys = ("alpha", "rank_p", "pit_p", "rank_floor", "pit_floor")  # NaN or inf may be real
    number = (int, float)
    if not isinstance(hist, list) or not all(
        isinstance(h, dict) and _count(h.get("n")) and _count(h.get("k"))
        and all(isinstance(h.get(k), number) and not isinstance(h.get(k), bool) for k in keys)
        for h in hist
    ):  # fmt: skip
        return f"history is not a list of looks with n, k, {', '.join(keys)}"
    if not isinstance(st.get("outside", []), list):
        return "outside is not a list"
    if not isinstance(st.get("spec_types", ""), str) or not isinstance(st.get("evidence", ""), str):
        return "spec_types or evidence is not text"
    return ""


def save_state(path: str | None, st: dict[str, Any]) -> None:
    """Write atomically: a run killed while saving keeps its previous state."""
    if path is None:
        return
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        Path(tmp).write_text(json.dumps(st, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as exc:
        raise SpecsimError(f"--state {path}: cannot save the audit state ({exc})") from None


def config_dict(cfg: AuditConfig) -> dict[str, Any]:
    return asdict(cfg)

"""What ``tune`` searches and how it scores: :class:`TuneConfig`, which feeds both the CLI
(``specsim tune``'s flags) and ``--json``'s ``config``, and the defaults behind it. The search
itself: :mod:`specsim.analysis.tune.run`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from specsim.errors import SpecsimError
from specsim.options import option as _f

ENGINES = ("vllm", "trtllm", "sglang", "llama")
OBJECTIVES = ("throughput", "goodput", "tpot", "ttft")
QUANTILES = (50, 90, 95, 99)
DEFAULT_GAINS = (0.0, 0.02, 0.04, 0.08)
DEFAULT_P_MINS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7)
# Requests per replay when --requests is not given. A replay costs about one policy call per
# engine step, and a closed loop at C takes requests x output / (C x tau) steps: a multiple of
# C keeps that flat across loads; the floor keeps a P90 over at least 100 requests at low
# concurrency. 8C, not the 3C replay accepts: warm-up and drain take C each, so the steady
# window holds ~6C. At 4C (a 2C window) the paired intervals at C = 64 on synthetic-chat were
# +-5-10% and SGLang's recommendation moved with --seed; at 8C they are +-2-4% and it held.
MIN_REQUESTS, REQUESTS_PER_CONCURRENCY, OPEN_LOOP_REQUESTS = 100, 8, 200
# Seeds per setting: 5 gives a paired t-interval (4 degrees of freedom) that separates the
# settings a seed change reorders from those it does not, at 5x one replay's cost.
DEFAULT_SEEDS, MAX_SEEDS = 5, 100


@dataclass(frozen=True)
class TuneConfig:
    """What ``tune`` searches and how it scores; also the ``config`` of ``--json``."""

    engine: str = _f("vllm", "the engine whose knobs are searched", choices=ENGINES)
    # -- the load: one of these (tuples: one search per load)
    concurrency: tuple[int, ...] | None = _f(None, "closed-loop loads", cli=False)
    rate: tuple[float, ...] | None = _f(None, "open-loop loads, requests/s", cli=False)
    arrivals: str | None = _f(None, "arrival times from a CSV or azure-conv/azure-code", cli=False)
    cv: float | None = _f(None, "with rate: Gamma gaps of this CV", cli=False)
    requests: int | None = _f(
        None,
        f"requests per replay (default: closed loop max({MIN_REQUESTS}, "
        f"{REQUESTS_PER_CONCURRENCY}C), open loop {OPEN_LOOP_REQUESTS})",
        type=int,
    )
    profile: str = _f("llama-3-8b-h100", "cost profile", cli=False)
    seed: int = _f(0, "random seed, the same for every candidate", cli=False)
    seeds: int = _f(
        DEFAULT_SEEDS,
        "replays per setting, seeds --seed x N .. --seed x N + N-1, the same for every setting "
        "(common random numbers): each number is their mean, each setting's difference to the "
        "best gets a 95% interval, and settings within noise of the best tie",
        type=int,
    )
    # -- the SLA and the objective
    slo: str | None = _f(
        None, "SLA latencies in ms, e.g. ttft=200,tpot=50 (e2e= too): each one's "
        "--sla-quantile percentile must be at most its bound", metavar="ttft=MS,tpot=MS",
    )  # fmt: skip
    sla_tps: float | None = _f(None, "SLA: mean per-user speed at least this, tok/s", type=float)
    sla_quantile: int = _f(90, "the percentile the --slo bounds hold at", choices=QUANTILES)
    objective: str | None = _f(
        None,
        "what the best setting maximises among those meeting the SLA: throughput (tok/s), "
        "goodput (req/s meeting --slo), tpot or ttft (lowest percentile); default: throughput "
        "for --concurrency, tpot for --rate/--arrivals",
        choices=OBJECTIVES,
    )
    # -- the grid
    draft_lens: tuple[int, ...] | None = _f(
        None, "draft lengths tried (k, max_draft_len, G, N; default: 1..the block)",
        type=int, sequence=True,
    )  # fmt: skip
    max_batched_tokens: tuple[int, ...] | None = _f(
        None, "the engine's token limit a step to search (vLLM --max-num-batched-tokens, SGLang "
        "--chunked-prefill-size, TensorRT-LLM max_num_tokens, llama.cpp -b): every setting at "
        "each; default: the profile's, and where nothing meets the SLA the least-bad setting "
        "and the default at 256..16384",
        type=int, sequence=True,
    )  # fmt: skip
    gains: tuple[float, ...] = _f(DEFAULT_GAINS, "trtllm: confidence_min_predicted_gain grid")
    p_mins: tuple[float, ...] = _f(DEFAULT_P_MINS, "llama: --spec-draft-p-min grid")
    # -- what the printed config names
    drafter: str | None = _f(
        None, "the drafter path the printed config names (default: a placeholder per engine)"
    )
    workers: int = _f(1, "local processes replaying candidates (1: this process)")
    # -- what the profile's assumptions move
    spread: tuple[str, ...] | None = _f(
        None, "profiles to replay the recommended setting and no speculation on (the same "
        "seeds), e.g. profile build's --assume against and favour builds: each load's gain "
        "over no speculation is printed with its span over them", type=str, sequence=True,
        metavar="P1,P2,...",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise SpecsimError(
                f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}"
            )
        loads = [n for n in ("concurrency", "rate", "arrivals") if getattr(self, n) is not None]
        if len(loads) != 1:
            raise SpecsimError(
                "give one load: --concurrency C[,C...], --rate R[,R...] or --arrivals CSV"
                + (f", not {' and '.join(loads)}" if loads else "")
            )
        if self.objective is not None and self.objective not in OBJECTIVES:
            raise SpecsimError(f"--objective must be one of {', '.join(OBJECTIVES)}")
        if self.objective == "goodput" and not self.slo:
            raise SpecsimError("--objective goodput counts requests meeting --slo: give --slo")
        if self.sla_quantile not in QUANTILES:
            raise SpecsimError(f"--sla-quantile must be one of {QUANTILES}")
        mbt = self.max_batched_tokens
        if mbt is not None and (not mbt or not all(1 <= int(n) <= 1_000_000 for n in mbt)):
            raise SpecsimError(
                "--max-batched-tokens takes token limits 1..1,000,000, e.g. 512,2048,8192"
            )
        if self.draft_lens is not None and (not self.draft_lens or min(self.draft_lens) < 1):
            raise SpecsimError("--draft-lens takes draft lengths of at least 1, e.g. 1,2,4,7")
        from specsim.policies.engines import MAX_MIN_GAIN, valid_min_gain  # numpy: not at --help

        if not all(valid_min_gain(g) for g in self.gains):
            raise SpecsimError(
                f"--gains takes minimum predicted gains in [0, {MAX_MIN_GAIN:g}] (a share: 0.04 "
                "is 4%), e.g. 0,0.02,0.04,0.08"
            )
        if any(not (0.0 <= p <= 1.0) for p in self.p_mins):
            raise SpecsimError("--p-mins takes confidences in [0, 1], e.g. 0,0.1,0.3,0.5")
        if isinstance(self.workers, bool) or int(self.workers) != self.workers or self.workers < 1:
            raise SpecsimError(f"--workers must be a whole number >= 1, got {self.workers}")
        n = self.seeds
        if isinstance(n, bool) or int(n) != n or not 1 <= n <= MAX_SEEDS:
            raise SpecsimError(f"--seeds must be a whole number in [1, {MAX_SEEDS}], got {n}")
        s = self.seed
        if isinstance(s, bool) or not hasattr(s, "__index__") or not 0 <= int(s) < 2**63:
            raise SpecsimError(f"--seed must be a whole number in [0, 2^63), got {s!r}")
        s = int(s)
        if s * n + n > 2**63:
            raise SpecsimError(
                f"--seed {s} with --seeds {n} replays seeds up to {s * n + n - 1}, past 2^63: "
                "use a smaller --seed"
            )

    @property
    def seed_list(self) -> tuple[int, ...]:
        """The seeds every setting is replayed with: ``seed x seeds`` + 0 .. seeds-1, so two
        ``--seed`` values share no seed and ``--seeds 1`` is ``--seed`` itself."""
        return tuple(int(self.seed) * int(self.seeds) + i for i in range(int(self.seeds)))

    @property
    def load_kind(self) -> str:
        return next(n for n in ("concurrency", "rate", "arrivals") if getattr(self, n) is not None)

    @property
    def loads(self) -> tuple[Any, ...]:
        """The loads searched, one search each."""
        v = getattr(self, self.load_kind)
        return (v,) if isinstance(v, str) else tuple(v)

    @property
    def closed(self) -> bool:
        return self.load_kind == "concurrency"

    def objective_name(self) -> str:
        return self.objective or ("throughput" if self.closed else "tpot")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

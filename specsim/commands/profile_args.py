"""The value rules of ``specsim profile``'s flags, as argparse types: each a shared rule of
:mod:`specsim.sim.cost.profile_csv` (one line when bad), used by every profile action; and the
deployment ``profile build`` and ``profile fit`` read from their shared flags."""

from __future__ import annotations

import argparse

from specsim.errors import SpecsimError


def _arg(rule, *args):  # type: ignore[no-untyped-def]
    """An argparse type from a shared value rule (specsim.sim.cost.profile_csv): one line if bad."""

    def parse(text: str):  # type: ignore[no-untyped-def]
        try:
            return rule(text, "", *args)
        except SpecsimError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(": ")) from None

    return parse


def _positive_int(text: str) -> int:
    from specsim.sim.cost.profile_csv import count

    return _arg(count, 1, 10**13)(text)


def _engine_limit(text: str) -> int:
    """An engine limit a user sets (capture, max_num_seqs, max_num_batched_tokens): 1..10^6."""
    from specsim.sim.cost.profile_csv import count

    return _arg(count, 1, 10**6)(text)


def _capture(text: str) -> int:
    from specsim.sim.cost.profile_csv import count

    return _arg(count)(text)


def _context(text: str) -> float:
    from specsim.sim.cost.profile_csv import contexts

    return float(_arg(contexts)(text)[0])


def _tokens_per_request(text: str) -> float:
    """Verified tokens per request in a timed step: a finite number from 1 (a decode) to 1024."""
    from specsim.sim.cost.profile_csv import numbers

    value = float(_arg(numbers)(text)[0])
    if not 1.0 <= value <= 1024.0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number from 1 (a decode) to 1024")
    return value


def _sizes(text: str) -> list[int]:
    from specsim.sim.cost.profile_csv import whole

    out = [int(x) for x in _arg(whole)([x for x in text.split(",") if x.strip()])]
    if len(out) < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least 2 comma-separated sizes")
    return out


def _degree(text: str) -> int:
    """``--tp``/``--ep``/``--dp``: the build's own rule (``build.degree``); argparse names
    the flag."""
    from specsim.sim.cost.build import degree

    return _arg(degree)(text)


def _deployment(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from specsim.sim.cost.build import Deployment
    from specsim.sim.cost.models import model_arch

    return Deployment(
        model=model_arch(args.model), gpu=args.gpu, tp=args.tp, ep=args.ep, dp=args.dp,
        weight_dtype=args.weight_dtype or "", kv_dtype=args.kv_dtype, engine=args.engine,
        drafter=args.drafter, point=args.assume, capture=args.capture,
        max_running=args.max_num_seqs, max_batched_tokens=args.max_num_batched_tokens,
        graph_mode=args.graph_mode,
    )  # fmt: skip

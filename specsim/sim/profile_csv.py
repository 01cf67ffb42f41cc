"""Profile CSV files: the format a measured or generated cost profile is saved in.

Optional header lines ``# key: value`` hold the scalar costs (``draft_base_ms``,
``draft_per_request_ms``, ``draft_per_token_ms``, ``sched_base_us``, ``sched_us_per_request``,
``max_running``, ``kv_tokens``, ``prefill_budget``, and the measured engine terms
``step_overhead_ms``, ``verify_per_request_ms``, ``draft_per_context_us``,
``draft_context_window``, ``prefill_token_ms``, ``interpolation`` (``linear`` or ``step``) and
``capture_max_tokens``: specsim.sim.cost); anything else is kept as metadata. Then a table
with columns ``batch_tokens,step_ms`` and optionally ``context_tokens`` (a full grid: every
batch size at every context). docs/simulator.md has the details. Reading
validates everything (one-line errors); writing is atomic and refuses to overwrite.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost import COST_KEYS, CostModel

_INT_KEYS = (
    "max_running",
    "kv_tokens",
    "prefill_budget",
    "max_batched_tokens",
    "gpus",
    "draft_context_window",
    "capture_max_tokens",
)
_FLOAT_KEYS = COST_KEYS  # the cost model's non-negative float terms


# --------------------------------------------------------------------------- CSV


def read_profile_csv(path: str | os.PathLike, name: str | None = None) -> CostModel:
    """Load a profile CSV (``# key: value`` header + ``batch_tokens,step_ms[,context_tokens]``)."""
    p = Path(path)
    if not p.is_file():
        raise SpecsimError(f"profile file {str(p)!r} does not exist; give a CSV path or a name")
    try:
        text = p.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as exc:
        raise SpecsimError(f"profile {str(p)!r} is not a readable text CSV ({exc})") from None
    return parse_profile_csv(text, name or p.stem, source=str(p))


def parse_profile_csv(text: str, name: str, source: str = "") -> CostModel:
    import pandas as pd

    meta: dict[str, str] = {}
    body = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            key, sep, val = s[1:].partition(":")
            if sep:
                meta[key.strip()] = val.strip()
        elif s:
            body.append(line)
    where = source or name
    try:
        df = pd.read_csv(io.StringIO("\n".join(body)))
    except Exception as exc:  # noqa: BLE001 - any parse failure is the user's to fix
        raise SpecsimError(f"profile {where!r} is not a readable CSV: {exc}") from None
    if not {"batch_tokens", "step_ms"} <= set(df.columns):
        raise SpecsimError(
            f"profile {where!r} needs columns batch_tokens,step_ms (has {', '.join(df.columns)})"
        )
    kwargs: dict = {}
    for key in _FLOAT_KEYS + _INT_KEYS:
        if key in meta:
            try:
                kwargs[key] = int(float(meta.pop(key))) if key in _INT_KEYS else float(meta[key])
            except (ValueError, OverflowError):
                raise SpecsimError(f"profile {where!r}: header {key} is not a number") from None
            meta.pop(key, None)
    for key in ("overhead_curve", "draft_curve"):
        if key in meta:
            kwargs[key] = parse_curve(meta.pop(key), where, key)
    if "interpolation" in meta:
        kwargs["interpolation"] = meta.pop("interpolation").lower()
    meta.setdefault("source", source or "csv")
    for col in ("batch_tokens", "step_ms", "context_tokens"):
        if col in df.columns:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    if df[["batch_tokens", "step_ms"]].isna().any().any():
        raise SpecsimError(
            f"profile {where!r} has empty or non-numeric batch_tokens/step_ms cells; fix them"
        )
    b = df["batch_tokens"].to_numpy(np.float64)
    if np.any(b != np.round(b)) or np.any(np.abs(b) > 2**53):
        raise SpecsimError(f"profile {where!r}: batch_tokens must be whole numbers of tokens")
    steps = df["step_ms"].to_numpy(np.float64)
    if not np.all(np.isfinite(steps)) or np.any(steps <= 0) or np.any(steps > 3.6e6):
        raise SpecsimError(
            f"profile {where!r}: step_ms must be milliseconds in (0, 3,600,000] (an hour a "
            "step at most); check the units"
        )
    if "context_tokens" in df.columns:
        ctx = df["context_tokens"].to_numpy(np.float64)
        if not np.all(np.isfinite(ctx)) or np.any(ctx < 0):
            raise SpecsimError(
                f"profile {where!r}: context_tokens must be non-negative numbers in every row"
            )
        if df.duplicated(subset=["context_tokens", "batch_tokens"]).any():
            raise SpecsimError(
                f"profile {where!r} lists a (context_tokens, batch_tokens) pair twice; keep one"
            )
        piv = df.pivot_table(index="context_tokens", columns="batch_tokens", values="step_ms")
        if piv.isna().any().any():
            raise SpecsimError(
                f"profile {where!r}: a 2-D table needs every batch_tokens at every context_tokens"
            )
        return CostModel(
            name=name,
            batch_tokens=piv.columns.to_numpy(np.int64),
            step_ms=piv.to_numpy(np.float64),
            context_tokens=piv.index.to_numpy(np.float64),
            meta=meta,
            **kwargs,
        )
    df = df.sort_values("batch_tokens")
    if df["batch_tokens"].duplicated().any():
        raise SpecsimError(f"profile {where!r} lists a batch_tokens value twice")
    return CostModel(
        name=name,
        batch_tokens=df["batch_tokens"].to_numpy(np.int64),
        step_ms=df["step_ms"].to_numpy(np.float64),
        meta=meta,
        **kwargs,
    )


def format_curve(curve: tuple[tuple[int, float], ...]) -> str:
    """``((1, 0.5), (4, 12.0))`` -> ``'1:0.5,4:12'`` (a profile header value)."""
    return ",".join(f"{r}:{m:.6g}" for r, m in curve)


def parse_curve(
    text: str, where: str, key: str = "overhead_curve"
) -> tuple[tuple[int, float], ...]:
    """A header's ``overhead_curve`` or ``draft_curve``: ``R:ms,R:ms,...`` (the cost model
    checks the values)."""
    out = []
    for part in text.split(","):
        r, sep, m = part.strip().partition(":")
        try:
            if not sep or float(r) != int(float(r)):
                raise ValueError
            out.append((int(float(r)), float(m)))
        except (ValueError, OverflowError):
            raise SpecsimError(
                f"profile {where!r}: {key} must read 'requests:ms,...' "
                f"(e.g. '1:0.5,4:12,16:60'), got {text!r}"
            ) from None
    return tuple(out)


def write_profile_csv(model: CostModel, path: str | os.PathLike, force: bool = False) -> Path:
    """Write ``model`` as a profile CSV (atomic; refuses to overwrite without ``force``)."""
    from specsim.outputs import check_out, write_text

    p = check_out(path, force=force, suffixes=(".csv",), flag="profile")
    lines = [f"# name: {model.name}"]
    lines += [f"# {k}: {v}" for k, v in model.scalars().items()]
    for key in ("overhead_curve", "draft_curve"):
        if getattr(model, key):
            lines.append(f"# {key}: {format_curve(getattr(model, key))}")
    lines += [f"# {k}: {v}" for k, v in model.meta.items() if k != "name"]
    if model.is_2d:
        lines.append("context_tokens,batch_tokens,step_ms")
        for c, row in zip(model.context_tokens, model.step_ms, strict=True):
            lines += [f"{c:g},{b},{ms:.6g}" for b, ms in zip(model.batch_tokens, row, strict=True)]
    else:
        lines.append("batch_tokens,step_ms")
        lines += [f"{b},{ms:.6g}" for b, ms in zip(model.batch_tokens, model.step_ms, strict=True)]
    return write_text("\n".join(lines) + "\n", p)

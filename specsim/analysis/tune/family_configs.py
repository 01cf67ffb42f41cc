"""A drafter family of ``specsim tune --family`` (:mod:`specsim.analysis.tune.families`): its
knobs by the engine's own names, the config an operator pastes, and its spec, checked before
any replay (so a wrong input is one line, not a traceback ten minutes in).

Why a module of its own: :mod:`specsim.analysis.tune.configs` renders DSpark's knobs (its
block, vLLM's adaptive verification, SGLang's gamma); the families an operator compares it with
are set with other keys, and some DSpark knobs do not exist for them. What each engine takes,
as read in its source:

- vLLM's ``--speculative-config`` JSON (``SpeculativeConfig`` in ``vllm/config/speculative.py``
  at vllm-project/vllm@002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443): ``method`` one of
  ``SpeculativeMethod`` (``eagle``, ``eagle3``, ``mtp``, ``ngram``, ``dflash``, ``dspark``, ...)
  and ``num_speculative_tokens`` k. ``enable_adaptive_verification`` is "only supported for
  method='dspark'" (its ``__post_init__`` raises otherwise), so the other families' grid is k
  alone. ``mtp`` without ``model`` drafts with the target's own MTP weights; ``ngram`` needs no
  model (``prompt_lookup_min`` / ``_max`` default to 5); a k above the MTP checkpoint's
  ``n_predict`` must be a multiple of it, and vLLM warns that k > 1 reruns one MTP layer.
- SGLang's server flags (``ServerArgs`` in ``python/sglang/srt/server_args.py`` at
  sgl-project/sglang@001067fffe33427bee0ed2f007fb7551a1d76b44): ``--speculative-algorithm``
  (builtins ``EAGLE``, ``EAGLE3``, ``NEXTN``, ``STANDALONE``, ``NGRAM``, ``DFLASH``, ``DSPARK``),
  ``--speculative-num-steps`` (draft steps), ``--speculative-eagle-topk`` (candidates a step:
  1 is a chain, what a per-position trace describes) and ``--speculative-num-draft-tokens``
  (tokens verified, the root included: steps + 1 for a chain). ``NEXTN`` is MTP with the
  weights in the target's checkpoint (no ``--speculative-draft-model-path``);
  ``--speculative-dflash-block-size`` is DFlash's verify window (an alias of
  ``--speculative-num-draft-tokens``).

A chain of k drafts is what a trace of per-position acceptance predicts; a tree (topk > 1)
accepts more per step at a wider verify and is not searched here. The drafter's path is a
placeholder named so nobody mistakes it for a real one.

The spec: ``NAME=TRACE@PROFILE`` (the drafter's acceptance, its cost), or ``none@PROFILE`` for
the no-speculation baseline (no trace: the first family's requests are replayed). NAME is
``dspark``, ``eagle``, ``eagle3``, ``mtp``, ``ngram``, ``dflash``, ``none`` or a free label
(``eagle3-k2``), whose drafter is then read from its profile's source line where ``profile
build`` wrote one. Only the first ``@`` splits (a profile may be ``name@sched-x2``).

Refused (one line, exit 2): a spec without ``=`` (only ``none@PROFILE`` has no trace), no
``@PROFILE``, a trace or profile that does not exist, a name given twice, fewer than two
families, an engine other than vLLM or SGLang, ``--drafter`` (one path for several drafters). A
family with a trace on a profile built with ``--drafter none`` is REFUSED, not warned about: its
draft terms are zero, so that drafter would draft for free and beat every family whose profile
charges its drafter: exactly the comparison this mode makes, decided by a wrong input; the fix
is one command (``profile build --drafter KIND``), or ``none@PROFILE`` if it was meant as the
baseline. Warned about (stderr): a family whose name and profile's drafter disagree, a profile
that charges nothing for drafting, traces of different workloads (mean prompt or output over
``WORKLOAD_SPAN`` apart: the rows would compare workloads too), profiles of different
deployments.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from specsim.analysis.tune.configs import DEFAULT_DRAFTER, ENGINE_NAMES, EngineConfig, render
from specsim.analysis.tune.grid import NO_SPEC, Candidate
from specsim.analysis.tune.run import TuneConfig
from specsim.analysis.tune.score import BUILT, deployment_of
from specsim.errors import SpecsimError

# the drafter families specsim names (a free label is allowed too: no config is rendered)
METHODS = ("dspark", "eagle", "eagle3", "mtp", "ngram", "dflash")
# ``profile build --drafter`` kinds (specsim.sim.cost.drafters.KINDS) as families
PROFILE_KINDS = {"eagle1": "eagle", "eagle3": "eagle3", "mtp": "mtp", "dspark": "dspark",
                 "dflash": "dflash", "ngram": "ngram", "none": "none"}  # fmt: skip
# drafters that draft one position per forward: their cost grows with k (a block drafter's
# forward drafts every position at once, n-gram lookup is CPU work)
SEQUENTIAL = ("eagle", "eagle3", "mtp")
FAMILY_ENGINES = ("vllm", "sglang")
VLLM_METHOD = {m: m for m in METHODS}
SGLANG_ALGORITHM = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "ngram": "NGRAM",
                    "dflash": "DFLASH", "dspark": "DSPARK"}  # fmt: skip
NO_MODEL = ("mtp", "ngram")  # vLLM: no draft model path (the target's MTP weights; lookup)
KEYS_FROM = {
    "vllm": "vLLM's SpeculativeConfig at vllm-project/vllm@002e77c1 (vllm/config/speculative.py)",
    "sglang": "SGLang's ServerArgs at sgl-project/sglang@001067ff "
    "(python/sglang/srt/server_args.py)",
}


def chain_knobs(engine: str, method: str | None, k: int) -> tuple[tuple[str, Any], ...]:
    """A chain of ``k`` drafts in ``engine``'s names (the first knob is the draft length, which
    the tie rule's distance reads)."""
    if engine == "vllm":
        return (("num_speculative_tokens", int(k)),)
    if method == "dflash":
        return (("speculative_dflash_block_size", int(k) + 1),)
    if method == "ngram":
        return (("speculative_num_draft_tokens", int(k) + 1),)
    return (("speculative_num_steps", int(k)), ("speculative_eagle_topk", 1),
            ("speculative_num_draft_tokens", int(k) + 1))  # fmt: skip


def chain_grid(cfg: Any, block: int, *, method: str | None, max_k: int | None = None
               ) -> list[Candidate]:  # fmt: skip
    """No speculation, the default (k = the trace's block, or the drafts the profile prices if
    fewer) and every k of ``cfg.draft_lens`` (1..the block) up to ``max_k``: ``static:k``, the
    first k drafts verified every step, which is what these engines do."""
    top = min(block, max_k) if max_k else block
    wanted = cfg.draft_lens if cfg.draft_lens is not None else range(1, top + 1)
    lens = sorted({int(k) for k in wanted if int(k) <= top})
    out = [NO_SPEC, Candidate(f"k={top}", f"static:{top}", chain_knobs(cfg.engine, method, top),
                              None, "default")]  # fmt: skip
    out += [Candidate(f"k={k}", f"static:{k}", chain_knobs(cfg.engine, method, k))
            for k in lens if k != top]  # fmt: skip
    return out


def grid_for(method: str | None, max_k: int | None = None) -> Any:
    """The grid ``tune`` searches for a family: DSpark's own (None: the engine's grid, adaptive
    verification included), else a chain of k."""
    if method == "dspark":
        return None
    return partial(chain_grid, method=method, max_k=max_k)


def _placeholder(method: str) -> str:
    return f"./REPLACE-ME-{method}-drafter"


def _notes(engine: str, method: str, path: str | None) -> list[str]:
    notes = []
    if path is not None:
        notes.append(f"{path} is a placeholder: replace it with your {method} drafter's path")
    notes.append(f"keys as in {KEYS_FROM[engine]}")
    return notes


def vllm_family(method: str, knobs: dict[str, Any]) -> EngineConfig:
    """``--speculative-config`` JSON of a chain of ``num_speculative_tokens`` drafts."""
    k = int(knobs["num_speculative_tokens"])
    path = None if method in NO_MODEL else _placeholder(method)
    data: dict[str, Any] = {"method": VLLM_METHOD[method]}
    if path is not None:
        data["model"] = path
    data["num_speculative_tokens"] = k
    notes = _notes("vllm", method, path)
    if method == "mtp":
        notes.append(
            "method mtp drafts with the target checkpoint's MTP layers (no model); a k above "
            "its n_predict must be a multiple of it, and vLLM warns that k > 1 reruns one layer"
        )
    if method == "ngram":
        notes.append("prompt_lookup_min/max default to 5: the trace's acceptance is for yours")
    text = "--speculative-config " + shlex.quote(json.dumps(data))
    return EngineConfig("vllm", "json", text, data, tuple(notes))


def sglang_family(method: str, knobs: dict[str, Any]) -> EngineConfig:
    """``sglang.launch_server`` flags of a chain (topk 1), in SGLang's algorithm names."""
    path = None if method in ("mtp", "ngram") else _placeholder(method)
    data: dict[str, Any] = {"speculative_algorithm": SGLANG_ALGORITHM[method]}
    if path is not None:
        data["speculative_draft_model_path"] = path
    data.update(knobs)
    parts: list[str] = []
    for key, v in data.items():
        parts += ["--" + key.replace("_", "-"), str(v)]
    notes = _notes("sglang", method, path)
    if method == "mtp":
        notes.append("NEXTN reads the MTP weights from the target's checkpoint (no draft path)")
    return EngineConfig("sglang", "flags", shlex.join(parts), data, tuple(notes))


def render_family(engine: str, method: str | None, knobs: dict[str, Any],
                  block: int | None = None, label: str = "") -> EngineConfig:  # fmt: skip
    """The config to paste for one family's setting: DSpark through the existing renderer
    (:func:`specsim.analysis.tune.configs.render`), the others here; no knobs: speculation
    off; a free label (``method`` None): no config, a note saying so."""
    if not knobs or method in (None, "none", "dspark"):
        if method is None and knobs:
            text = f"(no {ENGINE_NAMES[engine]} config: {label or 'this family'} is no drafter "
            text += "specsim knows; set its k yourself)"
            note = (f"name the family {', '.join(METHODS)} (or build its profile with "
                    "profile build --drafter) for a config to paste")  # fmt: skip
            return EngineConfig(engine, "text", text, dict(knobs), (note,))
        if not knobs or method != "dspark":
            return render(engine, knobs, block=block)
        path = DEFAULT_DRAFTER[engine]  # given, so the note is this mode's (no --drafter here)
        ec = render(engine, knobs, block=block, drafter=path)
        note = (f"{path} is a placeholder: replace it with your dspark drafter's path (where "
                "public ones exist: docs/vllm.md, 'Where the drafter comes from')")  # fmt: skip
        return replace(ec, notes=(note, *ec.notes))
    fn = vllm_family if engine == "vllm" else sglang_family
    return fn(method, knobs)


# ------------------------------------------------------------------ the spec, checked
NONE = "none"
SPEC = "NAME=TRACE@PROFILE"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,39}")
WORKLOAD_SPAN = 1.10  # traces whose mean prompt or output differ more hold other workloads
BUILD_HINT = {"dspark": "dspark:layers=5,block=7", "dflash": "dflash:layers=5,block=16",
              "eagle": "eagle1", "eagle3": "eagle3", "mtp": "mtp:3", "ngram": "ngram"}  # fmt: skip


@dataclass(frozen=True)
class Family:
    """One drafter to compare: its name, its trace (None: the none baseline) and its profile;
    ``method`` (dspark, eagle, eagle3, mtp, ngram, dflash, none; None: a free label whose
    profile does not say) and ``max_k`` (the drafts a sequential drafter's profile prices)."""

    name: str
    trace: str | None
    profile: str
    method: str | None = None
    max_k: int | None = None

    @property
    def is_none(self) -> bool:
        return self.name.lower() == NONE


def parse_family(text: str) -> Family:
    """``NAME=TRACE@PROFILE`` or ``none@PROFILE`` (the profile may carry ``@sched-xS``: only
    the first ``@`` splits)."""
    raw = str(text).strip()
    name, eq, rest = raw.partition("=")
    if not eq:
        head, at, prof = raw.partition("@")
        if head.strip().lower() == NONE and at:
            return _family(NONE, None, prof, raw)
        raise SpecsimError(
            f"--family {raw!r} has no '=': write {SPEC} (e.g. eagle3=e3.parquet@e3.csv), or "
            "none@PROFILE for the no-speculation baseline"
        )
    trace, at, prof = rest.partition("@")
    if not at:
        raise SpecsimError(
            f"--family {raw!r} names no profile: write {SPEC}, the profile (a profile build "
            "CSV or a built-in name) after '@'"
        )
    return _family(name.strip(), trace.strip() or None, prof, raw)


def _family(name: str, trace: str | None, prof: str, raw: str) -> Family:
    if not _NAME.fullmatch(name):
        raise SpecsimError(
            f"--family {raw!r}: name {name!r} must be letters, digits, '.', '_', '+' or '-' "
            "(e.g. eagle3, dspark-k4)"
        )
    if not prof.strip():
        raise SpecsimError(f"--family {raw!r} names no profile after '@': write {SPEC}")
    if trace is None and name.lower() != NONE:
        raise SpecsimError(
            f"--family {raw!r} names no trace: a drafter's acceptance is its trace ({SPEC}); "
            "only none@PROFILE takes none"
        )
    return Family(name, trace, prof.strip())


def parse_families(texts: Sequence[str]) -> list[Family]:
    """Every ``--family``, each name once, at least two of them."""
    fams = [parse_family(t) for t in texts]
    seen: dict[str, Family] = {}
    for f in fams:
        if f.name.lower() in seen:
            raise SpecsimError(
                f"--family {f.name} is given twice: give each family once, or name them apart "
                f"({f.name}-a=..., {f.name}-b=...)"
            )
        seen[f.name.lower()] = f
    if len(fams) < 2:
        raise SpecsimError(
            "--family is given once: compare two or more (e.g. --family eagle3=e.parquet@e.csv "
            "--family dspark=d.parquet@d.csv --family none@e.csv), or tune one drafter with "
            "TRACE --profile PROFILE"
        )
    return fams


def profile_drafter(profile: Any) -> tuple[str | None, int | None]:
    """(kind, drafts a step) of the drafter a ``profile build`` profile prices, read from its
    source line; (None, None) for any other profile (imported, fitted by hand, built-in)."""
    source = str((getattr(profile, "meta", None) or {}).get("source", ""))
    if not source.startswith(BUILT) or ", drafter " not in source:
        return None, None
    label = source.rsplit(", drafter ", 1)[1].strip()
    m = re.search(r"(?:steps|block)=(\d+)", label) or re.fullmatch(r"mtp:(\d+)", label)
    return label.split(":")[0], (int(m.group(1)) if m else None)


@dataclass(frozen=True, eq=False)
class Prepared:
    """A family resolved: its trace (None for none without one) and profile, loaded, and the
    TuneConfig it is tuned with."""

    family: Family
    trace: Any
    profile: Any
    cfg: TuneConfig


def prepare(fams: Sequence[Family], cfg: TuneConfig) -> tuple[list[Prepared], list[str]]:
    """Load and check every family before any replay (module docstring: what is refused, what
    is warned about); the warnings, one line each."""
    if cfg.engine not in FAMILY_ENGINES:
        raise SpecsimError(
            f"--family renders vLLM and SGLang configs: use --engine vllm or sglang (--engine "
            f"{cfg.engine} tunes one DSpark drafter: TRACE --profile PROFILE)"
        )
    if cfg.drafter:
        raise SpecsimError(
            "--drafter names one drafter's path; with --family each config carries a "
            "placeholder per family: drop --drafter"
        )
    out, warns = [], []
    for f in fams:
        trace, profile = _load(f)
        kind, drafts = profile_drafter(profile)
        method = _method(f, kind)
        max_k = drafts if PROFILE_KINDS.get(kind or "") in SEQUENTIAL else None  # as priced
        if not f.is_none:
            warns += _check_drafter(f, method, kind, profile, trace)
        fam = replace(f, method=method, max_k=max_k)
        lens = cfg.draft_lens
        if max_k is not None and lens is not None and not any(int(k) <= max_k for k in lens):
            raise SpecsimError(
                f"--family {f.name}: every --draft-lens is above the {max_k} draft steps its "
                f"profile prices; give lengths 1..{max_k} or build the profile with more steps"
            )
        out.append(Prepared(fam, trace, profile, replace(cfg, profile=f.profile)))
    return out, warns + _consistency(out)


def _method(f: Family, kind: str | None) -> str | None:
    """The family's drafter: its name where specsim knows it, else its profile's drafter."""
    if f.is_none:
        return NONE
    if f.name.lower() in METHODS:
        return f.name.lower()
    return None if kind in (None, "none") else PROFILE_KINDS.get(kind)


def _load(f: Family) -> tuple[Any, Any]:
    from specsim.sim.cost.profiles import get_profile
    from specsim.trace.io import read_trace

    try:
        return (read_trace(f.trace) if f.trace else None), get_profile(f.profile)
    except SpecsimError as exc:
        raise SpecsimError(f"--family {f.name}: {exc}") from None


def _check_drafter(f: Family, method: str | None, kind: str | None, profile: Any, trace: Any
                   ) -> list[str]:  # fmt: skip
    """The refusal of a drafter on a ``--drafter none`` profile; the warnings of a drafter
    another family's profile prices, or one that drafts for free."""
    if kind == "none":
        hint = BUILD_HINT.get(method or "", "KIND")
        raise SpecsimError(
            f"--family {f.name}: profile {f.profile} was built with --drafter none, so "
            f"{f.name} would draft for free and flatter it against the others; build its own "
            f"(specsim profile build ... --drafter {hint}), or give it as none@{f.profile}"
        )
    warns = []
    priced = PROFILE_KINDS.get(kind or "")
    if method in METHODS and priced is not None and priced != method:
        warns.append(
            f"family {f.name}'s profile {f.profile} prices a {kind} drafter: {f.name} is "
            f"charged that drafter's cost (build its own with --drafter {BUILD_HINT[method]})"
        )
    if kind is None and float(profile.draft_ms(1, trace.block_size)) <= 0.0:
        warns.append(
            f"family {f.name}'s profile {f.profile} charges nothing for drafting: {f.name} "
            "drafts for free here (profile build --drafter prices it)"
        )
    return warns


def _consistency(prepared: list[Prepared]) -> list[str]:
    """Traces of different workloads, or profiles of different deployments, compare more than
    the drafters: one line each."""
    warns = []
    traces = [(p.family.name, p.trace) for p in prepared if p.trace is not None]
    name0, t0 = traces[0]
    for name, t in traces[1:]:
        for what in ("prompt_len", "output_len"):
            a, b = float(getattr(t, what).mean()), float(getattr(t0, what).mean())
            if max(a, b) > WORKLOAD_SPAN * min(a, b):
                warns.append(
                    f"family {name}'s trace has mean {what.split('_')[0]} {a:,.0f} tokens "
                    f"against {name0}'s {b:,.0f}: the families differ in workload as well as "
                    "drafter; make each drafter's trace on the same prompts"
                )
    deps = {p.family.name: (deployment_of(p.profile) or (None, None))[1] for p in prepared}
    known = {d for d in deps.values() if d}
    if len(known) > 1:
        warns.append(
            "the families' profiles model different deployments ("
            + "; ".join(f"{n}: {d}" for n, d in deps.items() if d)
            + "): build every profile for the same model, GPUs and engine"
        )
    return warns


__all__ = [
    "FAMILY_ENGINES",
    "METHODS",
    "NONE",
    "PROFILE_KINDS",
    "SEQUENTIAL",
    "SPEC",
    "Family",
    "Prepared",
    "chain_grid",
    "chain_knobs",
    "grid_for",
    "parse_families",
    "parse_family",
    "prepare",
    "profile_drafter",
    "render_family",
    "sglang_family",
    "vllm_family",
]

"""The grid's inputs: prompts as token ids, output lengths, the server's own outputs, and from
them one trace per speculative setting and temperature.

- Prompts: each text in the server's chat template, tokenized by the server.
- Output lengths: each prompt's greedy answer up to its end-of-sequence token, at most
  ``--max-tokens`` and at least 16 (one run of the plain server); every later request is sent
  with ``ignore_eos`` and that length, so the server and the simulator generate the same
  number of tokens.
- Outputs: one run of the plain server (no drafting) per temperature, seeded as the grid's
  runs are. A speculative run commits the same tokens (greedy: the argmax; T > 0: llama-server
  samples each position from the target, one draw per committed token, and accepts a draft
  iff it equals that sample), so these outputs are what every setting's runs emit, up to the
  arithmetic's dependence on the batch (the grid reports how many requests differ).
- Traces: the drafts llama-server makes at every position of those outputs
  (:mod:`specsim.serve.ngram` for ``ngram:M``, or with ``--ngram-trace server`` each
  server's own step log over a recording run; for ``dspark:N[:P]`` either the target's
  teacher-forced pass and the torch drafter, :mod:`specsim.record.llama_dspark_trace`, the
  only part of the grid that imports torch, or with ``--dspark-trace server`` the server's
  own step log over a recording run, :mod:`specsim.fidelity.llama.server_drafts`), built by
  :func:`specsim.serve.llama_trace.build_trace`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specsim.fidelity.llama.config import LlamaValidationConfig, SpecSetting
from specsim.fidelity.llama.servers import (
    drafter_folder,
    drafter_of,
    send,
    start_server,
    target_gguf,
)
from specsim.serve.llama_trace import build_trace
from specsim.serve.ngram import Positions, positions
from specsim.trace.model import Trace

MIN_OUTPUT = 16
TRACE_CONCURRENCY = 4  # the outputs' runs (not a grid cell; the outputs do not depend on it)


@dataclass(frozen=True)
class GridInputs:
    """Token-id prompts and output lengths of the grid and of the calibration runs, and the
    server's outputs of the grid's prompts at each temperature."""

    ids: list[list[int]]
    lengths: list[int]
    outputs: dict[float, list[list[int]]]
    calib_ids: list[list[int]]
    calib_lengths: list[int]


def prepare(
    cfg: LlamaValidationConfig, texts: list[str], calib_texts: list[str], log: Callable
) -> GridInputs:
    """Tokenize, measure output lengths and record the outputs (one plain server)."""
    from specsim.serve.llama_tokens import chat_prompt_ids

    none = SpecSetting("none")
    with start_server(cfg, none, cfg.out / "logs") as srv:
        ids = chat_prompt_ids(srv, texts)
        calib_ids = chat_prompt_ids(srv, calib_texts)
        lengths = natural_lengths(srv, ids, cfg)
        calib_lengths = natural_lengths(srv, calib_ids, cfg)
        log(f"prompts: grid {len(ids)}, calibration {len(calib_ids)}; mean output "
            f"{sum(lengths) / len(lengths):.1f} tokens")  # fmt: skip
        outputs = {}
        for t in cfg.temperatures:
            _, res, _ = send(srv, ids, lengths, temperature=t, seed=cfg.seed,
                             concurrency=TRACE_CONCURRENCY, requests=len(ids))  # fmt: skip
            by_prompt: dict[int, list[int]] = {r.trace_id: r.tokens for r in res}
            short = [i for i, n in enumerate(lengths) if len(by_prompt.get(i, ())) < n]
            for i in short:  # a token ending inside a UTF-8 character is never streamed
                if not any(r.trace_id == i and r.error for r in res):
                    by_prompt[i] = whole_output(srv, ids[i], lengths[i], t, cfg.seed)
            if short:
                log(
                    f"T={t:g}: {len(short)} outputs streamed short (a token ending inside a "
                    "UTF-8 character is not streamed) taken again whole, unstreamed"
                )
            bad = [i for i, n in enumerate(lengths) if len(by_prompt.get(i, ())) != n]
            if bad:
                from specsim.errors import SpecsimError

                failed = [r.error for r in res if r.error]  # the reason, where the client saw it
                why = f" ({len(failed)} failed; first error: {failed[0]})" if failed else ""
                raise SpecsimError(
                    f"llama-server returned short outputs for prompts {bad[:5]}{why}"
                )
            outputs[float(t)] = [by_prompt[i] for i in range(len(ids))]
    return GridInputs(ids, lengths, outputs, calib_ids, calib_lengths)


def whole_output(srv, prompt: list[int], n: int, temperature: float, seed: int) -> list[int]:  # noqa: ANN001
    """A request's output token ids in full: one unstreamed ``/completion`` (llama-server
    streams no event for a token that ends inside a UTF-8 character, server-context.cpp
    ``process_token``, so a streamed answer can lack ids; the unstreamed one lists them all)."""
    from specsim.serve.llama_server import completion_timeout_s

    ans = srv.completion({"prompt": prompt, "n_predict": n, "temperature": temperature,
                          "seed": seed, "ignore_eos": True, "cache_prompt": False,
                          "return_tokens": True}, timeout_s=completion_timeout_s(n))  # fmt: skip
    return [int(t) for t in ans.get("tokens", [])]


def natural_lengths(srv, ids: list[list[int]], cfg: LlamaValidationConfig) -> list[int]:  # noqa: ANN001
    """Each prompt's greedy answer length (to its EOS), clipped to [16, max_tokens]."""
    from specsim.errors import SpecsimError
    from specsim.serve.llama_server import completion_timeout_s
    from specsim.serve.wire import as_count

    out = []
    for p in ids:
        ans = srv.completion({"prompt": p, "n_predict": cfg.max_tokens, "temperature": 0.0,
                              "cache_prompt": False, "seed": cfg.seed},
                             timeout_s=completion_timeout_s(cfg.max_tokens))  # fmt: skip
        timings = ans.get("timings", {})
        raw = timings.get("predicted_n", cfg.max_tokens) if isinstance(timings, dict) else None
        n = as_count(raw, cfg.max_tokens)
        if n is None:
            raise SpecsimError(
                f"llama-server /completion answered timings {str(timings)[:80]}: no "
                f"timings.predicted_n in [0, {cfg.max_tokens}] (the tokens it generated)"
            )
        out.append(min(max(n, MIN_OUTPUT), cfg.max_tokens))
    return out


def setting_trace(
    cfg: LlamaValidationConfig,
    s: SpecSetting,
    inputs: GridInputs,
    temperature: float,
    log: Callable[[str], None] | None = None,
    draw: int = 0,
) -> Trace:
    """The trace of setting ``s`` at ``temperature``: over the plain server's outputs (the
    n-gram port), or its own server's walk (``--ngram-trace server``; draft-dspark: see
    :func:`dspark_traces`), in recording run ``draw`` (``--trace-draws``)."""
    outs = inputs.outputs[float(temperature)]
    plen = [len(p) for p in inputs.ids]
    meta = {
        "temperature": f"{temperature:g}",
        "target": f"{target_gguf(cfg).name} (llama-server)",
        "drafter": s.name,
    }
    if s.kind == "none":
        return build_trace(plen, inputs.lengths, None, None, None, 1, meta)
    if s.kind == "dspark":
        found = dspark_traces(cfg, [s], inputs, [temperature], draw=draw)
        return found[(s.name, float(temperature))]
    meta["drafter"] = f"ngram-simple n={cfg.ngram_n} m={s.n_max}"
    meta["drafts_from"] = cfg.ngram_trace
    if cfg.ngram_trace == "server":
        t = float(temperature)
        pos = _server_drafts(cfg, [s], inputs, [t], log, draw)[(s.name, t)]
        return _trace_of(plen, inputs.lengths, pos, s.n_max, meta)
    d = drafter_of(cfg, s)
    assert d is not None
    pos = [positions(d, p, o, cfg.ctx_per_slot) for p, o in zip(inputs.ids, outs, strict=True)]
    return _trace_of(plen, inputs.lengths, pos, s.n_max, meta)


def _trace_of(
    plen: list[int], lengths: list[int], pos: Sequence[Positions], n_max: int, meta: dict
) -> Trace:
    """The trace of a setting from each request's positions (any drafter)."""
    drafted, accepted = [p.drafted for p in pos], [p.accepted for p in pos]
    return build_trace(plen, lengths, drafted, accepted, [p.tokens for p in pos], n_max, meta)


def all_traces(
    cfg: LlamaValidationConfig,
    inputs: GridInputs,
    log: Callable[[str], None] = print,
    draw: int = 0,
) -> dict[tuple[str, float], Trace]:
    """Every setting's trace at every temperature, keyed ``(name, T)`` in the grid's order;
    the draft-dspark ones made together (:func:`dspark_traces`: one target pass per output
    serves them all); ``draw``: which recording run (``--trace-draws``; the plain setting's
    trace, lengths only, is the same in every draw)."""
    settings = cfg.settings
    dspark = [s for s in settings if s.kind == "dspark"]
    made = dspark_traces(cfg, dspark, inputs, cfg.temperatures, log, draw) if dspark else {}
    for s in settings:
        for t in cfg.temperatures:
            if s.kind != "dspark":
                made[(s.name, float(t))] = setting_trace(cfg, s, inputs, t, log, draw)
    return {(s.name, float(t)): made[(s.name, float(t))] for s in settings
            for t in cfg.temperatures}  # fmt: skip


def trace_draws(
    cfg: LlamaValidationConfig, inputs: GridInputs, log: Callable[[str], None] = print
) -> dict[tuple[str, float], tuple[Trace, ...]]:
    """Draws 1 .. K-1 of every setting's trace (``--trace-draws K``; draw 0 is
    :func:`all_traces`'s), keyed as it: one recording run per setting, temperature and draw,
    each on a fresh server of the setting with a seed of its own (``cfg.draw_seed``).
    Why: at T > 0 every measured run samples its own answers, and a setting's acceptance over
    24 sampled answers moved 9-18% from run to run on the held-out grids; one recorded draw
    puts that whole spread into the simulator's acceptance (reports/llama-cpp-v4, PLAN step
    23)."""
    made: dict[tuple[str, float], list[Trace]] = {}
    for k in range(1, cfg.trace_draws):
        for key, tr in all_traces(cfg, inputs, log, draw=k).items():
            made.setdefault(key, []).append(tr)
    return {key: tuple(v) for key, v in made.items()}


def dspark_traces(
    cfg: LlamaValidationConfig,
    settings: list[SpecSetting],
    inputs: GridInputs,
    temperatures: tuple[float, ...] | list[float],
    log: Callable[[str], None] | None = None,
    draw: int = 0,
) -> dict[tuple[str, float], Trace]:
    """The traces of draft-dspark settings, from ``cfg.dspark_trace``: ``torch``, what the
    server drafts at every position of the plain server's outputs
    (:mod:`specsim.record.llama_dspark_trace`: the target's teacher-forced pass and the torch
    drafter, each block of N decoded as llama.cpp decodes it; torch is imported here, and only
    for these settings: ``specsim.fidelity`` itself stays torch-free,
    tests/test_architecture.py); ``server``, what each setting's own server drafted and
    accepted along its walk (:mod:`specsim.fidelity.llama.server_drafts`)."""
    folder = drafter_folder(cfg)
    temps = [float(t) for t in temperatures]
    plen = [len(p) for p in inputs.ids]
    if cfg.dspark_trace == "server":
        found = _server_drafts(cfg, settings, inputs, temps, log, draw)
    else:  # one output per prompt: every draw the same (config.check_draws refuses K > 1)
        found = _torch_dspark(cfg, settings, inputs, temps, log)
    out = {}
    target = target_gguf(cfg).name
    for s in settings:
        for t in temps:
            meta = {"temperature": f"{t:g}", "target": f"{target} (llama-server)",
                    "drafter": f"draft-dspark {folder.name} n-max={s.n_max} "
                               f"p-min={s.p_min:g}", "drafts_from": cfg.dspark_trace}  # fmt: skip
            out[(s.name, t)] = _trace_of(plen, inputs.lengths, found[(s.name, t)], s.n_max, meta)
    return out


def _torch_dspark(cfg, settings, inputs, temps, log):  # noqa: ANN001, ANN202
    """The torch drafter at every position of the plain server's outputs (one model load)."""
    from specsim.record.llama_dspark_trace import settings_positions

    folder = drafter_folder(cfg)
    requests = [(p, o) for t in temps for p, o in zip(inputs.ids, inputs.outputs[t], strict=True)]
    if log is not None:
        log(f"draft-dspark traces: {len(requests)} outputs, drafter {folder.name} in torch, "
            f"settings {', '.join(s.name for s in settings)}")  # fmt: skip
    wanted = list(dict.fromkeys((s.n_max, s.p_min) for s in settings))
    found = settings_positions(requests, wanted, folder, cfg.ctx_per_slot, cfg.threads, log)
    n = len(inputs.ids)
    return {(s.name, t): found[(s.n_max, s.p_min)][k * n : (k + 1) * n]
            for s in settings for k, t in enumerate(temps)}  # fmt: skip


def _server_drafts(cfg, settings, inputs, temps, log, draw=0):  # noqa: ANN001, ANN202
    """Each setting's own server over the grid's prompts, its step log read (one run each,
    recording run ``draw``)."""
    from specsim.fidelity.llama.server_drafts import server_positions

    out = {}
    for s in settings:
        for t in temps:
            pos, outs = server_positions(cfg, s, inputs.ids, inputs.lengths, t, draw)
            differ = sum(a != b for a, b in zip(outs, inputs.outputs[t], strict=True))
            out[(s.name, t)] = pos
            if log is not None:
                drafted = sum(int(p.drafted.sum()) for p in pos)
                accepted = sum(int(p.accepted.sum()) for p in pos)
                at = f" (draw {draw})" if draw else ""
                # a later draw samples with a seed of its own: at T > 0 its answers are other
                # samples than the plain server's (drawn at the grid's seed), by design
                why = " (sampled with another seed)" if draw and t > 0 else ""
                log(
                    f"{s.name} T={t:g}{at}: the server's own drafts: {accepted} of {drafted} "
                    f"accepted; {differ} of {len(pos)} outputs differ from the plain server's{why}"
                )
    return out


def request_positions(
    cfg: LlamaValidationConfig,
    s: SpecSetting,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
) -> list[Positions] | None:
    """What the server of setting ``s`` drafts and accepts at every position of each
    ``(prompt, output)`` request (None for ``none``): the n-gram port, or for draft-dspark the
    torch drafter over the target's teacher-forced pass (all requests at once: one model
    load). Why: one entry point for every setting's reconstruction, for a caller that holds
    outputs of its own (the calibration's step rebuild, ``calibrate.run_steps``, which today
    calls the n-gram port directly and so cannot rebuild a draft-dspark run's steps)."""
    if s.kind == "none":
        return None
    if s.kind == "ngram":
        d = drafter_of(cfg, s)
        assert d is not None
        return [positions(d, p, o, cfg.ctx_per_slot) for p, o in requests]
    from specsim.record.llama_dspark_trace import settings_positions

    key = (s.n_max, s.p_min)
    found = settings_positions(requests, [key], drafter_folder(cfg), cfg.ctx_per_slot, cfg.threads)
    return found[key]


def write_traces(traces: dict[tuple[str, float], Trace], folder: Path) -> None:
    from specsim.trace.io import write_trace

    folder.mkdir(parents=True, exist_ok=True)
    for (name, t), tr in traces.items():
        write_trace(tr, folder / f"trace-{name.replace(':', '-')}-t{t:g}.parquet", force=True)

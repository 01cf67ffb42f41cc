"""Export a specsim DSpark drafter for llama.cpp's ``--spec-type draft-dspark``.

Why a separate export: llama.cpp's converter (``convert_hf_to_gguf.py``, class ``DSparkModel``
in ``conversion/qwen.py``) reads a DeepSpec checkpoint with conventions specsim's own save does
not follow: ``markov_head_type`` must be ``"vanilla"``, ``d2t`` holds offsets (target id =
``i + d2t[i]``), ``max_position_embeddings`` becomes the GGUF's ``dflash.context_length``, and
the backbone must carry q/k norms. ``export_deepspec`` writes that checkpoint (fp32, so the GGUF
holds the very weights specsim drafts with), ``convert_to_gguf`` runs llama.cpp's own converter
on it, and ``replay_llama_server`` predicts, from specsim's drafts, the ``draft_n`` and
``draft_n_accepted`` llama-server reports for a greedy request. docs/llama-cpp-dspark.md has
the full list of semantic points and the source lines behind them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specsim.errors import SpecsimError
from specsim.record.dspark import ARCH, DSparkConfig, DSparkDrafter, load_drafter


def target_model_dir(target: Any) -> Path:
    """A Hugging Face directory of the target (``--target-model-dir`` for the converter).

    ``load_target`` already keeps GGUF targets converted to safetensors in the cache; the
    loaded model's ``name_or_path`` is that directory. A model loaded from elsewhere is saved
    once into ``<cache>/hf-targets/``.
    """
    from specsim.record.models import cache_dir

    path = Path(str(getattr(target.model, "name_or_path", "") or ""))
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        return path
    out = cache_dir() / "hf-targets" / target.sha256[:16]
    if not (out / "config.json").is_file():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        target.model.save_pretrained(tmp)
        if target.tokenizer is not None:
            target.tokenizer.save_pretrained(tmp)
        tmp.replace(out)
    return out


def text_config(target_config: dict[str, Any]) -> dict[str, Any]:
    """A target's HF config with a multimodal ``text_config`` folded in (what the layer, width
    and vocabulary checks read)."""
    return {**target_config, **target_config.get("text_config", {})}


def layout_problems(
    cfg: DSparkConfig, target_config: dict[str, Any], engine: str, qk_norm_source: str
) -> list[str]:
    """Why ``engine``'s DSpark draft would compute something else than this drafter (empty: it
    computes the same). The engines that run DSpark drafts (llama.cpp's draft-dspark, vLLM's
    speculators layout) agree on these points: a Qwen3 backbone with q/k norms (where
    ``qk_norm_source`` says), every position before the anchor in context, feature layers read
    as the INPUT of layer i+1, and the target's embeddings shared."""
    tc = text_config(target_config)
    n_layers = int(tc["num_hidden_layers"])
    n_ctx = int(tc.get("max_position_embeddings") or 0)
    out = []
    if not cfg.qk_norm:
        out.append(
            f"qk_norm is false: {engine}'s DSpark backbone is Qwen3's and requires q/k norms "
            f"({qk_norm_source}); retrain with qk_norm=True"
        )
    if cfg.context_window < n_ctx:
        out.append(
            f"context_window {cfg.context_window} < the target's {n_ctx} positions: {engine}'s "
            "draft attends to every position before the anchor; retrain with the default "
            "(FULL_CONTEXT)"
        )
    if max(cfg.target_layer_ids) > n_layers - 2 or min(cfg.target_layer_ids) < 0:
        out.append(
            f"target_layer_ids {list(cfg.target_layer_ids)}: {engine} extracts the INPUT of "
            f"layer i+1, which does not exist for i = {n_layers - 1}; use ids in "
            f"[0, {n_layers - 2}]"
        )
    if cfg.hidden_size != int(tc["hidden_size"]) or cfg.vocab_size != int(tc["vocab_size"]):
        out.append(
            f"the drafter's hidden size / vocabulary differ from the target's: {engine} shares "
            "the target's token embeddings (and LM head for a full draft vocabulary)"
        )
    return out


def llama_cpp_problems(cfg: DSparkConfig, target_config: dict[str, Any]) -> list[str]:
    """Why llama.cpp's draft-dspark would compute something else than this drafter (empty: it
    computes the same; blk.N.attn_q_norm / attn_k_norm are required tensors there)."""
    return layout_problems(cfg, target_config, "llama.cpp", "src/models/dflash.cpp")


def deepspec_config(cfg: DSparkConfig, target_config: dict[str, Any]) -> dict[str, Any]:
    """config.json for llama.cpp's converter; specsim's own keys ride along for load_drafter."""
    tc = text_config(target_config)
    out = cfg.to_json()
    out.update(
        architectures=[ARCH],
        markov_head_type="vanilla",
        max_position_embeddings=int(tc.get("max_position_embeddings") or 8192),
        hidden_act="silu",
        attention_bias=False,
        tie_word_embeddings=False,
        sample_from_anchor=True,
        torch_dtype="float32",
        d2t_format="offset",
    )
    if cfg.draft_vocab_size is None:
        out.pop("draft_vocab_size", None)
    return out


def export_deepspec(
    drafter: DSparkDrafter, out_dir: str | Path, target_dir: str | Path, force: bool = False
) -> Path:
    """Write the DeepSpec checkpoint llama.cpp's converter reads (fp32 weights, offset d2t).

    Refuses a drafter llama.cpp would run differently (``llama_cpp_problems``): the drafter
    shipped before this export existed (no q/k norms, a 192-position window) is one.
    """
    from safetensors.torch import save_file

    target_config = json.loads((Path(target_dir) / "config.json").read_text())
    problems = llama_cpp_problems(drafter.cfg, target_config)
    if problems:
        raise SpecsimError(
            "llama.cpp cannot run this drafter as specsim does: " + "; ".join(problems)
        )
    out = Path(out_dir)
    if out.exists() and not force:
        raise SpecsimError(f"{out} exists; pass force=True to overwrite it")
    state = {
        k: (v.detach().float() if v.is_floating_point() else v.detach()).contiguous().cpu()
        for k, v in drafter.state_dict().items()
    }
    d2t = state.pop("d2t").long()
    if drafter.cfg.draft_vocab_size is not None:
        state["d2t"] = d2t - torch.arange(d2t.numel())  # offsets: target id = i + d2t[i]
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(state, str(tmp / "model.safetensors"))
    conf = deepspec_config(drafter.cfg, target_config)
    (tmp / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def convert_to_gguf(
    ckpt_dir: str | Path,
    target_dir: str | Path,
    out_file: str | Path,
    llama_cpp_src: str | Path | None = None,
    outtype: str = "f32",
    python: str | None = None,
) -> Path:
    """Run llama.cpp's ``convert_hf_to_gguf.py`` (with its own gguf-py) on an exported drafter.

    ``python`` defaults to this interpreter (it needs torch, transformers, sentencepiece).
    fp32 keeps the GGUF's weights bit-identical to specsim's; the converter's log is in the
    error when it fails.
    """
    if llama_cpp_src is None:
        from specsim.serve.llama_server import llama_cpp_source

        llama_cpp_src = llama_cpp_source()
    src = Path(llama_cpp_src)
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(src / "gguf-py"), os.environ.get("PYTHONPATH", "")) if p
        ),
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [
        python or sys.executable,
        str(src / "convert_hf_to_gguf.py"),
        str(ckpt_dir),
        "--target-model-dir",
        str(target_dir),
        "--outtype",
        outtype,
        "--outfile",
        str(out),
    ]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if run.returncode != 0 or not out.is_file():
        tail = "\n".join((run.stdout + run.stderr).splitlines()[-25:])
        raise SpecsimError(f"llama.cpp's converter failed ({' '.join(cmd)}):\n{tail}")
    return out


def cached_gguf(folder: str | Path, target: Any = None) -> Path:
    """The GGUF of the drafter checkpoint in ``folder``, made now if the user's cache lacks it
    (``draft_gguf.gguf_path``: named by the drafter and a hash of its files):
    :func:`export_deepspec` (fp32) and llama.cpp's converter into a temporary folder, the GGUF
    then renamed into place (a second process making it at once writes the same bytes).
    ``target``: the loaded SmolLM2 target, if the caller has it (else loaded here). Why cached:
    the export and the converter take a minute, and every draft-dspark grid serves the file."""
    from specsim.record.draft_gguf import check_target, gguf_path
    from specsim.record.models import load_target

    folder = Path(folder)
    out = gguf_path(folder)
    if out.is_file():
        return out
    if target is None:
        target = load_target("smollm2")
    check_target(folder, target.sha256)
    drafter = load_drafter(folder).float().eval()
    tdir = target_model_dir(target)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.stem}.tmp{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        ckpt = export_deepspec(drafter, work / "deepspec", tdir, force=True)
        os.replace(convert_to_gguf(ckpt, tdir, work / "draft.gguf"), out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def llama_server_args(
    draft_gguf: str | Path, block_size: int, ctx: int = 2048, p_min: float = 0.0
) -> tuple[str, ...]:
    """llama-server flags that run a draft as specsim predicts it: one slot, blocks of
    ``block_size`` (the trained one; a shorter block is decoded as a block of its own, which
    changes every hidden state: attention is non-causal, see :func:`with_block`), and the
    confidence cut ``p_min`` (0: none; see ``replay_llama_server``)."""
    from specsim.record.draft_gguf import draft_dspark_args

    return (
        *draft_dspark_args(draft_gguf, block_size, p_min),
        "-np",
        "1",
        "-c",
        str(ctx),
        "--temp",
        "0",
    )


@dataclass(frozen=True)
class ReplayStep:
    """One speculative step of a greedy llama-server request, as specsim predicts it."""

    anchor: int  # sequence position of the anchor (the last committed token)
    drafted: int
    accepted: int
    draft: tuple[int, ...]


def with_block(drafter: DSparkDrafter, n_max: int) -> DSparkDrafter:
    """The drafter as llama-server runs it with ``--spec-draft-n-max n_max``.

    Why not the trained block cut to ``n_max``: llama.cpp (build 11434,
    common/speculative.cpp, ``common_speculative_impl_draft_dflash::draft``) decodes a block of
    ``n_block_tokens = params.n_max`` tokens, ``[anchor, mask x (n_max - 1)]``, after clamping
    ``n_max`` to the trained block size in the constructor. Attention inside the block is
    non-causal, so a block of 4 computes other hidden states than the first 4 of a block of 7.
    The returned drafter shares no parameters with ``drafter`` (a copy, with ``block_size``
    ``n_max`` and the first ``n_max`` STS temperatures); ``n_max`` = the block: ``drafter``.
    """
    from dataclasses import replace

    size = drafter.cfg.block_size
    if not 1 <= n_max <= size:
        raise SpecsimError(
            f"--spec-draft-n-max {n_max} is outside [1, {size}] (the drafter's block; "
            "llama.cpp clamps a larger one to it)"
        )
    if n_max == size:
        return drafter
    temps = drafter.cfg.sts_temperatures
    cfg = replace(drafter.cfg, block_size=n_max,
                  sts_temperatures=None if temps is None else temps[:n_max])  # fmt: skip
    view = DSparkDrafter(cfg).to(device=drafter.fc.weight.device, dtype=drafter.fc.weight.dtype)
    view.load_state_dict(drafter.state_dict())
    if drafter.embed is not None:
        view.bind(drafter.embed)
    return view.eval()


def confidence_cut(raw_conf: torch.Tensor, p_min: float) -> list[int]:
    """Per anchor, the drafts llama.cpp keeps under ``--spec-draft-p-min p_min``: those before
    the first position whose raw confidence is below ``p_min`` (the whole block at 0)."""
    n_anchors, n = raw_conf.shape
    if p_min <= 0:
        return [n] * n_anchors
    low = raw_conf < p_min
    whole = torch.full((n_anchors,), n, dtype=torch.long)
    return [int(k) for k in torch.where(low.any(1), low.long().argmax(1), whole).tolist()]


def accepted_prefix(draft: list[int], out: list[int], g: int, eog_ids: tuple[int, ...] = ()) -> int:
    """How many of ``draft`` (anchored after ``out[g - 1]``) llama-server accepts: the leading
    ones equal to the output (the target's argmax at T = 0, its sample at T > 0); a drafted
    end-of-generation token before the draft's last ends acceptance."""
    acc = 0
    for i, d in enumerate(draft):
        if g + i >= len(out) or d != out[g + i]:
            break
        if d in eog_ids and i + 1 < len(draft):
            break
        acc += 1
    return acc


def replay_llama_server(
    drafter: DSparkDrafter,
    feats: torch.Tensor,
    seq: torch.Tensor,
    prompt_len: int,
    n_predict: int,
    eog_ids: tuple[int, ...] = (),
    start: int = 0,
    p_min: float = 0.0,
    n_max: int | None = None,
) -> list[ReplayStep]:
    """The steps llama-server takes for a greedy request whose output is ``seq[prompt_len:]``.

    Mirrors tools/server/server-context.cpp: the first output token comes from the prefill
    (no draft); then each step drafts ``n_max`` tokens from the anchor at ``pos_next``, keeps
    ``min(n_max, n_remaining - 1)`` of them, accepts the leading ones equal to the output (an
    end-of-generation draft before the last one ends acceptance), and commits accepted + 1.
    With ``--spec-draft-p-min P`` > 0 a block is cut before the first position whose RAW
    confidence (the head's sigmoid, without specsim's STS temperatures) is below P.
    ``feats``/``seq`` are a teacher-forced pass over ``seq`` (``features.target_pass``).
    ``n_max``: the server's ``--spec-draft-n-max`` (default: the drafter's block size); a
    smaller one is drafted as llama.cpp does, with a block of ``n_max`` (:func:`with_block`).
    """
    if n_max is not None:
        drafter = with_block(drafter, n_max)
    n_max = drafter.cfg.block_size
    out = seq[prompt_len:].tolist()
    steps: list[ReplayStep] = []
    if len(out) < 2:
        return steps
    # draft every possible anchor once (a step's anchor depends on earlier acceptance)
    all_anchors = torch.arange(prompt_len, prompt_len + len(out) - 1)
    drafts = drafter.draft(feats, seq, all_anchors, start=start)
    tokens = drafts.tokens.tolist()
    keep = confidence_cut(drafts.raw_conf, p_min) if p_min > 0 else [n_max] * len(tokens)
    g = 1
    while g < len(out):
        remaining = n_predict - g
        n_draft = min(n_max, remaining - 1)
        if n_draft <= 0:
            break
        anchor = prompt_len + g - 1
        draft = tokens[anchor - prompt_len][: min(n_draft, keep[anchor - prompt_len])]
        acc = accepted_prefix(draft, out, g, eog_ids)
        steps.append(
            ReplayStep(anchor=anchor, drafted=len(draft), accepted=acc, draft=tuple(draft))
        )
        g += acc + 1
    return steps


@dataclass(frozen=True)
class ParityRow:
    """One request: what llama-server measured and what specsim predicts for it."""

    prompt_len: int
    output_len: int
    server_drafted: int
    server_accepted: int
    specsim_drafted: int
    specsim_accepted: int


def compare_with_llama_server(
    drafter: DSparkDrafter,
    target: Any,
    prompts: list[list[int]],
    draft_gguf: str | Path,
    target_gguf: str | Path,
    n_predict: int = 64,
    p_min: float = 0.0,
    temperature: float = 0.0,
    seed: int = 0,
    threads: int = 2,
    n_max: int | None = None,
) -> list[ParityRow]:
    """Serve ``draft_gguf`` on ``target_gguf`` with llama-server, send each prompt (token ids)
    once, and replay the same requests with specsim (``replay_llama_server`` over the server's
    own output tokens). Why: the check that a converted drafter drafts what specsim predicts;
    at temperature > 0 the output is the server's sample and the replay is still exact.
    ``n_max``: ``--spec-draft-n-max`` (default: the drafter's block size).
    """
    from specsim.record.features import target_pass
    from specsim.serve.llama_server import LlamaServer, ServerSpec

    n_max = drafter.cfg.block_size if n_max is None else n_max
    args = llama_server_args(draft_gguf, n_max, p_min=p_min)
    spec = ServerSpec(model=Path(target_gguf), args=(*args, "-t", str(threads)))
    answers = []
    with LlamaServer(spec) as srv:
        for p in prompts:
            req = {"prompt": p, "n_predict": n_predict, "temperature": temperature}
            req.update(cache_prompt=False, return_tokens=True, seed=seed)
            answers.append(srv.completion(req))
    rows = []
    for p, ans in zip(prompts, answers, strict=True):
        out, timings = list(ans["tokens"]), ans.get("timings", {})
        cfg = drafter.cfg
        s = target_pass(target, p, out, cfg.target_layer_ids, cfg.context_window)
        steps = replay_llama_server(
            drafter, s.feats, s.seq, len(p), n_predict, target.eos_ids, s.start, p_min, n_max
        )
        rows.append(
            ParityRow(
                prompt_len=len(p),
                output_len=len(out),
                server_drafted=int(timings.get("draft_n", 0)),
                server_accepted=int(timings.get("draft_n_accepted", 0)),
                specsim_drafted=sum(st.drafted for st in steps),
                specsim_accepted=sum(st.accepted for st in steps),
            )
        )
    return rows

"""Export a specsim DSpark drafter in the ``speculators`` format vLLM serves as ``method: dspark``.

Why a separate export: vLLM loads DSpark drafters through the ``speculators`` checkpoint format
(a ``config.json`` whose ``speculators_model_type`` is ``"dspark"``; vLLM's
``vllm/transformers_utils/configs/speculators/algos.py``, ``update_dspark``), whose conventions
differ from the DeepSpec layout specsim saves. Checked against speculators 0.9.0 (paths inside
its wheel):

- ``speculators/models/dspark/config.py`` (``DSparkSpeculatorConfig``) extends
  ``speculators/models/dflash/config.py``: ``transformer_layer_config`` (the draft's own Qwen3
  decoder shape), ``draft_vocab_size``, ``block_size``, ``aux_hidden_state_layer_ids``,
  ``mask_token_id``, ``sample_from_anchor``, ``markov_rank``, ``markov_head_type``,
  ``enable_confidence_head``, ``confidence_head_with_markov``; ``speculators/config.py``
  (``SpeculatorsConfig``, ``VerifierConfig``) and ``speculators/proposals/greedy.py`` for
  ``speculators_config``.
- Feature layers: speculators (and vLLM's aux-hidden-state capture) name a layer by its INPUT,
  ``hidden_states[i]``; specsim and DeepSpec by its output, ``hidden_states[i + 1]``. So
  ``aux_hidden_state_layer_ids = [i + 1 for i in target_layer_ids]``, as speculators' own
  converter does for DeepSpec/z-lab checkpoints (``speculators/convert/dflash/converter.py``)
  and vLLM undoes (``update_dflash``: ``target_layer_ids = [i - 1 for i in aux ids]``). vLLM
  records the input of layers ``0..n-1`` only, so aux id ``n`` (specsim id ``n - 1``) is refused.
- Block and context (``speculators/models/dflash/core.py`` ``_backbone_forward``,
  ``speculators/models/dflash/attention.py``): ``[anchor, mask x (block_size - 1)]``,
  non-causal inside the block, attending to every target position strictly before the anchor
  (no window unless ``layer_types`` asks for one), context K/V from ``hidden_norm(fc(feats))``
  through each layer's ``k_proj``/``v_proj`` and ``k_norm`` (no input norm), q/k RMSNorm per
  head before half-split RoPE (``speculators/models/dflash/model_definitions.py``). With
  ``sample_from_anchor=True`` slot 0 predicts the token after the anchor and a block yields
  ``block_size`` proposals (``speculative_tokens``). specsim's drafter computes exactly this
  when ``qk_norm`` is on and ``context_window`` covers the target's context: others are refused.
- Heads (``speculators/models/dspark/model_definitions.py``, ``core.py``): the ``vanilla``
  Markov head ``W2(W1[prev])`` with ``prev`` the previous block token (the anchor for slot 0),
  and the confidence head ``proj([h ; W1[prev]])`` on the final-norm output
  (``confidence_head_with_markov=True``). specsim's ``"linear"`` is the same ``vanilla`` head.
- Weights (``DFlashDraftModel``'s ``_keys_to_ignore_on_save``): the module names are
  specsim's own (``fc``, ``hidden_norm``, ``layers.N.*`` with ``q_norm``/``k_norm``, ``norm``,
  ``markov_head.markov_w1/w2``, ``confidence_head.proj``); ``embed_tokens``,
  ``verifier_lm_head`` and ``verifier_norm`` are never saved (the verifier's are used), and
  ``lm_head`` only for a reduced draft vocabulary (a full one shares the verifier's head, which
  specsim's frozen copy equals). A reduced vocabulary carries ``d2t`` as OFFSETS (target id =
  ``i + d2t[i]``) and ``t2d`` as a boolean mask over the target vocabulary
  (``speculators/train/vocab_mapping.py``), with draft ids in ascending target-id order
  (``speculators/model.py`` ``_load_verifier_weights`` builds the head as
  ``verifier_head[t2d]``): the export sorts the draft vocabulary, permuting ``lm_head`` and
  ``markov_w2`` rows with it, which changes no draft.

Not in the format: specsim's STS temperatures (``sts_temperatures``) calibrate the confidence
head, which vLLM's DSpark proposer does not use (fixed-length blocks). They ride along under the
extra ``specsim`` key, which speculators' config keeps and vLLM ignores.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from specsim.errors import SpecsimError
from specsim.record.dspark import DSparkConfig, DSparkDrafter
from specsim.record.dspark_export import layout_problems, text_config

SPECULATORS_VERSION = "0.9.0"  # the speculators release this format was checked against
ARCHITECTURE = "DSparkDraftModel"  # the class speculators' save_pretrained names


def speculators_problems(cfg: DSparkConfig, target_config: dict[str, Any]) -> list[str]:
    """Why vLLM's speculators DSpark would compute something else than this drafter (empty:
    it computes the same; the rules are llama.cpp's too, ``layout_problems``)."""
    return layout_problems(
        cfg, target_config, "speculators/vLLM",
        "speculators/models/dflash/model_definitions.py always applies q_norm/k_norm",
    )  # fmt: skip


def _layer_config(cfg: DSparkConfig, tc: dict[str, Any]) -> dict[str, Any]:
    """``transformer_layer_config``: the draft decoder as a full Qwen3 config (every key vLLM's
    ``DFlashQwen3Model`` reads, none left to defaults)."""
    n = cfg.num_hidden_layers
    return {
        "model_type": "qwen3",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": n,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": int(tc.get("max_position_embeddings") or 8192),
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"] * n,
        "tie_word_embeddings": False,
    }


def speculators_config(
    cfg: DSparkConfig, target_config: dict[str, Any], target_name: str | None
) -> dict[str, Any]:
    """config.json in the speculators 0.9.0 DSpark format (``DSparkSpeculatorConfig``).

    ``target_name`` is the verifier's Hugging Face id or path (``speculators_config.verifier``):
    what ``vllm serve <export>`` loads as the target and speculators loads embeddings from.
    """
    tc = text_config(target_config)
    rank = cfg.markov_rank
    return {
        "architectures": [ARCHITECTURE],
        "speculators_model_type": "dspark",
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "dspark",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": cfg.block_size,  # sample_from_anchor: every slot
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": target_name,
                "architectures": list(target_config.get("architectures") or []),
            },
        },
        "transformer_layer_config": _layer_config(cfg, tc),
        "draft_vocab_size": cfg.n_draft_vocab,
        "block_size": cfg.block_size,
        "target_hidden_size": int(tc["hidden_size"]),
        "aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids],
        "mask_token_id": cfg.mask_token_id,
        "sliding_window_non_causal": False,
        "sample_from_anchor": True,
        "markov_rank": rank,
        "markov_head_type": "vanilla",  # specsim's "linear" is the same head
        "enable_confidence_head": cfg.enable_confidence_head,
        "confidence_head_with_markov": rank > 0,
        "dtype": "float32",
        "specsim": {
            "sts_temperatures": None
            if cfg.sts_temperatures is None
            else list(cfg.sts_temperatures),
            "source_config": cfg.to_json(),
        },
    }


def speculators_state(drafter: DSparkDrafter) -> dict[str, torch.Tensor]:
    """The tensors a speculators ``DSparkDraftModel`` saves, from specsim's (fp32)."""
    cfg = drafter.cfg
    state = {
        k: (v.detach().float() if v.is_floating_point() else v.detach()).cpu()
        for k, v in drafter.state_dict().items()
    }
    d2t = state.pop("d2t").long()
    if cfg.markov_rank == 0:  # speculators builds no Markov head; its bias is zero here too
        state.pop("markov_head.markov_w1.weight")
        state.pop("markov_head.markov_w2.weight")
    if not cfg.enable_confidence_head:
        state.pop("confidence_head.proj.weight")
        state.pop("confidence_head.proj.bias")
    if cfg.draft_vocab_size is None:
        state.pop("lm_head.weight")  # speculators uses the verifier's head for a full vocabulary
    else:
        order = torch.argsort(d2t)  # draft ids in ascending target-id order, as t2d implies
        d2t = d2t[order]
        state["lm_head.weight"] = state["lm_head.weight"][order]
        if "markov_head.markov_w2.weight" in state:
            state["markov_head.markov_w2.weight"] = state["markov_head.markov_w2.weight"][order]
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[d2t] = True
        state["d2t"] = d2t - torch.arange(d2t.numel())  # offsets: target id = i + d2t[i]
        state["t2d"] = t2d
    return {k: v.contiguous() for k, v in state.items()}


def export_speculators(
    drafter: DSparkDrafter,
    out_dir: str | Path,
    target_dir_or_config: str | Path | dict[str, Any],
    force: bool = False,
    target_name: str | None = None,
) -> Path:
    """Write a speculators-format DSpark checkpoint (config.json + model.safetensors, fp32).

    ``target_dir_or_config``: the target's Hugging Face directory or its config dict.
    ``target_name`` (the verifier recorded in the config) defaults to that directory's absolute
    path; pass the Hub id (``HuggingFaceTB/SmolLM2-135M-Instruct``) for a checkpoint that will
    be served elsewhere. Refuses a drafter vLLM would run differently (``speculators_problems``).
    """
    from safetensors.torch import save_file

    if isinstance(target_dir_or_config, dict):
        target_config = target_dir_or_config
    else:
        tdir = Path(target_dir_or_config).expanduser()
        if not (tdir / "config.json").is_file():
            raise SpecsimError(
                f"{tdir} has no config.json; pass the target's Hugging Face directory "
                "(specsim.record.dspark_export.target_model_dir) or its config dict"
            )
        target_config = json.loads((tdir / "config.json").read_text())
        if target_name is None:
            target_name = str(tdir.resolve())
    cfg = drafter.cfg
    problems = speculators_problems(cfg, target_config)
    d2t = drafter.d2t.detach().cpu()
    if cfg.draft_vocab_size is not None and torch.unique(d2t).numel() != d2t.numel():
        problems.append(
            "d2t maps two draft ids to one target token: speculators' t2d mask cannot say "
            "which; rebuild the draft vocabulary without duplicates"
        )
    if problems:
        raise SpecsimError("vLLM cannot run this drafter as specsim does: " + "; ".join(problems))
    out = Path(out_dir)
    if out.exists() and not force:
        raise SpecsimError(f"{out} exists; pass force=True to overwrite it")
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(speculators_state(drafter), str(tmp / "model.safetensors"), {"format": "pt"})
    conf = speculators_config(cfg, target_config, target_name)
    (tmp / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out

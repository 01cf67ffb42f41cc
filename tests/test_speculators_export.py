"""specsim's DSpark drafter exported in the speculators format (vLLM ``method: dspark``).

Checked with the ``speculators`` package's own code (0.9.0): the config validates through its
``DSparkSpeculatorConfig``; the tensors are exactly those its ``DSparkDraftModel`` creates and
its ``save_pretrained`` writes; its ``from_pretrained`` loads the export (taking embeddings and
the full-vocabulary head from the target directory, as it does for any checkpoint) and its
forward gives specsim's step logits and confidences; the feature-layer ids it records are the
target hidden states specsim reads; a drafter vLLM would run differently is refused; and the
shipped v3 drafter exports and validates. The whole file skips where speculators is not
installed (the ``speculators`` extra, installed with ``--no-deps``: see pyproject.toml).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
from record_tiny import tiny_model, torch

from specsim.errors import SpecsimError
from specsim.record.dspark import (
    DSparkConfig,
    DSparkDrafter,
    config_for_target,
    init_from_target,
    load_drafter,
)
from specsim.record.features import target_pass
from specsim.record.models import Target
from specsim.record.speculators_export import (
    SPECULATORS_VERSION,
    export_speculators,
    speculators_config,
    speculators_problems,
    speculators_state,
)

if importlib.util.find_spec("speculators") is None:
    pytest.skip(
        "speculators is not installed (pip install --no-deps speculators==0.9.0)",
        allow_module_level=True,
    )

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_V3 = ROOT / "specsim" / "data" / "drafters" / "dspark-v3-b179c9523d0e"
# SmolLM2-135M-Instruct's config.json (the keys the export reads)
SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
    "tie_word_embeddings": True,
}
# verifier-owned tensors speculators' DSpark model creates but never saves
VERIFIER_OWNED = {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}


def _speculators() -> types.SimpleNamespace:
    """speculators' config and DSpark modules, imported WITHOUT ``speculators/__init__.py``.

    Why: that file imports every model and, through EAGLE-3's data pipeline, openai, datasets
    and hs-connectors, none of which the DSpark config and model need (nor are they installed
    with ``--no-deps``). The package is registered as a bare namespace over its installed
    directory, so ``speculators.config`` and ``speculators.models.dspark`` import as they are.
    """
    mod = sys.modules.get("speculators")
    if mod is None or not hasattr(mod, "SpeculatorModelConfig"):
        spec = importlib.util.find_spec("speculators")
        root = Path(spec.submodule_search_locations[0])
        pkg = types.ModuleType("speculators")
        pkg.__path__ = [str(root)]
        pkg.__file__ = spec.origin
        sys.modules["speculators"] = pkg
        config = importlib.import_module("speculators.config")
        for name in ("SpeculatorModelConfig", "SpeculatorsConfig", "VerifierConfig"):
            setattr(pkg, name, getattr(config, name))
        models = types.ModuleType("speculators.models")
        models.__path__ = [str(root / "models")]
        sys.modules["speculators.models"] = models
        pkg.SpeculatorModel = importlib.import_module("speculators.model").SpeculatorModel
        importlib.import_module("speculators.models.dspark")
        config.reload_schemas()
    return types.SimpleNamespace(
        base=importlib.import_module("speculators.config"),
        config=importlib.import_module("speculators.models.dspark.config"),
        core=importlib.import_module("speculators.models.dspark.core"),
    )


def _tiny(vocab=None, **kw):
    """A 1-layer drafter on the 4-layer tiny Llama target, every head non-trivial."""
    model = tiny_model(0)
    draft_vocab = None if vocab is None else int(vocab.numel())
    cfg = config_for_target(
        model.config, num_hidden_layers=1, markov_rank=8, block_size=4, draft_vocab_size=draft_vocab
    )
    cfg = DSparkConfig.from_json({**cfg.to_json(), **kw}) if kw else cfg
    d = DSparkDrafter(cfg)
    init_from_target(d, model, vocab)
    with torch.no_grad():  # so that a lost, transposed or mis-ordered weight shows
        d.fc.weight.normal_(std=0.3)
        d.markov_head.markov_w2.weight.normal_(std=2.0)
        d.confidence_head.proj.weight.normal_()
        for layer in d.layers:
            if layer.self_attn.q_norm is not None:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    return model, d.eval()


def _export(tmp_path: Path, vocab=None, **kw):
    model, d = _tiny(vocab, **kw)
    tdir = tmp_path / "target"
    model.save_pretrained(tdir)
    return model, d, export_speculators(d, tmp_path / "spec", tdir)


def _load(out: Path):
    """The export as speculators itself loads it: config class, then ``from_pretrained``
    (vocab mappings and verifier weights included), eager attention so it runs on a CPU."""
    sp = _speculators()
    conf = sp.base.SpeculatorModelConfig.from_pretrained(str(out))
    conf.transformer_layer_config._attn_implementation = "eager"
    return conf, sp.core.DSparkDraftModel.from_pretrained(str(out), config=conf).eval()


VOCABS = {
    "full": None,
    "reduced": torch.arange(0, 96, 2),  # every other token, ascending
    "unsorted": torch.randperm(96, generator=torch.Generator().manual_seed(0))[:40],
}


@pytest.mark.parametrize("vocab", VOCABS.values(), ids=VOCABS.keys())
def test_the_config_validates_through_speculators_own_class(tmp_path, vocab):
    sp = _speculators()
    model, d, out = _export(tmp_path, vocab)
    raw = json.loads((out / "config.json").read_text())
    conf = sp.base.SpeculatorModelConfig.from_dict(raw)
    assert type(conf) is sp.config.DSparkSpeculatorConfig
    assert conf.speculators_model_type == "dspark" and raw["speculators_version"] == "0.9.0"
    assert conf.transformer_layer_config.model_type == "qwen3"
    tl = conf.transformer_layer_config
    assert (tl.num_hidden_layers, tl.hidden_size, tl.vocab_size) == (1, 64, 96)
    assert tl.rope_parameters["rope_theta"] == d.cfg.rope_theta
    assert conf.aux_hidden_state_layer_ids == [i + 1 for i in d.cfg.target_layer_ids]
    assert conf.block_size == 4 and conf.sample_from_anchor is True
    assert conf.mask_token_id == d.cfg.mask_token_id and conf.markov_rank == 8
    assert conf.markov_head_type == "vanilla" and conf.confidence_head_with_markov is True
    assert conf.draft_vocab_size == (96 if vocab is None else vocab.numel())
    sc = conf.speculators_config
    assert sc.algorithm == "dspark" and sc.default_proposal_method == "greedy"
    assert sc.proposal_methods[0].speculative_tokens == 4  # every slot proposes a token
    assert sc.verifier.name_or_path == str((tmp_path / "target").resolve())
    assert sc.verifier.architectures == ["LlamaForCausalLM"]
    # what vLLM's speculators loader reads (vllm/transformers_utils/configs/speculators/
    # base.py and algos.py, update_dflash/update_dspark) is there, under those names
    assert isinstance(raw["transformer_layer_config"], dict)
    for key in ("aux_hidden_state_layer_ids", "mask_token_id", "draft_vocab_size"):
        assert raw[key] is not None
    # the dict the module builds is the file's, and it survives speculators' own to_dict
    target_config = json.loads((tmp_path / "target" / "config.json").read_text())
    assert speculators_config(d.cfg, target_config, sc.verifier.name_or_path) == raw
    assert conf.to_dict()["specsim"]["source_config"] == d.cfg.to_json()


@pytest.mark.parametrize("vocab", VOCABS.values(), ids=VOCABS.keys())
def test_the_weights_are_what_speculators_model_creates_and_saves(tmp_path, vocab):
    from safetensors.torch import load_file

    sp = _speculators()
    _, d, out = _export(tmp_path, vocab)
    conf = sp.base.SpeculatorModelConfig.from_pretrained(str(out))
    conf.transformer_layer_config._attn_implementation = "eager"
    fresh = sp.core.DSparkDraftModel(conf)
    want = {k: (tuple(v.shape), v.dtype) for k, v in fresh.state_dict().items()}
    for k in VERIFIER_OWNED:
        want.pop(k)
    if vocab is None:  # a full vocabulary uses the verifier's head; no mappings exist
        want.pop("lm_head.weight")
    state = load_file(str(out / "model.safetensors"))
    got = {k: (tuple(v.shape), v.dtype) for k, v in state.items()}
    assert got == want
    # speculators' own save_pretrained writes the same tensor names from the loaded export
    _, loaded = _load(out)
    loaded.save_pretrained(str(tmp_path / "resaved"))
    assert set(load_file(str(tmp_path / "resaved" / "model.safetensors"))) == set(state)


@pytest.mark.parametrize("vocab", VOCABS.values(), ids=VOCABS.keys())
def test_speculators_loads_the_export_and_computes_specsims_heads(tmp_path, vocab, monkeypatch):
    """Round trip through speculators: ``from_pretrained`` and its DSpark forward (the one it
    trains with, teacher-forced: slot k's Markov predecessor is the true previous token) give,
    at every anchor, specsim's step logits ``U_k + W2(W1[prev])`` and confidence logits."""
    sp = _speculators()
    model, d, out = _export(tmp_path, vocab)
    conf, m = _load(out)
    state = speculators_state(d)
    for k, v in m.state_dict().items():  # every saved tensor arrives unchanged
        if k in state:
            assert torch.equal(v, state[k]), k
    if vocab is not None:  # t2d order: speculators' verifier head rows ARE the drafter's rows
        assert torch.equal(m.verifier_lm_head.weight, m.lm_head.weight)
        d2t = state["d2t"] + torch.arange(state["d2t"].numel())
        assert torch.equal(d2t, torch.sort(d.d2t).values)
        assert torch.equal(torch.nonzero(state["t2d"]).squeeze(1), d2t)
    else:
        assert torch.equal(m.lm_head.weight, d.lm_head.weight)  # the target's (tied) head

    target = Target(model=model, tokenizer=None, name="tiny", sha256="0" * 64, device="cpu")
    prompt = list(range(5, 17))
    gen = model.generate(
        torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None
    )[0, len(prompt) :].tolist()
    s = target_pass(target, prompt, gen, d.cfg.target_layer_ids, d.cfg.context_window)
    with torch.no_grad():
        hs = model(s.seq[None], output_hidden_states=True).hidden_states
    # speculators' aux id j is hidden_states[j]: the very features specsim drafts from
    aux = torch.cat([hs[j][0] for j in conf.aux_hidden_state_layer_ids], -1)
    assert s.start == 0 and torch.equal(aux.half(), s.feats)

    seq, g = s.seq, d.cfg.block_size
    n = seq.numel() - g  # speculators anchors every position but the last block's
    seen = {}

    def capture(logits, targets, confidence_logits, *args, **kwargs):
        seen["logits"], seen["conf"] = logits, confidence_logits
        return torch.zeros(()), {}

    monkeypatch.setattr(sp.core, "compute_metrics", capture)
    with torch.no_grad():
        m(
            hidden_states=aux[None],
            input_ids=seq[None],
            loss_mask=torch.ones(1, seq.numel()),
            verifier_last_hidden_states=hs[-1],
            document_ids=torch.zeros(1, seq.numel(), dtype=torch.long),
            max_anchors=n,
        )
        anchors = torch.arange(n)
        h = d.backbone(aux, seq, anchors)
        logits, conf_logits = d.heads(h, seq[anchors[:, None] + torch.arange(g)])
    theirs = seen["logits"].view(n, g, -1)
    # compare over target ids: the export may order the draft vocabulary differently
    their_ids = state["d2t"] + torch.arange(state["d2t"].numel()) if vocab is not None else None
    our_ids = d.d2t
    if their_ids is not None:
        full = torch.full((n, g, 96), float("nan"))
        full[..., their_ids] = theirs
        theirs = full[..., our_ids]
    assert torch.allclose(theirs, logits, atol=1e-4), (theirs - logits).abs().max()
    assert torch.allclose(seen["conf"].view(n, g), conf_logits, atol=1e-4)


def test_a_drafter_vllm_would_run_differently_is_refused(tmp_path):
    model, d = _tiny(qk_norm=False, context_window=64, target_layer_ids=[1, 3])
    tdir = tmp_path / "target"
    model.save_pretrained(tdir)
    with pytest.raises(SpecsimError, match="qk_norm.*context_window.*target_layer_ids") as e:
        export_speculators(d, tmp_path / "spec", tdir)
    assert "\n" not in str(e.value) and "retrain" in str(e.value)
    assert not (tmp_path / "spec").exists()
    assert speculators_problems(d.cfg, {**model.config.to_dict(), "vocab_size": 97})[-1].startswith(
        "the drafter's hidden size / vocabulary"
    )
    _, dup = _tiny(torch.arange(0, 96, 2))
    with torch.no_grad():
        dup.d2t[1] = dup.d2t[0]
    with pytest.raises(SpecsimError, match="d2t maps two draft ids"):
        export_speculators(dup, tmp_path / "spec", tdir)
    _, ok = _tiny()
    export_speculators(ok, tmp_path / "spec", tdir)
    with pytest.raises(SpecsimError, match="exists"):
        export_speculators(ok, tmp_path / "spec", tdir)
    export_speculators(ok, tmp_path / "spec", tdir, force=True)
    with pytest.raises(SpecsimError, match="no config.json"):
        export_speculators(ok, tmp_path / "other", tmp_path)


def test_the_shipped_v3_drafter_exports_and_validates(tmp_path):
    from safetensors.torch import load_file

    sp = _speculators()
    d = load_drafter(SHIPPED_V3)
    name = "HuggingFaceTB/SmolLM2-135M-Instruct"
    out = export_speculators(d, tmp_path / "v3", SMOLLM2, target_name=name)
    raw = json.loads((out / "config.json").read_text())
    conf = sp.config.DSparkSpeculatorConfig.from_dict(raw)
    assert conf.speculators_config.verifier.name_or_path == name
    assert conf.aux_hidden_state_layer_ids == [2, 10, 20, 29]  # specsim's [1, 9, 19, 28] + 1
    assert (conf.block_size, conf.draft_vocab_size, conf.markov_rank) == (7, 8192, 64)
    assert conf.speculators_config.proposal_methods[0].speculative_tokens == 7
    assert conf.transformer_layer_config.max_position_embeddings == 8192
    assert raw["specsim"]["sts_temperatures"] == list(d.cfg.sts_temperatures)
    conf.transformer_layer_config._attn_implementation = "eager"
    with torch.device("meta"):  # shapes only: no 49k x 576 allocations
        fresh = sp.core.DSparkDraftModel(conf)
    want = {k: tuple(v.shape) for k, v in fresh.state_dict().items() if k not in VERIFIER_OWNED}
    state = load_file(str(out / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in state.items()} == want
    assert torch.equal(state["d2t"] + torch.arange(8192), d.d2t)  # already in ascending order
    assert torch.equal(state["markov_head.markov_w2.weight"], d.markov_head.markov_w2.weight)
    assert int(state["t2d"].sum()) == 8192 and SPECULATORS_VERSION == raw["speculators_version"]

"""The DSpark drafter: DeepSpec checkpoint layout round trip, context strictly before the anchor,
the Markov and confidence heads, and training that learns (tiny random targets, no downloads)."""

from __future__ import annotations

import json

import pytest
from record_tiny import tiny_model, torch

from specsim.errors import SpecsimError
from specsim.record.dspark import (
    DSparkDrafter,
    config_for_target,
    init_from_target,
    load_drafter,
    position_weights,
    save_drafter,
)
from specsim.record.features import target_pass
from specsim.record.models import Target
from specsim.record.train import TrainConfig, block_loss, choose_vocab, train

DEEPSPEC_WEIGHTS = [
    "fc.weight", "hidden_norm.weight", "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight", "layers.0.self_attn.q_norm.weight",
    "layers.0.self_attn.k_norm.weight", "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight", "norm.weight",
    "lm_head.weight", "markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
    "confidence_head.proj.weight",
]  # fmt: skip


def _setup(qk_norm=True, draft_vocab=None, seed=0):
    model = tiny_model(seed)
    cfg = config_for_target(
        model.config,
        num_hidden_layers=2,
        markov_rank=8,
        block_size=4,
        context_window=16,
        qk_norm=qk_norm,
        draft_vocab_size=draft_vocab,
    )
    target = Target(model=model, tokenizer=None, name="tiny", sha256="0" * 64, device="cpu")
    return model, cfg, target


def _sequences(target, cfg, n=6, out_len=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(n):
        prompt = torch.randint(3, 96, (8,), generator=g).tolist()
        out = target.model.generate(
            torch.tensor([prompt]), max_new_tokens=out_len, do_sample=False, eos_token_id=None
        )[0, 8:].tolist()
        seqs.append(
            target_pass(
                target, prompt, out, cfg.target_layer_ids, cfg.context_window, topk=8, category="x"
            )
        )
    return seqs


def test_checkpoint_round_trip_in_deepspec_layout(tmp_path):
    from safetensors.torch import load_file

    model, cfg, target = _setup(qk_norm=True, draft_vocab=64)
    seqs = _sequences(target, cfg, n=2)
    d = DSparkDrafter(cfg)
    init_from_target(d, model, choose_vocab(seqs, 64, 96))
    with torch.no_grad():  # make the heads non-trivial so a lost weight would show
        d.markov_head.markov_w2.weight.normal_()
        d.confidence_head.proj.weight.normal_()
    save_drafter(d, tmp_path / "ckpt")
    conf = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert conf["architectures"] == ["Qwen3DSparkModel"]
    for key in (
        "block_size",
        "num_hidden_layers",
        "target_layer_ids",
        "mask_token_id",
        "markov_rank",
        "markov_head_type",
        "enable_confidence_head",
    ):
        assert key in conf
    names = set(load_file(str(tmp_path / "ckpt" / "model.safetensors")))
    assert set(DEEPSPEC_WEIGHTS) <= names
    assert "embed.weight" not in names  # the target's embedding is bound, never saved
    back = load_drafter(tmp_path / "ckpt").bind(model.get_input_embeddings())
    s = seqs[0]
    anchors = torch.arange(s.prompt_len - 1, s.seq.numel() - 1)
    a, b = d.eval().draft(s.feats, s.seq, anchors), back.draft(s.feats, s.seq, anchors)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.conf, b.conf)
    assert set(a.tokens.unique().tolist()) <= set(d.d2t.tolist())  # reduced vocabulary
    with pytest.raises(SpecsimError, match="exists"):
        save_drafter(d, tmp_path / "ckpt")


def test_loads_a_released_style_checkpoint_with_model_prefix(tmp_path):
    from safetensors.torch import save_file

    model, cfg, _ = _setup(qk_norm=True)
    d = DSparkDrafter(cfg)
    state = {f"model.{k}": v for k, v in d.state_dict().items() if k != "d2t"}
    (tmp_path / "r").mkdir()
    save_file(state, str(tmp_path / "r" / "model.safetensors"))
    raw = cfg.to_json()
    raw.pop("draft_vocab_size")
    (tmp_path / "r" / "config.json").write_text(json.dumps(raw))
    back = load_drafter(tmp_path / "r")
    assert back.cfg.block_size == 4 and back.cfg.n_draft_vocab == 96
    (tmp_path / "bad").mkdir()
    save_file({"foo": torch.zeros(1)}, str(tmp_path / "bad" / "model.safetensors"))
    (tmp_path / "bad" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(SpecsimError, match="DSpark layout"):
        load_drafter(tmp_path / "bad")


def test_context_is_strictly_before_the_anchor():
    model, cfg, target = _setup(qk_norm=False)
    s = _sequences(target, cfg, n=1)[0]
    d = DSparkDrafter(cfg)
    init_from_target(d, model, None)
    with torch.no_grad():
        d.fc.weight.normal_(std=0.5)
    a = s.prompt_len + 5
    base = d.backbone(s.feats, s.seq, torch.tensor([a]), s.start)
    later = s.feats.clone()
    later[a - s.start :] = torch.randn_like(later[a - s.start :])  # anchor and after
    assert torch.equal(base, d.backbone(later, s.seq, torch.tensor([a]), s.start))
    earlier = s.feats.clone()
    earlier[a - 1 - s.start] += 3.0  # the position just before the anchor
    assert not torch.allclose(base, d.backbone(earlier, s.seq, torch.tensor([a]), s.start))
    # blocks of several anchors in one call equal blocks drafted one at a time
    many = d.backbone(s.feats, s.seq, torch.tensor([a - 3, a, a + 2]), s.start)
    assert torch.allclose(many[1], base[0], atol=1e-5)


def test_markov_head_conditions_each_step_on_the_previous_draft():
    model, cfg, target = _setup(qk_norm=False)
    s = _sequences(target, cfg, n=1)[0]
    d = DSparkDrafter(cfg)
    init_from_target(d, model, None)
    h = d.backbone(s.feats, s.seq, torch.tensor([s.prompt_len]), s.start)[:, 1]
    l1, c1 = d.heads(h, torch.tensor([5]))
    l2, _ = d.heads(h, torch.tensor([6]))
    assert torch.equal(l1, l2)  # W2 starts at zero: the plain parallel drafter
    with torch.no_grad():
        d.markov_head.markov_w2.weight.normal_()
    l1, _ = d.heads(h, torch.tensor([5]))
    l2, _ = d.heads(h, torch.tensor([6]))
    assert not torch.allclose(l1, l2)
    assert c1.shape == (1,)


def test_position_weights_follow_the_paper():
    w = position_weights(7)
    assert w[0] == 1.0 and torch.allclose(
        w[1:] / w[:-1], torch.full((6,), torch.exp(torch.tensor(-1 / 7)))
    )


def test_training_lowers_the_loss_and_raises_acceptance():
    model, cfg, target = _setup(qk_norm=False, draft_vocab=80)
    seqs = _sequences(target, cfg, n=6)
    d = DSparkDrafter(cfg)
    init_from_target(d, model, choose_vocab(seqs, 80, 96))
    t2d = d.t2d()
    anchors = torch.arange(seqs[0].prompt_len - 1, seqs[0].seq.numel() - 2)

    def loss_acc():
        with torch.no_grad():
            vals = [block_loss(d, s, anchors, t2d, 0.0) for s in seqs]
        return sum(float(v[0]) for v in vals), sum(v[1]["acc"] for v in vals)

    before, acc0 = loss_acc()
    train(
        d,
        seqs,
        TrainConfig(
            steps=60, seqs_per_step=3, anchors_per_seq=8, lr=3e-3, warmup=5, log_every=1000
        ),
        log=lambda m: None,
    )
    after, acc1 = loss_acc()
    assert after < 0.8 * before
    assert acc1 > acc0


def test_a_stopped_training_run_resumes_to_the_same_weights(tmp_path):
    """Killed after 9 steps and rerun, training ends bit-identical to one uninterrupted run:
    the saved state holds the weights, the optimiser, both RNGs, the step and the clock."""
    model, cfg, target = _setup(qk_norm=False, draft_vocab=80)
    seqs = _sequences(target, cfg, n=4)
    vocab = choose_vocab(seqs, 80, 96)
    tc = TrainConfig(
        steps=16, seqs_per_step=2, anchors_per_seq=4, lr=3e-3, warmup=3, log_every=3,
        checkpoint_minutes=0.0, eval_minutes=0.0,
    )  # fmt: skip

    def fresh():
        torch.manual_seed(0)
        d = DSparkDrafter(cfg)
        init_from_target(d, model, vocab)
        return d

    whole = fresh()
    hist, curve = train(whole, seqs, tc, log=lambda m: None, evaluate=lambda: {"tau": 1.0})
    assert [c["step"] for c in curve] == [0, 16] and len(hist) == 5

    class Stop(Exception):
        pass

    def die_at_step_9(msg):
        if msg.startswith("step=9 "):
            raise Stop

    state = tmp_path / "state.pt"
    first = fresh()
    with pytest.raises(Stop):
        train(first, seqs, tc, log=die_at_step_9, state_file=state)
    assert state.exists()  # saved after step 8 (every step here)
    resumed = fresh()
    msgs = []
    hist2, _ = train(resumed, seqs, tc, log=msgs.append, state_file=state)
    assert msgs[0].startswith("resumed from") and "at step 8" in msgs[0]
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert [h["step"] for h in hist2] == [h["step"] for h in hist]
    assert not any(m.startswith("warning") for m in msgs)
    again = fresh()  # the same state once finished: nothing is trained, and the log says so
    msgs = []
    train(again, seqs, tc, log=msgs.append, state_file=state)
    assert msgs[1].startswith("warning") and "already trained 16 steps" in msgs[1]
    for a, b in zip(resumed.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_a_checkpoint_saved_in_fp16_loads_as_the_same_rounded_drafter(tmp_path):
    model, cfg, target = _setup(draft_vocab=80)
    d = DSparkDrafter(cfg)
    init_from_target(d, model, torch.arange(80))
    with torch.no_grad():
        for p in d.parameters():
            p.copy_(p.to(torch.float16).float())
    save_drafter(d, tmp_path / "d", dtype=torch.float16)
    from safetensors.torch import load_file

    stored = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert stored["fc.weight"].dtype == torch.float16 and stored["d2t"].dtype == torch.long
    back = load_drafter(tmp_path / "d")
    for (name, a), b in zip(d.state_dict().items(), back.state_dict().values(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name

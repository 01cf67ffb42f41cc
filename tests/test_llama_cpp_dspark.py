"""specsim's DSpark drafter as llama.cpp's ``draft-dspark`` runs it (docs/llama-cpp-dspark.md).

Fast: new drafters default to llama.cpp's semantics, old checkpoints keep theirs, the DeepSpec
export (offset d2t, vanilla Markov head) loads back to the same drafts, a drafter llama.cpp
would run differently is refused, the llama-server replay, and the server wrapper (on a fake
server). Slow: export a tiny drafter, convert it with llama.cpp's converter and serve it with
llama-server on the SmolLM2 target; the server must load the draft and draft tokens.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from record_tiny import tiny_model, torch

from specsim.errors import SpecsimError
from specsim.record.dspark import (
    FULL_CONTEXT,
    DSparkConfig,
    DSparkDrafter,
    config_for_target,
    d2t_format,
    init_from_target,
    load_drafter,
    save_drafter,
)
from specsim.record.dspark_export import (
    export_deepspec,
    llama_cpp_problems,
    llama_server_args,
    replay_llama_server,
)
from specsim.record.features import target_pass
from specsim.record.models import Target
from specsim.serve.llama_server import LlamaServer, ServerSpec, find_llama_server

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "specsim" / "data" / "drafters" / "dspark-b179c9523d0e"


def _tiny(draft_vocab=None, **kw):
    model = tiny_model(0)
    cfg = config_for_target(
        model.config, num_hidden_layers=1, markov_rank=8, block_size=4, draft_vocab_size=draft_vocab
    )
    cfg = DSparkConfig.from_json({**cfg.to_json(), **kw}) if kw else cfg
    d = DSparkDrafter(cfg)
    vocab = torch.arange(0, 96, 2) if draft_vocab else None  # every other token
    init_from_target(d, model, vocab)
    with torch.no_grad():  # non-trivial heads, so a lost or mis-mapped weight shows
        d.fc.weight.normal_(std=0.3)
        d.markov_head.markov_w2.weight.normal_(std=2.0)
        d.confidence_head.proj.weight.normal_()
    return model, d.eval()


def _target_dir(model, path: Path) -> Path:
    model.save_pretrained(path)
    return path


def _seq(model, cfg, n_out=20):
    target = Target(model=model, tokenizer=None, name="tiny", sha256="0" * 64, device="cpu")
    prompt = list(range(5, 17))
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=n_out, do_sample=False, eos_token_id=None
    )[0, len(prompt) :].tolist()
    return target_pass(target, prompt, out, cfg.target_layer_ids, cfg.context_window)


@pytest.mark.slow
def test_new_drafters_default_to_llama_cpp_semantics():
    model = tiny_model(0)
    cfg = config_for_target(model.config)  # a Llama target: no q/k norms of its own
    assert cfg.qk_norm and cfg.markov_head_type == "vanilla"
    assert cfg.context_window == FULL_CONTEXT
    assert max(cfg.target_layer_ids) <= model.config.num_hidden_layers - 2
    tc = model.config.to_dict()
    assert llama_cpp_problems(cfg, tc) == []
    with pytest.raises(SpecsimError, match="target_layer_ids"):
        config_for_target(model.config, target_layer_ids=(1, 3))  # 3 = the last layer
    with pytest.raises(SpecsimError, match="markov_head_type"):
        config_for_target(model.config, markov_head_type="mlp")


def test_the_old_shipped_checkpoint_keeps_its_behaviour_and_is_refused_for_llama_cpp():
    raw = json.loads((SHIPPED / "config.json").read_text())
    cfg = DSparkConfig.from_json(raw)
    assert (cfg.qk_norm, cfg.context_window, cfg.markov_head_type) == (False, 192, "linear")
    assert d2t_format(raw) == "absolute"  # specsim wrote target ids before d2t_format existed
    assert d2t_format({"block_size": 7}) == "offset"  # a DeepSpec config: EAGLE-3 offsets
    tc = {"num_hidden_layers": 30, "max_position_embeddings": 8192}
    tc |= {"hidden_size": 576, "vocab_size": 49152}
    problems = " ".join(llama_cpp_problems(cfg, tc))
    assert "qk_norm" in problems and "context_window" in problems


def test_export_writes_what_llama_cpps_converter_reads_and_loads_back(tmp_path):
    from safetensors.torch import load_file

    model, d = _tiny(draft_vocab=48)
    tdir = _target_dir(model, tmp_path / "target")
    out = export_deepspec(d, tmp_path / "ds", tdir)
    conf = json.loads((out / "config.json").read_text())
    assert conf["architectures"] == ["Qwen3DSparkModel"]
    assert conf["markov_head_type"] == "vanilla" and conf["sample_from_anchor"] is True
    assert conf["max_position_embeddings"] == model.config.max_position_embeddings
    assert conf["draft_vocab_size"] == 48 and conf["qk_norm"] is True
    state = load_file(str(out / "model.safetensors"))
    assert torch.equal(state["d2t"] + torch.arange(48), d.d2t)  # offsets, as the converter adds
    assert all(v.dtype in (torch.float32, torch.int64) for v in state.values())
    assert "layers.0.self_attn.q_norm.weight" in state
    back = load_drafter(out).bind(model.get_input_embeddings())
    assert torch.equal(back.d2t, d.d2t)
    s = _seq(model, d.cfg)
    anchors = torch.arange(s.prompt_len - 1, s.seq.numel() - 1)
    a, b = d.draft(s.feats, s.seq, anchors), back.draft(s.feats, s.seq, anchors)
    assert torch.equal(a.tokens, b.tokens) and torch.allclose(a.raw_conf, b.raw_conf)
    # specsim's own save round-trips too, and says which d2t it wrote
    save_drafter(d, tmp_path / "own")
    assert json.loads((tmp_path / "own" / "config.json").read_text())["d2t_format"] == "absolute"
    assert torch.equal(load_drafter(tmp_path / "own").d2t, d.d2t)
    with pytest.raises(SpecsimError, match="exists"):
        export_deepspec(d, tmp_path / "ds", tdir)


def test_export_refuses_a_drafter_llama_cpp_would_run_differently(tmp_path):
    model, d = _tiny(qk_norm=False, context_window=64)
    tdir = _target_dir(model, tmp_path / "target")
    with pytest.raises(SpecsimError, match="qk_norm.*context_window"):
        export_deepspec(d, tmp_path / "ds", tdir)


def test_replay_follows_the_servers_greedy_loop():
    model, d = _tiny()
    s = _seq(model, d.cfg, n_out=20)
    p = s.prompt_len
    steps = replay_llama_server(d, s.feats, s.seq, p, n_predict=20, start=s.start)
    assert steps[0].anchor == p  # the prefill sampled output[0]: it anchors the first block
    for a, b in zip(steps, steps[1:], strict=False):
        assert b.anchor == a.anchor + a.accepted + 1
    last = steps[-1]
    assert last.anchor + last.accepted + 1 <= p + 20 - 1  # never drafts past n_predict - 1
    assert all(st.drafted == min(4, p + 18 - st.anchor) for st in steps)
    # a drafter whose blocks are the output itself is accepted in full
    out = s.seq[p:]

    class Oracle:
        cfg = d.cfg

        def draft(self, feats, seq, anchors, start=0):
            pad = torch.cat([out, torch.full((4,), -1)])
            rows = torch.stack([pad[a - p + 1 : a - p + 5] for a in anchors.tolist()])
            return type("D", (), {"tokens": rows})

    full = replay_llama_server(Oracle(), s.feats, s.seq, p, n_predict=20)
    assert [st.accepted for st in full] == [st.drafted for st in full]
    assert sum(st.accepted + 1 for st in full) == 20 - 1


def test_server_args_run_blocks_of_the_trained_size():
    args = llama_server_args("d.gguf", 7)
    assert args[args.index("--spec-draft-n-max") + 1] == "7"
    assert args[args.index("--spec-type") + 1] == "draft-dspark"
    assert args[args.index("--spec-draft-p-min") + 1] == "0"


FAKE_SERVER = textwrap.dedent(
    """
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(BaseHTTPRequestHandler):
        def _send(self, obj):
            body = json.dumps(obj).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body)
        def do_GET(self):
            self._send({"status": "ok"})
        def do_POST(self):
            n = int(self.headers["Content-Length"]); req = json.loads(self.rfile.read(n))
            self._send({"content": "x", "timings": {"draft_n": 3, "draft_n_accepted": 1},
                        "echo": req})
        def log_message(self, *a):
            print("request", *a, flush=True)
    print("fake llama-server listening", flush=True)
    HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def _fake_binary(tmp_path: Path, code: str) -> Path:
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\n{code}")
    exe.chmod(0o755)
    return exe


def test_llama_server_wrapper_starts_waits_answers_and_stops(tmp_path):
    spec = ServerSpec(model=tmp_path / "m.gguf", binary=_fake_binary(tmp_path, FAKE_SERVER))
    with LlamaServer(spec) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        ans = srv.completion({"prompt": [1, 2], "n_predict": 4})
        assert ans["timings"]["draft_n"] == 3 and ans["echo"]["n_predict"] == 4
        proc = srv.proc
        assert "listening" in srv.log_text()
    assert proc is not None and proc.poll() is not None  # stopped on exit
    assert not srv.log_path.exists()  # its temporary log is gone


def test_llama_server_wrapper_reports_a_server_that_dies(tmp_path):
    dying = _fake_binary(tmp_path, "print('error: unknown argument --bogus'); raise SystemExit(1)")
    with pytest.raises(SpecsimError, match="exited with code 1.*unknown argument"):
        LlamaServer(ServerSpec(model=tmp_path / "m.gguf", binary=dying)).start()


def test_a_missing_binary_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSIM_LLAMA_CPP_HOME", str(tmp_path / "nowhere"))
    monkeypatch.delenv("SPECSIM_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SpecsimError, match="install-llama-server.sh"):
        find_llama_server()


# ---- the real thing: llama.cpp converts and serves a specsim drafter --------------------------
@pytest.mark.slow
@pytest.mark.record
@pytest.mark.real_server(converter=True)
def test_llama_server_runs_a_specsim_drafter_on_smollm2(tmp_path):
    from specsim.record.dspark_export import convert_to_gguf, target_model_dir
    from specsim.record.models import load_target, prompt_ids, smollm2_gguf

    target = load_target("smollm2")
    cfg = config_for_target(target.model.config, num_hidden_layers=1, draft_vocab_size=1024)
    drafter = DSparkDrafter(cfg)
    init_from_target(drafter, target.model, torch.arange(1024))
    tdir = target_model_dir(target)
    ckpt = export_deepspec(drafter, tmp_path / "ckpt", tdir)
    gguf = convert_to_gguf(ckpt, tdir, tmp_path / "draft.gguf")
    prompt = prompt_ids(target.tokenizer, "Count from one to twenty.")
    spec = ServerSpec(
        model=smollm2_gguf(), args=(*llama_server_args(gguf, cfg.block_size), "-t", "2")
    )
    with LlamaServer(spec) as srv:
        req = {"prompt": prompt, "n_predict": 24, "temperature": 0, "return_tokens": True}
        ans = srv.completion(req)
        log = srv.log_text()
    assert "draft-dspark" in log
    drafted, accepted = ans["timings"]["draft_n"], ans["timings"]["draft_n_accepted"]
    assert drafted > 0, log[-3000:]
    assert len(ans["tokens"]) > 1
    # specsim predicts the server's counts from its own drafts (an arithmetic near-tie between
    # the Q4_1 target's features and specsim's fp32 copy may flip one acceptance)
    s = target_pass(target, prompt, ans["tokens"], cfg.target_layer_ids, cfg.context_window)
    steps = replay_llama_server(
        drafter.eval(), s.feats, s.seq, len(prompt), 24, target.eos_ids, start=s.start
    )
    pred = (sum(st.drafted for st in steps), sum(st.accepted for st in steps))
    close = pred == (drafted, accepted) or (pred[0] > 0 and abs(pred[1] - accepted) <= 1)
    assert close, f"llama-server drafted/accepted {drafted}/{accepted}, specsim predicts {pred}"

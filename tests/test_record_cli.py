"""``specsim record`` / ``profile`` / ``train-drafter`` end to end on a tiny Hugging Face model
directory (random weights, word-level tokenizer): real Parquet traces, resume, refusal to
overwrite, one-line errors; and the n-gram drafter's lookup table."""

from __future__ import annotations

import numpy as np
import pytest
from record_tiny import prompts_file, tiny_dir, torch

from specsim.cli import main
from specsim.record.ngram import lookup
from specsim.trace.io import read_trace


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_dir(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSIM_CACHE", str(tmp_path / "cache"))


def test_ngram_lookup_table():
    seq = np.array([5, 6, 7, 8, 5, 6, 7, 9, 5, 6])
    draft, conf = lookup(seq, 9, 3, 4)
    assert draft.tolist() == [7, 9, 5, 6]  # after the latest "5 6"
    assert conf.tolist() == [0.75, 0.5, 2 / 3, 2 / 3]  # votes of both earlier "5 6"
    draft, conf = lookup(seq, 1, 3, 4)
    assert draft.tolist() == [6, 6, 6, 6] and conf.max() < 0.05  # no match: low confidence


def test_record_writes_a_valid_greedy_trace(model_dir, tmp_path, capsys):
    prompts = prompts_file(tmp_path / "p.jsonl", 5)
    out = tmp_path / "t.parquet"
    args = [
        "record",
        "--target",
        str(model_dir),
        "--drafter",
        "ngram:2",
        "--prompts",
        str(prompts),
        "--category",
        "chat",
        "--out",
        str(out),
        "--max-new-tokens",
        "12",
        "--threads",
        "1",
    ]
    assert main(args) == 0
    tr = read_trace(out)
    assert tr.n_requests == 5 and tr.block_size == 7
    assert tr.meta["source"] == "recorded" and tr.meta["temperature"] == "0"
    assert tr.meta["drafter"] == "ngram:2" and "target_sha256" in tr.meta
    assert set(tr.category) == {"chat"}
    pos = np.concatenate([np.arange(n) for n in tr.output_len])
    assert np.all(tr.accept_len <= tr.output_len.repeat(tr.output_len) - 1 - pos)
    assert not (tmp_path / "t.parquet.partial").exists()
    capsys.readouterr()
    assert main(args) == 2  # refuses to overwrite without --force
    assert "--force" in capsys.readouterr().err


def test_record_resumes_after_an_interruption(model_dir, tmp_path, monkeypatch):
    from specsim.record import recorder

    prompts = prompts_file(tmp_path / "p.jsonl", 20)
    base = [
        "record",
        "--target",
        str(model_dir),
        "--drafter",
        "ngram",
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "10",
        "--threads",
        "1",
    ]
    assert main([*base, "--out", str(tmp_path / "full.parquet")]) == 0
    real = recorder.greedy_rows
    calls = {"n": 0}

    def dying(*a, **k):
        calls["n"] += 1
        if calls["n"] > 9:  # after the first chunk of 8 requests is safely on disk
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(recorder, "greedy_rows", dying)
    out = tmp_path / "resumed.parquet"
    assert main([*base, "--out", str(out)]) == 130
    assert not out.exists() and len(list((tmp_path / "resumed.parquet.partial").glob("chunk-*")))
    monkeypatch.setattr(recorder, "greedy_rows", real)
    assert main([*base, "--out", str(out)]) == 0
    a, b = read_trace(tmp_path / "full.parquet"), read_trace(out)
    assert np.array_equal(a.accept_len, b.accept_len) and np.array_equal(a.conf, b.conf)
    assert np.array_equal(a.draft_tokens, b.draft_tokens)


def test_record_at_temperature_one_records_accept_prob(model_dir, tmp_path):
    prompts = prompts_file(tmp_path / "p.jsonl", 2)
    out = tmp_path / "t1.parquet"
    assert (
        main(
            [
                "record",
                "--target",
                str(model_dir),
                "--drafter",
                "ngram",
                "--prompts",
                str(prompts),
                "--out",
                str(out),
                "--max-new-tokens",
                "8",
                "--temperature",
                "1",
                "--block-size",
                "3",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    tr = read_trace(out)
    assert tr.meta["temperature"] == "1" and tr.accept_prob is not None
    assert tr.accept_prob.shape == (tr.n_rows, 3)
    assert np.all((tr.accept_prob >= 0) & (tr.accept_prob <= 1))


def test_train_drafter_then_record_with_it(model_dir, tmp_path):
    prompts = prompts_file(tmp_path / "p.jsonl", 20)
    ckpt = tmp_path / "drafter"
    assert (
        main(
            [
                "train-drafter",
                "--target",
                str(model_dir),
                "--prompts",
                str(prompts),
                "--out",
                str(ckpt),
                "--max-new-tokens",
                "16",
                "--block-size",
                "4",
                "--layers",
                "1",
                "--draft-vocab",
                "64",
                "--markov-rank",
                "8",
                "--steps",
                "20",
                "--seqs-per-step",
                "2",
                "--anchors-per-seq",
                "4",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    assert (ckpt / "config.json").exists() and (ckpt / "training_report.json").exists()
    import json

    from safetensors.torch import load_file

    report = json.loads((ckpt / "training_report.json").read_text())
    curve = report["learning_curve"]  # held-out tau against training minutes, from step 0
    assert curve[0]["step"] == 0 and curve[-1]["step"] == report["steps"] == 20
    assert all(c["tau"] >= 1 and c["cpu_minutes"] >= 0 for c in curve)
    assert load_file(str(ckpt / "model.safetensors"))["fc.weight"].dtype == torch.float16
    out = tmp_path / "d.parquet"
    assert (
        main(
            [
                "record",
                "--target",
                str(model_dir),
                "--drafter",
                str(ckpt),
                "--prompts",
                str(prompts) + "[:3]",
                "--out",
                str(out),
                "--max-new-tokens",
                "10",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    tr = read_trace(out)
    assert tr.block_size == 4 and tr.meta["confidence"] == "sts"


def test_profile_writes_a_profile_the_simulator_reads(model_dir, tmp_path):
    from specsim.sim.cost.profiles import read_profile_csv

    out = tmp_path / "prof.csv"
    assert (
        main(
            [
                "profile",
                "--target",
                str(model_dir),
                "--out",
                str(out),
                "--batch-tokens",
                "1,8,16",
                "--contexts",
                "16,32",
                "--repeats",
                "2",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    model = read_profile_csv(out)
    assert model.batch_tokens.tolist() == [1, 8, 16] and model.is_2d
    assert np.all(model.step_ms > 0)


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    assert (
        main(
            [
                "record",
                "--target",
                str(tmp_path / "nope"),
                "--prompts",
                "gsm8k[:1]",
                "--out",
                str(tmp_path / "x.parquet"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--target" in err
    assert (
        main(
            [
                "record",
                "--prompts",
                str(tmp_path / "missing.jsonl"),
                "--out",
                str(tmp_path / "x.parquet"),
            ]
        )
        == 2
    )
    assert "not found" in capsys.readouterr().err
    assert torch is not None

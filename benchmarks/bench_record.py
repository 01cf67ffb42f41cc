"""Speed of the DSpark drafter at SmolLM2-135M size on one CPU thread (no model download).

Run: python benchmarks/bench_record.py
Targets (this project's 2-core CPU, one thread, idle machine):
- drafting every position of a 256-token output (256 blocks of 7): under 2 s;
- one training step (6 sequences x 12 anchors x 7 positions, draft vocabulary 8,192): under 1.5 s.
Measured figures are in traces/README.md.
"""

from __future__ import annotations

import time

import torch

from specsim.record.dspark import DSparkConfig, DSparkDrafter
from specsim.record.features import Sequence
from specsim.record.train import TrainConfig, train

torch.set_num_threads(1)
CFG = DSparkConfig(
    hidden_size=576,
    intermediate_size=1536,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    vocab_size=49152,
    num_hidden_layers=2,
    block_size=7,
    target_layer_ids=(1, 9, 19, 28),
    markov_rank=64,
    draft_vocab_size=8192,  # q/k norms and the whole context: what llama.cpp runs
)


def fake_sequence(g: torch.Generator, prompt: int = 120, out: int = 256) -> Sequence:
    n = prompt + out
    seq = torch.randint(0, 49152, (n,), generator=g)
    return Sequence(
        seq=seq,
        prompt_len=prompt,
        start=0,
        feats=torch.randn(n, 4 * 576, generator=g).half(),
        greedy=torch.cat([seq[1:], seq[:1]]),
        topk_ids=torch.randint(0, 49152, (n, 8), generator=g),
        topk_p=torch.full((n, 8), 0.1).half(),
    )


def main() -> None:
    g = torch.Generator().manual_seed(0)
    d = DSparkDrafter(CFG).bind(torch.nn.Embedding(49152, 576))
    d.d2t.copy_(torch.arange(8192))
    s = fake_sequence(g)
    anchors = torch.arange(s.prompt_len - 1, s.seq.numel() - 1)
    d.eval()
    d.draft(s.feats, s.seq, anchors[:8])
    t = time.perf_counter()
    d.draft(s.feats, s.seq, anchors)
    print(f"draft 256 positions: {time.perf_counter() - t:.2f} s")
    seqs = [fake_sequence(g, out=160) for _ in range(12)]
    t = time.perf_counter()
    train(
        d,
        seqs,
        TrainConfig(steps=5, seqs_per_step=6, anchors_per_seq=12, log_every=1000),
        log=lambda m: None,
    )
    print(f"training step: {(time.perf_counter() - t) / 5:.2f} s")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    main()

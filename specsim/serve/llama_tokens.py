"""Prompts as llama-server sees them: its own chat template and tokenizer.

Why token ids: ``specsim bench --api llama`` sends token-id prompts, so the prompt length the
simulator is given is the one the server prefills, exactly (the same text tokenized by another
tokenizer, or without the chat template, would differ by the template's tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

from specsim.serve.llama_server import LlamaServer


def chat_prompt_ids(server: LlamaServer, texts: Sequence[str]) -> list[list[int]]:
    """Each text as one user turn in the server's chat template (``/apply-template``), then
    tokenized with its special tokens parsed (``/tokenize``)."""
    out = []
    for text in texts:
        msg = {"messages": [{"role": "user", "content": text}]}
        prompt = server.post("/apply-template", msg)["prompt"]
        toks = server.post("/tokenize", {"content": prompt, "add_special": False,
                                         "parse_special": True})  # fmt: skip
        out.append([int(t) for t in toks["tokens"]])
    return out

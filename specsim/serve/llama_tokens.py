"""Prompts as llama-server sees them: its own chat template and tokenizer.

Why token ids: ``specsim bench --api llama`` sends token-id prompts, so the prompt length the
simulator is given is the one the server prefills, exactly (the same text tokenized by another
tokenizer, or without the chat template, would differ by the template's tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

from specsim.errors import SpecsimError
from specsim.serve.llama_server import LlamaServer
from specsim.serve.wire import as_token_id


def chat_prompt_ids(server: LlamaServer, texts: Sequence[str]) -> list[list[int]]:
    """Each text as one user turn in the server's chat template (``/apply-template``), then
    tokenized with its special tokens parsed (``/tokenize``)."""
    out = []
    for text in texts:
        msg = {"messages": [{"role": "user", "content": text}]}
        ans = server.post("/apply-template", msg)
        prompt = ans.get("prompt") if isinstance(ans, dict) else None
        if not isinstance(prompt, str):
            raise SpecsimError(
                f"llama-server /apply-template answered {str(ans)[:80]} (no text 'prompt'); "
                "is this llama.cpp's llama-server (build b4000 or later)?"
            )
        toks = server.post("/tokenize", {"content": prompt, "add_special": False,
                                         "parse_special": True})  # fmt: skip
        ids = toks.get("tokens") if isinstance(toks, dict) else None
        if not isinstance(ids, list) or not all(as_token_id(t) is not None for t in ids):
            raise SpecsimError(
                f"llama-server /tokenize answered {str(toks)[:80]}, not a list of token ids "
                "in 'tokens'; is this llama.cpp's llama-server?"
            )
        out.append([int(t) for t in ids])
    return out

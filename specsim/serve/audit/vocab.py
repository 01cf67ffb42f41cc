"""Tokens a server audit bans on both servers: those whose bytes are not UTF-8 on their own.

Why: llama-server (build 11434) streams a character split over several tokens (an emoji is
often three byte-level pieces) as one chunk whose ``tokens`` holds only the last piece; the
others are lost from the stream (the non-streamed answer has them all). An audit that scores
what it was streamed would then score a history the server never had. A sequence of tokens
that are each valid UTF-8 is always valid UTF-8, so banning the others (``logit_bias`` false,
sent to the audited server and to the reference alike) removes the problem; the law under test
is the model's with those tokens banned, the same on both sides. SmolLM2 has a few hundred.

The vocabulary is read from the reference's GGUF file with a small reader of the GGUF header
(the ``gguf`` package is a heavy dependency that only ``specsim.record`` may import).
"""

from __future__ import annotations

import struct
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

from specsim.errors import SpecsimError

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
_WANTED = ("tokenizer.ggml.model", "tokenizer.ggml.tokens")


MAX_DEPTH = 4  # arrays of arrays a GGUF header may nest (its tokenizer needs one level)


class _Bad(ValueError):
    """A GGUF header that is not one (a length past the file's end, nesting too deep)."""


def _string(f: BinaryIO, size: int) -> bytes:
    (n,) = struct.unpack("<Q", f.read(8))
    if n > size - f.tell():  # a length past the end of the file: not a string of it
        raise _Bad(f"a string of {n} bytes at offset {f.tell()}, past the end of the file")
    return f.read(n)


def _value(f: BinaryIO, kind: int, keep: bool, size: int, depth: int = 0) -> object:
    if kind == _STRING:
        return _string(f, size)
    if kind == _ARRAY:
        if depth >= MAX_DEPTH:
            raise _Bad(f"arrays nested deeper than {MAX_DEPTH}")
        sub, n = struct.unpack("<IQ", f.read(12))
        if sub in _SCALARS and not keep:
            f.seek(n * struct.calcsize("<" + _SCALARS[sub]), 1)
            return None
        if n > size - f.tell():  # every element takes at least a byte
            raise _Bad(f"an array of {n} elements, longer than the file")
        return [_value(f, sub, keep, size, depth + 1) for _ in range(n)]
    fmt = "<" + _SCALARS[kind]
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def gguf_vocab(path: str | Path) -> tuple[str, list[bytes]]:
    """The tokenizer kind (``gpt2``, ``llama``, ...) and the token strings of a GGUF file.

    Only a regular file is opened (a FIFO or device named by a server's /props would block or
    never end), and a malformed header (lengths past the end, deep nesting, keys that are not
    UTF-8, fields of the wrong type) is one line naming the file, not a crash."""
    found: dict[str, object] = {}
    p = Path(path)
    if not p.is_file():
        raise SpecsimError(f"{path} is not a regular file: cannot read its vocabulary (give "
                           "--reference-model GGUF, or --no-ban-fragments)")  # fmt: skip
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            if f.read(4) != b"GGUF":
                raise SpecsimError(f"{path} is not a GGUF file")
            _version, _tensors, n_kv = struct.unpack("<IQQ", f.read(20))
            for _ in range(n_kv):
                key = _string(f, size).decode()
                (kind,) = struct.unpack("<I", f.read(4))
                v = _value(f, kind, key in _WANTED, size)
                if key in _WANTED:
                    found[key] = v
                if len(found) == len(_WANTED):
                    break
    except (OSError, struct.error, KeyError, ValueError, OverflowError) as exc:
        raise SpecsimError(f"cannot read the vocabulary of {path} ({str(exc)[:120]})") from None
    if len(found) < len(_WANTED):
        raise SpecsimError(f"{path} has no tokenizer.ggml.tokens: cannot find fragment tokens")
    kind, tokens = found[_WANTED[0]], found[_WANTED[1]]
    if not isinstance(kind, bytes) or not isinstance(tokens, list):
        raise SpecsimError(f"{path}: tokenizer.ggml.model or .tokens is not of GGUF's types")
    if not all(isinstance(t, bytes) for t in tokens):
        raise SpecsimError(f"{path}: tokenizer.ggml.tokens is not a list of strings")
    return kind.decode(errors="replace"), list(tokens)  # type: ignore[arg-type]


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: printable stand-ins for the 256 bytes."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def piece_bytes(kind: str, token: bytes, decoder: dict[str, int] | None = None) -> bytes:
    """The bytes a token stands for in the text."""
    s = token.decode("utf-8", errors="replace")
    if kind == "gpt2":
        dec = decoder or _gpt2_byte_decoder()
        if all(ch in dec for ch in s):
            return bytes(dec[ch] for ch in s)
        return token
    if s.startswith("<0x") and s.endswith(">") and len(s) == 6:  # SentencePiece byte token
        return bytes([int(s[3:5], 16)])
    return s.replace("\u2581", " ").encode()


@lru_cache(maxsize=4)
def fragment_tokens(path: str) -> tuple[int, ...]:
    """Ids of the tokens whose bytes are not valid UTF-8 by themselves."""
    kind, tokens = gguf_vocab(path)
    dec = _gpt2_byte_decoder()
    out = []
    for i, t in enumerate(tokens):
        try:
            piece_bytes(kind, t, dec).decode("utf-8")
        except UnicodeDecodeError:
            out.append(i)
    return tuple(out)

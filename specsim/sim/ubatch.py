"""How llama.cpp splits one server step into micro-batches when each slot has its own KV stream.

Why it matters: llama-server started with ``-np N`` (N > 1) keeps one KV stream per slot
(``kv_unified = false``, its default then), and ``llama_kv_cache::init_batch`` then cuts every
``llama_decode`` batch with ``llama_batch_allocr::split_equal(n_ubatch, sequential=true)``
(llama.cpp b11434, src/llama-kv-cache.cpp and src/llama-batch.cpp). A micro-batch (ubatch)
holds only sequences with CONSECUTIVE ids (the server's slot ids), and the same number of
tokens of each. Every ubatch is a whole forward pass: on the 2-core CPU of
reports/llama-cpp-v4 a 1-token pass costs about 4.8 ms and 6 tokens in one pass about 14 (the
calibration steps, docs/llama-cpp.md). So three decoders in slots 0, 2 and 5 pay three forward
passes, the same three in slots 0, 1 and 2 one; and one request verifying 1 + 3 drafts pays one
pass, not the four that four one-token decoders in scattered slots pay. A step's price that
reads only the verified tokens gets both wrong.

The rule, as the loop of ``split_equal`` runs it over a batch whose tokens come slot by slot in
slot order (``update_slots``): a ubatch starts at the first slot with tokens left, takes every
following slot whose id is the previous one's plus one and that has tokens left, and takes from
each as many tokens as the fewest any of them has left; repeated until no token is left.
(``n_ubatch``, 512 by default, never binds a decode step of a few slots.)
"""

from __future__ import annotations

from collections.abc import Sequence


def ubatch_sizes(slots: Sequence[int], tokens: Sequence[int]) -> list[int]:
    """The token count of each micro-batch llama.cpp cuts a step into: ``slots`` the decoding
    slots' ids (distinct), ``tokens`` how many tokens each verifies (its sampled token and its
    drafts), in the same order."""
    pairs = sorted((int(s), int(t)) for s, t in zip(slots, tokens, strict=True) if t > 0)
    ids = [s for s, _ in pairs]
    left = [t for _, t in pairs]
    out: list[int] = []
    first = 0
    while first < len(left):
        if left[first] <= 0:
            first += 1
            continue
        end = first + 1
        while end < len(left) and left[end] > 0 and ids[end] == ids[end - 1] + 1:
            end += 1
        take = min(left[first:end])
        for i in range(first, end):
            left[i] -= take
        out.append(take * (end - first))
    return out


def decoder_passes(slots, lens) -> list[int]:  # noqa: ANN001 - numpy arrays
    """The passes of a simulated step's decoders: ``slots`` their slots, ``lens`` the drafts
    each verifies (None, or not one per decoder: none drafted); each verifies its anchor too."""
    n = len(slots)
    if lens is None or len(lens) != n:
        return ubatch_sizes(slots.tolist(), [1] * n)
    return ubatch_sizes(slots.tolist(), (lens + 1).tolist())


def pass_text(sizes: Sequence[int]) -> str:
    """A step's passes as a table cell (``"3 1"``): what a step table keeps of them."""
    return " ".join(str(int(n)) for n in sizes)


def pass_sizes(text: object) -> list[int]:
    """:func:`pass_text` read back (``""``: a step with no decoder; a missing cell, NaN or
    None, where a step's slots were not in the log: none known)."""
    if not isinstance(text, str):
        return []
    return [int(n) for n in text.split()]

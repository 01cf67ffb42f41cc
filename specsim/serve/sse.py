"""Server-sent events as OpenAI-compatible and llama.cpp servers stream them.

One reader for every client here (``specsim bench``, the server audit): each ``data:`` line is
one JSON object, ``data: [DONE]`` ends the stream (OpenAI), and anything else (comments,
blank keep-alive lines) is skipped. What a broken server can send is refused here, once, as a
:class:`StreamError` with a one-line reason: a ``data:`` line that is not a JSON object, and a
line longer than :data:`MAX_LINE_CHARS` (read piece by piece, so a server that never sends a
newline cannot make the client hold an unbounded line in memory).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

# A streamed event of either API is at most a few kilobytes (one token, its probabilities, the
# final timings); 16 Mi characters is far beyond any real one and still small in memory.
MAX_LINE_CHARS = 16 * 2**20


class StreamError(ValueError):
    """The server's event stream is not one an OpenAI-compatible or llama.cpp server sends
    (the message is one line, for a failed request's ``error``)."""


async def sse_lines(response: Any, limit: int | None = None) -> AsyncIterator[str]:
    """The text lines of an httpx streaming ``response`` (``\\n``, ``\\r\\n`` or ``\\r`` ends one),
    refusing one longer than ``limit`` characters (default :data:`MAX_LINE_CHARS`) as soon as
    that many have arrived."""
    limit = MAX_LINE_CHARS if limit is None else limit
    pending: list[str] = []
    size = 0
    async for text in response.aiter_text():
        # \n, \r\n and a lone \r each end a line (as httpx's own line reader); a \r\n split
        # over two chunks makes one extra blank line, which no reader here looks at
        parts = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        for part in parts[:-1]:
            if size + len(part) > limit:
                raise _too_long(limit)
            pending.append(part)
            line = "".join(pending)
            pending, size = [], 0
            yield line
        if parts[-1]:
            pending.append(parts[-1])
            size += len(parts[-1])
            if size > limit:
                raise _too_long(limit)
    if pending:
        yield "".join(pending)


def _too_long(limit: int) -> StreamError:
    return StreamError(
        f"the server sent a line longer than {limit:,} characters (no event is that long); "
        "it is not an event stream of generated tokens"
    )


async def sse_json(response: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an httpx streaming ``response``, in order, up to ``[DONE]``."""
    async for line in sse_lines(response):
        if not line.startswith("data:"):
            continue
        raw = line[5:].strip()
        if raw == "[DONE]":
            return
        try:
            data = json.loads(raw)
        except ValueError:
            raise StreamError(
                f"the server sent a data: line that is not JSON ({raw[:80]!r}); a stream cut "
                "mid-event or not a server-sent event stream"
            ) from None
        if not isinstance(data, dict):
            raise StreamError(
                f"the server sent a data: line that is not a JSON object ({raw[:80]!r})"
            )
        yield data

"""Server-sent events as OpenAI-compatible and llama.cpp servers stream them.

One reader for every client here (``specsim bench``, the server audit): each ``data:`` line is
one JSON payload, ``data: [DONE]`` ends the stream (OpenAI), and anything else (comments,
blank keep-alive lines) is skipped.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any


async def sse_json(response: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of an httpx streaming ``response``, in order, up to ``[DONE]``."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        raw = line[5:].strip()
        if raw == "[DONE]":
            return
        yield json.loads(raw)

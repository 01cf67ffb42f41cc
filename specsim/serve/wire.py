"""What a number in a server's JSON answer must be before specsim computes with it.

One rule for every client of a real server (``specsim bench``, the server audit, ``validate
--engine llama-server``): a token id is a JSON integer in llama.cpp's int32 range; a count
(tokens generated, drafted, accepted) is a whole number >= 0, an integral float allowed (some
servers send 3.0), never a bool, NaN, a string or a negative. Each returns None for a value
that is not one, so each caller words its own one-line error (which server, which endpoint).
"""

from __future__ import annotations

import math
from typing import Any

MAX_TOKEN_ID = 2**31 - 1  # llama.cpp's llama_token is int32: any larger id is not a token


def as_token_id(v: Any) -> int | None:
    """``v`` if it is a token id: an integer (not a bool, float or string) in [0, 2^31 - 1]."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOKEN_ID:
        return None
    return v


def as_count(v: Any, most: int | None = None) -> int | None:
    """``v`` as an int if it is a count: a whole number >= 0 (and <= ``most`` if given)."""
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        return None
    return v if most is None or v <= most else None

"""The per-trace-row table of survivals, confidences and acceptance the engine's hot loop
gathers every step (``row_table``). (Serving model v1's 2-D step time in plain Python floats
and its shifted step-time function were retired with it; they run at commit 77e1490.)"""

from __future__ import annotations

import weakref
import zlib

import numpy as np

# Per trace row, what a step of a survival-ranking policy reads, side by side in one float64
# row: the survivals (cumprod of the confidences in float64), the confidences and accept_len.
# One gather per step then fetches all three (a step touches R scattered rows: one memory
# fetch per row instead of three). Built once per confidence array and kept while it lives: a
# sweep replays one trace many times.
_ROW_TABLES: dict[int, tuple[int, np.ndarray]] = {}


def _fingerprint(*arrays: np.ndarray) -> int:
    """CRC32 of the arrays' bytes (~1 ms per 4 MB): a table built from writeable arrays since
    changed in place is rebuilt, not reused."""
    crc = 0
    for a in arrays:
        crc = zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"), crc)
    return crc


def row_table(conf: np.ndarray, accept_len: np.ndarray) -> np.ndarray:
    """(rows, 2 gamma + 1) float64: [survival | conf | accept_len]; exact (conf and accept_len
    convert back losslessly), cached per (live, unchanged) confidence array."""
    key = id(conf)
    # read-only arrays (read_trace's) cannot change in place: no need to look
    mutable = conf.flags.writeable or accept_len.flags.writeable
    crc = _fingerprint(conf, accept_len) if mutable else 0
    hit = _ROW_TABLES.get(key)
    if hit is not None and hit[0] == crc and hit[1].shape[0] == conf.shape[0]:
        return hit[1]
    table = np.concatenate(
        (
            np.cumprod(conf.astype(np.float64), axis=1),
            conf.astype(np.float64),
            accept_len.astype(np.float64)[:, None],
        ),
        axis=1,
    )
    if hit is None:
        weakref.finalize(conf, _ROW_TABLES.pop, key, None)
    _ROW_TABLES[key] = (crc, table)
    return table

"""The in-memory trace: flat numpy arrays plus per-request offsets.

Why flat arrays: the simulator looks up (request, position) millions of times; ``offsets[i] +
position`` indexes a row in O(1) with no pandas on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TRACE_VERSION = "1"

# Column names of trace format v1 (docs/trace-format.md).
REQUIRED_COLUMNS = (
    "request_id",
    "position",
    "prompt_len",
    "output_len",
    "draft_tokens",
    "confidence",
    "accept_len",
)
OPTIONAL_COLUMNS = ("category", "accept_prob", "arrival_s")
# Parquet key-value metadata keys (all values are strings).
META_KEYS = ("specsim.trace_version", "block_size", "temperature", "target", "drafter", "source")


@dataclass(frozen=True, eq=False)
class Trace:
    """A validated trace. Rows are ordered by request (in file order), then position.

    Row ``offsets[i] + n`` holds position ``n`` of request ``i``; ``offsets[-1]`` is the number of
    rows. ``conf[row, k-1]`` is the conditional confidence c_k of draft position k;
    ``accept_len[row]`` is how many leading drafts the target accepts under full verification.
    """

    request_ids: np.ndarray  # (N,) int64 or object (strings)
    prompt_len: np.ndarray  # (N,) int32
    output_len: np.ndarray  # (N,) int32
    offsets: np.ndarray  # (N+1,) int64
    conf: np.ndarray  # (rows, gamma) float32, conditional confidences c_k in [0, 1]
    accept_len: np.ndarray  # (rows,) int16 in [0, gamma]
    draft_tokens: np.ndarray | None = None  # (rows, gamma) int32
    accept_prob: np.ndarray | None = None  # (rows, gamma) float32, min(1, p/q)
    category: np.ndarray | None = None  # (N,) object (str)
    arrival_s: np.ndarray | None = None  # (N,) float64
    meta: dict[str, str] = field(default_factory=dict)
    path: str = ""  # where it was read from, for error messages

    @property
    def block_size(self) -> int:
        """gamma: draft tokens per block."""
        return int(self.conf.shape[1])

    @property
    def n_requests(self) -> int:
        return int(self.output_len.shape[0])

    @property
    def n_rows(self) -> int:
        return int(self.offsets[-1])

    def survival(self) -> np.ndarray:
        """a_k = prod_{i<=k} c_i for every row: (rows, gamma) float64."""
        return np.cumprod(self.conf.astype(np.float64), axis=1)

    def select(self, idx: np.ndarray) -> Trace:
        """A new Trace holding requests ``idx`` (in that order)."""
        idx = np.asarray(idx, dtype=np.int64)
        lens = self.output_len[idx].astype(np.int64)
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        rows = (
            np.concatenate([np.arange(self.offsets[i], self.offsets[i + 1]) for i in idx])
            if len(idx)
            else np.zeros(0, dtype=np.int64)
        )

        def take_rows(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[rows]

        def take_req(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[idx]

        return Trace(
            request_ids=self.request_ids[idx],
            prompt_len=self.prompt_len[idx],
            output_len=self.output_len[idx],
            offsets=offsets,
            conf=self.conf[rows],
            accept_len=self.accept_len[rows],
            draft_tokens=take_rows(self.draft_tokens),
            accept_prob=take_rows(self.accept_prob),
            category=take_req(self.category),
            arrival_s=take_req(self.arrival_s),
            meta=dict(self.meta),
            path=self.path,
        )

    def with_conf(self, conf: np.ndarray) -> Trace:
        """The same trace with other confidences (for example after STS calibration)."""
        assert conf.shape == self.conf.shape
        from dataclasses import replace

        return replace(self, conf=conf.astype(np.float32))

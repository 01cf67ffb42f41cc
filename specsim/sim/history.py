"""What a policy that learns online may see: the verification history the engine keeps.

Counts of reached and accepted drafts by request class (the trace's category), draft position
and confidence bin (``HIST_BINS`` equal bins of [0, 1]), from steps that ENDED before the
decision was made: under ZOS, whose decision for step t runs during step t-1, the outcomes of
step t-1 are withheld too. A mixin of :class:`specsim.sim.serving.Engine`.
"""

from __future__ import annotations

import numpy as np

HIST_BINS = 20
# Up to this many requests a step's verification outcomes are counted in plain Python.
_HIST_PY_MAX_R = 4


class History:
    """The verification history of :class:`specsim.sim.serving.Engine` (a mixin)."""

    def _init_hist(self) -> None:
        """Class of every trace row, and empty (class, position, bin, [reached, accepted])."""
        tr = self.trace
        cats = tr.category if tr.category is not None else np.zeros(tr.n_requests, object)
        _, cls = np.unique(cats.astype(str), return_inverse=True)
        self.row_class = np.repeat(cls.astype(np.int64), np.diff(self.offsets))
        shape = (int(cls.max()) + 1 if cls.size else 1, self.gamma, HIST_BINS, 2)
        self.hist = np.zeros(shape, dtype=np.float64)  # what decisions may see
        # the last step's outcomes (ZOS: not seen yet), as the flat cells they add one to
        self.hist_pending = np.zeros(0, dtype=np.int64)
        self.hist_k = np.arange(self.gamma)

    def _hist_add(self, rows: np.ndarray, conf: np.ndarray, lens, a_ok) -> None:
        """Count this step's outcomes: draft k (0-based) of a request was reached iff
        k <= a_ok and k < lens, and accepted iff k < a_ok."""
        gamma = self.gamma
        if rows.shape[0] <= _HIST_PY_MAX_R:
            cells = self._hist_cells_py(rows, conf, lens, a_ok)
            if cells is not None:
                flat = self.hist.reshape(-1)
                if self.policy.zos:
                    for c in self.hist_pending:
                        flat[c] += 1.0
                    self.hist_pending = cells
                else:
                    for c in cells:
                        flat[c] += 1.0
                return
        k = self.hist_k
        reached = k < np.minimum(a_ok + 1, lens)[:, None]
        accepted = k < a_ok[:, None]
        b = np.minimum((conf.astype(np.float64) * HIST_BINS).astype(np.int64), HIST_BINS - 1)
        b = np.maximum(b, 0)
        cell = ((self.row_class[rows][:, None] * gamma + k) * HIST_BINS + b) * 2
        # one per reached draft, one per accepted (the cell next to it): whole counts, exact
        # in float64 whatever the order they are added in
        cells = np.concatenate((cell[reached], cell[accepted] + 1))
        flat = self.hist.reshape(-1)  # a view: hist is contiguous
        if self.policy.zos:  # the run-ahead decision of the next step cannot see this step yet
            np.add.at(flat, np.asarray(self.hist_pending, dtype=np.int64), 1.0)
            self.hist_pending = cells
        else:
            np.add.at(flat, cells, 1.0)

    def _hist_cells_py(self, rows, conf, lens, a_ok) -> list[int] | None:
        """``_hist_add``'s cells for a few requests in plain Python (a dozen numpy calls cost
        more than the whole loop): the same bins (int() truncates as astype does), the same
        cells. None for a confidence int() cannot take (NaN): the array path then."""
        gamma = self.gamma
        cls = self.row_class[rows].tolist()
        cells: list[int] = []
        try:
            for c, cf, ln, a in zip(cls, conf.tolist(), lens.tolist(), a_ok.tolist(), strict=True):
                base = c * gamma
                for k in range(min(a + 1, ln)):
                    b = int(float(cf[k]) * HIST_BINS)
                    b = 0 if b < 0 else HIST_BINS - 1 if b > HIST_BINS - 1 else b
                    cell = ((base + k) * HIST_BINS + b) * 2
                    cells.append(cell)
                    if k < a:
                        cells.append(cell + 1)
        except (ValueError, OverflowError):
            return None
        return cells

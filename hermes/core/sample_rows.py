"""A FIFO-capped table of float rows, kept in one numpy array.

The profiler (:mod:`hermes.core.profiler`) keeps, for every unit of an app, the features of
its latest ``MAX_SAMPLES`` invocations with the visit index (a row of six), and for every
(upstream -> unit) pair the latest ``MAX_SAMPLES`` joined rows (ten). As a ``deque`` of
tuples of Python floats a row of six took ~240 bytes and a row of ten ~370 (a tuple, a float
object per value, the deque's pointer); here it takes 8 bytes a value. A gateway learning
many apps holds these tables for each of them, filled to their caps as the apps' runs reach
``MAX_SAMPLES``: ~0.5 MiB of each app of agent traffic (a unit's and an edge's table each),
~25 MiB with 50 programs, still growing after 100,000 requests (``hermes bench soak
--agents``, docs/performance.md).

Rows come back oldest first, with the values they went in with (float64 holds a float, and
an integer below 2**53, exactly): a profiler keeps learning the same graph as with a deque.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np


class SampleRows:
    """The newest ``cap`` rows of ``width`` floats, like ``deque(maxlen=cap)`` of tuples.

    The array grows by doubling up to ``cap`` rows (a unit seen a few times holds a few
    rows), then the oldest row is overwritten by the next."""

    __slots__ = ("width", "cap", "_a", "_start", "_n")

    def __init__(self, width: int, cap: int, rows: Iterable[Sequence[float]] = ()) -> None:
        if width < 1:
            raise ValueError(f"SampleRows width must be >= 1, got {width}")
        if cap < 1:
            raise ValueError(f"SampleRows cap must be >= 1, got {cap}")
        self.width = width
        self.cap = cap
        self._a = np.empty((0, width))
        self._start = 0  # the oldest row, once the table is full
        self._n = 0
        for row in rows:
            self.append(row)

    def __len__(self) -> int:
        return self._n

    def append(self, row: Sequence[float]) -> None:
        """Add ``row`` (``width`` numbers); when full, the oldest row is dropped."""
        if len(row) != self.width:
            raise ValueError(f"a row of {len(row)} values in a table of {self.width}")
        a, n = self._a, self._n
        if n < a.shape[0]:  # room left (not full yet: the rows start at 0)
            a[n] = row
            self._n = n + 1
        elif a.shape[0] < self.cap:
            grown = np.empty((min(self.cap, max(16, 2 * a.shape[0])), self.width))
            grown[:n] = a[:n]
            grown[n] = row
            self._a = grown
            self._n = n + 1
        else:
            a[self._start] = row
            self._start = (self._start + 1) % self.cap

    def array(self) -> np.ndarray:
        """The rows, oldest first, as a new ``(len, width)`` float64 array."""
        a, s, n = self._a, self._start, self._n
        if s == 0:
            return a[:n].copy()
        return np.concatenate((a[s:n], a[:s]))

    def __iter__(self) -> Iterator[tuple[float, ...]]:
        """The rows, oldest first, as tuples of Python floats."""
        return iter([tuple(r) for r in self.array().tolist()])

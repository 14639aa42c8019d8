"""The one place that orders queued work by a policy's key.

Every queue in Hermes (an engine's waiting queue, a tool server's queue, a HermesLet's window)
is a :class:`KeyedQueue`: a priority queue of items keyed by
``policy.request_key(run, req, now)`` (lower is served first) that supports rank changes.
A run's rank changes while its requests wait (Gittins refreshes at bucket boundaries and unit
ends), so keys must be updatable in place; ``rekey`` and ``rekey_run`` do that in
``O(log n)`` per item with a lazily-invalidated binary heap (``heapq``).

The queue stores keys that the caller computes; :meth:`KeyedQueue.push` and ``rekey`` take the
key explicitly, so the queue itself never calls a policy, never reads the clock and can be used
by the simulator (virtual time) and the live runtime (wall-clock time) alike.
:func:`policy_key` is the helper both drivers use to compute a key (:func:`prewarm_key` that of
a prewarm request).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from hermes.core.state import RequestView, RunState

T = TypeVar("T")
Key = tuple[float, ...]


def policy_key(policy: object, run: RunState, req: RequestView, now: float) -> Key:
    """The sort key of ``req`` (of ``run``) under ``policy``: ``policy.request_key(...)``."""
    return tuple(policy.request_key(run, req, now))  # type: ignore[attr-defined]


def prewarm_key(policy: object, run: RunState, unit: str, now: float, seq: int = 0) -> Key:
    """The queue key of a KV-prefix prewarm request for ``unit`` of ``run``: the key the policy
    gives the run's own request for that unit arriving ``now``. Both drivers queue a prewarm
    with it (the simulated engine's waiting queue, the HermesLet's window), so that it runs
    right before the unit's request instead of jumping a busy engine's queue."""
    view = RequestView(request_id=f"{run.run_id}/prewarm", run_id=run.run_id, unit=unit,
                       arrival=now, seq=seq)
    return policy_key(policy, run, view, now)


@dataclass(slots=True)
class _Entry(Generic[T]):
    key: Key
    tie: int  # push order: FIFO among equal keys, kept across rekeys
    version: int  # heap tuples with another version are stale
    item_id: Hashable
    run_id: str | None
    item: T


@dataclass(slots=True)
class KeyedQueue(Generic[T]):
    """A priority queue of items with updatable keys; lowest key first, FIFO on equal keys.

    Items are identified by ``item_id`` (unique in the queue) and optionally grouped by
    ``run_id`` so that all of a run's queued items can be re-keyed when its rank changes.
    """

    _heap: list[tuple[Key, int, int, Hashable]] = field(default_factory=list)
    _entries: dict[Hashable, _Entry[T]] = field(default_factory=dict)
    _by_run: dict[str, set[Hashable]] = field(default_factory=dict)
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __contains__(self, item_id: Hashable) -> bool:
        return item_id in self._entries

    def push(self, item_id: Hashable, item: T, key: Key, run_id: str | None = None) -> None:
        """Add ``item`` with ``key``; an existing ``item_id`` is replaced."""
        if item_id in self._entries:
            self.remove(item_id)
        seq = next(self._counter)
        self._entries[item_id] = _Entry(key, seq, seq, item_id, run_id, item)
        if run_id is not None:
            self._by_run.setdefault(run_id, set()).add(item_id)
        heapq.heappush(self._heap, (key, seq, seq, item_id))

    def _valid(self, top: tuple[Key, int, int, Hashable]) -> bool:
        e = self._entries.get(top[3])
        return e is not None and e.version == top[2]

    def _clean(self) -> None:
        heap = self._heap
        while heap and not self._valid(heap[0]):
            heapq.heappop(heap)

    def peek(self) -> T | None:
        """The lowest-key item, or ``None`` when empty."""
        self._clean()
        return self._entries[self._heap[0][3]].item if self._heap else None

    def peek_key(self) -> Key | None:
        self._clean()
        return self._heap[0][0] if self._heap else None

    def pop(self) -> T:
        """Remove and return the lowest-key item (``IndexError`` when empty)."""
        self._clean()
        if not self._heap:
            raise IndexError("pop from an empty KeyedQueue")
        _, _, _, item_id = heapq.heappop(self._heap)
        return self._drop(item_id).item

    def pop_tie(self) -> tuple[T, int]:
        """:meth:`pop` that also returns the item's FIFO tie, for :meth:`restore`."""
        self._clean()
        if not self._heap:
            raise IndexError("pop from an empty KeyedQueue")
        _, _, _, item_id = heapq.heappop(self._heap)
        e = self._drop(item_id)
        return e.item, e.tie

    def restore(self, item_id: Hashable, item: T, key: Key, run_id: str | None, tie: int) -> None:
        """Put back an item taken with :meth:`pop_tie` at its old place among equal keys
        (a skipped request keeps its queue position)."""
        if item_id in self._entries:
            self.remove(item_id)
        ver = next(self._counter)
        self._entries[item_id] = _Entry(key, tie, ver, item_id, run_id, item)
        if run_id is not None:
            self._by_run.setdefault(run_id, set()).add(item_id)
        heapq.heappush(self._heap, (key, tie, ver, item_id))

    def remove(self, item_id: Hashable) -> T | None:
        """Remove an item by id (lazy in the heap); returns it, or ``None`` if absent."""
        if item_id not in self._entries:
            return None
        return self._drop(item_id).item

    def _drop(self, item_id: Hashable) -> _Entry[T]:
        e = self._entries.pop(item_id)
        if e.run_id is not None:
            ids = self._by_run.get(e.run_id)
            if ids is not None:
                ids.discard(item_id)
                if not ids:
                    del self._by_run[e.run_id]
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self._entries):
            self._compact()
        return e

    def _compact(self) -> None:
        self._heap = [t for t in self._heap if self._valid(t)]
        heapq.heapify(self._heap)

    def head(self, n: int) -> list[T]:
        """The ``n`` lowest-key items in queue order (lowest first; FIFO on equal keys),
        without removing them: the requests a driver will release next."""
        out: list[T] = []
        heap = self._heap
        if n <= 0 or not heap:
            return out
        # best-first walk down the heap from its root: O(n log n) nodes visited (plus the
        # stale ones among them), not the whole queue; drivers ask after every release
        frontier = [(heap[0], 0)]
        while frontier and len(out) < n:
            top, i = heapq.heappop(frontier)
            if self._valid(top):
                out.append(self._entries[top[3]].item)
            for c in (2 * i + 1, 2 * i + 2):
                if c < len(heap):
                    heapq.heappush(frontier, (heap[c], c))
        return out

    def key_of(self, item_id: Hashable) -> Key | None:
        e = self._entries.get(item_id)
        return e.key if e is not None else None

    def rekey(self, item_id: Hashable, key: Key) -> None:
        """Change the key of a queued item (no-op if absent or unchanged)."""
        e = self._entries.get(item_id)
        if e is None or e.key == key:
            return
        e.key = key
        e.version = next(self._counter)
        heapq.heappush(self._heap, (key, e.tie, e.version, item_id))

    def run_items(self, run_id: str) -> list[tuple[Hashable, T]]:
        """The queued ``(item_id, item)`` pairs of one run."""
        return [(i, self._entries[i].item) for i in self._by_run.get(run_id, ())]

    def rekey_run(self, run_id: str, key_of_item: Callable[[T], Key]) -> int:
        """Re-key every queued item of ``run_id`` with ``key_of_item(item) -> key``."""
        ids = list(self._by_run.get(run_id, ()))
        for i in ids:
            self.rekey(i, key_of_item(self._entries[i].item))
        return len(ids)

    def rekey_all(self, key_of_item: Callable[[T], Key]) -> None:
        """Re-key every item (e.g. after a global rank refresh) and rebuild the heap."""
        heap = []
        for e in self._entries.values():
            e.key = key_of_item(e.item)
            heap.append((e.key, e.tie, e.version, e.item_id))
        heapq.heapify(heap)
        self._heap = heap

    def ordered(self) -> Iterator[T]:
        """Items in key order (a sorted snapshot; O(n log n))."""
        live = sorted((e.key, e.tie, e.item_id) for e in self._entries.values())
        return (self._entries[i].item for _, _, i in live)

    def items(self) -> Iterator[T]:
        """Items in no particular order."""
        return (e.item for e in self._entries.values())

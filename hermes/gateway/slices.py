"""Batches of event-loop work done a slice at a time, so that no request waits for a batch.

Some work arrives in batches though each item is small: the run resolver's idle sweep closes
every inferred run idle past its app's figure at once (every ``scheduler.rekey_interval_s``),
and an edge's ``closed`` message carries every run its sweep closed. Finishing one run
(history entry, durable write, learning, metrics, prewarm bookkeeping) costs ~0.1-0.2 ms;
at 1,000 header-less requests a second a sweep finishes ~200 runs, and done in one callback
that held the event loop for 20-60 ms every half second: the p99 of every request in
flight (``hermes bench gateway``, issue 36's c32 rows).

:class:`SlicedQueue` runs the items in slices of at most :data:`SLICE_S` of the loop's time,
each slice a separate callback (``loop.call_soon``: the loop polls its sockets between two
slices, so requests that arrived meanwhile are read and answered in between). The total work
is the same; what changes is how long anything else waits behind it. Items are processed in
the order given; an item whose work raises is logged and the rest go on.

Slicing must not starve the work when the loop is saturated: the active scheduler reads
every message queued on its sockets in one callback, so at its limit a loop iteration lasts
tens of milliseconds and a 2 ms slice per iteration finished ~130 of the 4,000 runs a second
it closed (measured, ``run_scheduler_rate`` one-turn runs at 4,000 calls/s). Once the oldest
item has waited more than :data:`MAX_WAIT_S`, a slice may run as long as the rest of the
loop ran since the previous slice: the queue gets half the loop until it catches up, and no
slice is longer than the loop's other work already made an iteration. (Draining the backlog
at once instead brought back a stall: the backlog that built up behind 2 ms slices at c32
after a long history, drained in one go, held the loop 1.4 s, ``hermes bench gateway``.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

log = logging.getLogger("hermes.gateway.slices")

T = TypeVar("T")

#: the most loop time one slice takes before it yields (one item may overrun it)
SLICE_S = 0.002
#: once the oldest item has waited longer than this (seconds), a slice takes as much of the
#: loop as the rest of the loop took since the previous slice (at most :data:`MAX_SLICE_S`)
MAX_WAIT_S = 0.5
MAX_SLICE_S = 0.25


class SlicedQueue(Generic[T]):
    """Items waiting for ``work``, done on the running event loop a slice at a time.

    Without a running loop (a synchronous caller: a test, a shutdown path) :meth:`extend`
    does the items at once. :meth:`drain_now` does what is left at once (a clean stop: no
    item is left undone)."""

    def __init__(self, work: Callable[[T], object], *, name: str,
                 slice_s: float = SLICE_S, max_wait_s: float = MAX_WAIT_S) -> None:
        self.work = work
        self.name = name
        self.slice_s = slice_s
        self.max_wait_s = max_wait_s
        self._items: deque[T] = deque()
        #: ``(items queued before it, monotonic time)`` of each :meth:`extend`, oldest first:
        #: how long the oldest waiting item has waited (one entry per batch, not per item)
        self._batches: deque[tuple[int, float]] = deque()
        self._taken = 0  # items taken off the queue so far
        self._last_end = 0.0  # perf_counter() when the previous slice ended
        self._handle: asyncio.Handle | None = None
        #: counters: items done, slices run
        self.done = 0
        self.slices = 0

    def __len__(self) -> int:
        return len(self._items)

    def extend(self, items: Iterable[T]) -> None:
        """Queue ``items`` (after those waiting) and make sure a slice is due."""
        before = len(self._items)
        self._items.extend(items)
        if len(self._items) == before:
            return
        self._batches.append((self._taken + before, time.monotonic()))
        if self._handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: nothing else waits on this thread
            self.drain_now()
            return
        self._handle = loop.call_soon(self._slice)

    def drain_now(self) -> int:
        """Do every waiting item now; returns how many."""
        self.close()
        n = 0
        while self._items:
            self._one(self._items.popleft())
            n += 1
        self._batches.clear()
        return n

    def close(self) -> None:
        """Cancel the slice due (what waits stays queued: :meth:`drain_now` does it)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _slice(self) -> None:
        self._handle = None
        self.slices += 1
        items, clock = self._items, time.perf_counter
        start = clock()
        budget = self.slice_s
        if self._late():  # behind: an equal share with the rest of the loop
            budget = min(max(budget, start - self._last_end), MAX_SLICE_S)
        end = start + budget
        while items:
            self._one(items.popleft())
            if clock() >= end:
                break
        self._last_end = clock()
        if items:
            self._handle = asyncio.get_running_loop().call_soon(self._slice)

    def _late(self) -> bool:
        """Whether the oldest waiting item has waited past ``max_wait_s``."""
        batches, taken = self._batches, self._taken
        while len(batches) > 1 and batches[1][0] <= taken:
            batches.popleft()  # every item of the oldest batch is done
        if not self._items:
            batches.clear()
            return False
        return bool(batches) and time.monotonic() - batches[0][1] > self.max_wait_s

    def _one(self, item: T) -> None:
        try:
            self.work(item)
        except Exception:
            log.exception("%s: one item failed (the others go on)", self.name)
        self.done += 1
        self._taken += 1

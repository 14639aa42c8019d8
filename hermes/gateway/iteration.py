"""Work gathered during one event-loop iteration and done once, at its end.

Several things the scheduler does per call are cheaper done for many calls at once, and the
calls of one wake-up come together anyway (a batch of edge calls read in one callback, a
slice of closes): a ZeroMQ send wakes the socket's I/O thread unless another send just did
(:meth:`hermes.gateway.nodes.NodeTable.send_raw`), a blocking Redis round trip costs ~0.1 ms
of CPU here whatever it carries (:meth:`hermes.gateway.edge.link.EdgeLink`'s drops from the
shared index). :class:`EndOfIteration` holds what was added during the iteration and hands
it over, in order, in one ``call_soon`` after the iteration's other callbacks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class EndOfIteration(Generic[T]):
    """Items added during a loop iteration, given to ``flush`` together (oldest first) at
    its end; added without a running loop (a synchronous caller), at once."""

    __slots__ = ("_flush", "_items", "_soon")

    def __init__(self, flush: Callable[[list[T]], None]) -> None:
        self._flush = flush
        self._items: list[T] = []
        self._soon: asyncio.Handle | None = None

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: T) -> None:
        self._items.append(item)
        if self._soon is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # nothing would run the flush later
            self.flush_now()
            return
        self._soon = loop.call_soon(self._run)

    def flush_now(self) -> None:
        """Hand over what waits now (a close: before the socket or store goes)."""
        if self._soon is not None:
            self._soon.cancel()
        self._run()

    def _run(self) -> None:
        self._soon = None
        items, self._items = self._items, []
        if items:
            self._flush(items)

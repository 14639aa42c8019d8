"""The embedded HermesLet's link to its scheduler: protocol messages as objects, no ZeroMQ.

``hermes serve`` runs one HermesLet in the gateway process, on the scheduler's event loop. Over
ZeroMQ ``inproc://`` each message would still be encoded to JSON, sent through a socket pair,
woken up on by the loop and decoded and validated again: per LLM request a submit and a done,
four codec passes and two loop wake-ups, a large share of what the gateway adds to a request.
:class:`InprocLink` hands the same :mod:`hermes.protocol` messages over directly (the way vLLM's
``InprocClient`` stands in for its multiprocess client): the node's messages reach the
scheduler's handler on the next loop iteration (``call_soon``, so that neither side is
re-entered from inside the other), and the scheduler's messages wait in a deque that the
node's receive loop empties. Remote HermesLets keep using the ROUTER socket; the scheduler
treats both alike (identity, ``hello``, heartbeats, ``resync``).

Messages that the scheduler keeps after sending (``submit`` and ``tool``: it re-sends them,
with another engine, after a failure) are handed over as copies, so that neither side sees
the other's later changes, as on the wire.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from hermes import protocol as P

#: scheduler messages the scheduler keeps a reference to (``PendingRequest.msg``)
_RETAINED = (P.Submit, P.Tool)


class InprocLink:
    """One in-process node's two directions.

    ``to_scheduler(identity, msg)``: the scheduler's handler for node messages. The node
    calls :meth:`send` and awaits :meth:`recv`; the scheduler calls :meth:`deliver`.
    """

    def __init__(self, identity: bytes,
                 to_scheduler: Callable[[bytes, Any], None]) -> None:
        self.identity = identity
        self._to_scheduler = to_scheduler
        self._inbox: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False

    # ------------------------------------------------------------------ node side
    def send(self, msg: Any) -> None:
        """A node message to the scheduler (handled on the next loop iteration)."""
        if not self.closed:
            asyncio.get_running_loop().call_soon(self._to_scheduler, self.identity, msg)

    async def recv(self) -> list[Any]:
        """The scheduler messages waiting for the node (at least one), oldest first."""
        while not self._inbox:
            if self.closed:
                raise ConnectionError("in-process link closed")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        out = list(self._inbox)
        self._inbox.clear()
        return out

    # ------------------------------------------------------------------ scheduler side
    def deliver(self, msg: Any) -> None:
        """A scheduler message to the node."""
        if self.closed:
            return
        if isinstance(msg, P.Submit):
            msg.engine_body()  # a body left encoded (an edge's call) is the node's as a dict
        self._inbox.append(msg.model_copy() if isinstance(msg, _RETAINED) else msg)
        self._wake()

    def close(self) -> None:
        """No more messages either way; a pending :meth:`recv` raises ``ConnectionError``."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

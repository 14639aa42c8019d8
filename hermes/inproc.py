"""The embedded HermesLet's link to its scheduler: protocol messages as objects, no ZeroMQ.

``hermes serve`` runs one HermesLet in the gateway process, on the scheduler's event loop. Over
ZeroMQ ``inproc://`` each message would still be encoded to JSON, sent through a socket pair,
woken up on by the loop and decoded and validated again: per LLM request a submit and a done,
four codec passes and two loop wake-ups, a large share of what the gateway adds to a request.
:class:`InprocLink` hands the same :mod:`hermes.protocol` messages over directly (the way vLLM's
``InprocClient`` stands in for its multiprocess client). The scheduler's messages wait in a
deque that the node's receive loop empties; the node's reach the scheduler's handler on the
next loop iteration (``call_soon``). The two messages of every LLM request skip that hop
when nothing is ahead of them: a ``submit`` that finds the node's receive loop idle goes to
the node's handler for it at once (:meth:`InprocLink.direct`: it queues the request and
releases it to its engine, a task of the node's own context), and a ``done`` with no node
message waiting for the loop goes to the scheduler's handler at once. At one client that
was two of the ~ten loop iterations of a request. Neither handler calls back into the other
side synchronously (the node answers a submit it cannot take through :meth:`send`, the
scheduler's handler catches what a message raises), and order is kept: a message that
would overtake another goes the queued way. Remote HermesLets keep using the ROUTER
socket; the scheduler treats both alike (identity, ``hello``, heartbeats, ``resync``).

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
        #: the node's handler for a submit it can take at once (:meth:`direct`)
        self._take_submit: Callable[[P.Submit], None] | None = None
        #: node messages scheduled for the scheduler and not yet handled
        self._queued = 0

    def direct(self, take_submit: Callable[[P.Submit], None] | None) -> None:
        """Let :meth:`deliver` hand a submit straight to ``take_submit`` (the node's
        synchronous intake: queue it, release it to an engine with room) while the node's
        receive loop is idle; ``None``: every message through :meth:`recv`."""
        self._take_submit = take_submit

    # ------------------------------------------------------------------ node side
    def send(self, msg: Any) -> None:
        """A node message to the scheduler: a ``done`` with nothing of this node's ahead of
        it is handled now (the scheduler's handler catches what it raises), any other
        message on the next loop iteration."""
        if self.closed:
            return
        if self._queued == 0 and isinstance(msg, P.Done):
            self._to_scheduler(self.identity, msg)
            return
        self._queued += 1
        asyncio.get_running_loop().call_soon(self._handle_queued, msg)

    def _handle_queued(self, msg: Any) -> None:
        self._queued -= 1
        self._to_scheduler(self.identity, msg)

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
        msg = msg.model_copy() if isinstance(msg, _RETAINED) else msg
        w = self._waiter
        if (self._take_submit is not None and isinstance(msg, P.Submit) and not self._inbox
                and w is not None and not w.done()):  # the node waits for work: take it now
            self._take_submit(msg)
            return
        self._inbox.append(msg)
        self._wake()

    def close(self) -> None:
        """No more messages either way; a pending :meth:`recv` raises ``ConnectionError``."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

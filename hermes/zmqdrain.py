"""Take the ZeroMQ messages already queued on an asyncio socket without a future each.

``await sock.recv_multipart()`` on a ``zmq.asyncio`` socket costs a future, an event record,
a poll of the socket's ``EVENTS`` and a done callback per message, which is a visible part of
the gateway's per-request CPU (each request crosses the scheduler <-> HermesLet link twice).
Under load several messages are waiting by the time the loop wakes up; :class:`QueuedMessages`
hands them over from a synchronous shadow of the same socket (``NOBLOCK``), up to ``limit``
in a row so that one busy peer cannot starve the event loop. Only the task that owns the
receive side may use it (it never runs while an asyncio receive is pending).
"""

from __future__ import annotations

from collections.abc import Iterator

import zmq
import zmq.asyncio


class QueuedMessages:
    """``after(first)``: ``first``, then whatever is already queued (at most ``limit``)."""

    def __init__(self, sock: zmq.asyncio.Socket, limit: int = 64) -> None:
        self._sync: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        self.limit = limit

    def after(self, first: list[bytes]) -> Iterator[list[bytes]]:
        yield first
        sync = self._sync
        for _ in range(self.limit):
            try:
                # asked first: an empty queue answered by ``zmq.Again`` costs an exception
                # object each time (with an import lookup), most of a drain's time
                if not int(sync.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    return
                frames = sync.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:  # closed meanwhile: the asyncio receive will say so
                return
            yield frames

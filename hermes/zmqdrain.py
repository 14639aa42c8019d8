"""Take the ZeroMQ messages already queued on an asyncio socket without a future each.

``await sock.recv_multipart()`` on a ``zmq.asyncio`` socket costs a future, an event record,
a poll of the socket's ``EVENTS`` and a done callback per message, which is a visible part of
the gateway's per-request CPU (each request crosses the scheduler <-> HermesLet link twice).
Under load several messages are waiting by the time the loop wakes up; :class:`QueuedMessages`
hands them over from a synchronous shadow of the same socket (``NOBLOCK``), up to ``limit``
in a row so that one busy peer cannot starve the event loop. Only the task that owns the
receive side may use it (it never runs while an asyncio receive is pending).

:data:`EVENTS`, :data:`POLLIN`, ... are ZeroMQ's constants as plain ints and
:func:`send_frames` a non-blocking multipart send with them: pyzmq's constants are enum
members, and every ``&`` or ``|`` on one builds a new member (about a microsecond each: a
visible share of the per-message work of the sockets read on the event loop's readiness
callback, which ask ``EVENTS`` before each read and after each send).
"""

from __future__ import annotations

from collections.abc import Iterator

import zmq
import zmq.asyncio

EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)
POLLOUT = int(zmq.POLLOUT)
NOBLOCK = int(zmq.NOBLOCK)
SNDMORE = int(zmq.SNDMORE)


def events(sock: zmq.Socket[bytes]) -> int:
    """The socket's ``EVENTS`` (:data:`POLLIN`, :data:`POLLOUT` bits) as a plain int."""
    return sock.get(EVENTS)  # type: ignore[return-value]  # (an int option: an int)


def recv_frames(sock: zmq.Socket[bytes]) -> list[bytes]:
    """``sock.recv_multipart(zmq.NOBLOCK)`` without a socket-option read per frame: each
    part's ``more`` flag comes with the part (a ``zmq.Frame``), where ``recv_multipart``
    asks ``RCVMORE`` after every part, an option read that builds an enum member each time
    (2.4 -> 1.6 us for a two-part message). Raises as it does (:class:`zmq.Again` when
    nothing is queued; a multipart message is delivered whole or not at all)."""
    frame = sock.recv(NOBLOCK, copy=False)
    parts = [frame.bytes]
    while frame.more:
        frame = sock.recv(NOBLOCK, copy=False)
        parts.append(frame.bytes)
    return parts


def send_frames(sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
    """``sock.send_multipart(frames, flags=zmq.NOBLOCK)`` without its enum arithmetic
    (raises as it does: :class:`zmq.Again` or :class:`zmq.ZMQError` at the first frame, when
    a ROUTER cannot route or queue the message, and nothing is sent then)."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, NOBLOCK | SNDMORE if i < last else NOBLOCK)


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
                if not events(sync) & POLLIN:
                    return
                frames = recv_frames(sync)
            except zmq.Again:
                return
            except zmq.ZMQError:  # closed meanwhile: the asyncio receive will say so
                return
            yield frames

"""The node's sockets to edges: where a request's tokens and answer go when roles are split.

With ``hermes serve --role edge`` in front of a ``--role scheduler``, a ``submit`` names the
edge that holds the client's connection (:attr:`hermes.protocol.Submit.reply_to`). The node
streams the request's ``token`` messages and its full ``done`` straight to that edge over a
DEALER socket of its own (one per edge address, opened on first use), so the scheduler never
touches the bytes of an answer. Sends never wait: an edge that is gone (its client's request
is lost with it, and the client retries through the load balancer) only costs dropped frames
once its socket's queue is full (``zmq.Again``, counted in :attr:`EdgeSockets.dropped`).

CURVE (:mod:`hermes.security.curve`): an edge with CURVE gives its public key with its
address (``tcp://HOST:PORT#curve=KEY``), and the node connects with its own certificate (the
one it uses for the schedulers). A node without CURVE cannot answer such an edge, and a node
with CURVE never sends answers to an edge without it (no plain-text fallback). The node
follows each socket's handshakes: before a request for an edge is served,
:meth:`EdgeSockets.check` says why its answers cannot be delivered (the edge refuses this
node's key, or one side has no CURVE), and the node fails the request (retryable: another
node may be admitted) instead of streaming into a socket that never connects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import zmq
import zmq.asyncio

from hermes import protocol as P

log = logging.getLogger("hermeslet.edges")


class EdgeSockets:
    """A DEALER per edge address (identity: the node's name), sends without waiting."""

    #: frames queued for an edge whose connection is not up yet (or gone) before dropping
    HWM = 10_000
    #: how long the first request for a CURVE edge waits for the handshake's outcome (an edge
    #: that is slow to answer is then sent to as before: ZeroMQ queues the frames)
    HANDSHAKE_WAIT_S = 2.0

    def __init__(self, ctx: zmq.asyncio.Context, node: str,
                 curve_key: str | None = None) -> None:
        """``curve_key``: this node's CURVE secret key file (None: no CURVE)."""
        self.ctx = ctx
        self.node = node
        self.curve_key = curve_key
        self._socks: dict[str, zmq.Socket[bytes]] = {}
        #: CURVE edges: the handshakes of each socket (hermes.security.curve.Handshakes)
        self._handshakes: dict[str, Any] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: reply addresses answers cannot go to, and why (no CURVE on one side)
        self._unusable: dict[str, str] = {}
        #: frames an edge could not take (its queue full: the edge is gone)
        self.dropped = 0

    def _sock(self, reply_to: str) -> zmq.Socket[bytes] | None:
        sock = self._socks.get(reply_to)
        if sock is not None or reply_to in self._unusable:
            return sock
        from hermes.security.curve import split_reply_address

        try:
            address, edge_key = split_reply_address(reply_to)
        except ValueError as e:
            self._refuse(reply_to, str(e))
            return None
        if edge_key is not None and self.curve_key is None:
            self._refuse(reply_to, f"the edge at {address} takes answers only with CURVE "
                         "and this node has no CURVE key (--curve-key)")
            return None
        if edge_key is None and self.curve_key is not None:
            self._refuse(reply_to, f"the edge at {address} takes answers without CURVE and "
                         "this node sends them only with CURVE")
            return None
        # a plain (blocking-API) socket: a NOBLOCK send is a plain call
        sock = zmq.Socket(self.ctx, zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.node.encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.HWM)
        if edge_key is not None and self.curve_key is not None:
            from hermes.security.curve import Handshakes, secure_client

            secure_client(sock, self.curve_key, edge_key)
            hs = self._handshakes[reply_to] = Handshakes(
                sock, f"hermeslet {self.node} -> edge {address}")
            self._tasks[reply_to] = asyncio.get_running_loop().create_task(
                hs.run(), name=f"hermeslet-{self.node}-edge-handshakes")
        sock.connect(address)
        self._socks[reply_to] = sock
        return sock

    def _refuse(self, reply_to: str, why: str) -> None:
        log.error("hermeslet %s: %s: its requests fail here", self.node, why)
        self._unusable[reply_to] = why

    async def check(self, reply_to: str) -> str | None:
        """Why answers for ``reply_to`` cannot be delivered, or None. A CURVE edge's first
        request waits up to :attr:`HANDSHAKE_WAIT_S` for the handshake's outcome."""
        if self._sock(reply_to) is None:
            return self._unusable.get(reply_to, "no socket")
        hs = self._handshakes.get(reply_to)
        if hs is None:
            return None
        if hs.state == "pending":
            hs.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hs.changed.wait(), self.HANDSHAKE_WAIT_S)
        if hs.state == "refused":
            return f"cannot deliver the answer to the edge: {hs.reason} ({hs.label})"
        return None

    def send(self, address: str, msg: P.Token | P.Done | P.Failed) -> None:
        """One message to the edge at ``address`` (queued by ZeroMQ; never waits)."""
        sock = self._sock(address)
        if sock is None:
            self.dropped += 1
            return
        try:
            sock.send(P.encode(msg), flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            if self.dropped in (1, 100, 10_000):
                log.warning("hermeslet %s: edge %s takes no more messages (%d dropped)",
                            self.node, address, self.dropped)

    def close(self) -> None:
        for t in self._tasks.values():
            t.cancel()
        self._tasks.clear()
        for hs in self._handshakes.values():
            hs.close()
        self._handshakes.clear()
        for sock in self._socks.values():
            sock.close(linger=0)
        self._socks.clear()

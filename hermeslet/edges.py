"""The node's sockets to edges: where a request's tokens and answer go when roles are split.

With ``hermes serve --role edge`` in front of a ``--role scheduler``, a ``submit`` names the
edge that holds the client's connection (:attr:`hermes.protocol.Submit.reply_to`). The node
streams the request's ``token`` messages and its full ``done`` straight to that edge over a
DEALER socket of its own (one per edge address, opened on first use), so the scheduler never
touches the bytes of an answer. Sends never wait: an edge that is gone (its client's request
is lost with it, and the client retries through the load balancer) only costs dropped frames
once its socket's queue is full (``zmq.Again``, counted in :attr:`EdgeSockets.dropped`).
"""

from __future__ import annotations

import logging

import zmq
import zmq.asyncio

from hermes import protocol as P

log = logging.getLogger("hermeslet.edges")


class EdgeSockets:
    """A DEALER per edge address (identity: the node's name), sends without waiting."""

    #: frames queued for an edge whose connection is not up yet (or gone) before dropping
    HWM = 10_000

    def __init__(self, ctx: zmq.asyncio.Context, node: str) -> None:
        self.ctx = ctx
        self.node = node
        self._socks: dict[str, zmq.Socket[bytes]] = {}
        #: frames an edge could not take (its queue full: the edge is gone)
        self.dropped = 0

    def _sock(self, address: str) -> zmq.Socket[bytes]:
        sock = self._socks.get(address)
        if sock is None:  # a plain (blocking-API) socket: a NOBLOCK send is a plain call
            sock = zmq.Socket(self.ctx, zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, self.node.encode())
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, self.HWM)
            sock.connect(address)
            self._socks[address] = sock
        return sock

    def send(self, address: str, msg: P.Token | P.Done | P.Failed) -> None:
        """One message to the edge at ``address`` (queued by ZeroMQ; never waits)."""
        try:
            self._sock(address).send(P.encode(msg), flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            if self.dropped in (1, 100, 10_000):
                log.warning("hermeslet %s: edge %s takes no more messages (%d dropped)",
                            self.node, address, self.dropped)

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close(linger=0)
        self._socks.clear()

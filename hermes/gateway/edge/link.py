"""The scheduler's side of split roles: the socket edges send their calls to.

``hermes serve --role scheduler`` binds a ZeroMQ ROUTER (``[ha] edge_bind``) once it is the
active scheduler and advertises it in the lease record (``edge_address``), where edges find
it. Per LLM call an edge sends one :class:`~hermes.gateway.edge.wire.Call`; the scheduler
binds it to its run (a one-request run, or the run ``X-Hermes-Run`` names), ranks it and
dispatches it with ``reply_to`` = the edge, so the node streams tokens and the answer to the
edge and sends the scheduler only the counts (:attr:`hermes.protocol.Submit.reply_to`). The
scheduler answers the edge only when a call fails (:class:`~hermes.gateway.edge.wire.
CallFailed`) and pings with a pong; both carry the lease epoch and are not sent once the
lease has run out (a deposed scheduler says nothing).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from hermes.gateway.api.binding import APP_HEADER, RUN_HEADER, UNIT_HEADER
from hermes.gateway.edge import wire
from hermes.gateway.errors import RunNotActive, SchedulerError
from hermes.gateway.state import PendingRequest
from hermes.zmqdrain import QueuedMessages

log = logging.getLogger("hermes.gateway.edge")


class EdgeLink:
    """The ROUTER edges connect to, and the calls they send (module doc)."""

    def __init__(self, sched: Any, address: str,
                 context: zmq.asyncio.Context | None = None) -> None:
        self.sched = sched
        self.address = address
        self.context = context or zmq.asyncio.Context.instance()
        self.socket: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()
        #: counters: calls taken, failed (answered with ``failed``), bad frames
        self.calls = 0
        self.failed = 0
        self.bad = 0

    def start(self) -> None:
        sock = self.context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        try:
            sock.bind(self.address)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise SchedulerError(f"cannot bind the edge socket to [ha] edge_bind = "
                                 f"{self.address!r}: {exc}") from exc
        self.socket = sock
        self._task = asyncio.get_running_loop().create_task(self._recv_loop(),
                                                            name="hermes-edge-link")

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for t in self._calls:
            t.cancel()
        if self.socket is not None:
            self.socket.close(linger=0)
            self.socket = None

    # ------------------------------------------------------------------ wire
    def _send(self, identity: bytes, msg: wire.SchedulerMessage) -> None:
        nodes = self.sched.node_table
        if nodes.fence is not None and not nodes.fence():
            return  # the lease ran out: a deposed scheduler says nothing
        if self.socket is None:
            return
        try:
            self.socket.send_multipart([identity, wire.encode(msg)], flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("edge %r takes no more messages: dropped a %s", identity,
                        type(msg).__name__)

    async def _recv_loop(self) -> None:
        assert self.socket is not None
        sock = self.socket
        drain = QueuedMessages(sock)
        while True:
            first = await sock.recv_multipart()
            for frames in drain.after(first):
                if len(frames) < 2:
                    continue
                try:
                    msg = wire.decode_edge(frames[-1])
                except (msgspec.DecodeError, msgspec.ValidationError) as e:
                    self.bad += 1
                    log.warning("bad message from edge %r: %s", frames[0], e)
                    continue
                try:
                    self.handle(frames[0], msg)
                except Exception:  # one bad message must not stop the scheduler
                    log.exception("error handling a %s from edge %r", type(msg).__name__,
                                  frames[0])

    def handle(self, identity: bytes, msg: wire.EdgeMessage) -> None:
        if isinstance(msg, wire.Call):
            self.calls += 1
            task = asyncio.get_running_loop().create_task(self._call(identity, msg))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        elif isinstance(msg, wire.Ping):
            self._send(identity, wire.Pong(epoch=self.sched.node_table.epoch))
        elif isinstance(msg, wire.Cancel):
            req = self.sched.requests.get(msg.rid)
            if req is not None:
                self.sched.abandon(req)

    # ------------------------------------------------------------------ calls
    async def _call(self, identity: bytes, c: wire.Call) -> None:
        sched = self.sched
        run = ident = None
        try:
            served = await sched.serving_model(c.model, strict=True)
            headers = {RUN_HEADER: c.run or "none"}
            if c.app:
                headers[APP_HEADER] = c.app
            if c.unit:
                headers[UNIT_HEADER] = c.unit
            run, ident = sched.identities.bind(c.tenant, {}, headers)
            inv = sched.unit_for_request(run, ident.unit, f"llm:{served}")
            req = await sched.submit_llm(run, inv, model=served, endpoint=c.endpoint,
                                         body=c.body, stream=c.stream, request_id=c.rid,
                                         reply_to=c.reply_to, prompt_tokens=c.prompt_tokens)
        except SchedulerError as e:
            if ident is not None:
                sched.identities.abandoned(ident)
            if run is not None and run.auto_finish:
                sched.fail_run(run.run_id, str(e))
            self._failed(identity, c.rid, e)
            return
        req.future.add_done_callback(lambda _f: self._settled(identity, req, ident))

    def _settled(self, identity: bytes, req: PendingRequest, ident: Any) -> None:
        """A call's request is settled (the node's counts came, or it failed)."""
        sched, run = self.sched, req.run
        exc = req.future.exception()
        if exc is not None:
            sched.identities.abandoned(ident)
            if run.auto_finish and run.status in ("queued", "running"):
                sched.fail_run(run.run_id, str(exc))
            if not (isinstance(exc, RunNotActive) and str(exc) == "client disconnected"):
                self._failed(identity, req.request_id, exc)
        elif run.auto_finish and run.status in ("queued", "running"):
            sched.finish_run(run.run_id)

    def _failed(self, identity: bytes, rid: str, exc: BaseException) -> None:
        self.failed += 1
        status = getattr(exc, "status", 500) if isinstance(exc, SchedulerError) else 500
        code = getattr(exc, "code", None)
        self._send(identity, wire.CallFailed(rid=rid, epoch=self.sched.node_table.epoch,
                                             status=int(status), code=code, message=str(exc)))

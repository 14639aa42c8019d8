"""The scheduler's side of split roles: the socket edges send their calls to.

``hermes serve --role scheduler`` binds a ZeroMQ ROUTER (``[ha] edge_bind``) once it is the
active scheduler and advertises it in the lease record (``edge_address``), where edges find
it. Per LLM call an edge sends one :class:`~hermes.gateway.edge.wire.Call`; the scheduler
binds it to its run (a one-request run, or the run ``X-Hermes-Run`` names), ranks it and
dispatches it with ``reply_to`` = the edge, so the node streams tokens and the answer to the
edge and sends the scheduler only the counts (:attr:`hermes.protocol.Submit.reply_to`). A
call without run or app headers (opted out of run inference, or inference off) takes the
fast path (:mod:`hermes.gateway.edge.direct`: no run in the registry, what the global
ordering needs and no more). A call the edge's run resolver put in an inferred run
(``inferred``, :mod:`hermes.gateway.edge.infer`) joins that run, created on its first call;
the edge's ``closed`` messages end such runs (:attr:`EdgeLink.closing`, a slice at a time), and a
stopping edge's ``handover`` has them closed here when due
(:class:`~hermes.gateway.edge.infer.HandedRuns`). A new inferred run's first call names its
app id, so that the app is listed here and ``hermes apps rename|merge`` finds it; the
mapping they make reaches the edges in the pongs (:meth:`EdgeLink._names_for`), and so does
the served-model set (:meth:`EdgeLink._models_for`: edges answer ``count_tokens`` from it).
The apps an edge's resolver knows come once to each new leader
(:class:`~hermes.gateway.edge.wire.Apps`), which then lists them at once after a failover.
The scheduler answers the edge only when a call fails
(:class:`~hermes.gateway.edge.wire.CallFailed`) and pings with a pong; both carry the lease
epoch and are not sent once the lease has run out (a deposed scheduler says nothing).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from hermes.gateway.api.binding import APP_HEADER, RUN_HEADER, UNIT_HEADER
from hermes.gateway.edge import wire
from hermes.gateway.edge.direct import DirectCalls
from hermes.gateway.edge.infer import HandedRuns, close_due
from hermes.gateway.errors import RunNotActive, SchedulerError
from hermes.gateway.iteration import EndOfIteration
from hermes.gateway.shared import StoreUnavailable
from hermes.gateway.slices import SlicedQueue
from hermes.gateway.state import ACTIVE, LiveRun, PendingRequest
from hermes.gateway.tenancy import current_tenant
from hermes.zmqdrain import POLLIN, events, recv_frames, send_frames

log = logging.getLogger("hermes.gateway.edge")


class EdgeLink:
    """The ROUTER edges connect to, and the calls they send (module doc)."""

    #: messages taken in one wake-up before the loop runs its other work
    BATCH = 256
    #: how often direct calls nobody reported are looked for, and how old they must be
    SWEEP_S = 1.0
    SWEEP_GRACE_S = 5.0

    def __init__(self, sched: Any, address: str,
                 context: zmq.asyncio.Context | None = None) -> None:
        self.sched = sched
        self.address = address
        self.context = context or zmq.asyncio.Context.instance()
        self.socket: zmq.Socket[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._zap: Any = None  # the context's CURVE gate (hermes.security.curve), with CURVE
        #: header-less calls: the fast path (hermes.gateway.edge.direct)
        self.direct = DirectCalls(sched, self._send)
        sched.dispatch.external = self.direct.on_node_message
        sched.dispatch.on_node_gone = self.direct.node_gone
        self._calls: set[asyncio.Task[None]] = set()
        #: counters: calls taken, failed (answered with ``failed``), bad frames
        self.calls = 0
        self.failed = 0
        self.bad = 0
        #: inferred runs finished on their edges' close
        self.closed_runs = 0
        #: ``(tenant, run)`` closed here, to drop from the shared index (:meth:`_forget_closed`)
        self._forget: EndOfIteration[tuple[str, str]] = EndOfIteration(self._forget_closed)
        #: runs edges closed (their ``closed`` messages), finished a slice at a time
        self.closing: SlicedQueue[tuple[wire.ClosedRun, float]] = SlicedQueue(
            self._close_one, name="closing the inferred runs edges closed")
        sched.closing_queues.append(self.closing)
        #: inferred runs stopped edges handed over (closed here when due)
        self.handed = HandedRuns()
        #: the served-model set edges are given, and the node table's models_version of it
        self._models: wire.Models | None = None
        self._models_at = -1
        #: apps the edges reported (their resolvers' books, once per edge per leader)
        self.apps_reported = 0

    def start(self) -> None:
        # a plain socket read on the event loop's readiness callback: every message queued
        # is taken in one wake-up, without the future, event registration and done callback
        # an asyncio socket's receive costs per message (half the scheduler's CPU per call,
        # measured with py-spy --gil)
        sock: zmq.Socket[bytes] = zmq.Socket(self.context, zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sec = self.sched.config.security
        try:
            if sec.curve_dir:  # CURVE: only edges with a key in authorized-edges/ get in
                from hermes.security.curve import EDGES, secure_server

                self._zap = secure_server(sock, self.context, sec.curve_dir, domain=EDGES,
                                          admit="authorized-edges")
            sock.bind(self.address)
        except zmq.ZMQError as exc:
            sock.close(0)
            if self._zap is not None:
                self._zap.stop()
                self._zap = None
            raise SchedulerError(f"cannot bind the edge socket to [ha] edge_bind = "
                                 f"{self.address!r}: {exc}") from exc
        self.socket = sock
        self._loop = asyncio.get_running_loop()
        fd = self._fd = int(sock.getsockopt(zmq.FD))
        self._loop.add_reader(fd, self._readable)
        self._loop.call_soon(self._readable)
        self._sweeper = self._loop.create_task(self._sweep(), name="hermes-edge-sweep")

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.SWEEP_S)
            n = self.direct.sweep(time.monotonic(), self.SWEEP_GRACE_S)
            if n:
                log.warning("%d direct calls were never reported settled (their edge is "
                            "gone?) and no node holds them: dropped", n)
            if self.handed:
                now = time.monotonic()
                self.closing.extend((c, now) for c in self.handed.due(
                    self.sched.registry.runs, now, self.sched.ctx.clock.time_scale))

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        fence = self.sched.node_table.fence
        if fence is None or fence():  # still the leader: the closed runs end here
            self.closing.drain_now()
        elif len(self.closing):  # deposed: the new leader's idle reaping ends them
            log.warning("%d inferred runs edges closed were not finished here (this "
                        "scheduler lost its lease first): they end when the leader's idle "
                        "reaping (scheduler.run_idle_timeout_s) finds them",
                        len(self.closing))
        self.closing.close()
        self._forget.flush_now()  # (the runs this close ended, too)
        for t in self._calls:
            t.cancel()
        if self.socket is not None:
            if self._loop is not None and self._fd is not None:
                self._loop.remove_reader(self._fd)
            self.socket.close(linger=0)
            self.socket = None
        if self._zap is not None:
            self._zap.stop()
            self._zap = None

    # ------------------------------------------------------------------ wire
    def _send(self, identity: bytes, msg: wire.SchedulerMessage) -> None:
        nodes = self.sched.node_table
        if nodes.fence is not None and not nodes.fence():
            return  # the lease ran out: a deposed scheduler says nothing
        if self.socket is None:
            return
        try:
            send_frames(self.socket, [identity, wire.encode(msg)])
        except zmq.Again:
            log.warning("edge %r takes no more messages: dropped a %s", identity,
                        type(msg).__name__)
        self._recheck()

    def _recheck(self) -> None:
        """After a send: ZeroMQ's descriptor is edge-triggered, and an operation on the socket
        may have taken the readiness of messages that arrived meanwhile; look again."""
        if (self.socket is not None and self._loop is not None
                and events(self.socket) & POLLIN):
            self._loop.call_soon(self._readable)

    def _readable(self) -> None:
        """Take every queued message (at most :attr:`BATCH` in a row, then yield)."""
        sock = self.socket
        if sock is None:
            return
        for _ in range(self.BATCH):
            try:
                if not events(sock) & POLLIN:
                    return  # (asked: a zmq.Again per empty queue costs more than the question)
                frames = recv_frames(sock)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return  # closed
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
        if self._loop is not None:
            self._loop.call_soon(self._readable)  # more queued: the loop's other work first

    def handle(self, identity: bytes, msg: wire.EdgeMessage) -> None:
        if isinstance(msg, wire.Call):
            self.calls += 1
            if msg.settled:
                self.direct.settle(msg.settled)
            if msg.direct and self.sched.nodes:
                try:
                    self.direct.take(identity, msg)
                except SchedulerError as e:
                    self._failed(identity, msg.rid, e)
                return
            if msg.inferred and self.sched.nodes:  # nothing to wait for: no task
                self._inferred_now(identity, msg)
                return
            task = asyncio.get_running_loop().create_task(self._call(identity, msg))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        elif isinstance(msg, wire.Report):
            self.direct.settle(msg.settled)
        elif isinstance(msg, wire.Closed):
            now = time.monotonic()
            self.closing.extend((c, now) for c in msg.runs)
        elif isinstance(msg, wire.Handover):
            self.handed.take(msg.runs, self.sched.registry.runs, time.monotonic(),
                             self.sched.ctx.clock.time_scale)
        elif isinstance(msg, wire.Ping):
            self._send(identity, wire.Pong(epoch=self.sched.node_table.epoch,
                                           names=self._names_for(msg.names),
                                           models=self._models_for(msg.models)))
        elif isinstance(msg, wire.Apps):
            self.apps_reported += len(msg.apps)
            self.sched.identities.learned(msg.apps)
        elif isinstance(msg, wire.Cancel):
            if msg.rid in self.direct.calls:
                self.direct.cancel(msg.rid)
                return
            req = self.sched.requests.get(msg.rid)
            if req is not None:
                self.sched.abandon(req)

    def _names_for(self, digest: str) -> wire.Names | None:
        """The app names for a pong: None while the edge follows this scheduler's (the
        digest its ping carried is theirs), else the mapping (a rename or merge since, or a
        new edge, or a new leader whose knowledge base says otherwise)."""
        ids = self.sched.identities
        if digest == ids.names_digest:
            return None
        names = ids.resolver.names
        return wire.Names(ids.names_digest, dict(names.renames), dict(names.merges))

    def _models_for(self, digest: str) -> wire.Models | None:
        """The served-model set for a pong: None while the edge holds this scheduler's (the
        digest its ping carried is its digest), else the set (a node joined or left, a new
        edge, a new leader). Built again only when the node table's engines changed."""
        models = self.served_models()
        return None if digest == models.digest else models

    def served_models(self) -> wire.Models:
        """The models the connected engines serve, by task, with this scheduler's routing
        settings and their digest (cached by :attr:`~hermes.gateway.nodes.NodeTable.
        models_version`: a ping costs a comparison of two integers and two strings)."""
        nodes = self.sched.node_table
        if self._models is None or self._models_at != nodes.models_version:
            sc = self.sched.config.scheduler
            served = {task: nodes.served_models(task) for task in ("generate", "embed")}
            parts = [served, sc.default_model, sc.route_unknown_models, len(nodes.nodes)]
            digest = hashlib.blake2b(msgspec.msgpack.encode(parts), digest_size=8).hexdigest()
            self._models = wire.Models(digest, served, sc.default_model,
                                       sc.route_unknown_models, len(nodes.nodes))
            self._models_at = nodes.models_version
        return self._models

    # ------------------------------------------------------------------ calls
    async def _call(self, identity: bytes, c: wire.Call) -> None:
        sched = self.sched
        run = ident = None
        if c.authed:  # other tenants' runs are hidden (404), as at the all-in-one gateway
            current_tenant.set(c.tenant)  # (this task's own context)
        try:
            served = await sched.serving_model(c.model, strict=True, task=c.task)
            if c.inferred:
                self._submit_inferred(identity, c, served)
                return
            headers = {RUN_HEADER: c.run or "none"}
            if c.app:
                headers[APP_HEADER] = c.app
            if c.unit:
                headers[UNIT_HEADER] = c.unit
            run, ident = sched.identities.bind(c.tenant, {}, headers, k=c.k,
                                               deadline_s=c.deadline_s)
            if run.auto_finish:  # its id is never shown to the client: nothing to store
                run.transient = True
            inv = sched.unit_for_request(run, ident.unit, f"llm:{served}")
            req = await sched.submit_llm(run, inv, model=served, endpoint=c.endpoint,
                                         body=c.engine_body(), stream=c.stream, request_id=c.rid,
                                         reply_to=c.reply_to, prompt_tokens=c.prompt_tokens,
                                         native=c.native)
        except SchedulerError as e:
            if ident is not None:
                sched.identities.abandoned(ident)
            if run is not None and run.auto_finish:
                sched.fail_run(run.run_id, str(e))
            self._failed(identity, c.rid, e)
            return
        req.future.add_done_callback(lambda _f: self._settled(identity, req, ident))

    def _inferred_now(self, identity: bytes, c: wire.Call) -> None:
        """A call of an inferred run, with a node connected: taken in the socket's read
        callback, as it arrives (a task per call was a tenth of the scheduler's CPU per
        call); the same steps as :meth:`_call`'s."""
        token = current_tenant.set(c.tenant) if c.authed else None  # reset below: the
        try:  # callback's context is the reader's, shared by every call
            served = self.sched.resolve_model(c.model, strict=True, task=c.task)
            self._submit_inferred(identity, c, served)
        except SchedulerError as e:
            self._failed(identity, c.rid, e)
        finally:
            if token is not None:
                current_tenant.reset(token)

    def _submit_inferred(self, identity: bytes, c: wire.Call, served: str) -> None:
        sched = self.sched
        run = self._inferred_run(c)
        inv = sched.unit_for_request(run, c.unit or "default", f"llm:{served}")
        req = sched.submit_llm_now(run, inv, model=served, endpoint=c.endpoint, body=c.engine_body(),
                                   stream=c.stream, request_id=c.rid, reply_to=c.reply_to,
                                   native=c.native, prompt_tokens=c.prompt_tokens)
        # the run stays open after its call: the edge's resolver closes it (self.closing),
        # or the idle reaping; a failed call is told to the edge (the node tells only this
        # scheduler: the edge would wait for its timeout)
        req.future.add_done_callback(lambda _f: self._inferred_settled(identity, req))

    def _inferred_run(self, c: wire.Call) -> LiveRun:
        """The inferred run an edge's resolver put ``c`` in: the active one of that id, or a
        new one under that id (its first call, or the first after a failover: not stored at
        its start). A run that ended here meanwhile (closed through another edge, reaped,
        finished through the API) is refused with :class:`InferredRunEnded`: the edge
        resolves the call again, as the all-in-one gateway's binding does, so that the
        answer's ``X-Hermes-Run`` names the run the call is counted in."""
        reg = self.sched.registry
        assert c.run is not None
        self.handed.pop(c.run)  # a call of it: its edge holds it now
        run: LiveRun | None = reg.runs.get(c.run)
        if run is not None and run.status in ACTIVE:
            return run
        if run is not None or c.run in reg.finished:
            raise InferredRunEnded(f"inferred run {c.run!r} has ended")
        # not written at its start: after a failover its next call re-creates it under its
        # id (a durable write per new run was a quarter of the scheduler's CPU per one-turn
        # run); written with its progress and at its end
        new: LiveRun = reg.create_run(c.app or "default", tenant=c.tenant, run_id=c.run,
                                      inferred=True, lazy_store=True, k=c.k,
                                      deadline_s=c.deadline_s)
        if c.new and c.app_id and c.app:  # the operator can list, rename, merge it here
            self.sched.identities.noted(c.app_id, c.app, c.tenant, c.model)
        return new

    def close_inferred(self, runs: list[wire.ClosedRun]) -> int:
        """Finish the inferred runs an edge's resolver closed, each at its last activity,
        unless this scheduler saw it active since (:func:`close_due`), at once. Returns how
        many. (What an edge's ``closed`` message and the handed-over runs get, through
        :attr:`closing`, a slice at a time: this immediate form is the same steps.)"""
        now = time.monotonic()
        return sum(self._close_one((c, now)) for c in runs)

    def _close_one(self, item: tuple[wire.ClosedRun, float]) -> bool:
        """One closed run, told at ``received`` (monotonic): its idle time and end are those
        at receipt, however long it waited in :attr:`closing`."""
        c, received = item
        reg = self.sched.registry
        run = reg.runs.get(c.run)
        if run is None or run.status not in ACTIVE or not run.inferred:
            return False
        scale = self.sched.ctx.clock.time_scale
        idle = (received - run.last_activity) * scale  # (model seconds, as the edge's)
        if not close_due(c.idle_s, idle, len(run.pending)):  # (active since: not due)
            return False
        waited = (time.monotonic() - received) * scale
        try:  # ended at its last activity (never before what this scheduler saw)
            reg.finish_run(c.run, at=self.sched.ctx.now() - waited - min(c.idle_s, idle))
        except SchedulerError:  # ended meanwhile
            return False
        self.closed_runs += 1
        if self.sched.identities.shared_index is not None:  # no edge adopts it any more
            self._forget.add((run.state.tenant, c.run))
        return True

    def _forget_closed(self, runs: list[tuple[str, str]]) -> None:
        """Drop the runs closed during a loop iteration (a slice of :attr:`closing`) from the
        shared evidence index, in one round trip (:meth:`RedisKeyIndex.forget_runs`), at the
        iteration's end (:class:`~hermes.gateway.iteration.EndOfIteration`). Until then an edge may still find
        such a run there: adopting it asks this scheduler, which has ended it (a new run
        then, as after the forget). Unreachable store: the entries expire with the index's
        TTL (``identity.index_ttl_s``); the store logs and counts it."""
        index = self.sched.identities.shared_index
        if index is None:
            return
        try:
            index.forget_runs(runs)
        except StoreUnavailable:
            pass

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

    def _inferred_settled(self, identity: bytes, req: PendingRequest) -> None:
        """A call of an inferred run is settled: a failure is told to its edge."""
        if req.future.cancelled():  # abandoned here (a Cancel from the edge): nothing to tell
            return
        exc = req.future.exception()
        if exc is not None and not (isinstance(exc, RunNotActive)
                                    and str(exc) == "client disconnected"):
            self._failed(identity, req.request_id, exc)

    def _failed(self, identity: bytes, rid: str, exc: BaseException) -> None:
        self.failed += 1
        status = getattr(exc, "status", 500) if isinstance(exc, SchedulerError) else 500
        code = getattr(exc, "code", None)
        self._send(identity, wire.CallFailed(rid=rid, epoch=self.sched.node_table.epoch,
                                             status=int(status), code=code, message=str(exc),
                                             param=getattr(exc, "param", None)))


class InferredRunEnded(RunNotActive):
    """A call of an inferred run that has ended here (:meth:`EdgeLink._inferred_run`)."""

    code = wire.RUN_ENDED

"""The HermesLet node agent: one DEALER socket to the scheduler, queues in front of engines.

Per engine, submitted requests wait in a :class:`~hermes.core.ordering.KeyedQueue` ordered by
the key the scheduler sent (lower first) and are released to the engine through a bounded
in-flight window (``max_inflight``): at most that many requests are at the engine at once, so
that ``rekey`` (rank changes) still reorders everything else. Tool calls have their own keyed
queue and a concurrency limit. The agent never computes keys.

Messages are those of :mod:`hermes.protocol`. On start the agent sends ``hello``, then a
``heartbeat`` every ``heartbeat_s``; it answers ``resync`` with a new ``hello``.

KV-prefix prewarms that carry a queue key (``params.key``: the key the scheduler would give the
unit's own request) wait in the engine's queue like that request and are released through the
same window, so that a prewarm does not jump a busy engine's queue (the simulator queues them
the same way); a ``release`` of one still queued removes it, so a wrong branch costs the
engine nothing. Their outcome goes to the prewarm ack, not to the scheduler's request table.

Cancellation: queued requests are dropped, in-flight ones aborted (their task is cancelled,
which closes the HTTP stream or removes the request from the simulated engine); each
cancelled id is answered with ``failed {error: "cancelled", retryable: false}`` so that the
scheduler can release its bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from hermes import protocol as P
from hermes.core.kv_gate import KvGate
from hermes.core.ordering import KeyedQueue
from hermes.core.prewarm import resource_kind, resource_model
from hermeslet.edges import EdgeSockets
from hermeslet.engines.base import (
    TRACEPARENT,
    Endpoint,
    EngineAdapter,
    EngineError,
    GenChunk,
    GenResult,
)
from hermeslet.follow import LeaderFollower
from hermeslet.kv_events import EngineKVFollower
from hermeslet.placement import EngineLaunch, PlacementChange, parse_placement, plan_change
from hermeslet.tools import ToolRunner

if TYPE_CHECKING:
    from hermes.inproc import InprocLink
    from hermeslet.prewarmers import NodePrewarmer

VERSION = "0.1.0"
#: at a stop, how long the node waits for its cancelled tasks before cancelling again, and
#: how many times (:meth:`HermesLet._shutdown`)
CANCEL_WAIT_S = 1.0
CANCEL_ROUNDS = 5

log = logging.getLogger("hermeslet.agent")
#: the node's KV gate (:mod:`hermes.core.kv_gate`), for engines with ``kv_gate_tokens``; the
#: decode growth of released requests is left to the engine (no reserve: it preempts)
_GATE = KvGate()


@dataclass(slots=True)
class _Queued:
    msg: P.Submit | P.Tool
    arrival: float  # monotonic
    #: a node-internal request (a queued KV prewarm): its engine seconds, or its failure,
    #: go here instead of to the scheduler
    outcome: asyncio.Future[float] | None = None


@dataclass(slots=True)
class _EngineSlot:
    engine: EngineAdapter
    queue: KeyedQueue[_Queued] = field(default_factory=KeyedQueue)
    inflight: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)  # in flight: request id -> model
    #: in flight: request id -> prompt tokens the KV gate counts (engines with a gate), and
    #: their sum (kept as they come and go: the window is pumped at every release)
    prompts: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    #: a new engine of a placement change, not started yet: its requests wait in its queue
    starting: bool = False
    #: why a drained engine's in-flight requests were cut (its drain timed out); None: not cut
    abandoned: str | None = None


class HermesLet:
    """A node agent. Run it with ``await HermesLet(...).run()`` (or as an asyncio task).

    ``scheduler``: the scheduler's ROUTER address (``tcp://HOST:PORT`` or, in process,
    ``inproc://hermes-nodes`` with the scheduler's ``ctx``). ``release_log`` (tests,
    diagnostics) receives ``(engine, request_id)`` each time a request is released.
    """

    def __init__(
        self,
        node: str,
        scheduler: str | Sequence[str],
        engines: Sequence[EngineAdapter],
        *,
        tools: ToolRunner | None = None,
        tool_concurrency: int = 2,
        ctx: zmq.asyncio.Context | None = None,
        heartbeat_s: float = 1.0,
        priority_scale: float = 1000.0,
        release_log: Callable[[str, str], None] | None = None,
        prewarmer: NodePrewarmer | None = None,
        curve_keys: tuple[str, str] | None = None,
        link: InprocLink | None = None,
        placement_builder: Callable[[Sequence[EngineLaunch]], list[EngineAdapter]] | None = None,
        placement_gpus: int | None = None,
        placement_device: str | None = None,
        drain_timeout_s: float = 300.0,
    ) -> None:
        if not engines:
            raise ValueError("a HermesLet needs at least one engine")
        if not drain_timeout_s > 0:
            raise ValueError(f"drain_timeout_s must be > 0, got {drain_timeout_s}")
        names = [e.name for e in engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique: {names}")
        self.node = node
        #: the scheduler addresses: one, or several elected schedulers (the node follows the
        #: one with the highest lease epoch: :mod:`hermeslet.follow`)
        self.addresses = [scheduler] if isinstance(scheduler, str) else list(scheduler)
        if not self.addresses:
            raise ValueError("a HermesLet needs at least one scheduler address")
        self.address = self.addresses[0]
        self.follower = LeaderFollower(node, len(self.addresses))
        self.slots = {e.name: _EngineSlot(e) for e in engines}
        #: makes the engines of a plan the scheduler sends (``place``); None: the node does
        #: not accept plans (``hermeslet run --accept-placement`` sets one)
        self.placement_builder = placement_builder
        #: the GPUs plans may use here and their type (told in ``hello``; None: the gateway's)
        self.placement_gpus = placement_gpus
        self.placement_device = placement_device
        #: how long a placement change waits for a drained engine's requests to finish; then
        #: they are failed (retryable when nothing was streamed yet) and the change goes on,
        #: so a hung engine or a very long generation cannot hold placement up for ever
        self.drain_timeout_s = drain_timeout_s
        self._placed: set[str] = set()  # names of the engines the last plan sent made
        self.tools = tools if tools is not None else ToolRunner()
        self.tool_concurrency = tool_concurrency
        self.tool_queue: KeyedQueue[_Queued] = KeyedQueue()
        self.tool_tasks: dict[str, asyncio.Task[None]] = {}
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.asyncio.Context()
        self.heartbeat_s = heartbeat_s
        self.priority_scale = priority_scale
        self.release_log = release_log
        self.prewarmer = prewarmer  # hermeslet.prewarmers.NodePrewarmer (issue 5), optional
        #: (node secret key file, server public key file): connect with ZeroMQ CURVE
        self.curve_keys = curve_keys
        #: in the scheduler's process: its in-process link instead of a DEALER socket
        #: (``LiveScheduler.inproc_link``; ``scheduler`` is then only a label)
        self.link = link
        self.sock: zmq.asyncio.Socket | None = None
        #: with several scheduler addresses: a DEALER per address (``sock`` is None)
        self.socks: list[zmq.asyncio.Socket] = []
        self._stop = asyncio.Event()
        self._started = asyncio.Event()
        #: queued KV prewarms: (backend, prewarm id) -> (engine slot, request id)
        self._kv_queued: dict[tuple[str, object], tuple[_EngineSlot, str]] = {}
        self._kv_ids = itertools.count(1)
        self._prewarm_tasks: set[asyncio.Task[None]] = set()
        #: engines publishing KV events: their block indexes, summarised with heartbeats
        self.kv_followers: dict[str, EngineKVFollower] = {}
        #: engines a placement change drains (no new work; stopped once idle): name -> slot
        self.draining: dict[str, _EngineSlot] = {}
        self._placement_lock = asyncio.Lock()
        self._kv_tasks: dict[str, asyncio.Task[None]] = {}  # followers of placed engines
        #: DEALER sockets to the edges that requests name as ``reply_to`` (split roles)
        self.edges = EdgeSockets(self.ctx, node,
                                 curve_key=curve_keys[0] if curve_keys is not None else None)

    # ------------------------------------------------------------------ lifecycle
    @property
    def started(self) -> asyncio.Event:
        """Set once engines are up and ``hello`` has been sent."""
        return self._started

    def stop(self) -> None:
        self._stop.set()

    def hello(self) -> P.Hello:
        return P.Hello(
            node=self.node,
            engines=[
                P.EngineInfo(name=s.engine.name, model=s.engine.model, kind=s.engine.kind,
                             loras=self._served_loras(s), max_inflight=s.engine.max_inflight,
                             task=s.engine.task,
                             kv_blocks=(self.kv_followers[s.engine.name].block_spec()
                                        if s.engine.name in self.kv_followers else None))
                for s in self.slots.values()
            ],
            tools=self.tools.kinds,
            version=P.PROTOCOL_VERSION,
            holding=self.holding(),
            placement=self.placement_builder is not None,
            gpus=self.placement_gpus if self.placement_builder is not None else None,
            device=self.placement_device if self.placement_builder is not None else None,
        )

    def _served_loras(self, slot: _EngineSlot) -> list[str]:
        """The adapters an engine serves: loaded on it now, or loadable on demand by the
        node's LoRA prewarmer (a known ``--lora-path``), so that the scheduler routes their
        requests here."""
        out = list(slot.engine.loras)
        if self.prewarmer is not None:
            out += [a for a in self.prewarmer.loadable_adapters(slot.engine.model)
                    if a not in out]
        return out

    def heartbeat(self) -> P.Heartbeat:
        return P.Heartbeat(
            node=self.node,
            engines={
                name: P.EngineLoad(queued=len(s.queue), inflight=len(s.inflight),
                                   kv_usage=s.engine.last_metrics.kv_usage)
                for name, s in self.slots.items()
            },
            time=time.time(),
            tools_queued=len(self.tool_queue),
            tools_running=len(self.tool_tasks),
            holding=self.holding(),
        )

    def holding(self) -> dict[str, str]:
        """Request ids this node holds, queued or in flight (so that a restarted scheduler, or
        one deciding what to re-dispatch, knows what is where)."""
        held: dict[str, str] = {}
        for s in self._all_slots():
            for q in s.queue.items():
                if q.outcome is None:  # not a node-internal prewarm
                    held[q.msg.request_id] = "queued"
            for rid in s.inflight:
                held[rid] = "inflight"
        for q in self.tool_queue.items():
            held[q.msg.request_id] = "queued"
        for rid in self.tool_tasks:
            held[rid] = "inflight"
        return held

    async def run(self) -> None:
        """Start engines, connect (a DEALER socket, or the in-process link), serve until
        :meth:`stop`; then abort work and close."""
        for s in self.slots.values():
            await s.engine.start()
            if s.engine.kv_events is not None:
                self.kv_followers[s.engine.name] = EngineKVFollower(
                    self.node, s.engine.name, s.engine.kv_events, ctx=self.ctx)
        multi = self.link is None and len(self.addresses) > 1
        if multi:
            self.socks = [self._connect(a, immediate=True) for a in self.addresses]
        elif self.link is None:
            self.sock = self._connect(self.address)
        recv = (self._recv_link(self.link) if self.link is not None
                else self._recv_all() if multi else self._recv_loop(self.sock, 0))
        tasks: list[asyncio.Task[None]] = []
        try:
            if multi:  # whichever scheduler is up hears it (and each one that comes up later)
                await self._broadcast(self.hello())
            # a DEALER's send waits while no connection is up (e.g. a scheduler that refuses
            # this node's CURVE key): a stop must still end the node then
            elif not await self._until_stopped(self._send(self.hello())):
                return
            self._started.set()
            tasks = [
                asyncio.create_task(recv, name=f"hermeslet-{self.node}-recv"),
                asyncio.create_task(self._heartbeat_loop(), name=f"hermeslet-{self.node}-hb"),
            ] + [asyncio.create_task(f.subscriber.run(), name=f"hermeslet-{self.node}-kv-{e}")
                 for e, f in self.kv_followers.items()]
            stop = asyncio.create_task(self._stop.wait())
            done, _ = await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            for t in done:
                if t is not stop and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            if not tasks:
                recv.close()  # never scheduled
            await self._shutdown(tasks)
            if self.link is not None:
                self.link.close()
            if self.sock is not None:
                self.sock.close(linger=0)
                self.sock = None
            for sock in self.socks:
                sock.close(linger=0)
            self.socks = []
            self.edges.close()
            if self._own_ctx:
                self.ctx.term()

    async def _until_stopped(self, work: Coroutine[Any, Any, None]) -> bool:
        """Run ``work`` unless :meth:`stop` comes first (then cancel it): whether it ran."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return False
        task.result()
        return True

    def _connect(self, address: str, *, immediate: bool = False) -> zmq.asyncio.Socket:
        """A DEALER socket to a scheduler (identity = node name; CURVE when configured).
        ``immediate`` (several schedulers): nothing is queued for a scheduler that is not
        connected (a standby, a dead one): a send there fails at once instead."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.node.encode())
        sock.setsockopt(zmq.LINGER, 0)
        if immediate:
            sock.setsockopt(zmq.IMMEDIATE, 1)
        if self.curve_keys is not None:
            from hermes.security.curve import secure_client

            secure_client(sock, *self.curve_keys)
        sock.connect(address)
        return sock

    async def _shutdown(self, tasks: list[asyncio.Task[Any]]) -> None:
        """Cancel the loops and all queued work, close the engines.

        A task may outlive its cancel: Python 3.11's ``asyncio.wait_for`` returns the
        result of an awaitable that completed in the same loop iteration as the cancel,
        which is lost (fixed in 3.12). A loop that does so goes on (the heartbeat did: the
        node ignored SIGTERM, ~1 run in 30 of ``test_placement_live`` on a busy machine), so
        what is still running after :data:`CANCEL_WAIT_S` is cancelled again, up to
        :data:`CANCEL_ROUNDS` times; what still runs then is logged and left."""
        work = [t for s in self._all_slots() for t in s.inflight.values()]
        work += list(self.tool_tasks.values()) + list(self._prewarm_tasks)
        work += list(self._kv_tasks.values())
        everything = tasks + work
        pending = {t for t in everything if not t.done()}
        for _ in range(CANCEL_ROUNDS):
            if not pending:
                break
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=CANCEL_WAIT_S)
        for t in everything:  # errors retrieved (a stopped loop's are not news), as awaited
            if t.done() and not t.cancelled():
                t.exception()
        if pending:
            log.warning("hermeslet %s: %d tasks still running after %d cancels: %s", self.node,
                        len(pending), CANCEL_ROUNDS,
                        ", ".join(sorted(t.get_name() for t in pending)))
        for s in self._all_slots():
            with contextlib.suppress(Exception):
                await s.engine.close()

    async def _recv_link(self, link: InprocLink) -> None:
        ctx = contextvars.copy_context()  # this loop's: the tasks of submits taken directly
        link.direct(lambda msg: ctx.run(self._take_submit, msg))
        try:
            while True:
                for msg in await link.recv():
                    await self._handle_one(msg)
        finally:
            link.direct(None)

    async def _handle_one(self, msg: P.SchedulerMessage | P.NodeMessage) -> None:
        """:meth:`handle`, logging instead of raising: one message the node cannot apply must
        not stop it from serving the others."""
        try:
            await self.handle(msg)
        except Exception:
            log.exception("hermeslet %s: could not apply a %r message", self.node,
                          getattr(msg, "type", type(msg).__name__))

    async def _send(self, msg: P.NodeMessage) -> None:
        if self.link is not None:
            self.link.send(msg)
        elif self.sock is not None:
            await self.sock.send(P.encode(msg))
            if isinstance(msg, P.Done | P.ToolDone):  # kept for a new leader (follow)
                self.follower.sent(msg, time.monotonic())
        elif self.socks:
            await self._send_leader(msg)

    async def _send_leader(self, msg: P.NodeMessage) -> None:
        """Several schedulers: to the one followed, without waiting; a result that cannot
        leave (no leader reachable) is kept for the next leader (:mod:`hermeslet.follow`)."""
        lead = self.follower.leader
        if lead is not None:
            try:
                await self.socks[lead].send(P.encode(msg), flags=zmq.NOBLOCK)
                self.follower.sent(msg, time.monotonic())
                return
            except zmq.Again:
                pass
        self.follower.undelivered(msg)

    async def _broadcast(self, msg: P.NodeMessage) -> None:
        """To every scheduler that is connected (several schedulers: hellos, heartbeats, so
        that a newly elected one hears of this node within a heartbeat)."""
        frame = P.encode(msg)
        for sock in self.socks:
            with contextlib.suppress(zmq.Again):
                await sock.send(frame, flags=zmq.NOBLOCK)

    async def _follow(self) -> None:
        """A new leader (higher epoch): the results it may have missed go to it."""
        for msg in self.follower.for_new_leader(time.monotonic()):
            await self._send(msg)

    async def _heartbeat_loop(self) -> None:
        while True:
            for s in self.slots.values():
                # asyncio.timeout, not wait_for: a cancel (the node stopping) that comes as
                # the engine answers is not lost (Python 3.11's wait_for returned the answer)
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(self.heartbeat_s / 2):
                        await s.engine.metrics()
            if self.socks:
                await self._broadcast(self.heartbeat())
            else:
                await self._send(self.heartbeat())
            for f in self.kv_followers.values():
                if (summary := f.summary()) is not None:
                    await self._send(summary)
            await asyncio.sleep(self.heartbeat_s)

    async def _recv_all(self) -> None:
        """Several schedulers: a receive loop per address, and a hello to each scheduler
        as soon as a connection to it is up (a newly elected one hears of this node then)."""
        loops = [self._recv_loop(s, i) for i, s in enumerate(self.socks)]
        loops += [self._hello_on_connect(s) for s in self.socks]
        await asyncio.gather(*loops)

    async def _hello_on_connect(self, sock: zmq.asyncio.Socket) -> None:
        from zmq.utils.monitor import recv_monitor_message

        mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        try:
            while True:
                await recv_monitor_message(mon)
                with contextlib.suppress(zmq.Again):
                    await sock.send(P.encode(self.hello()), flags=zmq.NOBLOCK)
        finally:
            mon.close(linger=0)

    async def _recv_loop(self, sock: zmq.asyncio.Socket | None, source: int) -> None:
        assert sock is not None
        from hermes.zmqdrain import QueuedMessages

        drain = QueuedMessages(sock)  # what is already queued: no future per message
        while True:
            first = await sock.recv_multipart()
            for frames in drain.after(first):
                try:
                    msg = P.decode(frames[-1])
                except P.ProtocolError as e:
                    print(f"hermeslet {self.node}: dropped bad message: {e}", file=sys.stderr)
                    continue
                verdict = self.follower.judge(source, msg)
                if verdict == "stale":
                    continue  # a deposed scheduler's: never applied (fencing)
                if verdict == "follow":
                    await self._follow()
                if not isinstance(msg, P.Leader):
                    await self._handle_one(msg)

    # ------------------------------------------------------------------ message handling
    async def handle(self, msg: P.SchedulerMessage | P.NodeMessage) -> None:
        """Apply one scheduler message (public for in-process drivers and tests); a node-bound
        one is ignored."""
        match msg:
            case P.Submit():
                await self._on_submit(msg)
            case P.Rekey():
                self._on_rekey(msg)
            case P.Cancel():
                await self._on_cancel(msg)
            case P.Tool():
                self.tool_queue.push(msg.request_id, _Queued(msg, time.monotonic()),
                                     tuple(msg.key), msg.run_id)
                self._pump_tools()
            case P.Prewarm() if self.prewarmer is not None:
                taken = (self._queue_kv_prewarm(msg) if msg.action == "start"
                         else self._dequeue_kv_prewarm(msg))
                if not taken:
                    self._spawn(self._on_prewarm(msg))
            case P.Prewarm():
                await self._send(P.PrewarmAck(backend=msg.backend, action=msg.action, ok=False,
                                              detail="prewarming not implemented on this node"))
            case P.Resync():
                await self._send(self.hello())
                for f in self.kv_followers.values():
                    f.restart()
            case P.Place():
                self._spawn(self._on_place(msg))
            case _:
                print(f"hermeslet {self.node}: ignored {msg.type!r} (node-bound only)",
                      file=sys.stderr)

    async def _on_prewarm(self, msg: P.Prewarm) -> None:
        """Carry out a prewarm signal off the receive loop, then ack (with ``warmup_s=``)."""
        assert self.prewarmer is not None
        ok, detail = await self.prewarmer.handle(msg.backend, msg.action, msg.params)
        await self._send(P.PrewarmAck(backend=msg.backend, action=msg.action, ok=ok, detail=detail))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._prewarm_tasks.add(task)
        task.add_done_callback(self._prewarm_tasks.discard)

    def _queue_kv_prewarm(self, msg: P.Prewarm) -> bool:
        """A KV prewarm ``start`` with a queue key goes into its engine's queue (module
        docstring). ``False``: not such a signal (no key or a malformed one, no prefix
        prewarmer for the model): the prewarmer sends it at once."""
        assert self.prewarmer is not None
        if resource_kind(msg.backend) != "kv":
            return False
        model = resource_model(msg.backend)
        pw = self.prewarmer.prefixes.get(model)
        key, prefix = msg.params.get("key"), msg.params.get("prefix")
        slot = next((s for s in self.slots.values() if s.engine.model == model), None)
        if pw is None or slot is None or not key or not prefix:
            return False
        try:
            qkey = [float(k) for k in key]
        except (TypeError, ValueError):
            log.warning("kv prewarm %s: bad queue key %r, sent at once", msg.backend, key)
            return False
        adapter = msg.params.get("model")  # the unit's LoRA adapter, if any
        sub = P.Submit(request_id=f"prewarm-kv-{self.node}-{next(self._kv_ids)}",
                       run_id=str(msg.params.get("run_id") or ""),
                       unit=str(msg.params.get("unit") or ""),
                       model=adapter or model, endpoint="chat",
                       body=pw.request_body(prefix, adapter), key=qkey)
        outcome: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        slot.queue.push(sub.request_id, _Queued(sub, time.monotonic(), outcome),
                        tuple(sub.key), sub.run_id)
        tag = (msg.backend, msg.params.get("pid"))
        self._kv_queued[tag] = (slot, sub.request_id)
        pw.queued()
        self._spawn(self._ack_queued_prewarm(msg, tag, sub.request_id, outcome))
        self._pump(slot)
        return True

    def _dequeue_kv_prewarm(self, msg: P.Prewarm) -> bool:
        """A KV prewarm ``release`` takes its request out of the engine's queue if it is still
        there (a wrong branch: the engine never computes it). ``False``: it was not queued
        here or already went to the engine (the prewarmer answers the release)."""
        assert self.prewarmer is not None
        queued = self._kv_queued.pop((msg.backend, msg.params.get("pid")), None)
        if queued is None:
            return False
        slot, rid = queued
        item = slot.queue.remove(rid)
        if item is None or item.outcome is None:
            return False  # released to the engine meanwhile
        item.outcome.cancel()
        self.prewarmer.prefixes[resource_model(msg.backend)].dequeued()
        self._adapters_changed(slot)
        self._spawn(self._send(P.PrewarmAck(
            backend=msg.backend, action="release", ok=True,
            detail="removed from the queue before it reached the engine")))
        return True

    async def _ack_queued_prewarm(self, msg: P.Prewarm, tag: tuple[str, object], rid: str,
                                  outcome: asyncio.Future[float]) -> None:
        """Ack a queued KV prewarm once the engine served it (``warmup_s=`` its engine time,
        release to done, as the simulator learns it: the queue wait is the unit's too)."""
        await asyncio.wait([outcome])
        if self._kv_queued.get(tag, (None, None))[1] == rid:
            del self._kv_queued[tag]
        if outcome.cancelled():
            ok, detail = True, "cancelled: released before it reached the engine"
        elif (exc := outcome.exception()) is not None:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        else:
            assert self.prewarmer is not None
            self.prewarmer.prefixes[resource_model(msg.backend)].served(outcome.result())
            ok, detail = True, f"warmup_s={outcome.result():.4f}"
        await self._send(P.PrewarmAck(backend=msg.backend, action="start", ok=ok, detail=detail))

    def _pick(self, msg: P.Submit) -> _EngineSlot | None:
        if msg.engine is not None and msg.engine in self.slots:
            return self.slots[msg.engine]
        # (an engine unknown here or being drained: the gateway chose it before our hello
        # after a placement change reached it; one of the model here, else the drained one)
        for s in self.slots.values():
            if s.engine.serves(msg.model):
                return s
        if msg.engine is not None:
            return self.draining.get(msg.engine)
        if self.prewarmer is not None:
            for s in self.slots.values():
                pw = self.prewarmer.loras.get(s.engine.model)
                if pw is not None and pw.loadable(msg.model):
                    return s
        if len(self.slots) == 1:
            return next(iter(self.slots.values()))
        return None

    async def _on_submit(self, msg: P.Submit) -> None:
        self._take_submit(msg)

    def _take_submit(self, msg: P.Submit) -> None:
        """Queue a submit at its engine and release what the engine has room for (an
        in-process scheduler calls this directly, :meth:`InprocLink.direct`); one no
        engine here serves is answered ``failed``. Never raises into the caller: a submit
        whose intake raised before this node held it is answered ``failed`` (retryable: the
        scheduler sends it elsewhere or fails it), not dropped, so that its client is not left
        waiting for an answer that never comes; one it holds (queued or released) is left to
        its engine."""
        try:
            slot = self._pick(msg)
            if slot is None:
                self._spawn(self._send(P.Failed(
                    request_id=msg.request_id, retryable=False,
                    error=f"no engine on node {self.node!r} serves {msg.engine or msg.model!r}")))
                return
            slot.queue.push(msg.request_id, _Queued(msg, time.monotonic()), tuple(msg.key),
                            msg.run_id)
            self._pump(slot)
        except Exception as exc:
            log.exception("hermeslet %s: could not take submit %s", self.node, msg.request_id)
            if msg.request_id not in self.holding():
                self._spawn(self._send(P.Failed(
                    request_id=msg.request_id, retryable=True,
                    error=f"node {self.node!r} could not take the request: "
                          f"{type(exc).__name__}: {exc}")))

    def _on_rekey(self, msg: P.Rekey) -> None:
        moved: set[str] = set()
        for rid, key in msg.keys.items():
            k = tuple(key)
            for s in self._all_slots():
                if rid in s.queue:
                    s.queue.rekey(rid, k)
                    moved.add(s.engine.name)
                    break
                if rid in s.inflight:  # at the engine: its priority, where it can change
                    s.engine.reprioritize(rid, P.key_to_priority(k, self.priority_scale))
                    break
            else:
                if rid in self.tool_queue:
                    self.tool_queue.rekey(rid, k)
        for s in self._all_slots():  # the release order changed: so may the adapters to load
            if s.engine.name in moved:
                self._adapters_changed(s)

    async def _on_cancel(self, msg: P.Cancel) -> None:
        for rid in msg.request_ids:
            dropped = self.tool_queue.remove(rid) is not None  # queued: report here
            for s in self._all_slots():
                if s.queue.remove(rid) is not None:
                    dropped = True
                    self._adapters_changed(s)
                task = s.inflight.get(rid)
                if task is not None:  # in flight: the task reports `failed`, refills window
                    task.cancel()
                    with contextlib.suppress(Exception):
                        await s.engine.abort(rid)
            ttask = self.tool_tasks.get(rid)
            if ttask is not None:
                ttask.cancel()
            if dropped:
                await self._send(P.Failed(request_id=rid, error="cancelled", retryable=False))

    # ------------------------------------------------------------------ engine window
    def _pump(self, slot: _EngineSlot) -> None:
        """Release queued requests while the engine's window has room (lowest key first)."""
        if slot.starting:
            return
        budget = slot.engine.kv_gate_tokens
        while slot.queue and len(slot.inflight) < slot.engine.max_inflight:
            key = slot.queue.peek_key() or ()
            if budget is not None:
                head = slot.queue.peek()
                assert head is not None and isinstance(head.msg, P.Submit)
                tokens = head.msg.prompt_estimate()
                free = budget - slot.prompt_tokens
                if not _GATE.admits(tokens, free, busy=bool(slot.inflight)):
                    break  # the head waits for room; the order is kept (kv_gate)
                slot.prompts[head.msg.request_id] = tokens
                slot.prompt_tokens += tokens
            item = slot.queue.pop()
            assert isinstance(item.msg, P.Submit)
            sub = item.msg
            if self.release_log is not None:
                self.release_log(slot.engine.name, sub.request_id)
            slot.models[sub.request_id] = sub.model
            serve = self._serve if item.outcome is None else self._serve_prewarm
            slot.inflight[sub.request_id] = asyncio.create_task(
                serve(slot, item, key), name=f"req-{sub.request_id}"
            )
        self._adapters_changed(slot)

    def _adapters_changed(self, slot: _EngineSlot) -> None:
        """Issue 5: after the slot's in-flight requests or queue order changed, tell the LoRA
        prewarmer which adapters the in-flight requests use (none of them is unloaded), and
        with the lookahead on, start loading those of the slot's next queued requests
        (:mod:`hermeslet.lora_lookahead`)."""
        pw = self.prewarmer
        base = slot.engine.model
        if pw is None or base not in pw.loras:
            return
        inflight = {m for m in slot.models.values() if m and m != base}
        if pw.lora_lookahead is not None:
            pw.lora_lookahead.update(slot.engine.name, base,
                                     # (an engine's queue holds submits only)
                                     lambda n: [q.msg.model for q in slot.queue.head(n)
                                                if isinstance(q.msg, P.Submit)],
                                     inflight)
        else:
            pw.set_in_use(slot.engine.name, base, inflight)

    async def _ensure_adapter(self, slot: _EngineSlot, model: str) -> str | None:
        """Before a request with a LoRA adapter goes to the engine: load the adapter if the
        node's prewarmer can and it is not loaded (a cold start the request waits for).
        Returns why a load failed (``None``: loaded, or nothing to load); the request is sent
        anyway (the engine may have the adapter), and that reason is added to its error."""
        pw = self.prewarmer.loras.get(slot.engine.model) if self.prewarmer is not None else None
        if pw is None or model == slot.engine.model or not pw.loadable(model):
            return None
        try:
            await pw.ensure(model)
        except Exception as exc:
            log.warning("loading LoRA adapter %r on engine %s failed: %s: %s", model,
                        slot.engine.name, type(exc).__name__, exc)
            return f"loading LoRA adapter {model!r} failed ({type(exc).__name__}: {exc})"
        return None

    async def _serve(self, slot: _EngineSlot, item: _Queued, key: tuple[float, ...]) -> None:
        sub = item.msg
        assert isinstance(sub, P.Submit)
        eng = slot.engine
        released = time.monotonic()
        ttft: float | None = None
        prio = sub.priority if sub.priority is not None else \
            P.key_to_priority(key, self.priority_scale)
        endpoint: Endpoint = sub.endpoint
        body = {**sub.body, "model": sub.model}
        if sub.native is not None and sub.native.get("endpoint") == "messages" \
                and "messages" in eng.native_endpoints:
            endpoint = "messages"  # the client's API, served as it was sent
            body = {**(sub.native.get("body") or {}), "model": sub.model}
        load_err: str | None = None
        if sub.traceparent is not None:  # this task's context: the adapter sends it on
            TRACEPARENT.set(sub.traceparent)
        try:
            if sub.reply_to is not None:  # the edge must take this node's answers (CURVE)
                undeliverable = await self.edges.check(sub.reply_to)
                if undeliverable is not None:
                    raise EngineError(undeliverable, retryable=True, status=502)
            load_err = await self._ensure_adapter(slot, sub.model)
            result: GenResult | None = None
            async for out in eng.generate(endpoint, body, sub.stream,
                                          request_id=sub.request_id, priority=prio):
                if isinstance(out, GenChunk):
                    if ttft is None:
                        ttft = time.monotonic() - released
                    token = P.Token(request_id=sub.request_id, text=out.text,
                                    n_tokens=out.n_tokens, chunk=out.chunk)
                    if sub.reply_to is not None:  # straight to the client's edge
                        self.edges.send(sub.reply_to, token)
                    else:
                        await self._send(token)
                else:
                    result = out
            if result is None:
                raise EngineError("engine ended without a result", retryable=True)
            end = time.monotonic()
            done = P.Done(
                request_id=sub.request_id, input_tokens=result.input_tokens,
                output_tokens=result.output_tokens, text=result.text,
                finish_reason=result.finish_reason, engine=eng.name,
                queue_s=released - item.arrival, service_s=end - released,
                ttft_s=ttft if ttft is not None else (end - released),
                response=result.response,
            )
            if sub.reply_to is None:
                await self._send(done)
            else:  # the answer to the edge; the counts to the scheduler unless the edge says
                self.edges.send(sub.reply_to, done)
                if not sub.reply_only:
                    await self._send(done.model_copy(update={"text": "", "response": None}))
        except asyncio.CancelledError:
            if slot.abandoned is not None:  # its engine's drain timed out (_abandon)
                await self._send(P.Failed(request_id=sub.request_id, error=slot.abandoned,
                                          retryable=ttft is None))
            else:
                await self._send(P.Failed(request_id=sub.request_id, error="cancelled",
                                          retryable=False))
        except EngineError as e:
            err = str(e) if load_err is None else f"{e}; {load_err}"
            await self._send(P.Failed(request_id=sub.request_id, error=err,
                                      retryable=e.retryable, status=e.status))
        except Exception as e:  # never let one request kill the agent
            await self._send(P.Failed(request_id=sub.request_id,
                                      error=f"{type(e).__name__}: {e}", retryable=True))
        finally:
            self._left_engine(slot, sub.request_id)

    def _left_engine(self, slot: _EngineSlot, request_id: str) -> None:
        """A released request (the scheduler's or a queued prewarm) is done at the engine:
        free its place in the window and release the next."""
        slot.inflight.pop(request_id, None)
        slot.models.pop(request_id, None)
        slot.prompt_tokens -= slot.prompts.pop(request_id, 0)
        if not self._stop.is_set():
            self._pump(slot)

    async def _serve_prewarm(self, slot: _EngineSlot, item: _Queued,
                             key: tuple[float, ...]) -> None:
        """A queued KV prewarm released to the engine: its outcome goes to its future."""
        sub, outcome = item.msg, item.outcome
        assert isinstance(sub, P.Submit) and outcome is not None
        released = time.monotonic()
        try:
            await self._ensure_adapter(slot, sub.model)
            async for _ in slot.engine.generate(
                    sub.endpoint, {**sub.body, "model": sub.model}, False,
                    request_id=sub.request_id,
                    priority=P.key_to_priority(key, self.priority_scale)):
                pass
            if not outcome.done():
                outcome.set_result(time.monotonic() - released)
        except asyncio.CancelledError:
            outcome.cancel()
            raise
        except Exception as e:
            if not outcome.done():
                outcome.set_exception(e)
        finally:
            self._left_engine(slot, sub.request_id)

    # ------------------------------------------------------------------ placement (issue 22)
    def _all_slots(self) -> list[_EngineSlot]:
        """The engines serving and those being drained."""
        return [*self.slots.values(), *self.draining.values()]

    async def apply_placement(self, engines: Sequence[EngineAdapter]) -> PlacementChange:
        """Change this node's engines to ``engines`` (not started; a placement plan's,
        :mod:`hermeslet.placement`), while it runs: keep those with the same name and model,
        drain the others (re-announced without them at once; their queued requests move to
        an engine of the same model, else wait; in-flight ones finish), stop them, start the
        new ones (their requests wait at the node meanwhile), and announce the engines again.
        One change at a time; returns what it did."""
        if not self._started.is_set() or self._stop.is_set():
            raise RuntimeError(f"hermeslet {self.node}: apply_placement needs a running node")
        async with self._placement_lock:
            change = plan_change({n: s.engine.model for n, s in self.slots.items()},
                                 [(e.name, e.model) for e in engines])
            old = {n: self.slots[n] for n in change.drained}
            self.slots = {e.name: self.slots[e.name] if e.name in change.kept
                          else _EngineSlot(e, starting=True) for e in engines}
            self.draining.update(old)
            moved = sum(self._move_queued(s) for s in old.values())
            await self._send(self.hello())  # no new work for the drained engines
            deadline = time.monotonic() + self.drain_timeout_s
            abandoned = 0
            while any(s.queue or s.inflight for s in old.values()) and not self._stop.is_set():
                if time.monotonic() >= deadline:
                    abandoned = await self._abandon(old.values())
                    break
                await asyncio.sleep(0.02)
            for name, s in old.items():
                self._unfollow_kv(name)
                with contextlib.suppress(Exception):
                    await s.engine.close()
                if self.draining.get(name) is s:
                    del self.draining[name]
            failed: dict[str, str] = {}
            for name in change.started:
                slot = self.slots[name]
                try:
                    await slot.engine.start()
                except Exception as e:
                    failed[name] = f"{type(e).__name__}: {e}"
                    await self._fail_start(slot, failed[name])
                    continue
                slot.starting = False
                if slot.engine.kv_events is not None:
                    f = self.kv_followers[name] = EngineKVFollower(
                        self.node, name, slot.engine.kv_events, ctx=self.ctx)
                    self._kv_tasks[name] = asyncio.create_task(
                        f.subscriber.run(), name=f"hermeslet-{self.node}-kv-{name}")
                self._pump(slot)
            await self._send(self.hello())
            log.info("hermeslet %s: placement kept %s, drained %s, started %s (%d queued "
                     "requests moved)", self.node, change.kept, change.drained, change.started,
                     moved)
            if failed:  # the node serves on without them: say so where operators look
                log.error("hermeslet %s: placement: engines failed to start, serving without "
                          "them (their waiting requests failed, retryable): %s", self.node,
                          failed)
            return PlacementChange(change.kept, change.drained, change.started, moved, failed,
                                   abandoned)

    async def _abandon(self, slots: Iterable[_EngineSlot]) -> int:
        """The drain timed out: fail what the drained engines still hold (queued: retryable;
        in flight: cancelled at the engine, retryable unless tokens were streamed, since a
        retry would stream them again) and wait for their tasks. Returns how many."""
        n = 0
        for slot in slots:
            if not (slot.queue or slot.inflight):
                continue
            slot.abandoned = (f"engine {slot.engine.name} was stopped by a placement change: "
                              f"still busy after the {self.drain_timeout_s:g} s drain timeout")
            log.warning("hermeslet %s: %s (%d queued, %d in flight failed)", self.node,
                        slot.abandoned, len(slot.queue), len(slot.inflight))
            n += len(slot.queue) + len(slot.inflight)
            await self._fail_queued(slot, slot.abandoned)
            tasks = list(slot.inflight.items())
            for rid, task in tasks:
                task.cancel()
                with contextlib.suppress(Exception):
                    await slot.engine.abort(rid)
            await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
        return n

    async def _on_place(self, msg: P.Place) -> None:
        """A plan from the scheduler, applied as :meth:`apply_placement`: its engines replace
        those of the last plan and the node's engines of the models it names; the node's other
        engines (an embedding model, a model no plan has named) stay. A node without a
        builder, or a bad plan, is logged and changes nothing."""
        if self.placement_builder is None:
            log.warning("hermeslet %s: ignored a placement plan (start the node with "
                        "--accept-placement to apply them)", self.node)
            return
        try:
            launches = parse_placement(msg.plan)
            planned = {e.model for e in launches}
            engines = self.placement_builder(launches)
        except Exception as e:
            log.error("hermeslet %s: refused a placement plan: %s: %s", self.node,
                      type(e).__name__, e)
            return
        others = [s.engine for n, s in self.slots.items()
                  if s.engine.model not in planned and n not in self._placed]
        self._placed = {e.name for e in engines}
        await self.apply_placement([*engines, *others])

    def _move_queued(self, slot: _EngineSlot) -> int:
        """Move a drained engine's queued requests to a serving engine of its model (their
        keys and runs kept); how many moved (0: none serves it, they wait on the engine)."""
        target = next((s for s in self.slots.values() if s.engine.model == slot.engine.model),
                      None)
        if target is None:
            return 0
        n = 0
        while slot.queue:
            key = slot.queue.peek_key() or ()
            item = slot.queue.pop()
            rid = item.msg.request_id
            target.queue.push(rid, item, key, item.msg.run_id)
            for tag, (s, r) in list(self._kv_queued.items()):
                if s is slot and r == rid:
                    self._kv_queued[tag] = (target, rid)
            n += 1
        self._pump(target)
        return n

    async def _fail_start(self, slot: _EngineSlot, error: str) -> None:
        """A new engine did not start: fail what waits for it, serve without it."""
        self.slots.pop(slot.engine.name, None)
        await self._fail_queued(slot, f"engine {slot.engine.name} did not start: {error}")
        with contextlib.suppress(Exception):
            await slot.engine.close()

    async def _fail_queued(self, slot: _EngineSlot, error: str) -> None:
        """Fail the requests waiting in ``slot``'s queue, retryable (they never reached the
        engine; a KV prewarm's waiter gets the error)."""
        while slot.queue:
            item = slot.queue.pop()
            if item.outcome is not None:
                item.outcome.set_exception(EngineError(error))
            else:
                await self._send(P.Failed(request_id=item.msg.request_id, retryable=True,
                                          error=error))

    def _unfollow_kv(self, name: str) -> None:
        self.kv_followers.pop(name, None)
        task = self._kv_tasks.pop(name, None)
        if task is not None:
            task.cancel()

    # ------------------------------------------------------------------ tools
    def _pump_tools(self) -> None:
        while self.tool_queue and len(self.tool_tasks) < self.tool_concurrency:
            item = self.tool_queue.pop()
            assert isinstance(item.msg, P.Tool)
            self.tool_tasks[item.msg.request_id] = asyncio.create_task(self._run_tool(item))

    async def _run_tool(self, item: _Queued) -> None:
        t = item.msg
        assert isinstance(t, P.Tool)
        started = time.monotonic()
        try:
            r = await self.tools.run(t.backend, code=t.code, command=t.command,
                                     timeout_s=t.timeout_s)
            await self._send(P.ToolDone(
                request_id=t.request_id, exit_code=r.exit_code, stdout=r.stdout,
                stderr=r.stderr, duration_s=r.duration_s, cold=r.cold, timed_out=r.timed_out,
                queue_s=started - item.arrival,
            ))
        except asyncio.CancelledError:
            await self._send(P.Failed(request_id=t.request_id, error="cancelled",
                                      retryable=False))
        except Exception as e:
            await self._send(P.Failed(request_id=t.request_id,
                                      error=f"tool runner: {type(e).__name__}: {e}",
                                      retryable=False))
        finally:
            self.tool_tasks.pop(t.request_id, None)
            if not self._stop.is_set():
                self._pump_tools()

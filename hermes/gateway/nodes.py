"""The connected HermesLets: how to reach each, what each serves, its load, what it holds,
and which engine or tool node gets a piece of work.

:class:`NodeTable` owns the node side of the wire: one ZeroMQ ROUTER socket (inproc always,
TCP when ``scheduler.bind`` is set; CURVE when ``security.curve_dir`` is) and in-process links
(:mod:`hermes.inproc`, the embedded HermesLet), the receive loop that decodes node messages
and hands them to one handler (dispatch's), the node registry kept from ``hello`` and
``heartbeat`` messages, and the detection of nodes that fell silent (the periodic sweep, and a
socket monitor that reacts to TCP disconnects in seconds). Requests are sent to the
engine the router picks among those serving their model (:meth:`NodeTable.pick_engine`,
:mod:`hermes.core.routing`; ``scheduler.router``, least loaded by default). Messages to
remote nodes leave at the end of the loop iteration that sent them, back to back and in order
(:meth:`NodeTable._flush_outbox`: one wake-up of ZeroMQ's I/O thread per burst).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Set
from typing import Any

import zmq
import zmq.asyncio

from hermes.core.kv_blocks import BlockHashing, external_hash
from hermes.core.kv_index import BlockIndex, match_blocks
from hermes.core.routing import (
    EngineState,
    PrefixIndex,
    Router,
    RouteRequest,
    RouteStats,
    make_router,
)
from hermes.gateway.context import SchedulerContext
from hermes.gateway.errors import NoCapacity, SchedulerError
from hermes.gateway.iteration import EndOfIteration
from hermes.gateway.prefixes import prompt_token_ids
from hermes.gateway.served import resolve_served
from hermes.gateway.state import Node
from hermes.inproc import InprocLink
from hermes.protocol import (
    EngineInfo,
    Heartbeat,
    Hello,
    KVBlockSpec,
    KVSummary,
    Leader,
    ProtocolError,
    Resync,
    Submit,
    Tool,
    decode,
    encode,
)
from hermes.zmqdrain import POLLIN, POLLOUT, events, recv_frames, send_frames

log = logging.getLogger("hermes.gateway.nodes")

#: messages kept for nodes whose pipes are full, at most (then dropped, logged)
MAX_UNSENT = 100_000
#: how often kept messages are tried again (also when the socket says it can send)
UNSENT_RETRY_S = 0.005

NODE_TIMEOUT_S = 10.0  # wall seconds without a message before a node is considered gone

#: what a client can do when no node can run tool code in a sandbox
NO_SANDBOX = ("tool calls are refused: no connected node has a tool sandbox. Install bubblewrap "
              "on the gateway's host (apt-get install bubblewrap; the Docker image has it, "
              "but a container's default seccomp profile forbids the user namespaces it "
              "needs) or connect a HermesLet with a Docker sandbox (hermeslet run --docker); "
              "for local development only, `hermes serve --unsafe-unsandboxed-tools` "
              "(loopback only) runs tool code unsandboxed")

#: takes every decoded node message: (the sender's identity, the message)
MessageHandler = Callable[[bytes, Any], None]


class NodeTable:
    """Connected nodes, the socket and links to them, engine choice (see the module doc)."""

    def __init__(self, ctx: SchedulerContext, context: zmq.asyncio.Context,
                 inproc_address: str) -> None:
        self.ctx = ctx
        self.context = context
        self.inproc_address = inproc_address
        self.nodes: dict[str, Node] = {}
        #: bumped whenever the engines served may have changed (a node's hello, a node
        #: dropped): what the served-model set given to edges is cached by
        self.models_version = 0
        #: set while at least one node is connected
        self.ready = asyncio.Event()
        #: request id -> (node, "queued"|"inflight"), from the nodes' hellos and heartbeats
        self.held: dict[str, tuple[str, str]] = {}
        #: every decoded message goes here (dispatch's router, set by the scheduler)
        self.handler: MessageHandler = lambda identity, msg: None
        #: called with the node after each ``hello`` is registered (and, elected, the node
        #: told whom to follow): the placer sends a restarted node its plan in force
        self.hello_listeners: list[Callable[[Node], None]] = []
        self.socket: zmq.asyncio.Socket | None = None
        #: in-process nodes by identity (hermes.inproc: the embedded HermesLet), beside the socket
        self._links: dict[bytes, InprocLink] = {}
        self._zap: Any = None
        self._monitor: Any = None
        self._monitor_task: asyncio.Task[None] | None = None
        sc = ctx.config.scheduler
        #: engine choice (issue 19) and what it did
        self.router: Router = make_router(
            sc.router, index=PrefixIndex(capacity_tokens=sc.router_index_tokens))
        self.router_stats = RouteStats()
        #: per engine (``node/engine``) publishing KV events, its block index, rebuilt from
        #: the node's ``kv_summary`` messages (issue 19), and the next summary's ``seq``
        self.kv_indexes: dict[str, BlockIndex] = {}
        self._kv_seq: dict[str, int] = {}
        self._kv_hashing: dict[tuple[int, str, str], BlockHashing] = {}
        #: with elected schedulers (:mod:`hermes.gateway.ha`): the lease epoch stamped on
        #: every message to a node, and whether the lease still holds, asked before each
        #: send (None: a lone scheduler, nothing stamped or checked)
        self.epoch: int | None = None
        self.fence: Callable[[], bool] | None = None
        #: wall time of the first submit or tool call sent in this term (failover figures)
        self.first_dispatch_at: float | None = None
        #: count the CPU time of node messages in ``stats["scheduler_cpu_ns"]`` (set by the
        #: scheduler with ``HERMES_ROLE_CPU=1``)
        self.meter = False
        #: a synchronous shadow of :attr:`socket`: every receive and send goes through it
        #: on the event loop's readiness callback (:meth:`recv_loop`)
        self._sync: zmq.Socket[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self._reading = False
        #: frames the peers' pipes could not take yet (zmq.Again), in send order
        self._unsent: dict[bytes, deque[list[bytes]]] = {}  # by node identity
        self._n_unsent = 0
        self._unsent_timer: asyncio.TimerHandle | None = None
        #: messages to nodes (frames, message) waiting for the end of this loop iteration
        self._outbox: EndOfIteration[tuple[list[bytes], Any]] = EndOfIteration(
            self._flush_outbox)
        #: messages refused because their node is gone (EHOSTUNREACH), and dropped because
        #: :data:`MAX_UNSENT` were waiting already
        self.unroutable = 0
        self.overflowed = 0

    # ------------------------------------------------------------------ wire
    def bind(self) -> None:
        """Bind the ROUTER socket (inproc always, TCP when configured)."""
        sock = self.context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting node takes over its identity
        cfg = self.ctx.config
        if cfg.security.curve_dir:  # CURVE: only nodes with an authorized key get in
            from hermes.security.curve import secure_server

            self._zap = secure_server(sock, self.context, cfg.security.curve_dir)
        sock.bind(self.inproc_address)
        if cfg.scheduler.bind:
            try:
                sock.bind(cfg.scheduler.bind)
            except zmq.ZMQError as exc:
                sock.close(0)
                raise SchedulerError(
                    f"cannot bind the node socket to scheduler.bind = "
                    f"{cfg.scheduler.bind!r}: {exc} (is another gateway running? pick "
                    f"another address with --bind / HERMES_BIND, or '' for embedded nodes only)"
                ) from exc
        # a message the peer's pipe cannot take now is refused (zmq.Again) rather than
        # dropped without a word, and kept until it can (:meth:`_flush_unsent`); one to a
        # peer that is gone is refused too (EHOSTUNREACH) and dropped, as before
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket = sock
        self._sync = zmq.Socket.shadow(sock.underlying)

    def curve_refused(self) -> dict[str, int]:
        """CURVE handshakes refused on this process's sockets, by socket (``nodes``, and
        ``edges`` for a ``--role scheduler``; :class:`hermes.security.curve.CurveGate`)."""
        from hermes.security.curve import gate_of

        gate = gate_of(self.context)
        return gate.counts() if gate is not None else {}

    def close(self) -> None:
        if self._monitor_task is not None:
            self._monitor_task.cancel()
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None
        self._stop_reading()
        self._outbox.flush_now()  # sent before the socket closes, as before
        if self._unsent_timer is not None:
            self._unsent_timer.cancel()
            self._unsent_timer = None
        self._sync = None
        if self.socket is not None:
            self.socket.close(linger=0)
            self.socket = None
        for link in self._links.values():
            link.close()
        self._links.clear()
        if self._zap is not None:
            self._zap.stop()
            self._zap = None

    async def recv_loop(self) -> None:
        """Receive node messages until cancelled.

        A plain (synchronous) read of the socket on the event loop's readiness callback, as
        :class:`hermes.gateway.edge.link.EdgeLink` reads the edges: every queued message is
        taken in one wake-up, without the future, event registration and done callback that
        an asyncio socket's receive costs per message. ZeroMQ's descriptor is
        edge-triggered: it signals when the socket's state changed, and any operation on
        the socket (a send included) may take that signal, so :meth:`_readable` reads until
        ``EVENTS`` says nothing is queued and every send looks again (:meth:`_recheck`)."""
        assert self._sync is not None
        loop = self._loop = asyncio.get_running_loop()
        fd = self._fd = int(self._sync.getsockopt(zmq.FD))
        loop.add_reader(fd, self._readable)
        loop.call_soon(self._readable)  # queued before the reader was added
        try:
            await loop.create_future()  # never set: until cancelled
        finally:
            self._stop_reading()

    def _stop_reading(self) -> None:
        if self._loop is not None and self._fd is not None:
            try:
                self._loop.remove_reader(self._fd)
            except (RuntimeError, ValueError, OSError):  # the loop or descriptor is closed
                pass
        self._fd = None

    #: messages taken in a row before the loop's other work runs
    BATCH = 64

    def _readable(self) -> None:
        """Take the queued node messages (at most :attr:`BATCH`, then yield and come back)."""
        if not self.meter:
            self._read()
            return
        t0 = time.thread_time_ns()  # HERMES_ROLE_CPU: the scheduler's share of the CPU
        self._read()
        self.ctx.stats["scheduler_cpu_ns"] += time.thread_time_ns() - t0

    def _read(self) -> None:
        sync = self._sync
        if sync is None or self._fd is None:
            return
        self._reading = True  # (sends meanwhile need not look: this loop asks EVENTS next)
        try:
            self._read_batch(sync)
        finally:
            self._reading = False

    def _read_batch(self, sync: zmq.Socket[bytes]) -> None:
        for _ in range(self.BATCH):
            try:
                # asked first: an empty queue answered by zmq.Again costs an exception object
                ev = events(sync)
                if self._unsent and ev & POLLOUT:
                    self._flush_unsent()
                if not ev & POLLIN:
                    return
                frames = recv_frames(sync)
            except zmq.Again:
                return
            except zmq.ZMQError as e:  # closed meanwhile
                log.debug("zmq receive failed: %s", e)
                return
            self._on_frames(frames)
        if self._loop is not None:
            self._loop.call_soon(self._readable)  # more queued: the loop's other work first

    def _recheck(self) -> None:
        """After a send: a message that arrived meanwhile may have had its readiness signal
        taken by the send; read it (on the next loop iteration) rather than wait for the
        next signal, which may never come."""
        sync = self._sync
        if (sync is not None and not self._reading and self._loop is not None
                and self._fd is not None and events(sync) & POLLIN):
            self._loop.call_soon(self._readable)

    def _on_frames(self, frames: list[bytes]) -> None:
        if len(frames) >= 2:
            identity, frame = frames[0], frames[-1]
            try:
                msg = decode(frame)
            except ProtocolError as e:
                log.warning("bad message from %r: %s", identity, e)
                return
            self._on_message(identity, msg)

    def _on_message(self, identity: bytes, msg: Any) -> None:
        try:
            self.handler(identity, msg)
        except Exception:  # one bad message must not stop the scheduler
            log.exception("error handling %s from %r", getattr(msg, "type", "?"), identity)

    def inproc_link(self, node: str) -> InprocLink:
        """A link for a HermesLet in this process and event loop (``hermes serve``'s embedded
        node): the protocol's messages without ZeroMQ or JSON (:mod:`hermes.inproc`)."""
        identity = node.encode()
        if identity in self._links:
            raise SchedulerError(f"an in-process node {node!r} is already linked")
        link = InprocLink(identity, self._on_message)
        self._links[identity] = link
        return link

    def send(self, node: Node, msg: Any) -> None:
        self.send_raw(node.identity, msg)

    def send_raw(self, identity: bytes, msg: Any) -> None:
        if self.fence is not None:
            if not self.fence():  # the lease ran out: a deposed scheduler sends nothing
                self._fenced(msg)
                return
            msg.epoch = self.epoch
            if self.first_dispatch_at is None and isinstance(msg, Submit | Tool):
                self.first_dispatch_at = time.time()
        link = self._links.get(identity)
        if link is not None:
            link.deliver(msg)
            return
        if self._sync is None:
            raise NoCapacity("scheduler is not running")
        self._outbox.add(([identity, encode(msg)], msg))  # (no loop: sent at once)

    def _flush_outbox(self, out: list[tuple[list[bytes], Any]]) -> None:
        """Send the messages of :meth:`send_raw` gathered during the loop iteration
        (:class:`~hermes.gateway.iteration.EndOfIteration`), back to back and in order (a node's messages stay in the order they were sent), then look for
        messages that arrived meanwhile (:meth:`_recheck`).

        Why they wait for the end of the loop iteration: each ZeroMQ send to a peer whose
        pipe the I/O thread had drained wakes that thread (an eventfd write, then its
        epoll, its pipe read and the TCP send), and on this machine's virtual CPUs a
        wake-up is the bulk of a small message's cost. Sent one at a time with the work of
        a call between them, every send woke it; sent together, the first one does (a
        sender alone: ~31-33 us of process CPU per message one at a time, ~4-5 us in groups
        of 16). The lease is checked again here: a scheduler paused between a send and
        this flush sends nothing once it has lost the lease."""
        if self.fence is not None and not self.fence():
            for _, msg in out:
                self._fenced(msg)
            return
        if self._sync is None:  # closed meanwhile: the socket's unsent messages are dropped
            return
        for frames, _ in out:
            if frames[0] in self._unsent:  # after those waiting already: a node's in order
                self._keep_unsent(frames)
                self._flush_unsent()
            else:
                self._send_frames(frames)
        self._recheck()

    def _send_frames(self, frames: list[bytes]) -> bool:
        """One non-blocking send; False: the node's pipe is full (kept, sent later)."""
        assert self._sync is not None
        try:
            send_frames(self._sync, frames)
        except zmq.Again:  # the node's pipe is full (ROUTER_MANDATORY): kept, sent later
            self._keep_unsent(frames)
            return False
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            self.unroutable += 1  # the node is gone: its work is moved when it is noticed
            log.debug("node %r is gone: dropped a message to it", frames[0])
        return True

    def _keep_unsent(self, frames: list[bytes]) -> None:
        if self._n_unsent >= MAX_UNSENT:
            self.overflowed += 1
            if self.overflowed == 1 or self.overflowed % 1000 == 0:
                log.error("%d messages to nodes dropped: %d are waiting for nodes that do not "
                          "read (pipes full)", self.overflowed, self._n_unsent)
            return
        self._unsent.setdefault(frames[0], deque()).append(frames)
        self._n_unsent += 1
        if self._unsent_timer is None and self._loop is not None:
            self._unsent_timer = self._loop.call_later(UNSENT_RETRY_S, self._retry_unsent)

    def _retry_unsent(self) -> None:
        self._unsent_timer = None
        self._flush_unsent()
        self._recheck()

    def _flush_unsent(self) -> None:
        """Send the kept messages that the nodes' pipes take now, each node's in order, up
        to the first its pipe refuses; try again later while some are left
        (:data:`UNSENT_RETRY_S`; also whenever the socket says it can send)."""
        assert self._sync is not None
        for identity in list(self._unsent):
            queue = self._unsent[identity]
            while queue:
                try:
                    send_frames(self._sync, queue[0])
                except zmq.Again:
                    break
                except zmq.ZMQError as e:
                    if e.errno != zmq.EHOSTUNREACH:
                        raise
                    self.unroutable += len(queue)  # gone: what it was owed goes nowhere
                    self._n_unsent -= len(queue)
                    queue.clear()
                    break
                queue.popleft()
                self._n_unsent -= 1
            if not queue:
                del self._unsent[identity]
        if self._unsent and self._unsent_timer is None and self._loop is not None:
            self._unsent_timer = self._loop.call_later(UNSENT_RETRY_S, self._retry_unsent)

    def _fenced(self, msg: Any) -> None:
        stats = self.ctx.stats
        n = stats["ha_fenced_sends"] = stats.get("ha_fenced_sends", 0) + 1
        if n == 1 or n % 100 == 0:
            log.error("fenced: refused to send %s (%d so far): the scheduler lease of epoch %s "
                      "is no longer held", getattr(msg, "type", "?"), n, self.epoch)

    # ------------------------------------------------------------------ registry
    async def wait_for_nodes(self, timeout: float = 10.0) -> bool:
        try:
            await asyncio.wait_for(self.ready.wait(), timeout)
            return True
        except TimeoutError:
            return False

    def observe(self, identity: bytes, msg: Any) -> Node | None:
        """What any message says about its node: it is alive; an unknown node (this gateway
        restarted) is asked to say hello again (``resync``); a ``hello`` (re)registers it, a
        ``heartbeat`` updates its load; both report the request ids it holds."""
        node = self.by_identity(identity)
        if node is not None:
            node.last_seen = time.monotonic()
        elif not isinstance(msg, Hello):  # a node we do not know (we restarted): ask again
            self.send_raw(identity, Resync())
        if isinstance(msg, Hello | Heartbeat) and msg.holding is not None:
            self._holding(msg.node, msg.holding)
        if isinstance(msg, Heartbeat):
            if node is not None:
                node.queued = {name: load.queued for name, load in msg.engines.items()}
                node.kv_usage = {name: load.kv_usage for name, load in msg.engines.items()}
        elif isinstance(msg, Hello):
            joined = self._hello(identity, msg)
            if self.epoch is not None:  # elected: tell the node whom to follow
                self.send_raw(identity, Leader())
            for listener in self.hello_listeners:
                listener(joined)
        elif isinstance(msg, KVSummary) and node is not None:
            self._kv_summary(identity, msg)
        return node

    def _kv_summary(self, identity: bytes, msg: KVSummary) -> None:
        """Apply one engine's block-index summary; one missing (``seq`` gap) or an increment
        before the full one: drop the copy and ask the node for a ``hello`` and full ones."""
        node = self.nodes.get(msg.node)
        if node is None or msg.engine not in node.engines:
            return
        key = f"{msg.node}/{msg.engine}"
        idx = self.kv_indexes.get(key)
        if msg.full:
            idx = self.kv_indexes[key] = BlockIndex()
        elif idx is None or self._kv_seq.get(key) != msg.seq:
            log.warning("kv summary %s of %s: expected %s; resync", msg.seq, key,
                        self._kv_seq.get(key, "a full one"))
            self.kv_indexes.pop(key, None)
            self._kv_seq.pop(key, None)
            self.send_raw(identity, Resync())
            return
        idx.apply_delta(msg.stored, msg.removed, full=msg.full)
        self._kv_seq[key] = msg.seq + 1

    def _holding(self, node: str, holding: dict[str, str]) -> None:
        for rid in [r for r, (n, _) in self.held.items() if n == node and r not in holding]:
            del self.held[rid]
        for rid, state in holding.items():
            self.held[rid] = (node, state)

    def by_identity(self, identity: bytes) -> Node | None:
        node = self.nodes.get(identity.decode(errors="replace"))
        if node is not None and node.identity == identity:
            return node
        for n in self.nodes.values():
            if n.identity == identity:
                return n
        return None

    def _hello(self, identity: bytes, msg: Hello) -> Node:
        old = self.nodes.get(msg.node)
        node = Node(
            name=msg.node,
            identity=identity,
            engines={e.name: e for e in msg.engines},
            tools=list(msg.tools),
            last_seen=time.monotonic(),
            accepts_placement=msg.placement,
            gpus=msg.gpus,
            device=msg.device,
        )
        if old is not None:
            node.outstanding = old.outstanding
            node.tools_outstanding = old.tools_outstanding
            for gone in old.engines.keys() - node.engines.keys():  # a placement change
                self.router.index.forget(f"{msg.node}/{gone}")
                self.kv_indexes.pop(f"{msg.node}/{gone}", None)
                self._kv_seq.pop(f"{msg.node}/{gone}", None)
        self.nodes[msg.node] = node
        self.models_version += 1
        for e in msg.engines:  # a full summary follows a hello
            self.kv_indexes.pop(f"{msg.node}/{e.name}", None)
            self._kv_seq.pop(f"{msg.node}/{e.name}", None)
        if self.ctx.metrics is not None:
            self.ctx.metrics.on_node_joined(msg.node, node.engines)
        self.ready.set()
        log.info("node %s connected: engines %s, tools %s", msg.node,
                 [f"{e.name}({e.model})" for e in msg.engines], msg.tools)
        return node

    def drop_silent(self, silent_s: float, gone: Callable[[str], None], *,
                    why: str = "silent") -> list[str]:
        """Drop the nodes silent for ``silent_s`` wall seconds, calling ``gone(name)`` right
        after each (its work moves elsewhere); returns their names."""
        cutoff = time.monotonic() - silent_s
        dropped = [name for name, n in self.nodes.items() if n.last_seen < cutoff]
        for name in dropped:
            if why == "silent":
                log.warning("node %s silent for %.0f s: resubmitting its requests", name, silent_s)
            else:
                log.warning("node %s disconnected and silent for %.1f s: re-dispatching", name,
                            silent_s)
            for e in self.nodes.pop(name).engines:
                self.models_version += 1
                self.router.index.forget(f"{name}/{e}")
                self.kv_indexes.pop(f"{name}/{e}", None)
                self._kv_seq.pop(f"{name}/{e}", None)
            gone(name)
        if not self.nodes:
            self.ready.clear()
        return dropped

    def start_monitor(self, gone: Callable[[str], None], suspect_s: float = 2.0) -> None:
        """Watch the ROUTER for TCP disconnects: a node that disconnected and then missed a
        heartbeat (``suspect_s``) is treated as dead at once, rather than after the silence
        timeout of the sweep, so that its work moves elsewhere in seconds."""
        sock = self.socket
        if sock is None or self._monitor is not None:
            return
        from zmq.utils.monitor import recv_monitor_message

        mon = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._monitor = mon

        async def watch() -> None:
            try:
                while True:
                    await recv_monitor_message(mon)
                    await asyncio.sleep(suspect_s)
                    self.drop_silent(suspect_s, gone, why="disconnected")
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("socket monitor stopped")

        self._monitor_task = asyncio.get_running_loop().create_task(watch(), name="hermes-monitor")

    # ------------------------------------------------------------------ engine choice
    def served_models(self, task: str | None = None) -> list[str]:
        """Models the connected engines serve (base models and LoRA adapters), those of
        engines of ``task`` only (``generate`` or ``embed``) when given."""
        seen: dict[str, None] = {}
        for node in self.nodes.values():
            for e in node.engines.values():
                if task is not None and e.task != task:
                    continue
                seen[e.model] = None
                for lora in e.loras:
                    seen[lora] = None
        return list(seen)

    def base_model(self, model: str) -> str | None:
        """The base model of an engine that serves ``model`` as a LoRA adapter (``None``: no
        connected engine does, or ``model`` is a base model)."""
        for node in self.nodes.values():
            for e in node.engines.values():
                if model != e.model and model in e.loras:
                    return e.model
        return None

    def resolve_model(self, model: str | None, *, strict: bool, task: str = "generate") -> str:
        """The model a request for ``task`` goes to: itself if served, else the default
        (unless strict). A model served only for the other task is refused (:class:`WrongTask`)
        rather than routed elsewhere (:func:`hermes.gateway.served.resolve_served`, the rule
        edges apply to the served-model set this scheduler gives them)."""
        sc = self.ctx.config.scheduler
        return resolve_served(model, strict=strict, task=task, served=self.served_models,
                              default_model=sc.default_model,
                              route_unknown=sc.route_unknown_models)

    async def serving_model(self, model: str | None, *, strict: bool,
                            task: str = "generate") -> str:
        """:meth:`resolve_model`, after waiting (up to 10 s) for a HermesLet when none is
        connected: a gateway that has just (re)started accepts runs before its nodes have said
        hello, and their calls should wait for an engine rather than fail at once."""
        if not self.nodes:
            await self.wait_for_nodes()
        return self.resolve_model(model, strict=strict, task=task)

    def pick_engine(self, model: str, exclude: Set[str] = frozenset(),
                    route: RouteRequest | None = None,
                    prompt: tuple[str, dict[str, Any]] | None = None) -> tuple[Node, EngineInfo]:
        """The engine for a request of ``model`` on a node not in ``exclude``: the router's
        choice (``scheduler.router``, :mod:`hermes.core.routing`) among the engines serving it,
        each described by its in-flight fraction of its window, the node's reported queue for
        it and its KV use; ``route``: the request (its run and prompt prefixes), none for a
        bare choice (least loaded). The choice is recorded in the router's prefix index.
        ``prompt``: the request's ``(endpoint, body)``, for an exact look-up of its blocks in
        the indexes of the engines that publish KV events (:meth:`_exact_cached`)."""
        cands: list[EngineState] = []
        where: dict[str, tuple[Node, EngineInfo]] = {}
        for node in self.nodes.values():
            if node.name in exclude:
                continue
            for e in node.engines.values():
                if e.model != model and model not in e.loras:
                    continue
                key = f"{node.name}/{e.name}"
                where[key] = (node, e)
                cands.append(EngineState(key, node.outstanding.get(e.name, 0) / e.max_inflight,
                                         node.queued.get(e.name, 0), node.kv_usage.get(e.name)))
        if not cands:
            raise NoCapacity(f"no connected engine serves model {model!r}")
        if len(cands) == 1:
            chosen = cands[0]
        elif route is None:
            chosen = min(cands, key=lambda c: (c.load, c.queued))
        else:
            if prompt is not None:
                self._exact_cached(cands, where, *prompt)
            chosen = self.router.pick(route, cands, self.ctx.now())
        if route is not None:
            self.router_stats.note(chosen.engine, route.input_tokens,
                                   self.router.matched_tokens(route, chosen))
            self.router.sent(route, chosen.engine, self.ctx.now())
        return where[chosen.engine]

    def _exact_cached(self, cands: list[EngineState], where: dict[str, tuple[Node, EngineInfo]],
                      endpoint: str, body: dict[str, Any]) -> None:
        """Set ``cached_tokens`` of the candidates with a KV-event block index: the prompt's
        leading blocks (vLLM's hashes of its token ids) they hold, on the GPU or a lower tier;
        the others keep the approximate index."""
        groups: dict[tuple[int, str, str, str | None], list[EngineState]] = {}
        specs: dict[tuple[int, str, str, str | None], KVBlockSpec] = {}
        for c in cands:
            spec = where[c.engine][1].kv_blocks
            if spec is not None and c.engine in self.kv_indexes:
                gkey = (spec.block_size, spec.hash_algo, spec.seed, spec.tokenizer)
                specs[gkey] = spec
                groups.setdefault(gkey, []).append(c)
        for key, group in groups.items():
            spec = specs[key]
            ids = prompt_token_ids(endpoint, body, spec.tokenizer)
            hkey = (spec.block_size, spec.hash_algo, spec.seed)
            hashing = self._kv_hashing.get(hkey)
            if hashing is None:
                try:
                    hashing = self._kv_hashing[hkey] = BlockHashing(*hkey)
                except ValueError as e:
                    log.warning("engine blocks cannot be looked up: %s", e)
                    continue
            if ids is None:
                continue
            got = match_blocks((external_hash(h) for h in hashing.iter_hashes(ids)),
                               {c.engine: self.kv_indexes[c.engine] for c in group})
            for c in group:
                m = got[c.engine]
                c.cached_tokens = min(len(ids), (m.gpu_blocks + m.cpu_blocks) * spec.block_size)

    def pick_tool_node(self, backend: str, exclude: Set[str] = frozenset()) -> Node:
        """The tool node with the fewest of our calls, among those running ``backend``'s kind
        of tool (any tool node if none says so)."""
        kind = backend.split(":", 1)[0]
        capable = [n for n in self.nodes.values() if n.tools and n.name not in exclude]
        exact = [n for n in capable if kind in n.tools]
        pool = exact or capable
        if not pool:
            raise NoCapacity("no connected node runs tools")
        return min(pool, key=lambda n: n.tools_outstanding)

    def no_tool_sandbox(self) -> bool:
        """Connected nodes, none of which runs tool calls (none has a sandbox)."""
        return bool(self.nodes) and not any(n.tools for n in self.nodes.values())

"""An edge process (``hermes serve --role edge``): HTTP in front of the active scheduler.

Many edges run behind a load balancer; each

- follows the **lease record** in the election store (``[ha] election``): the active
  scheduler's epoch, its address for edges (``edge_address``) and its HTTP address; it
  re-reads it every :attr:`SchedulerLink.WATCH_S` and reconnects when the leader changes;
- answers ``/readyz`` 200 only while the active scheduler answers its pings (within
  :attr:`SchedulerLink.READY_S`), so that a load balancer sends it traffic only then;
- serves the LLM endpoints itself (``POST /v1/chat/completions``, ``/v1/completions``,
  ``/v1/embeddings``, Anthropic's ``/v1/messages``): API keys and tenant admission (the
  gateway's security middleware), parsing and validation (the same models as the all-in-one
  gateway), then **one compact message per call** to the scheduler
  (:class:`~hermes.gateway.edge.wire.Call`: the request id, run headers, model, the prompt's
  token estimate and the engine body). The scheduler
  ranks and dispatches it with ``reply_to`` = this edge's ZeroMQ address (``--bind``): the
  node streams the tokens and sends the answer **here**, and the scheduler only the counts;
  the answer is written here as the all-in-one gateway writes it (the same functions:
  :mod:`hermes.gateway.api.openai_api`, :mod:`hermes.gateway.api.anthropic_answers`);
- answers ``POST /v1/messages/count_tokens`` without any message to the scheduler: the
  served-model set comes in its pongs (:meth:`EdgeApp.count_tokens`);
- serves ``POST /v1/responses`` and the stored responses' routes too when the response store
  is shared (``[cluster] store``: a follow-up's ``previous_response_id`` is found whichever
  edge stored it);
- answers ``GET /metrics`` with its own series (:meth:`EdgeApp.metrics`);
- refuses to start with tenant admission limits and no shared store, where each edge would
  count alone (:func:`check_limits_exact`; ``[cluster] per_edge_limits`` accepts that);
- forwards every other request (runs, apps, admin, and the Responses API's routes without
  a shared store) to the active scheduler's HTTP address, as a reverse proxy (hosted runs
  are journaled there before they are accepted);
- on a clean stop, hands the inferred runs its resolver holds to the scheduler and saves the
  resolver's state for the edge started in its place (:meth:`EdgeApp._hand_over`).

Fencing: every scheduler message carries the lease epoch; a message of an epoch lower than
the highest seen is dropped and counted (:class:`hermes.core.lease.EpochGate`). When the
leader changes, the calls that have had no answer yet are sent again to the new one under the
same request id (the edge takes the first answer; a call the old leader had already given a
node may then run twice, which a one-request call tolerates: its client sees one answer; a
stream keeps the node that sent its first token, and is failed only if that node's end does
not come within :attr:`SchedulerLink.STITCH_WAIT_S` of another node's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple

import httpx
import msgspec
import zmq
import zmq.asyncio
from fastapi import HTTPException
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from hermes import protocol as P
from hermes.anthropic_wire import CountTokensBody, MessagesError, assistant_reply, count_tokens
from hermes.anthropic_wire import error_body as anthropic_error_body
from hermes.anthropic_wire import status as anthropic_status
from hermes.core.lease import EpochGate
from hermes.gateway.api.anthropic_answers import (
    VERSION_HEADER,
    MessageEvents,
    message_object,
    message_request,
)
from hermes.gateway.api.anthropic_bodies import check_version, parse_body
from hermes.gateway.api.binding import (
    APP_HEADER,
    RUN_HEADER,
    UNIT_HEADER,
    check_app_header,
    run_params,
)
from hermes.gateway.api.errors import error_response
from hermes.gateway.api.json_response import AnswerResponse
from hermes.gateway.api.openai_api import ChunkWriter, completion_object, embeddings_object
from hermes.gateway.api.openai_bodies import (
    EmbeddingBody,
    engine_body,
    parse_completion_body,
    validate_body,
)
from hermes.gateway.api.responses_answers import (
    ResponseEvents,
    delete_stored,
    response_answer,
    response_request,
    store_unavailable,
    stored_items,
    stored_response,
)
from hermes.gateway.auth import Security, tenant_for
from hermes.gateway.config import ConfigError, GatewayConfig, resolve_state_dir
from hermes.gateway.edge import wire
from hermes.gateway.edge.infer import EdgeRuns, inferred_app_id, run_headers
from hermes.gateway.errors import SchedulerError, error_type
from hermes.gateway.resolve import ChatReplies, Identity
from hermes.gateway.responses import ResponsesError, ResponseStorage
from hermes.gateway.served import resolve_served
from hermes.gateway.shared import StoreUnavailable
from hermes.gateway.state import new_id
from hermes.gateway.tenancy import current_tenant
from hermes.gateway.waiting import wait_settled, wake
from hermes.zmqdrain import QueuedMessages

log = logging.getLogger("hermes.gateway.edge")

#: the endpoints an edge serves itself (POST): path -> what it is
Endpoint = Literal["chat", "completions", "embeddings", "messages", "count_tokens",
                   "responses", "stored"]
_ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat", "/v1/completions": "completions",
    "/v1/embeddings": "embeddings", "/v1/messages": "messages",
    "/v1/messages/count_tokens": "count_tokens",
    "/v1/responses": "responses"}  # (with a shared response store: EdgeApp.serves)
#: hop-by-hop headers a proxy does not forward (RFC 9110 7.6.1)
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length"}


class CallFailedError(Exception):
    """A call the scheduler refused or could not serve (status, code: the client's)."""

    def __init__(self, status: int, code: str | None, message: str,
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param
        self.headers = headers

    def openai(self) -> JSONResponse:
        """The refusal in OpenAI's error shape."""
        return error_response(self.status, str(self), code=self.code, param=self.param,
                              headers=self.headers)


class Sent(NamedTuple):
    """A call the scheduler took (:meth:`EdgeApp._dispatch`): the call, its answer (None
    for a stream under way), its inferred run (None: not in one) and the run headers its
    answer carries."""

    call: EdgeCall
    done: P.Done | None
    ident: Identity | None
    headers: dict[str, str]


class EdgeCall:
    """One call in flight at this edge: the message (kept to send it again after a leader
    change), its tokens (streamed calls) and its answer."""

    __slots__ = ("msg", "tokens", "future", "answered", "source", "started", "waiter")

    def __init__(self, msg: wire.Call) -> None:
        self.msg = msg
        self.tokens: asyncio.Queue[P.Token | None] | None = asyncio.Queue() if msg.stream \
            else None
        self.future: asyncio.Future[P.Done] = asyncio.get_running_loop().create_future()
        #: a node has sent something for it (it is not sent again to a new leader)
        self.answered = False
        #: the node that streamed its first token: a stream is never stitched from two
        #: nodes (a resend after a node died would repeat the start of the answer)
        self.source: bytes | None = None
        #: set at its first token or its end (a stream's answer starts then: its headers
        #: name the run the scheduler put it in, and a refusal gets its HTTP status)
        self.started = asyncio.Event()
        #: what the handler waiting for ``future`` sleeps on (woken by :meth:`settle`;
        #: :mod:`hermes.gateway.waiting`)
        self.waiter: asyncio.Future[None] | None = None

    def settle(self, result: P.Done | BaseException) -> None:
        self.answered = True
        self.started.set()
        if self.future.done():
            return
        if isinstance(result, BaseException):
            self.future.set_exception(result)
            self.future.exception()  # retrieved: the client may be gone
        else:
            self.future.set_result(result)
        wake(self)
        if self.tokens is not None:
            self.tokens.put_nowait(None)


class SchedulerLink:
    """This edge's view of the active scheduler: the lease record, a DEALER to it, pings,
    and the calls in flight (module doc)."""

    WATCH_S = 0.1  # how often the lease record is read
    REPORT_S = 0.005  # settled calls wait at most this for a call to carry them
    STITCH_WAIT_S = 2.0  # a stream's own node's end is awaited this long after another's
    PING_S = 0.2  # how often the scheduler is pinged
    READY_S = 1.0  # ready while a pong of the current leader came within this

    def __init__(self, config: GatewayConfig, ctx: zmq.asyncio.Context, name: str,
                 reply_to: str) -> None:
        from hermes.gateway.ha.backends import open_lease_store

        self.config = config
        self.ctx = ctx
        self.name = name
        self.reply_to = reply_to
        self.store = open_lease_store(config.ha.election)
        self.gate = EpochGate()
        self.leader: dict[str, Any] | None = None
        self.sock: zmq.asyncio.Socket | None = None
        self.last_pong: float | None = None
        self.calls: dict[str, EdgeCall] = {}
        #: direct calls answered, not yet reported to the scheduler
        self.settled: list[wire.Settled] = []
        #: counters: calls sent again to a new leader, leader changes, messages not decoded
        self.resent = 0
        self.leader_changes = 0
        self.bad = 0
        self._recv: asyncio.Task[None] | None = None
        self._record_epoch: Any = None  # the epoch of the last lease record looked at
        #: with CURVE: (this edge's certificate, the schedulers' public key file), and the
        #: handshakes of the socket to the leader (a refused key is logged and shown)
        sec = config.security
        self.curve: tuple[str, str] | None = (
            (sec.curve_key, os.path.join(sec.curve_dir, "server.key")) if sec.curve_dir
            else None)
        self.handshakes: Any = None
        self._handshakes_task: asyncio.Task[None] | None = None
        #: the app names this edge follows: their digest (sent in every ping) and what to do
        #: with the scheduler's when a pong brings them (:mod:`hermes.gateway.edge.infer`)
        self.names_digest: Callable[[], str] = lambda: ""
        self.on_names: Callable[[wire.Names], None] | None = None
        #: the models the active scheduler's engines serve (its pongs bring them when they
        #: change: ``count_tokens`` is answered here from them); None before the first
        self.models: wire.Models | None = None
        self._models_came = asyncio.Event()
        #: called at the first pong of each new leader (the edge tells it its apps)
        self.on_leader: Callable[[], None] | None = None
        self._greeted: Any = None  # the epoch on_leader was last called for

    # ------------------------------------------------------------------ leader
    def ready(self) -> bool:
        return (self.sock is not None and self.last_pong is not None
                and time.monotonic() - self.last_pong < self.READY_S)

    def http_base(self) -> str | None:
        addr = (self.leader or {}).get("http_address")
        return f"http://{addr}" if addr else None

    def switch(self, record: dict[str, Any]) -> None:
        """Follow the leader of ``record`` (a new term): reconnect, send again the calls
        that have had no answer."""
        address = record.get("edge_address")
        epoch = record.get("epoch")
        if not address:
            log.warning("edge %s: the leader %s (epoch %s) takes no edges (no edge_address: "
                        "started without --role scheduler?)", self.name, record.get("holder"),
                        epoch)
            return
        if self.gate.judge(epoch if isinstance(epoch, int) else None) == "stale":
            return  # an old record read late
        self.leader = record
        self.leader_changes += 1
        self.last_pong = None
        if self._recv is not None:
            self._recv.cancel()
        self.close_socket()
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, f"{self.name}-{uuid.uuid4().hex[:6]}".encode())
        if self.curve is not None:
            self._secure(sock, address)
        sock.connect(address)
        self.sock = sock
        self._recv = asyncio.get_running_loop().create_task(self._recv_loop(sock),
                                                            name="hermes-edge-recv")
        log.warning("edge %s: following the scheduler %s at %s (epoch %s)", self.name,
                    record.get("holder"), address, epoch)
        for call in self.calls.values():
            if not call.answered:
                self.resent += 1
                self.send_call(call.msg)
        self.send(self._ping())

    def _ping(self) -> wire.Ping:
        return wire.Ping(edge=self.name, names=self.names_digest(),
                         models=self.models.digest if self.models is not None else "")

    async def models_with_nodes(self, timeout: float) -> wire.Models | None:
        """The served-model set, after waiting up to ``timeout`` for one with a node
        connected when the scheduler has none (the scheduler's own requests wait so for a
        node: :meth:`~hermes.gateway.nodes.NodeTable.serving_model`)."""
        deadline = time.monotonic() + timeout
        while self.models is not None and not self.models.nodes:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            came = self._models_came
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(came.wait(), left)
        return self.models

    def _secure(self, sock: zmq.asyncio.Socket, address: str) -> None:
        """CURVE to the scheduler: this edge's certificate, the scheduler's public key; the
        handshakes followed (a scheduler that does not list this edge's key is logged)."""
        from hermes.security.curve import Handshakes, secure_client

        assert self.curve is not None
        secure_client(sock, *self.curve)
        self.handshakes = Handshakes(sock, f"edge {self.name} -> scheduler {address}")
        self._handshakes_task = asyncio.get_running_loop().create_task(
            self.handshakes.run(), name="hermes-edge-handshakes")

    def close_socket(self, *, linger_ms: int = 0) -> None:
        """Close the socket to the scheduler (and its handshake monitor); ``linger_ms``: how
        long messages still queued may take to leave (a clean stop's handover)."""
        if self._handshakes_task is not None:
            self._handshakes_task.cancel()
            self._handshakes_task = None
        if self.handshakes is not None:
            self.handshakes.close()
            self.handshakes = None
        if self.sock is not None:
            self.sock.close(linger=linger_ms)
            self.sock = None

    async def watch(self) -> None:
        """Read the lease record every :attr:`WATCH_S`; follow a new term."""
        while True:
            try:
                rec = await asyncio.to_thread(self.store.leader)
            except Exception as exc:
                log.warning("edge %s: cannot read the lease record: %s", self.name, exc)
                rec = None
            if rec is not None and rec.get("epoch") != self._record_epoch:
                self._record_epoch = rec.get("epoch")  # each term is looked at once
                self.switch(rec)
            await asyncio.sleep(self.WATCH_S)

    async def ping(self) -> None:
        while True:
            self.send(self._ping())
            await asyncio.sleep(self.PING_S)

    # ------------------------------------------------------------------ wire
    def send(self, msg: wire.EdgeMessage) -> bool:
        if self.sock is None:
            return False
        try:
            sent = self.sock.send(wire.encode(msg), flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        # an asyncio socket answers a NOBLOCK send with a finished future: zmq.Again (no
        # connection up, e.g. a CURVE key the scheduler refuses) is its exception, taken here
        return not (isinstance(sent, asyncio.Future) and sent.done()
                    and sent.exception() is not None)

    async def _recv_loop(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            frame = await sock.recv()
            try:
                msg = wire.decode_scheduler(frame)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                self.bad += 1
                log.warning("edge %s: bad message from the scheduler: %s", self.name, e)
                continue
            self.apply(msg)

    def apply(self, msg: wire.SchedulerMessage) -> None:
        """A scheduler message, fenced by its epoch (a stale one is dropped and counted)."""
        if self.gate.judge(msg.epoch) == "stale":
            log.warning("edge %s: rejected a %s of stale epoch %s (following epoch %s; %d "
                        "rejected so far)", self.name, type(msg).__name__, msg.epoch,
                        self.gate.epoch, self.gate.stale_rejected)
            return
        if isinstance(msg, wire.Pong):
            if msg.names is not None and self.on_names is not None:
                self.on_names(msg.names)  # before it makes the edge ready: no call misnamed
            if msg.models is not None:  # (likewise: ready with the set, never without it)
                self.models = msg.models
                came, self._models_came = self._models_came, asyncio.Event()
                came.set()
            if self.leader is not None and msg.epoch == self.leader.get("epoch"):
                self.last_pong = time.monotonic()
                if self._greeted != msg.epoch:  # a new leader's first pong
                    self._greeted = msg.epoch
                    if self.on_leader is not None:
                        self.on_leader()
        elif isinstance(msg, wire.CallFailed):
            call = self.calls.get(msg.rid)
            if call is not None:
                call.settle(CallFailedError(msg.status, msg.code, msg.message, msg.param))

    # ------------------------------------------------------------------ node answers
    def on_node_message(self, node: bytes, msg: Any) -> None:
        """A node's ``token`` or ``done`` for a call of this edge (from node ``node``)."""
        if isinstance(msg, P.Token):
            call = self.calls.get(msg.request_id)
            if call is None or call.tokens is None or call.future.done():
                return
            if call.source is None:
                call.source = node
            elif call.source != node:
                return  # a second node's copy of a stream already under way
            call.answered = True
            call.tokens.put_nowait(msg)
            call.started.set()
        elif isinstance(msg, P.Done):
            call = self.calls.get(msg.request_id)
            if call is None:
                return
            if call.msg.direct:  # the scheduler hears of it from here (reply_only)
                self.report(wire.Settled(msg.request_id, node.decode(errors="replace"),
                                         msg.engine, msg.queue_s, msg.service_s))
            if call.source is not None and call.source != node:
                # another node's copy (sent again after a failover, or after the streaming
                # node died): the streaming node's own end is awaited a while, then the
                # stream is failed (it cannot be stitched from two answers)
                asyncio.get_running_loop().call_later(self.STITCH_WAIT_S, self._cut, call)
                return
            call.settle(msg)

    @staticmethod
    def _cut(call: EdgeCall) -> None:
        call.settle(CallFailedError(502, "stream_cut", "the node streaming this answer was "
                                    "lost mid-stream; retry"))

    def report(self, item: wire.Settled) -> None:
        """Tell the scheduler a direct call was answered: with the next call, or within
        :attr:`REPORT_S` in a report of its own."""
        self.settled.append(item)
        if len(self.settled) == 1:
            asyncio.get_running_loop().call_later(self.REPORT_S, self._flush_settled)

    def _flush_settled(self) -> None:
        if self.settled:
            items, self.settled = self.settled, []
            if not self.send(wire.Report(settled=items)):
                self.settled = items + self.settled  # no scheduler now: with the next one

    def send_call(self, msg: wire.Call) -> None:
        """A call, carrying the settled calls not reported yet."""
        if self.settled:
            msg.settled, self.settled = self.settled, []
        if not self.send(msg) and msg.settled:
            self.settled = msg.settled + self.settled
        msg.settled = []


class EdgeApp:
    """The edge's ASGI app (module doc)."""

    def __init__(self, config: GatewayConfig, evidence_index: Any | None = None,
                 responses: ResponseStorage | None = None) -> None:
        """``evidence_index``: the run resolver's shared evidence index (``[cluster]
        store``), or None (this edge's own: :mod:`hermes.gateway.edge.infer`);
        ``responses``: the shared response store (``[cluster] store``), or None: without
        one, ``POST /v1/responses`` is forwarded to the scheduler, whose store is then the
        one every edge reaches (a follow-up's ``previous_response_id`` is found there)."""
        self.config = config
        self.responses = responses
        self.name = config.ha.member or f"{socket.gethostname()}:{os.getpid()}"
        self.reply_to = config.ha.advertised(config.scheduler.bind)
        sec = config.security
        if sec.curve_dir:  # nodes learn this edge's public key with the address
            from hermes.security.curve import public_key, reply_address

            self.reply_to = reply_address(self.reply_to, public_key(sec.curve_key))
        self._zap: Any = None  # the CURVE gate of the answers' socket (with CURVE)
        self.ctx = zmq.asyncio.Context()
        self.link = SchedulerLink(config, self.ctx, self.name, self.reply_to)
        #: the run resolver: header-less calls in inferred runs
        self.runs = EdgeRuns(config.identity, evidence_index)
        # the operator's app names: the active scheduler's, brought by its pongs
        self.link.names_digest = lambda: self.runs.names_digest
        self.link.on_names = self._follow_names
        self.link.on_leader = self._tell_apps
        self._evidence_index = evidence_index
        self._scale = config.scheduler.time_scale
        self._wall0 = time.time() - time.monotonic()
        self.timeout_s = config.scheduler.request_timeout_s
        self.inbox: zmq.asyncio.Socket | None = None
        self.http: httpx.AsyncClient | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: calls taken, and answered from a node
        self.stats = {"calls": 0, "answered": 0, "failed": 0, "proxied": 0, "counted": 0}
        #: the security middleware's state (:func:`edge_app`): keys, admission limits
        self.security: Security | None = None
        self._registry: Any = None  # this edge's own /metrics (:meth:`metrics`)

    def per_instance_limits(self) -> bool:
        """Whether this edge's tenant admission limits are its own (no shared store): with
        ``[cluster] per_edge_limits`` in force, or limits enforced from its memory now."""
        if self.config.cluster.store:
            return False
        return self.config.cluster.per_edge_limits or bool(
            self.security is not None and self.security.local_limits())

    def now(self) -> float:
        """The resolver's clock: model seconds (``scheduler.time_scale`` times the wall
        clock read at start, advanced by the monotonic clock: a step of the wall clock does
        not close runs), as the all-in-one gateway's resolver reads the scheduler clock;
        only its differences matter, also between this edge and the one started in its
        place (the saved state: :meth:`_hand_over`)."""
        return (self._wall0 + time.monotonic()) * self._scale

    def _follow_names(self, names: wire.Names) -> None:
        self.runs.follow_names(names)
        log.info("edge %s: app names %s (%d renames, %d merges) from the scheduler",
                 self.name, names.digest, len(names.renames), len(names.merges))

    def _tell_apps(self) -> None:
        """A new leader answers: tell it the apps this edge's resolver knows, so that it
        lists them (and renames or merges them) at once, not from their next new run."""
        apps = self.runs.apps_seen(self.now()) if self.runs.enabled else []
        if apps and self.link.send(wire.Apps(apps=apps)):
            log.info("edge %s: told the scheduler of epoch %s the %d apps inferred here",
                     self.name, self.link._greeted, len(apps))

    def _saved_state(self) -> Path:
        """Where a clean stop saves the run resolver's state (``stores.state_dir``), for
        the edge started in its place (of the same ``[ha] member``)."""
        member = "".join(c if c.isalnum() or c in "-_." else "_"
                         for c in (self.config.ha.member or "edge"))
        return resolve_state_dir(self.config.stores.state_dir) / f"edge-identity-{member}.json"

    # ------------------------------------------------------------------ lifecycle
    async def startup(self) -> None:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sec = self.config.security
        if sec.curve_dir:  # CURVE: answers only from nodes with a key in authorized/
            from hermes.security.curve import ANSWERS, secure_server

            self._zap = secure_server(sock, self.ctx, sec.curve_dir, domain=ANSWERS,
                                      admit="authorized", secret_file=sec.curve_key)
        sock.bind(self.config.scheduler.bind)
        self.inbox = sock
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s, connect=2.0))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self.link.watch(), name="hermes-edge-watch"),
                       loop.create_task(self.link.ping(), name="hermes-edge-ping"),
                       loop.create_task(self._inbox_loop(sock), name="hermes-edge-inbox")]
        if self.runs.enabled:
            self._tasks.append(loop.create_task(self._sweep_runs(), name="hermes-edge-runs"))
            n = self.runs.load(self._saved_state())
            if n:
                log.warning("edge %s: %d open inferred runs restored from %s", self.name, n,
                            self._saved_state())
            if self._evidence_index is None:
                log.warning("edge %s: runs are inferred from this edge's own evidence index "
                            "([cluster] store is not set): a conversation whose next turn "
                            "reaches another edge starts a new run there", self.name)
        self._warn_per_instance()
        log.warning("edge %s: HTTP on %s:%s, answers from nodes on %s, scheduler from the "
                    "lease in %s", self.name, self.config.server.host, self.config.server.port,
                    self.reply_to, self.link.store.url)

    def _warn_per_instance(self) -> None:
        """Say at start what this edge keeps to itself that several edges would need
        shared: tenant limits (``[cluster] per_edge_limits``), API keys from a file."""
        sec, cl = self.security, self.config.cluster
        if not cl.store and cl.per_edge_limits:
            local = sec.local_limits() if sec is not None else []
            log.warning("edge %s: tenant limits are PER EDGE ([cluster] per_edge_limits = "
                        "true, no [cluster] store): N edges behind a load balancer admit N "
                        "times each limit (%s); hermes_edge_per_instance_limits = 1", self.name,
                        "; ".join(local) or "none configured now")
        auth_file = self.config.security.auth_file
        if auth_file and not self.config.security.auth_redis:
            log.warning("edge %s: API keys are read from the file %s on this edge: a key "
                        "revoked there (hermes keys revoke) is refused at the next request, "
                        "but only by the edges that read that same file; an edge with its "
                        "own copy admits it until its copy changes (security.auth_redis: one "
                        "key store for every edge)", self.name, auth_file)

    async def shutdown(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self.runs.enabled:
            self._hand_over()
        if self.link._recv is not None:
            self.link._recv.cancel()
        if self.http is not None:
            await self.http.aclose()
        if self.inbox is not None:
            self.inbox.close(linger=0)
        # the last messages (the handover) leave before the socket closes
        self.link.close_socket(linger_ms=self.HANDOVER_LINGER_MS)
        if self._zap is not None:
            self._zap.stop()
            self._zap = None
        self.ctx.term()

    #: how long a stopping edge's last messages to the scheduler may take to leave
    HANDOVER_LINGER_MS = 1000

    def _hand_over(self) -> None:
        """A clean stop: tell the scheduler the runs closed and not told yet, and hand it the
        open ones (:class:`~hermes.gateway.edge.wire.Handover`: it closes each when its
        app's idle figure says, unless a next turn reaches an edge first, which joins it
        through the shared index); save the resolver's state for the edge started in this
        one's place (a next turn through it joins its run, with or without a shared
        index)."""
        now = self.now()
        try:
            closed = self.runs.sweep(now)
            if closed and self.link.send(wire.Closed(runs=closed)):
                self.runs.told()
            held = self.runs.held(now)
            if held and self.link.send(wire.Handover(runs=held)):
                log.warning("edge %s: %d open inferred runs handed over to the scheduler",
                            self.name, len(held))
            path = self._saved_state()
            path.parent.mkdir(parents=True, exist_ok=True)
            self.runs.save(path)
        except Exception:
            log.exception("edge %s: handing over the inferred runs at stop failed", self.name)

    async def _sweep_runs(self) -> None:
        """Close the idle inferred runs every ``scheduler.rekey_interval_s`` (the all-in-one
        gateway's sweep cadence) and tell the scheduler, in one message per sweep."""
        while True:
            await asyncio.sleep(self.config.scheduler.rekey_interval_s)
            try:
                closed = self.runs.sweep(self.now())
                if closed and self.link.ready() and self.link.send(wire.Closed(runs=closed)):
                    self.runs.told()
            except Exception:
                log.exception("edge %s: closing idle inferred runs failed", self.name)

    async def _inbox_loop(self, sock: zmq.asyncio.Socket) -> None:
        drain = QueuedMessages(sock)
        on = self.link.on_node_message
        while True:
            first = await sock.recv_multipart()
            for frames in drain.after(first):
                try:
                    on(frames[0], P.decode(frames[-1]))
                except P.ProtocolError as e:
                    log.warning("edge %s: bad message from node %r: %s", self.name, frames[0], e)

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind != "http":
            return
        path = scope["path"]
        if path == "/readyz" or path == "/healthz":
            ready = self.link.ready() or path == "/healthz"
            leader = self.link.leader or {}
            body = {"status": "ready" if ready else "not_ready", "role": "edge",
                    "member": self.name, "epoch": leader.get("epoch"),
                    "scheduler": leader.get("holder"), "calls": len(self.link.calls),
                    "stale_rejected": self.link.gate.stale_rejected,
                    "resent": self.link.resent,
                    # the run resolver: inferred runs open here, closed (told the scheduler
                    # or waiting for one)
                    "inferred_open": self.runs.resolver.open_runs(),
                    "inferred_closed": self.runs.closed,
                    "inferred_closed_untold": len(self.runs.pending),
                    # the digest of the app names followed (the scheduler's)
                    "app_names": self.runs.names_digest,
                    # the digest of the served-model set held (count_tokens is answered
                    # from it), "" before the scheduler gave one
                    "models": self.link.models.digest if self.link.models else ""}
            if self.config.security.curve_dir:  # CURVE: refused nodes, and this edge's key
                from hermes.security.curve import ANSWERS

                hs = self.link.handshakes
                body["curve_refused"] = (self._zap.refused.get(ANSWERS, 0)
                                         if self._zap is not None else 0)
                body["curve"] = "pending" if hs is None else hs.state
                if hs is not None and hs.reason:
                    body["curve_reason"] = hs.reason
            await JSONResponse(body, status_code=200 if ready else 503)(scope, receive, send)
            return
        if path == "/metrics" and scope["method"] == "GET":
            await self.metrics(Request(scope, receive))(scope, receive, send)
            return
        endpoint = self.serves(scope)
        if endpoint is not None:
            request = Request(scope, receive)
            if endpoint == "embeddings":
                response = await self.embeddings(request)
            elif endpoint == "messages":
                response = await self.messages(request)
            elif endpoint == "count_tokens":
                response = await self.count_tokens(request)
            elif endpoint == "responses":
                response = await self.create_response(request)
            elif endpoint == "stored":
                response = self.stored(request)
            else:
                response = await self.completion(request, endpoint)
            await response(scope, receive, send)
            return
        await self.proxy(scope, receive, send)

    def serves(self, scope: dict[str, Any]) -> Endpoint | None:
        """The endpoint of an HTTP request this edge answers itself (None: forwarded).
        With a shared response store, ``POST /v1/responses`` and the stored responses'
        routes too (``stored``: :func:`_stored_route`); without one the scheduler's store is
        the one every edge reaches."""
        if scope["method"] != "POST":
            if self.responses is not None and _stored_route(scope["method"], scope["path"]):
                return "stored"
            return None
        endpoint = _ENDPOINTS.get(scope["path"])
        if endpoint == "responses" and self.responses is None:
            return None
        return endpoint

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ------------------------------------------------------------------ completions
    #: times a call is resolved again after the scheduler said its inferred run had ended
    REBIND_TRIES = 2

    async def completion(self, request: Request,
                         endpoint: Literal["chat", "completions"]) -> Response:
        """One completion request: validate, one call to the scheduler, the answer from the
        node (module doc; :meth:`_dispatch`)."""
        parsed = await parse_completion_body(request, endpoint)
        if isinstance(parsed, Response):
            return parsed
        ebody = engine_body(parsed)
        try:
            sent = await self._dispatch(request, model=parsed.model, endpoint=endpoint,
                                        body=ebody, stream=bool(parsed.stream),
                                        evidence={**ebody, "model": parsed.model})
        except CallFailedError as e:
            return e.openai()
        call, ident = sent.call, sent.ident
        if parsed.stream:
            include_usage = bool((parsed.stream_options or {}).get("include_usage"))
            return StreamingResponse(
                self._sse(call, endpoint, parsed.model, include_usage, ident),
                media_type="text/event-stream",
                headers={**sent.headers, "Cache-Control": "no-cache"})
        assert sent.done is not None
        content = completion_object(endpoint, call.msg.rid, parsed.model, sent.done)
        if ident is not None:  # before the answer leaves: the next turn finds the run
            self.runs.answered(ident, _chat_replies(content) if endpoint == "chat" else None,
                               self.now())
        return AnswerResponse(content, headers=sent.headers)

    async def embeddings(self, request: Request) -> Response:
        """``POST /v1/embeddings``: the body checked as the all-in-one gateway checks it
        (:class:`~hermes.gateway.api.openai_bodies.EmbeddingBody`: its bounds on inputs,
        dimensions and the answer's size), one call to the scheduler (an engine that embeds;
        bound by its run headers only: a vector has no conversation to continue), the answer
        from the node (:func:`~hermes.gateway.api.openai_api.embeddings_object`)."""
        body = validate_body(await request.body(), EmbeddingBody)
        if isinstance(body, Response):
            return body
        try:
            sent = await self._dispatch(
                request, model=body.model, endpoint="embeddings",
                body=body.model_dump(exclude_none=True, exclude={"model"}), stream=False,
                infer=False)
        except CallFailedError as e:
            return e.openai()
        assert sent.done is not None
        return AnswerResponse(embeddings_object(body.model, sent.done), headers=sent.headers)

    async def messages(self, request: Request) -> Response:
        """``POST /v1/messages`` (Anthropic's Messages API): checked as the all-in-one
        gateway checks it, one call to the scheduler (the chat form for an engine that
        translates, the request as sent for one that serves ``/v1/messages`` itself), the
        node's answer written as the all-in-one gateway writes it
        (:mod:`hermes.gateway.api.anthropic_answers`); every error in Anthropic's shape."""
        try:
            m = message_request(await request.body(), request.headers.get(VERSION_HEADER))
        except MessagesError as e:
            return _anthropic_error(e.status, str(e))
        try:
            sent = await self._dispatch(request, model=m.body.model, endpoint="chat",
                                        body=m.chat, stream=m.body.stream, evidence=m.evidence,
                                        messages=m.chat["messages"], native=m.native)
        except CallFailedError as e:
            return _anthropic_error(e.status, str(e), e.headers)
        call, ident = sent.call, sent.ident
        rid = call.msg.rid
        headers = {**sent.headers, "request-id": rid}
        if m.body.stream:
            def told(reply: dict[str, Any]) -> None:
                if ident is not None:
                    self.runs.answered(ident, reply, self.now())

            events = MessageEvents(rid, m.body, told)
            return StreamingResponse(
                self._relay(call, ident, [], events.feed, events.finish,
                            lambda status, message: [events.error(status, message)]),
                media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})
        assert sent.done is not None
        message = message_object(sent.done, rid, m.body)
        if ident is not None:  # before the answer leaves: the next turn finds the run
            self.runs.answered(ident, assistant_reply(message["content"]), self.now())
        return AnswerResponse(message, headers=headers)

    #: how long a request waits for a node when the scheduler has none (as there)
    NODE_WAIT_S = 10.0

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``, answered here without a message to the
        scheduler: the body checked and counted (:func:`hermes.anthropic_wire.count_tokens`)
        and the model looked up in the served-model set the active scheduler gave this edge
        (:class:`~hermes.gateway.edge.wire.Models`) by the scheduler's own rule
        (:func:`~hermes.gateway.served.resolve_served`: an unknown model is a 404), all as
        the all-in-one gateway answers it. An edge that is not ready (no pong of the active
        scheduler, hence no set of its own) answers 503 ``not_ready`` with ``Retry-After``,
        in Anthropic's shape (529), as ``/v1/messages`` does there."""
        try:
            check_version(request.headers.get(VERSION_HEADER))
            body = parse_body(await request.body(), CountTokensBody)
        except MessagesError as e:
            return _anthropic_error(e.status, str(e))
        models = await self.link.models_with_nodes(self.NODE_WAIT_S) \
            if self.link.ready() else None
        if models is None:
            return _anthropic_error(503, "no active scheduler reachable from this edge; retry "
                                    "through the load balancer", {"Retry-After": "1"})
        assert isinstance(body, CountTokensBody)
        try:
            resolve_served(body.model, strict=True, task="generate", served=models.models,
                           default_model=models.default_model,
                           route_unknown=models.route_unknown)
            n = count_tokens(body)
        except (MessagesError, SchedulerError) as e:
            return _anthropic_error(e.status, str(e))
        self.stats["counted"] += 1
        return JSONResponse({"input_tokens": n})

    async def create_response(self, request: Request) -> Response:
        """``POST /v1/responses`` with a shared response store (``[cluster] store``): checked
        as the all-in-one gateway checks it, ``previous_response_id`` read from the shared
        store (whichever edge stored it), one call to the scheduler (the chat body), the
        node's answer written and stored here as the all-in-one gateway does
        (:mod:`hermes.gateway.api.responses_answers`), the response id told to the resolver
        (through the shared index, a follow-up at any edge joins the run)."""
        store = self.responses
        assert store is not None
        tenant = tenant_for(request, None)
        try:
            r = response_request(await request.body(), store, tenant)
        except ResponsesError as e:
            return error_response(e.status, str(e), param=e.param, code=e.code)
        except StoreUnavailable as e:
            return store_unavailable(e)
        try:
            sent = await self._dispatch(request, model=r.req.model, endpoint=r.endpoint,
                                        body=r.body, stream=r.req.stream, evidence=r.raw,
                                        messages=r.body["messages"])
        except CallFailedError as e:
            return e.openai()
        call, ident = sent.call, sent.ident
        run_id = ident.run if ident is not None else sent.headers.get(RUN_HEADER)

        def told(reply: dict[str, Any], response_id: str | None) -> None:
            if ident is not None:
                self._answered(ident, reply, response_id)

        if r.req.stream:
            events = ResponseEvents(r, store, tenant, told)
            return StreamingResponse(
                self._relay(call, ident, events.start(), events.feed,
                            lambda done: events.finish(done, run_id),
                            lambda _status, message: events.fail(message)),
                media_type="text/event-stream",
                headers={**sent.headers, "Cache-Control": "no-cache"})
        assert sent.done is not None
        resp, reply = response_answer(sent.done, call.msg.rid, r, store, tenant, run_id)
        told(reply, resp["id"] if r.req.store else None)  # before the answer leaves
        return AnswerResponse(resp, headers=sent.headers)

    def stored(self, request: Request) -> Response:
        """``GET``/``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``
        from the shared response store, answered as the all-in-one gateway answers them
        (``limit`` parsed as its router parses it: a 422 naming ``query.limit``)."""
        store = self.responses
        route = _stored_route(request.method, request.url.path)
        assert store is not None and route is not None
        kind, response_id = route
        tenant = tenant_for(request, None)
        if kind == "get":
            return stored_response(store, tenant, response_id)
        if kind == "delete":
            return delete_stored(store, tenant, response_id)
        q = request.query_params
        try:
            limit = _QUERY_INT.validate_python(q.get("limit", "20"))
        except ValidationError as e:
            msg = e.errors()[0]["msg"]
            return error_response(422, f"query.limit: {msg}", param="query.limit",
                                  code="invalid_value")
        return stored_items(store, tenant, response_id, limit=limit,
                            order=q.get("order", "desc"), after=q.get("after"))

    def _answered(self, ident: Identity, reply: Any, response_id: str | None) -> None:
        """Tell the resolver a Responses call's reply and its stored response's id (the
        evidence ``previous_response_id`` is resolved by)."""
        try:
            self.runs.resolver.answered(ident, reply, self.now(), response_id=response_id)
        except StoreUnavailable:
            pass  # the answer is out; its evidence is lost (the store logged and counts it)

    async def _dispatch(self, request: Request, *, model: str,
                        endpoint: Literal["chat", "completions", "embeddings"],
                        body: dict[str, Any], stream: bool,
                        evidence: dict[str, Any] | None = None,
                        messages: list[Any] | None = None,
                        native: dict[str, Any] | None = None,
                        infer: bool = True) -> Sent:
        """Send one call (after the body was validated) and wait for its answer, or, for a
        stream, its first token (or its end), so that a refusal gets its HTTP status and the
        headers name the run the call is counted in. The run headers are checked as the
        all-in-one gateway checks them (:func:`~hermes.gateway.api.binding.run_params`, the
        ``X-Hermes-App`` owner, the tenant); a header-less call is put in an inferred run by
        the edge's resolver (``evidence``: the request as the resolver reads it, ``messages``
        its chat form; ``infer=False``: headers only). Every refusal raises
        :class:`CallFailedError` (each API answers it in its own error shape)."""
        if not self.link.ready():
            raise CallFailedError(503, "not_ready", "no active scheduler reachable from this "
                                  "edge; retry through the load balancer",
                                  headers={"Retry-After": "1"})
        h = request.headers
        try:
            tenant = tenant_for(request, h.get("X-Hermes-Tenant")) or "default"
            k, deadline_s = run_params(h)
            check_app_header(h, tenant)
        except HTTPException as e:
            raise CallFailedError(e.status_code, "permission_denied", str(e.detail)) from None
        except SchedulerError as e:
            raise CallFailedError(e.status, e.code, str(e), e.param) from None
        authed = current_tenant.get() is not None
        prompt_tokens = P.estimate_tokens(endpoint, body)
        infer = infer and RUN_HEADER not in h and self.runs.enabled
        # the body leaves encoded, once: the scheduler forwards these bytes to the node
        # without decoding them (wire.Call.body_json), reading only what is taken here
        enc = wire.encode_body(body)
        for attempt in range(self.REBIND_TRIES + 1):
            rid = new_id(P.EDGE_REQUEST_PREFIX)
            ident: Identity | None = None
            if infer:
                try:
                    ident = self.runs.resolve(tenant, evidence if evidence is not None
                                              else {**body, "model": model}, h, self.now(),
                                              messages=messages)
                except StoreUnavailable as e:
                    raise CallFailedError(503, "store_unavailable", f"{e}; retry later",
                                          headers={"Retry-After": "1"}) from None
            if ident is not None:  # a header-less call in an inferred run
                msg = wire.Call(rid=rid, reply_to=self.reply_to, model=model,
                                endpoint=endpoint, body={}, body_json=enc.json, prefix=enc.prefix,
                                max_tokens=enc.max_tokens, prompt_tokens=prompt_tokens,
                                tenant=tenant, app=ident.app, unit=ident.unit, run=ident.run,
                                stream=stream, inferred=True, new=ident.new_run,
                                k=k, deadline_s=deadline_s, authed=authed, native=native,
                                app_id=inferred_app_id(ident))
                headers = run_headers(ident)
            else:
                run = h.get(RUN_HEADER)
                app = h.get(APP_HEADER)
                if run is not None and run.strip().lower() == "none" and not app:
                    run = None  # opted out: a one-request run of app default, the fast path
                msg = wire.Call(rid=rid, reply_to=self.reply_to, model=model,
                                endpoint=endpoint, body={}, body_json=enc.json, prefix=enc.prefix,
                                max_tokens=enc.max_tokens, prompt_tokens=prompt_tokens,
                                tenant=tenant, app=app, unit=h.get(UNIT_HEADER), run=run,
                                stream=stream, k=k, deadline_s=deadline_s, authed=authed,
                                native=native)
                # a named run's answers name it, as the all-in-one gateway's do (a
                # one-request run's id is the scheduler's and is not shown)
                headers = ({RUN_HEADER: msg.run, UNIT_HEADER: msg.unit or "default"}
                           if msg.run and msg.run.lower() != "none" else {})
            call = EdgeCall(msg)
            self.link.calls[rid] = call
            self.stats["calls"] += 1
            self.link.send_call(msg)
            try:
                if stream:
                    await self._started(call)
                    # (a refusal raises here, before the stream's answer starts)
                    done = await self._wait(call) if call.future.done() else None
                else:
                    done = await self._wait(call)
            except CallFailedError as e:
                if ident is not None:
                    if e.code == wire.RUN_ENDED and attempt < self.REBIND_TRIES:
                        self.runs.ended(ident, self.now())  # and resolve it again
                        continue
                    self.runs.abandoned(ident, self.now())
                raise
            except BaseException:
                if ident is not None:  # the client went away
                    self.runs.abandoned(ident, self.now())
                raise
            return Sent(call, done, ident, headers)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _started(self, call: EdgeCall) -> None:
        """Until the call's first token or its end; a timeout cancels it (504)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await call.started.wait()
        except TimeoutError:
            rid = call.msg.rid
            self.link.send(wire.Cancel(rid=rid))
            self.link.calls.pop(rid, None)
            raise CallFailedError(504, "timeout", f"request {rid} timed out after "
                                  f"{self.timeout_s:g} s") from None
        except BaseException:  # the client went away
            self.link.send(wire.Cancel(rid=call.msg.rid))
            self.link.calls.pop(call.msg.rid, None)
            raise

    async def _wait(self, call: EdgeCall) -> P.Done:
        rid = call.msg.rid
        fut = call.future
        try:
            await wait_settled(call, self.timeout_s)
            return fut.result()
        except TimeoutError:
            self.link.send(wire.Cancel(rid=rid))
            raise CallFailedError(504, "timeout", f"request {rid} timed out after "
                                  f"{self.timeout_s:g} s") from None
        except CallFailedError:
            self.stats["failed"] += 1
            raise
        finally:
            if not call.future.done():  # the client went away
                self.link.send(wire.Cancel(rid=rid))
            self.link.calls.pop(rid, None)

    async def _sse(self, call: EdgeCall, endpoint: str, model: str, include_usage: bool,
                   ident: Identity | None = None) -> AsyncIterator[bytes]:
        """The call's tokens as OpenAI chunks (:class:`ChunkWriter`), as the all-in-one
        gateway writes them, ending with ``data: [DONE]``. ``ident``: the call's inferred
        run (its reply is told to the resolver before ``[DONE]``)."""
        w = ChunkWriter(call.msg.rid, endpoint, model, include_usage)
        tokens = call.tokens
        assert tokens is not None
        first, raw_finished = True, False
        replies = ChatReplies() if (ident is not None and w.chat
                                    and ident.conversation is not None) else None
        told = ident is None
        try:
            while True:
                async with asyncio.timeout(self.timeout_s):
                    tok = await tokens.get()
                if tok is None:
                    break
                if replies is not None:
                    replies.feed(tok.chunk, tok.text)
                if tok.chunk is not None:
                    out = w.forward(tok.chunk)
                    if out is not None:
                        raw_finished = raw_finished or any(
                            c.get("finish_reason") for c in tok.chunk.get("choices") or ())
                        first = False
                        yield out
                    continue
                if first and w.chat:
                    yield w.chunk(None, None, first=True)
                first = False
                yield w.chunk(tok.text, None)
            done = await self._wait(call)
            if not raw_finished:
                if first and w.chat:
                    yield w.chunk(None, None, first=True)
                yield w.chunk(None, done.finish_reason or "stop")
            if include_usage:
                yield w.usage(done)
            if ident is not None:
                self.runs.answered(ident, None if replies is None else replies.messages(),
                                   self.now())
                told = True
            yield b"data: [DONE]\n\n"
        except (CallFailedError, TimeoutError) as e:
            status, code = (e.status, e.code) if isinstance(e, CallFailedError) else (504, "timeout")
            err = {"error": {"message": str(e) or "timed out", "type": error_type(status),
                             "param": None, "code": code, "status": status}}
            yield f"data: {json.dumps(err)}\n\n".encode()
        finally:
            self._stream_ended(call, ident, told)

    def _stream_ended(self, call: EdgeCall, ident: Identity | None, told: bool) -> None:
        """A streamed call's relay ended (answered, failed, or the client went away): an
        inferred run not told its reply is told the call was abandoned, a call still open
        at the scheduler is cancelled there, and the edge forgets it."""
        if not told and ident is not None:
            self.runs.abandoned(ident, self.now())
        if not call.future.done():
            self.link.send(wire.Cancel(rid=call.msg.rid))
        self.link.calls.pop(call.msg.rid, None)

    async def _relay(self, call: EdgeCall, ident: Identity | None, head: list[bytes],
                     feed: Callable[[P.Token], list[bytes]],
                     finish: Callable[[P.Done], list[bytes]],
                     fail: Callable[[int, str], list[bytes]]) -> AsyncIterator[bytes]:
        """A streamed call's events in its API's format, written by the all-in-one gateway's
        own writers: ``head`` first, ``feed`` per token, ``finish`` with the node's answer
        (which tells the resolver the reply before the last event), ``fail`` (status,
        message) for a failure after the start, as at the all-in-one gateway."""
        tokens = call.tokens
        assert tokens is not None
        told = ident is None
        try:
            for out in head:
                yield out
            while True:
                async with asyncio.timeout(self.timeout_s):
                    tok = await tokens.get()
                if tok is None:
                    break
                for out in feed(tok):
                    yield out
            done = await self._wait(call)
            for out in finish(done):
                yield out
            told = True
        except (CallFailedError, TimeoutError) as e:
            status = e.status if isinstance(e, CallFailedError) else 504
            for out in fail(status, str(e) or "timed out"):
                yield out
        finally:
            self._stream_ended(call, ident, told)

    def metrics(self, request: Request) -> Response:
        """``GET /metrics``: this edge's own series (:class:`EdgeCollector`; with a shared
        store its health, ``hermes_shared_store_*``), with the all-in-one gateway's access
        rule (:func:`~hermes.gateway.api.admin_api.metrics_denied`). The scheduler's series
        are on the scheduler's own ``/metrics``."""
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from hermes.gateway.api.admin_api import TOKEN_ENV, metrics_denied

        sec = self.config.security
        auth_on = self.security is not None and self.security.auth_on
        denied = metrics_denied(sec.metrics_token,
                                os.environ.get(TOKEN_ENV) or None if auth_on else None,
                                auth_on, request.headers.get("authorization", ""))
        if denied is not None:
            return denied
        if self._registry is None:
            from hermes.gateway.shared.store import SharedStoreCollector

            registry = CollectorRegistry(auto_describe=False)
            registry.register(EdgeCollector(self))
            shared = self.security.shared if self.security is not None else None
            if shared is not None:
                registry.register(SharedStoreCollector(shared))  # type: ignore[arg-type]
            self._registry = registry
        return Response(generate_latest(self._registry), media_type=CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------------ the rest: proxied
    async def proxy(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Forward a request to the active scheduler's HTTP address, streaming both ways."""
        base = self.link.http_base()
        if base is None or not self.link.ready() or self.http is None:
            resp = error_response(503, "no active scheduler reachable from this edge; retry "
                                  "through the load balancer", code="not_ready",
                                  headers={"Retry-After": "1"})
            await resp(scope, receive, send)
            return
        self.stats["proxied"] += 1
        request = Request(scope, receive)
        body = await request.body()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        url = base + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        try:
            upstream = await self.http.send(
                self.http.build_request(scope["method"], url, headers=headers, content=body),
                stream=True)
        except httpx.HTTPError as exc:
            resp = error_response(503, f"the active scheduler did not answer ({exc}); retry",
                                  code="not_ready", headers={"Retry-After": "1"})
            await resp(scope, receive, send)
            return
        out = [(k.encode("latin-1"), v.encode("latin-1"))
               for k, v in upstream.headers.items() if k.lower() not in _HOP]
        await send({"type": "http.response.start", "status": upstream.status_code,
                    "headers": out})
        try:
            async for part in upstream.aiter_raw():
                await send({"type": "http.response.body", "body": part, "more_body": True})
        except httpx.HTTPError:
            pass  # the scheduler went away mid-answer: the client sees the body end
        finally:
            await upstream.aclose()
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": b"", "more_body": False})


#: a query parameter read as an integer, as the all-in-one gateway's router reads it
_QUERY_INT: TypeAdapter[int] = TypeAdapter(int)


def _stored_route(method: str, path: str) -> tuple[Literal["get", "delete", "items"], str] | None:
    """``(what, response id)`` of a stored response's route (the all-in-one gateway's
    ``/v1/responses/{response_id}`` and ``.../input_items``), or None."""
    prefix = "/v1/responses/"
    if not path.startswith(prefix):
        return None
    rest = path[len(prefix):]
    kind: Literal["get", "delete", "items"]
    if method == "GET" and rest.endswith("/input_items"):
        kind, rest = "items", rest[:-len("/input_items")]
    elif method in ("GET", "DELETE"):
        kind = "get" if method == "GET" else "delete"
    else:
        return None
    if not rest or "/" in rest:
        return None
    return kind, rest


def _anthropic_error(code: int, message: str, headers: dict[str, str] | None = None
                     ) -> JSONResponse:
    """An error in Anthropic's shape (the Messages API's routes), as the all-in-one's."""
    return JSONResponse(anthropic_error_body(code, message), status_code=anthropic_status(code),
                        headers=headers)


def _chat_replies(content: dict[str, Any]) -> list[Any]:
    """The assistant message of every choice of a chat completion object."""
    choices = content.get("choices")
    return [c.get("message") for c in choices if isinstance(c, dict)] \
        if isinstance(choices, list) else []


#: how the refusal and the warnings name the fix
_EXACT_FIX = ("set [cluster] store = \"redis://HOST:PORT/DB\" (HERMES_CLUSTER__STORE) to keep "
              "them exact across edges, or accept limits per edge with [cluster] "
              "per_edge_limits = true (HERMES_CLUSTER__PER_EDGE_LIMITS=true)")


def check_limits_exact(config: GatewayConfig, security: Security) -> None:
    """Refuse (:class:`~hermes.gateway.config.ConfigError`) an edge that would enforce
    tenant admission limits from its own memory (no ``[cluster] store``): behind a load
    balancer N edges would admit N times each limit, silently. ``[cluster] per_edge_limits
    = true`` accepts that (one edge, or approximate limits): the edge starts, says so in a
    WARNING at start and in ``hermes_edge_per_instance_limits``. Without it, limits that
    appear in the key store later are logged as an ERROR naming the fix
    (:attr:`Security.warn_local_limits`)."""
    local = security.local_limits()
    if config.cluster.store or config.cluster.per_edge_limits:
        return
    if local:
        raise ConfigError(
            "an edge (--role edge) without a shared store would enforce these tenant limits "
            "in its own memory, so N edges behind a load balancer admit N times each: "
            f"{'; '.join(local)}. To start it, {_EXACT_FIX}")
    security.warn_local_limits = (
        "tenant limits now enforced by this edge alone (N edges admit N times each; "
        f"{_EXACT_FIX})")


class EdgeCollector:
    """Prometheus collector of an edge's own series (its ``GET /metrics``):
    ``hermes_edge_per_instance_limits`` (1 while this edge enforces admission limits from
    its own memory, or ``[cluster] per_edge_limits`` is in force without a shared store)."""

    def __init__(self, app: EdgeApp) -> None:
        self.app = app

    def describe(self) -> list[object]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        g = GaugeMetricFamily(
            "hermes_edge_per_instance_limits",
            "1 while this edge's tenant limits are its own (no [cluster] store: N edges "
            "admit N times each limit), else 0")
        g.add_metric([], 1.0 if self.app.per_instance_limits() else 0.0)
        yield g


def edge_app(config: GatewayConfig) -> Any:
    """The edge's ASGI app, inside the gateway's security middleware (body limits, API
    keys, tenant admission: :mod:`hermes.gateway.auth`) for the endpoints it serves itself
    (:meth:`EdgeApp.serves`); the proxied requests are checked by the scheduler that answers
    them."""
    from hermes.gateway.auth import SecurityMiddleware, build_security
    from hermes.gateway.disconnect import CancelOnDisconnect
    from hermes.gateway.shared import open_shared_state

    shared = open_shared_state(config)
    security = build_security(config, shared.store if shared is not None else None)
    check_limits_exact(config, security)
    app = EdgeApp(config, shared.evidence if shared is not None else None,
                  shared.responses if shared is not None else None)
    app.security = security
    # a client gone cancels its handler: an LLM call the edge serves, or a run's tool call it
    # forwards (the forwarding's connection closes, and the scheduler cancels the call)
    cancelling = CancelOnDisconnect(app)
    secured = SecurityMiddleware(cancelling, security)

    async def route(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and app.serves(scope) is not None:
            await secured(scope, receive, send)
        else:
            await cancelling(scope, receive, send)

    route.edge = app  # type: ignore[attr-defined]
    return route

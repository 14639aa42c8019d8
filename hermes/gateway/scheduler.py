"""The live scheduler: the asyncio driver of the decision core.

It keeps a registry of runs (:class:`LiveRun`, each wrapping the core's
:class:`~hermes.core.state.RunState`), calls the policy hooks exactly where the simulator
does (``on_arrival``, ``on_unit_start``, ``on_unit_finish``, ``on_service``, ``on_finish``),
computes every request's sort key with ``policy.request_key`` and talks to the HermesLets
over one ZeroMQ ROUTER socket (:mod:`hermes.protocol`): ``submit``/``tool`` out, ``rekey``
when ranks change, ``cancel`` on run cancellation; ``done``/``token``/``failed``/``tool_done``
in. Requests are dispatched to the least-loaded engine serving their model.

Clock: every time handed to the core is the *scheduler clock* ``now()``, which is wall-clock
epoch time when ``time_scale`` is 1 and otherwise runs ``time_scale`` times faster (the
built-in engine runs at the same scale), so run records, ACT and PDGraph durations are in
model seconds either way.

Units: hosted apps and ``/events`` open and close unit invocations explicitly. Otherwise a
request for unit ``U`` joins the open invocation of ``U`` if that one still has requests in
flight (fan-out) and starts a new invocation otherwise (a loop, or the next unit); an
implicitly opened invocation closes when its last request completes.

Every finished run becomes a :class:`~hermes.core.records.RunRecord`, appended to
``<state_dir>/records.jsonl`` and fed to the app's :class:`~hermes.core.profiler.Profiler`; the
learned PDGraph replaces the app's graph in the :class:`~hermes.core.estimator.EstimatorPool`
and (every ``kb_write_every`` runs) in the knowledge base.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import zmq
import zmq.asyncio

from hermes.core.costmodel import CostModel, get_cost_model
from hermes.core.ordering import Key, policy_key, prewarm_key
from hermes.core.policies.base import SchedulingPolicy, make_policy, policy_class
from hermes.core.records import RequestRecord, RunRecord, UnitRecord
from hermes.core.state import RequestView, RunState, UnitObservation
from hermes.gateway.auth import visible
from hermes.gateway.config import GatewayConfig, resolve_state_dir
from hermes.inproc import InprocLink
from hermes.kb.base import APP_NAME_RE
from hermes.protocol import (
    Cancel,
    Done,
    EngineInfo,
    Failed,
    Heartbeat,
    Hello,
    PrewarmAck,
    ProtocolError,
    Rekey,
    Resync,
    Submit,
    Token,
    Tool,
    ToolDone,
    UnitEvent,
    decode,
    encode,
)
from hermes.zmqdrain import QueuedMessages

log = logging.getLogger("hermes.gateway.scheduler")

RunStatus = Literal["queued", "running", "finished", "failed", "cancelled"]
ACTIVE: frozenset[str] = frozenset({"queued", "running"})
NODE_TIMEOUT_S = 10.0  # wall seconds without a message before a node is considered gone


# ---------------------------------------------------------------------------------- errors
class SchedulerError(Exception):
    """Base of the errors the HTTP layers turn into responses (``status``, ``code``, and
    ``param``: the request field at fault, when one is)."""

    status = 400
    code = "invalid_request"
    param: str | None = None


class RunNotFound(SchedulerError):
    status = 404
    code = "run_not_found"


class RunNotActive(SchedulerError):
    status = 409
    code = "run_not_active"


class ModelNotFound(SchedulerError):
    status = 404
    code = "model_not_found"
    param = "model"


class WrongTask(SchedulerError):
    """A model asked for what it does not do (embeddings of a chat model, or the reverse)."""

    status = 400
    code = "model_not_supported"
    param = "model"


class NoCapacity(SchedulerError):
    status = 503
    code = "no_engine"


class RequestFailed(SchedulerError):
    status = 502
    code = "engine_error"


class RunCancelled(SchedulerError):
    status = 409
    code = "run_cancelled"


# ---------------------------------------------------------------------------------- state
@dataclass(eq=False)
class PendingRequest:
    """An LLM request or tool call the scheduler sent to a node and waits for."""

    request_id: str
    run: LiveRun
    inv: UnitInvocation
    kind: Literal["llm", "tool"]
    msg: Submit | Tool
    view: RequestView
    key: tuple[float, ...]
    future: asyncio.Future
    model: str | None = None
    node: str | None = None
    engine: str | None = None
    tokens: asyncio.Queue | None = None
    sent_at: float = 0.0  # scheduler clock
    credited_s: float = 0.0  # service already credited from streamed tokens
    retries: int = 0
    result: Done | ToolDone | None = None
    error: str | None = None
    finished_at: float | None = None


@dataclass(eq=False)
class UnitInvocation:
    """One invocation of a unit inside a run: its requests or its tool call."""

    unit: str
    backend: str
    started: float
    explicit: bool
    upstream: str | None = None
    finished: float | None = None
    requests: list[PendingRequest] = field(default_factory=list)
    duration_s: float | None = None  # tool units
    closed: bool = False

    @property
    def in_flight(self) -> int:
        return sum(1 for r in self.requests if r.finished_at is None)

    def last_done(self) -> float | None:
        ends = [r.finished_at for r in self.requests if r.finished_at is not None]
        return max(ends) if ends else None

    def llm_results(self) -> list[Done]:
        return [r.result for r in self.requests if r.kind == "llm" and isinstance(r.result, Done)]

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "backend": self.backend,
            "started": self.started,
            "finished": self.finished,
            "duration_s": self.duration_s,
            "requests": [
                {
                    "request_id": r.request_id,
                    "kind": r.kind,
                    "node": r.node,
                    "engine": r.engine,
                    "state": "done" if r.result is not None else ("failed" if r.error else "pending"),
                    "input_tokens": getattr(r.result, "input_tokens", None),
                    "output_tokens": getattr(r.result, "output_tokens", None),
                    "queue_s": getattr(r.result, "queue_s", None),
                    "service_s": getattr(r.result, "service_s", None)
                    if isinstance(r.result, Done)
                    else getattr(r.result, "duration_s", None),
                    "sent": r.sent_at,
                    "finished": r.finished_at,
                }
                for r in self.requests
            ],
        }


@dataclass(eq=False)
class LiveRun:
    """A run as the gateway tracks it: the core's RunState plus what the driver needs."""

    state: RunState
    status: RunStatus = "queued"
    units: list[UnitInvocation] = field(default_factory=list)
    open: list[UnitInvocation] = field(default_factory=list)
    pending: dict[str, PendingRequest] = field(default_factory=dict)
    hosted: bool = False
    auto_finish: bool = False  # one-request runs (no headers): finish when the request does
    input: Any = None
    result: Any = None
    error: str | None = None
    task: asyncio.Task | None = None
    last_activity: float = field(default_factory=time.monotonic)
    seq: itertools.count = field(default_factory=itertools.count)
    finished_event: asyncio.Event = field(default_factory=asyncio.Event)
    #: its record is in records.jsonl (written by this gateway, or by the one before a restart
    #: that was killed between the record and the durable end): it is not written again
    recorded: bool = False

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def app(self) -> str:
        return self.state.app

    def act_s(self, now: float) -> float:
        end = self.state.finished if self.state.finished is not None else now
        return end - self.state.submitted

    def to_json(self, now: float) -> dict[str, Any]:
        s = self.state
        return {
            "run_id": s.run_id,
            "app": s.app,
            "tenant": s.tenant,
            "state": self.status,
            "hosted": self.hosted,
            "submitted": s.submitted,
            "finished": s.finished,
            "deadline": s.deadline,
            "k": s.k,  # the run's own prewarming knob (None: the tenant's, app's or default)
            "act_s": self.act_s(now),
            "rank": _finite(s.rank),
            "attained_s": s.attained_s,
            "attained_tokens": s.attained_tokens,
            "current_unit": s.progress.current,
            "pending_requests": len(self.pending),
            "units": [u.to_json() for u in self.units],
            "input": self.input,
            "result": self.result,
            "error": self.error,
        }


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


@dataclass(eq=False)
class Node:
    """A connected HermesLet."""

    name: str
    identity: bytes
    engines: dict[str, EngineInfo]
    tools: list[str]
    last_seen: float  # wall monotonic
    outstanding: dict[str, int] = field(default_factory=dict)  # engine -> our requests there
    tools_outstanding: int = 0
    queued: dict[str, int] = field(default_factory=dict)  # engine -> node-reported queue
    kv_usage: dict[str, float | None] = field(default_factory=dict)  # engine -> KV use (0..1)


# ---------------------------------------------------------------------------------- driver
class LiveScheduler:
    """The gateway's scheduler: runs, policy hooks, dispatch, node protocol, learning."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        context: zmq.asyncio.Context | None = None,
        kb: Any | None = None,
    ) -> None:
        self.config = config
        sc = config.scheduler
        self.time_scale = sc.time_scale
        self.cost: CostModel = get_cost_model(sc.cost_model)
        self.context = context or zmq.asyncio.Context.instance()
        self.inproc_address = f"inproc://hermes-nodes-{uuid.uuid4().hex[:8]}"
        self._t0_wall = time.time()
        self._t0_mono = time.monotonic()
        self.kb = kb if kb is not None else _open_kb(config.stores.kb, config.stores.state_dir)
        self.pool = self._build_pool()
        # the policy samples through a memo of identical run states (hermes.gateway.sample_cache)
        from hermes.gateway.sample_cache import CachingEstimatorPool

        policy_pool = CachingEstimatorPool(self.pool) if self.pool is not None else None
        self.policy: SchedulingPolicy = make_policy(sc.policy, estimators=policy_pool, seed=sc.seed)
        self.runs: dict[str, LiveRun] = {}
        self._finished_order: OrderedDict[str, None] = OrderedDict()
        self.requests: dict[str, PendingRequest] = {}
        #: the same requests by tenant (policies whose keys read per-tenant state: key_scope)
        self._by_tenant: dict[str, dict[str, PendingRequest]] = {}
        self.nodes: dict[str, Node] = {}
        self._node_ready = asyncio.Event()
        self._profilers: dict[str, Any] = {}
        self._profiled_runs: dict[str, int] = {}
        self._kb_written: dict[str, int] = {}
        self._no_graph_warned: set[str] = set()  # apps whose missing PDGraph was logged
        self._dirty: set[str] = set()
        self._latest_graphs: dict[str, Any] = {}  # app -> the last PDGraph refresh_graphs built
        self._kb_records: list[RunRecord] = []
        self._records_fh: Any = None
        self._socket: zmq.asyncio.Socket | None = None
        #: in-process nodes by identity (hermes.inproc: the embedded HermesLet), beside the socket
        self._links: dict[bytes, InprocLink] = {}
        self._tasks: list[asyncio.Task] = []
        self._req_seq = itertools.count()
        state_dir = resolve_state_dir(config.stores.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.records_path = state_dir / "records.jsonl"
        self.stats = {"runs_finished": 0, "records_written": 0, "rekeys_sent": 0}
        #: metrics hooks (a :class:`hermes.metrics.GatewayMetrics`, set by the app) or None
        self.metrics: Any = None
        #: the K knob per scope, set by the admin API: {"default": {"": k}, "app": {name: k},
        #: "tenant": {name: k}}; read with :func:`hermes.core.policy_switch.resolve_k`
        self.knobs: dict[str, dict[str, float]] = {"default": {}, "app": {}, "tenant": {}}
        from hermes.gateway.prewarm import GatewayPrewarmer

        self.prewarm = GatewayPrewarmer.from_scheduler(self)  # prewarm planner (issue 5)
        from hermes.gateway.durable import attach

        self.durable = attach(self)  # durable run state, recovery, node faults (issue 7)

    # ------------------------------------------------------------------ lifecycle
    def _build_pool(self) -> Any | None:
        cls = policy_class(self.config.scheduler.policy)
        if not getattr(cls, "uses_estimator", False):
            return None
        from hermes.core.estimator import EstimatorPool

        sc = self.config.scheduler
        graphs = {}
        if self.kb is not None:
            for app in self.kb.list_apps():
                g = self.kb.get(app)
                if g is not None:
                    graphs[app] = g
        return EstimatorPool(
            graphs,
            self.cost,
            refine=bool(getattr(cls, "refine", True)) and sc.refine,
            n_walks=sc.n_walks,
            min_match=sc.min_match,
            seed=sc.seed,
        )

    async def start(self) -> None:
        """Bind the ROUTER socket (inproc always, TCP when configured) and start the loops."""
        sock = self.context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting node takes over its identity
        self._zap = None
        if self.config.security.curve_dir:  # CURVE: only nodes with an authorized key get in
            from hermes.security.curve import secure_server

            self._zap = secure_server(sock, self.context, self.config.security.curve_dir)
        sock.bind(self.inproc_address)
        if self.config.scheduler.bind:
            try:
                sock.bind(self.config.scheduler.bind)
            except zmq.ZMQError as exc:
                sock.close(0)
                raise SchedulerError(
                    f"cannot bind the node socket to scheduler.bind = "
                    f"{self.config.scheduler.bind!r}: {exc} (is another gateway running? pick "
                    f"another address with --bind / HERMES_BIND, or '' for embedded nodes only)"
                ) from exc
        self._socket = sock
        self._tasks = [
            asyncio.create_task(self._recv_loop(), name="hermes-recv"),
            asyncio.create_task(self._sweep_loop(), name="hermes-sweep"),
            asyncio.create_task(self._learn_loop(), name="hermes-learn"),
        ]

    async def stop(self) -> None:
        for run in list(self.runs.values()):
            if run.task is not None and not run.task.done():
                run.task.cancel()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        for req in list(self.requests.values()):
            if not req.future.done():
                req.future.set_exception(NoCapacity("gateway shutting down"))
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        for link in self._links.values():
            link.close()
        self._links.clear()
        if getattr(self, "_zap", None) is not None:
            self._zap.stop()
            self._zap = None
        try:
            self.flush_learning()
        except Exception:
            log.exception("final knowledge-base flush failed")
        self.durable.close()
        if self._records_fh is not None:
            self._records_fh.close()
            self._records_fh = None

    def now(self) -> float:
        """The scheduler clock (model seconds; epoch time when ``time_scale`` is 1)."""
        return self._t0_wall + (time.monotonic() - self._t0_mono) * self.time_scale

    def wall_s(self, model_s: float) -> float:
        """Wall seconds that ``model_s`` model seconds take at the configured time scale."""
        return model_s / self.time_scale

    async def wait_for_nodes(self, timeout: float = 10.0) -> bool:
        try:
            await asyncio.wait_for(self._node_ready.wait(), timeout)
            return True
        except TimeoutError:
            return False

    # ------------------------------------------------------------------ runs
    def create_run(
        self,
        app: str,
        *,
        deadline_s: float | None = None,
        tenant: str | None = None,
        k: float | None = None,
        input: Any = None,
        hosted: bool = False,
        auto_finish: bool = False,
        idempotency: dict[str, str] | None = None,
    ) -> LiveRun:
        """``idempotency``: ``{"key", "body"}`` of an ``Idempotency-Key`` request, stored with
        the run (:meth:`DurableState.idempotent_run` finds it again, also after a restart)."""
        now = self.now()
        rid = f"run-{uuid.uuid4().hex[:16]}"
        state = RunState(
            run_id=rid,
            app=app,
            submitted=now,
            tenant=tenant or "default",
            deadline=None if deadline_s is None else now + deadline_s,
            k=k,
        )
        run = LiveRun(state=state, hosted=hosted, auto_finish=auto_finish, input=input)
        self.runs[rid] = run
        if idempotency is not None:
            run.idempotency = idempotency  # type: ignore[attr-defined]
            self.durable.remember_idempotency(run)
        if (self.pool is not None and app not in self._no_graph_warned and app != "default"
                and len(self._no_graph_warned) < 1024 and self.pool.get(app) is None):
            # once per app ("default": plain OpenAI requests, no app to model)
            self._no_graph_warned.add(app)
            log.warning("no PDGraph for app %r in the knowledge base (stores.kb = %r): its runs "
                        "get rank 0 until it learns from finished runs", app, self.config.stores.kb)
        self.policy.on_arrival(state, now)
        if self.metrics is not None:
            self.metrics.on_run_created(run)
        self.durable.run_created(run)  # committed before the run is acknowledged
        return run

    def get_run(self, run_id: str) -> LiveRun:
        run = self.runs.get(run_id)
        if run is None or not visible(run.state.tenant):  # other tenants' runs: 404
            raise RunNotFound(f"run {run_id!r} not found")
        return run

    def recent_runs(self, match: Callable[[LiveRun], bool], limit: int) -> list[LiveRun]:
        """Up to ``limit`` runs for which ``match`` holds, newest first (the run listings of
        the runs API and the admin API)."""
        out: list[LiveRun] = []
        for run in reversed(self.runs.values()):
            if len(out) >= limit:
                break
            if match(run):
                out.append(run)
        return out

    def active_run(self, run_id: str) -> LiveRun:
        run = self.get_run(run_id)
        if run.status not in ACTIVE:
            raise RunNotActive(f"run {run_id!r} is {run.status}")
        return run

    def finish_run(self, run_id: str, *, result: Any = None) -> LiveRun:
        """The run is done: close its units, write its record, learn from it."""
        run = self.active_run(run_id)
        now = self.now()
        for req in list(run.pending.values()):
            self._cancel_request(req, RunNotActive(f"run {run_id!r} finished"))
        for inv in list(run.open):
            self._close_unit(run, inv, now)
        if result is not None:
            run.result = result
        run.status = "finished"
        run.state.finished = now
        self.policy.on_finish(run.state, now)
        self._retire(run)
        self.stats["runs_finished"] += 1
        if run.units and not run.recorded:
            # the record first: a kill between the two leaves a run that resumes (and finds its
            # record, :meth:`recorded_run_ids`), never a durably finished run without a record
            self._learn(self._record(run))
            run.recorded = True
        self.durable.run_ended(run)
        return run

    def fail_run(self, run_id: str, error: str) -> None:
        run = self.runs.get(run_id)
        if run is None or run.status not in ACTIVE:
            return
        now = self.now()
        for req in list(run.pending.values()):
            self._cancel_request(req, RunNotActive(f"run {run_id!r} failed"))
        for inv in list(run.open):
            self._close_unit(run, inv, now)
        run.status = "failed"
        run.error = error
        run.state.finished = now
        self.policy.on_finish(run.state, now)
        self._retire(run)
        self.durable.run_ended(run)

    def cancel_run(self, run_id: str) -> LiveRun:
        """Cancel: queued requests are dropped and in-flight ones aborted at the engines."""
        run = self.active_run(run_id)
        now = self.now()
        for req in list(run.pending.values()):
            self._cancel_request(req, RunCancelled(f"run {run_id!r} was cancelled"))
        run.status = "cancelled"
        run.state.finished = now
        for inv in list(run.open):
            inv.closed = True
            inv.finished = now
        run.open.clear()
        self.policy.on_finish(run.state, now)
        if run.task is not None and not run.task.done():
            run.task.cancel()
        self._retire(run)
        self.durable.run_ended(run)
        return run

    def _retire(self, run: LiveRun) -> None:
        self.prewarm.on_run_finish(run.state, self.now())
        if self.metrics is not None:
            self.metrics.on_run_end(run)
        run.finished_event.set()
        self._finished_order[run.run_id] = None
        while len(self._finished_order) > self.config.scheduler.keep_finished_runs:
            old, _ = self._finished_order.popitem(last=False)
            self.runs.pop(old, None)

    # ------------------------------------------------------------------ units
    def begin_unit(
        self,
        run: LiveRun,
        unit: str,
        backend: str,
        *,
        explicit: bool = True,
        upstream: str | None = None,
        at: float | None = None,
    ) -> UnitInvocation:
        """Open a unit invocation (hosted apps, ``/events`` start, or implicitly)."""
        now = self.now() if at is None else at
        for inv in list(run.open):  # implicitly opened, already complete: close before the next
            if not inv.explicit and inv.in_flight == 0:
                self._close_unit(run, inv, now)
        inv = UnitInvocation(unit=unit, backend=backend, started=now, explicit=explicit, upstream=upstream)
        run.units.append(inv)
        run.open.append(inv)
        if run.status == "queued":
            run.status = "running"
        st = run.state
        st.begin_unit(unit)
        self.policy.on_unit_start(st, unit, now)
        self.prewarm.on_unit_start(st, unit, backend, now)
        self._rekey_run(run, now)
        return inv

    def end_unit(self, run: LiveRun, inv: UnitInvocation, *, duration_s: float | None = None) -> None:
        """Close an explicitly opened invocation (its requests have completed)."""
        if inv.closed:
            return
        if duration_s is not None:
            inv.duration_s = duration_s
        self._close_unit(run, inv, self.now())

    def unit_for_request(self, run: LiveRun, unit: str, backend: str) -> UnitInvocation:
        """The invocation a new request of ``unit`` belongs to (see the module docstring)."""
        for inv in reversed(run.open):
            if inv.unit == unit and (inv.explicit or inv.in_flight > 0):
                return inv
        return self.begin_unit(run, unit, backend, explicit=False)

    def unit_event(self, run: LiveRun, unit: str, event: str, *, backend: str | None = None,
                   at: float | None = None) -> UnitInvocation | None:
        """A client-reported unit boundary (``POST /v1/runs/{id}/events`` or a node event)."""
        if event == "start":
            return self.begin_unit(run, unit, backend or "api:client", explicit=True, at=at)
        for inv in reversed(run.open):
            if inv.unit == unit:
                now = self.now() if at is None else at
                if not inv.requests and inv.duration_s is None:
                    inv.duration_s = max(0.0, now - inv.started)
                    self._credit(run, inv.duration_s, 0, now)
                self._close_unit(run, inv, now)
                return inv
        return None

    def _close_unit(self, run: LiveRun, inv: UnitInvocation, now: float) -> None:
        if inv.closed:
            return
        inv.closed = True
        done = inv.last_done()
        inv.finished = max(inv.started, done if done is not None and inv.explicit is False else now)
        if inv in run.open:
            run.open.remove(inv)
        results = inv.llm_results()
        duration = float(inv.duration_s if inv.duration_s is not None else inv.finished - inv.started)
        if results:
            obs = UnitObservation.from_requests(
                inv.unit,
                [d.input_tokens for d in results],
                [d.output_tokens for d in results],
                self.cost,
                duration_s=duration,
                started=inv.started,
                finished=inv.finished,
            )
        else:
            obs = UnitObservation(
                unit=inv.unit,
                duration_s=duration,
                service_s=float(inv.duration_s or 0.0),
                started=inv.started,
                finished=inv.finished,
            )
        st = run.state
        st.end_unit(obs, run.open[-1].unit if run.open else None)
        self.policy.on_unit_finish(st, obs, now)
        self._rekey_run(run, now)
        if run.status in ACTIVE:
            self.durable.run_progress(run)

    # ------------------------------------------------------------------ service accounting
    def _credit(self, run: LiveRun, seconds: float, tokens: int, now: float) -> None:
        st = run.state
        st.credit(seconds, tokens)
        before = st.rank
        self.policy.on_service(st, seconds, tokens, now)
        if st.rank != before:
            self._rekey_run(run, now)

    def credit_tool_time(self, run: LiveRun, seconds: float) -> None:
        """Service delivered by a tool the gateway did not dispatch (simulated tool steps)."""
        self._credit(run, seconds, 0, self.now())

    # ------------------------------------------------------------------ dispatch
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

    def resolve_model(self, model: str | None, *, strict: bool,
                      task: str = "generate") -> str:
        """The model a request for ``task`` goes to: itself if served, else the default
        (unless strict). A model served only for the other task is refused (:class:`WrongTask`)
        rather than routed elsewhere."""
        served = self.served_models(task)
        if model and model in served:
            return model
        if model and strict and model in self.served_models():
            what = "embedding" if task == "embed" else "chat/text generation"
            raise WrongTask(f"the model {model!r} does not support {what}; models that do: "
                            f"{', '.join(served) or 'none'}")
        if strict and model and not self.config.scheduler.route_unknown_models:
            raise ModelNotFound(f"the model {model!r} does not exist; served: {', '.join(served) or 'none'}")
        default = (self.config.scheduler.default_model if task == "generate" else "") \
            or (served[0] if served else "")
        if not default:
            raise NoCapacity(f"no connected engine serves {task} requests")
        return default

    async def serving_model(self, model: str | None, *, strict: bool,
                            task: str = "generate") -> str:
        """:meth:`resolve_model`, after waiting (up to 10 s) for a HermesLet when none is
        connected: a gateway that has just (re)started accepts runs before its nodes have said
        hello, and their calls should wait for an engine rather than fail at once."""
        if not self.nodes:
            await self.wait_for_nodes()
        return self.resolve_model(model, strict=strict, task=task)

    def _pick_engine(self, model: str, exclude: set[str] = frozenset()) -> tuple[Node, EngineInfo]:
        best: tuple[float, int, Node, EngineInfo] | None = None
        for node in self.nodes.values():
            if node.name in exclude:
                continue
            for e in node.engines.values():
                if e.model != model and model not in e.loras:
                    continue
                load = node.outstanding.get(e.name, 0) / e.max_inflight
                cand = (load, node.queued.get(e.name, 0), node, e)
                if best is None or cand[:2] < best[:2]:
                    best = cand
        if best is None:
            raise NoCapacity(f"no connected engine serves model {model!r}")
        return best[2], best[3]

    def _pick_tool_node(self, backend: str, exclude: set[str] = frozenset()) -> Node:
        kind = backend.split(":", 1)[0]
        capable = [n for n in self.nodes.values() if n.tools and n.name not in exclude]
        exact = [n for n in capable if kind in n.tools]
        pool = exact or capable
        if not pool:
            raise NoCapacity("no connected node runs tools")
        return min(pool, key=lambda n: n.tools_outstanding)

    def _view(self, run: LiveRun, inv: UnitInvocation, rid: str, input_tokens: int,
              max_tokens: int | None, now: float) -> RequestView:
        return RequestView(
            request_id=rid,
            run_id=run.run_id,
            unit=inv.unit,
            arrival=now,
            input_tokens=input_tokens,
            max_output_tokens=max_tokens,
            seq=next(self._req_seq),
        )

    def prewarm_key(self, run_id: str, unit: str) -> Key | None:
        """The queue key of a KV prewarm for ``unit`` of an active run, as the policy would key
        the run's own request for that unit now (:func:`hermes.core.ordering.prewarm_key`);
        ``None`` when the run is not active."""
        run = self.runs.get(run_id)
        if run is None or run.status not in ACTIVE:
            return None
        return prewarm_key(self.policy, run.state, unit, self.now(), next(self._req_seq))

    async def submit_llm(
        self,
        run: LiveRun,
        inv: UnitInvocation,
        *,
        model: str,
        endpoint: Literal["chat", "completions", "embeddings"],
        body: dict[str, Any],
        stream: bool = False,
    ) -> PendingRequest:
        """Queue an LLM request of ``run`` (in ``inv``) at the least-loaded engine of ``model``."""
        if run.status not in ACTIVE:
            raise RunNotActive(f"run {run.run_id!r} is {run.status}")
        if not self.nodes:
            await self.wait_for_nodes()
        now = self.now()
        self.prewarm.note_request(run.app, inv.unit, body, run.state.tenant)
        rid = f"req-{uuid.uuid4().hex[:16]}"
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        view = self._view(run, inv, rid, _estimate_tokens(endpoint, body), max_tokens, now)
        key = policy_key(self.policy, run.state, view, now)
        msg = Submit(
            request_id=rid, run_id=run.run_id, unit=inv.unit, model=model, endpoint=endpoint,
            body=body, stream=stream, key=list(key),
        )
        req = PendingRequest(
            request_id=rid, run=run, inv=inv, kind="llm", msg=msg, view=view, key=key,
            future=asyncio.get_running_loop().create_future(), model=model,
            tokens=asyncio.Queue() if stream else None, sent_at=now,
        )
        self._register(req)
        self._send_llm(req)
        return req

    async def submit_tool(
        self,
        run: LiveRun,
        inv: UnitInvocation,
        *,
        backend: str,
        code: str | None = None,
        command: list[str] | None = None,
        timeout_s: float = 30.0,
    ) -> PendingRequest:
        """Queue a tool call of ``run`` at a node's tool runner, ordered by the run's rank."""
        if run.status not in ACTIVE:
            raise RunNotActive(f"run {run.run_id!r} is {run.status}")
        if not self.nodes:
            await self.wait_for_nodes()
        now = self.now()
        rid = f"tool-{uuid.uuid4().hex[:16]}"
        view = self._view(run, inv, rid, 0, None, now)
        key = policy_key(self.policy, run.state, view, now)
        msg = Tool(
            request_id=rid, run_id=run.run_id, unit=inv.unit, backend=backend, code=code,
            command=command, timeout_s=timeout_s, key=list(key),
        )
        req = PendingRequest(
            request_id=rid, run=run, inv=inv, kind="tool", msg=msg, view=view, key=key,
            future=asyncio.get_running_loop().create_future(), sent_at=now,
        )
        self._register(req)
        self._send_tool(req)
        return req

    def _register(self, req: PendingRequest) -> None:
        self.requests[req.request_id] = req
        self._by_tenant.setdefault(req.run.state.tenant, {})[req.request_id] = req
        req.run.pending[req.request_id] = req
        req.inv.requests.append(req)
        req.run.last_activity = time.monotonic()

    def _send_llm(self, req: PendingRequest, exclude: set[str] = frozenset()) -> None:
        try:
            node, engine = self._pick_engine(req.model or "", exclude)
        except NoCapacity as e:
            self._fail_request(req, e)
            return
        req.node, req.engine = node.name, engine.name
        assert isinstance(req.msg, Submit)
        req.msg.engine = engine.name
        req.msg.key = list(req.key)
        node.outstanding[engine.name] = node.outstanding.get(engine.name, 0) + 1
        self._send(node, req.msg)

    def _send_tool(self, req: PendingRequest, exclude: set[str] = frozenset()) -> None:
        assert isinstance(req.msg, Tool)
        try:
            node = self._pick_tool_node(req.msg.backend, exclude)
        except NoCapacity as e:
            self._fail_request(req, e)
            return
        req.node = node.name
        req.msg.key = list(req.key)
        node.tools_outstanding += 1
        self._send(node, req.msg)

    def _send(self, node: Node, msg: Any) -> None:
        self._send_raw(node.identity, msg)

    def _send_raw(self, identity: bytes, msg: Any) -> None:
        link = self._links.get(identity)
        if link is not None:
            link.deliver(msg)
            return
        if self._socket is None:
            raise NoCapacity("scheduler is not running")
        frames = [identity, encode(msg)]
        try:
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:  # the peer's pipe is full: send from the loop (rare)
            asyncio.get_running_loop().create_task(self._socket.send_multipart(frames))

    async def wait(self, req: PendingRequest, timeout: float | None = None) -> Done | ToolDone:
        """Wait for a request's result; raises RequestFailed / RunCancelled / RunNotActive."""
        t = timeout if timeout is not None else self.config.scheduler.request_timeout_s
        try:
            return await asyncio.wait_for(asyncio.shield(req.future), t)
        except TimeoutError:
            self._cancel_request(req, RequestFailed(f"request {req.request_id} timed out after {t} s"))
            raise RequestFailed(f"request {req.request_id} timed out after {t} s") from None

    async def stream(self, req: PendingRequest) -> AsyncIterator[Token]:
        """The streamed chunks (the node's :class:`~hermes.protocol.Token` messages, the
        engine's chunk object in each) of a request submitted with ``stream=True``."""
        assert req.tokens is not None
        while True:
            item = await req.tokens.get()
            if item is None:
                break
            yield item
        if req.future.done() and req.future.exception() is not None:
            raise req.future.exception()  # type: ignore[misc]

    def abandon(self, req: PendingRequest) -> None:
        """The client went away: cancel the request at its node."""
        if req.request_id in self.requests:
            self._cancel_request(req, RunNotActive("client disconnected"))

    # ------------------------------------------------------------------ completion
    def _untrack(self, req: PendingRequest) -> None:
        self.requests.pop(req.request_id, None)
        same = self._by_tenant.get(req.run.state.tenant)
        if same is not None:
            same.pop(req.request_id, None)
            if not same:
                del self._by_tenant[req.run.state.tenant]
        req.run.pending.pop(req.request_id, None)
        node = self.nodes.get(req.node or "")
        if node is not None:
            if req.kind == "llm" and req.engine:
                node.outstanding[req.engine] = max(0, node.outstanding.get(req.engine, 0) - 1)
            elif req.kind == "tool":
                node.tools_outstanding = max(0, node.tools_outstanding - 1)
        req.finished_at = self.now()
        req.run.last_activity = time.monotonic()

    def _cancel_request(self, req: PendingRequest, exc: SchedulerError) -> None:
        node = self.nodes.get(req.node or "")
        if node is not None and req.request_id in self.requests:
            self._send(node, Cancel(request_ids=[req.request_id]))
        self._fail_request(req, exc)

    def _fail_request(self, req: PendingRequest, exc: SchedulerError) -> None:
        self._untrack(req)
        req.error = str(exc)
        if not req.future.done():
            req.future.set_exception(exc)
            req.future.exception()  # mark retrieved: nobody may be waiting
        if req.tokens is not None:
            req.tokens.put_nowait(None)
        self._after_request(req)

    def _on_done(self, msg: Done) -> None:
        req = self.requests.get(msg.request_id)
        if req is None:
            return
        self._untrack(req)
        req.result = msg
        if self.metrics is not None:
            self.metrics.on_request_done(req.node, msg.engine, msg.queue_s, msg.service_s)
        run, now = req.run, self.now()
        service = self.cost.request_service_s(msg.input_tokens, msg.output_tokens)
        self._credit(run, max(0.0, service - req.credited_s), msg.input_tokens + msg.output_tokens, now)
        if req.tokens is not None:
            req.tokens.put_nowait(None)
        if not req.future.done():
            req.future.set_result(msg)
        self._after_request(req)

    def _on_token(self, msg: Token) -> None:
        req = self.requests.get(msg.request_id)
        if req is None:
            return
        if req.tokens is not None:
            req.tokens.put_nowait(msg)
        if msg.n_tokens:
            # decode service of these tokens alone (the rest is credited when the request is done)
            s = msg.n_tokens * (self.cost.base_s + self.cost.decode_s_per_seq)
            req.credited_s += s
            self._credit(req.run, s, msg.n_tokens, self.now())

    def _on_tool_done(self, msg: ToolDone) -> None:
        req = self.requests.get(msg.request_id)
        if req is None:
            return
        self._untrack(req)
        req.result = msg
        if self.metrics is not None and isinstance(req.msg, Tool):
            self.metrics.on_tool_done(req.msg.backend, msg.duration_s, msg.cold)
        req.inv.duration_s = (req.inv.duration_s or 0.0) + msg.duration_s
        self._credit(req.run, msg.duration_s, 0, self.now())
        if not req.future.done():
            req.future.set_result(msg)
        self._after_request(req)

    def _on_failed(self, msg: Failed) -> None:
        req = self.requests.get(msg.request_id)
        if req is None:
            return
        if msg.retryable and req.retries < self.config.scheduler.max_retries:
            req.retries += 1
            node = self.nodes.get(req.node or "")
            if node is not None:
                if req.kind == "llm" and req.engine:
                    node.outstanding[req.engine] = max(0, node.outstanding.get(req.engine, 0) - 1)
                elif req.kind == "tool":
                    node.tools_outstanding = max(0, node.tools_outstanding - 1)
            exclude = {req.node} if req.node and len(self.nodes) > 1 else set()
            resend = self._send_llm if req.kind == "llm" else self._send_tool
            delay = min(2.0, 0.1 * 2 ** (req.retries - 1))  # backoff: 0.1, 0.2, 0.4 ... 2 s

            def _retry() -> None:
                if req.request_id in self.requests:  # not cancelled meanwhile
                    resend(req, exclude)

            asyncio.get_running_loop().call_later(delay, _retry)
            return
        exc = RequestFailed(msg.error)
        if msg.status is not None and 400 <= msg.status < 500:
            exc.status = msg.status
            exc.code = "invalid_request"
        self._fail_request(req, exc)

    def _after_request(self, req: PendingRequest) -> None:
        """Close an implicitly opened invocation when its last request completes. A one-request
        run's is closed by :meth:`finish_run` once the answer has left (off the request's
        path; the invocation's end is its last result's time either way)."""
        inv, run = req.inv, req.run
        if run.auto_finish:
            return
        if not inv.explicit and not inv.closed and inv.in_flight == 0 and run.status in ACTIVE:
            self._close_unit(run, inv, self.now())

    # ------------------------------------------------------------------ ranks -> keys
    def _rekey_run(self, run: LiveRun, now: float) -> None:
        """Re-key the queued requests whose keys ``run``'s new state can change: its own, or
        its tenant's when keys read per-tenant state (VTC: O(the tenant's queue), not
        O(every queued request), per completion), or all (``policy.key_scope``)."""
        scope = self.policy.key_scope
        if scope == "all":
            self.rekey_all()
            return
        reqs = run.pending if scope == "run" else self._by_tenant.get(run.state.tenant, {})
        changes: dict[str, dict[str, list[float]]] = {}
        for req in reqs.values():  # re-keying changes keys, not membership
            self._recompute(req, now, changes)
        self._send_rekeys(changes)

    def _recompute(self, req: PendingRequest, now: float, changes: dict) -> None:
        key = policy_key(self.policy, req.run.state, req.view, now)
        if key != req.key:
            req.key = key
            if req.node:
                changes.setdefault(req.node, {})[req.request_id] = list(key)

    def _send_rekeys(self, changes: dict[str, dict[str, list[float]]]) -> None:
        for node_name, keys in changes.items():
            node = self.nodes.get(node_name)
            if node is not None and keys:
                self._send(node, Rekey(keys=keys))
                self.stats["rekeys_sent"] += len(keys)

    def rekey_all(self) -> None:
        """Recompute every queued request's key (policies whose keys depend on other runs)."""
        now = self.now()
        changes: dict[str, dict[str, list[float]]] = {}
        for req in list(self.requests.values()):
            self._recompute(req, now, changes)
        self._send_rekeys(changes)

    def switch_policy(self, name: str) -> dict[str, Any]:
        """Install policy ``name`` live: every active run is ranked afresh and every queued
        request re-keyed at its node (``ValueError`` for an unknown policy)."""
        from hermes.core.policy_switch import adopt_runs

        cls = policy_class(name)  # ValueError names the known policies
        previous = self.config.scheduler.policy
        self.config.scheduler.policy = name
        try:
            pool = self._build_pool() if getattr(cls, "uses_estimator", False) else None
            if pool is not None:
                for prof in self._profilers.values():
                    with contextlib.suppress(Exception):
                        pool.update(prof.graph)
            policy = make_policy(name, estimators=pool, seed=self.config.scheduler.seed)
        except Exception:
            self.config.scheduler.policy = previous
            raise
        self.pool, self.policy = pool, policy
        now = self.now()
        n = adopt_runs(policy, (r.state for r in self.runs.values() if r.status in ACTIVE), now)
        before = self.stats["rekeys_sent"]
        self.rekey_all()
        if self.metrics is not None:
            self.metrics.on_policy_switch()
        return {"policy": name, "previous": previous, "runs_reranked": n,
                "requests_rekeyed": self.stats["rekeys_sent"] - before}

    # ------------------------------------------------------------------ node protocol
    async def _recv_loop(self) -> None:
        assert self._socket is not None
        # messages already queued are taken without a future each (hermes.zmqdrain)
        drain = QueuedMessages(self._socket)
        while True:
            try:
                first = await self._socket.recv_multipart()
            except asyncio.CancelledError:
                raise
            except zmq.ZMQError as e:
                log.warning("zmq receive failed: %s", e)
                await asyncio.sleep(0.05)
                continue
            for frames in drain.after(first):
                self._on_frames(frames)

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
            self._handle(identity, msg)
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

    def _handle(self, identity: bytes, msg: Any) -> None:
        node = self._node_by_identity(identity)
        if node is not None:
            node.last_seen = time.monotonic()
        elif not isinstance(msg, Hello):  # a node we do not know (we restarted): ask again
            self._send_raw(identity, Resync())
        if isinstance(msg, Done | ToolDone) and msg.request_id not in self.requests:
            self.durable.on_orphan(msg)  # a result from before a restart (issue 7)
        elif isinstance(msg, Hello | Heartbeat) and msg.holding is not None:
            self.durable.on_holding(msg.node, msg.holding)
        if isinstance(msg, Done):
            self._on_done(msg)
        elif isinstance(msg, Token):
            self._on_token(msg)
        elif isinstance(msg, ToolDone):
            self._on_tool_done(msg)
        elif isinstance(msg, Failed):
            self._on_failed(msg)
        elif isinstance(msg, Heartbeat):
            if node is not None:
                node.queued = {name: load.queued for name, load in msg.engines.items()}
                node.kv_usage = {name: load.kv_usage for name, load in msg.engines.items()}
        elif isinstance(msg, Hello):
            self._on_hello(identity, msg)
        elif isinstance(msg, UnitEvent):
            run = self.runs.get(msg.run_id)
            if run is not None and run.status in ACTIVE:
                self.unit_event(run, msg.unit, msg.event)
        elif isinstance(msg, PrewarmAck):
            log.debug("prewarm ack %s", msg)
            self.prewarm.on_ack(msg)

    def _node_by_identity(self, identity: bytes) -> Node | None:
        node = self.nodes.get(identity.decode(errors="replace"))
        if node is not None and node.identity == identity:
            return node
        for n in self.nodes.values():
            if n.identity == identity:
                return n
        return None

    def _on_hello(self, identity: bytes, msg: Hello) -> None:
        old = self.nodes.get(msg.node)
        node = Node(
            name=msg.node,
            identity=identity,
            engines={e.name: e for e in msg.engines},
            tools=list(msg.tools),
            last_seen=time.monotonic(),
        )
        if old is not None:
            node.outstanding = old.outstanding
            node.tools_outstanding = old.tools_outstanding
        self.nodes[msg.node] = node
        if self.metrics is not None:
            self.metrics.on_node_joined(msg.node, node.engines)
        self._node_ready.set()
        log.info("node %s connected: engines %s, tools %s", msg.node,
                 [f"{e.name}({e.model})" for e in msg.engines], msg.tools)

    async def _sweep_loop(self) -> None:
        """Periodic work: rekey everything, drop silent nodes, finish idle client runs."""
        sc = self.config.scheduler
        while True:
            await asyncio.sleep(sc.rekey_interval_s)
            try:
                t0 = time.perf_counter()
                self.rekey_all()
                if self.metrics is not None:
                    self.metrics.on_rank_refresh(time.perf_counter() - t0)
                self._reap_nodes()
                self._reap_idle_runs()
            except Exception:
                log.exception("scheduler sweep failed")

    def _reap_nodes(self) -> None:
        cutoff = time.monotonic() - NODE_TIMEOUT_S
        for name, node in list(self.nodes.items()):
            if node.last_seen >= cutoff:
                continue
            log.warning("node %s silent for %.0f s: resubmitting its requests", name, NODE_TIMEOUT_S)
            del self.nodes[name]
            self.durable.redispatch(name)  # queued: elsewhere; in flight: retried once or failed
        if not self.nodes:
            self._node_ready.clear()

    def _reap_idle_runs(self) -> None:
        limit = self.config.scheduler.run_idle_timeout_s
        cutoff = time.monotonic() - limit
        for run in list(self.runs.values()):
            if (run.status in ACTIVE and not run.hosted and not run.pending
                    and run.last_activity < cutoff):
                log.info("run %s idle for %.0f s: finishing it", run.run_id, limit)
                self.finish_run(run.run_id)

    # ------------------------------------------------------------------ records and learning
    def _record(self, run: LiveRun) -> RunRecord:
        units = []
        for inv in sorted(run.units, key=lambda u: u.started):
            results = inv.llm_results()
            finished = inv.finished if inv.finished is not None else inv.started
            if results:
                units.append(UnitRecord(
                    unit=inv.unit, backend=inv.backend, started=inv.started, finished=finished,
                    requests=[RequestRecord(input_tokens=d.input_tokens, output_tokens=d.output_tokens)
                              for d in results],
                    upstream=inv.upstream,
                ))
            else:
                backend = inv.backend if not inv.backend.startswith("llm:") else "api:client"
                units.append(UnitRecord(
                    unit=inv.unit, backend=backend, started=inv.started, finished=finished,
                    duration_s=float(inv.duration_s if inv.duration_s is not None else finished - inv.started),
                    upstream=inv.upstream,
                ))
        st = run.state
        return RunRecord(app=st.app, run_id=st.run_id, submitted=st.submitted,
                         finished=st.finished or self.now(), deadline=st.deadline, units=units)

    def recorded_run_ids(self, tail_bytes: int = 1 << 16) -> set[str]:
        """Run ids of the last records in records.jsonl (its last ``tail_bytes``): after a
        restart, a run whose record was written just before the kill but whose end was not
        stored resumes, and must not be recorded twice. Only the run being finished at the
        kill can be in that state (record and durable end are written in one synchronous
        step), so the tail is enough."""
        try:
            with self.records_path.open("rb") as fh:
                size = fh.seek(0, 2)
                fh.seek(max(0, size - tail_bytes))
                lines = fh.read().splitlines()
        except FileNotFoundError:
            return set()
        if size > tail_bytes:
            lines = lines[1:]  # cut through
        out: set[str] = set()
        for line in lines:
            try:
                out.add(json.loads(line)["run_id"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line
        return out

    def _learn(self, rec: RunRecord) -> None:
        """Append the record and feed it to its app's profiler.

        Rebuilding the PDGraph (masks, sample lists) costs milliseconds, so it is done at most
        every ``learn_interval_s`` per app (:meth:`refresh_graphs`), and knowledge-base writes
        (which fsync) run in a worker thread, off the event loop.
        """
        if self._records_fh is None:
            self._records_fh = self.records_path.open("a")
        self._records_fh.write(rec.model_dump_json(exclude_none=True) + "\n")
        self._records_fh.flush()
        self.stats["records_written"] += 1
        try:
            self._profiler(rec.app).add(rec)
        except Exception:
            log.exception("profiler failed on run %s of %s", rec.run_id, rec.app)
            return
        self._dirty.add(rec.app)
        self._kb_records.append(rec)
        self._profiled_runs[rec.app] = self._profiled_runs.get(rec.app, 0) + 1

    def _profiler(self, app: str) -> Any:
        from hermes.core.profiler import Profiler

        prof = self._profilers.get(app)
        if prof is None:
            base = self.kb.get(app) if self.kb is not None else None
            prof = self._profilers[app] = Profiler(app, base)
        return prof

    def refresh_graphs(self, apps: set[str] | None = None) -> dict[str, Any]:
        """Rebuild the learned PDGraphs of apps with new runs; hand them to the estimator."""
        todo = self._dirty if apps is None else (self._dirty & apps)
        graphs = {}
        for app in list(todo):
            self._dirty.discard(app)
            try:
                graph = self._profilers[app].graph
            except Exception:
                log.exception("PDGraph rebuild failed for %s", app)
                continue
            graphs[app] = graph
            self._latest_graphs[app] = graph
            if self.pool is not None:
                self.pool.update(graph)
        return graphs

    def _kb_batch(self, graphs: dict[str, Any]) -> tuple[list[RunRecord], list[Any]]:
        """What to write to the knowledge base now: new records, graphs due (kb_write_every)."""
        recs, self._kb_records = self._kb_records, []
        every = self.config.stores.kb_write_every
        due = []
        if every:
            for app, graph in graphs.items():
                if self._profiled_runs.get(app, 0) - self._kb_written.get(app, 0) >= every:
                    self._kb_written[app] = self._profiled_runs.get(app, 0)
                    due.append(graph)
        return recs, due

    def _kb_write(self, recs: list[RunRecord], graphs: list[Any]) -> None:
        if self.kb is None:
            return
        if recs and hasattr(self.kb, "append_records"):
            try:  # one write and one fsync per app for the batch
                self.kb.append_records(recs)
                recs = []
            except Exception:  # one by one: a bad record must not lose the others
                pass
        for rec in recs:
            if hasattr(self.kb, "append_record"):
                try:
                    self.kb.append_record(rec)
                except Exception:
                    log.exception("knowledge base record log failed for %s", rec.app)
        for graph in graphs:
            try:
                self.kb.put(graph)
            except Exception:
                log.exception("knowledge base write failed for %s", graph.app)

    async def _learn_loop(self) -> None:
        interval = self.config.stores.learn_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                recs, due = self._kb_batch(self.refresh_graphs())
                if recs or due:
                    await asyncio.to_thread(self._kb_write, recs, due)
            except Exception:
                log.exception("learning loop failed")

    def flush_learning(self) -> None:
        """Rebuild every pending graph and write the knowledge base now (shutdown, tests)."""
        self._kb_write(*self._kb_batch(self.refresh_graphs()))

    def app_graph(self, app: str) -> Any | None:
        """The current PDGraph of ``app``: learned online if any run finished, else the KB's.

        The learned graph is the one the last :meth:`refresh_graphs` built (the learner
        refreshes every ``stores.learn_interval_s``); it is rebuilt here only if none was
        built yet. Rebuilding on every call put a PDGraph rebuild (and a new estimator) on the
        path of every unit start (the prewarm planner asks at each one)."""
        graph = self._latest_graphs.get(app)
        if graph is not None:
            return graph
        if not APP_NAME_RE.fullmatch(app):
            return None  # not a storable app name: no app can have it (callers answer 404)
        if app in self._profilers:
            self._dirty.add(app)
            return self.refresh_graphs({app}).get(app)
        return self.kb.get(app) if self.kb is not None else None

    def put_graph(self, graph: Any) -> None:
        """Install an uploaded PDGraph: knowledge base, estimator, and the online profiler."""
        from hermes.core.profiler import Profiler

        if self.kb is not None:
            self.kb.put(graph)
        self._profilers[graph.app] = Profiler(graph.app, graph)
        self._latest_graphs[graph.app] = graph
        self._dirty.discard(graph.app)
        if self.pool is not None:
            self.pool.update(graph)

    def app_names(self) -> list[str]:
        names = set(self._profilers)
        if self.kb is not None:
            names.update(self.kb.list_apps())
        return sorted(names)


def _estimate_tokens(endpoint: str, body: dict[str, Any]) -> int:
    """A cheap prompt-length estimate for ordering (the engine reports the exact count)."""
    if endpoint == "chat":
        text = " ".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
    else:
        p = body.get("prompt", "")
        text = p if isinstance(p, str) else " ".join(map(str, p))
    return max(1, len(text) // 4)


def _open_kb(url: str, state_dir: str) -> Any | None:
    """The knowledge base. A directory (the shipped ``pdgraphs/`` by default) is read-only to
    the gateway: what it learns goes to ``<state_dir>/pdgraphs`` on top of it."""
    if not url:
        return None
    from hermes.kb import open_store
    from hermes.kb.file import FileStore
    from hermes.kb.overlay import OverlayStore

    store = open_store(url)
    if isinstance(store, FileStore):
        return OverlayStore(FileStore(resolve_state_dir(state_dir) / "pdgraphs"), store)
    return store

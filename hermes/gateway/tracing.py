"""Traces of runs: one OpenTelemetry trace per run, joined to the caller's trace.

:class:`RunTracer` is an observer of the run registry (:class:`~hermes.gateway.runs.
RunObserver`) and of dispatch (``Dispatcher.trace``: :meth:`RunTracer.sent`, called as a
request or tool call goes to its node) and of the prewarm planner (``on_action``). It makes:

- the **run** the root span (``run APP``: app, tenant, inferred or not, hosted; outcome,
  ACT and the service it received when it ends), started at its submission and ended at its
  end. Its parent is the caller's context when the request that created the run carried a
  W3C ``traceparent`` (:class:`TraceContextMiddleware`): the run joins the agent's own
  trace; without one the run is its own trace;
- each **unit invocation** a child span (``unit UNIT``);
- each **LLM request** (``chat MODEL``, ``text_completion MODEL``, ``embeddings MODEL``) and
  **tool call** (``execute_tool UNIT``) a span under its unit, with the GenAI semantic
  conventions (``gen_ai.operation.name``, ``gen_ai.request.model``,
  ``gen_ai.usage.input_tokens`` / ``output_tokens``, ``gen_ai.response.finish_reasons``,
  ``gen_ai.tool.name``) and Hermes' own attributes: ``hermes.rank`` and ``hermes.policy`` at
  dispatch, ``hermes.queue_s`` (waiting in the node's queue), ``hermes.service_s``,
  ``hermes.ttft_s``, ``hermes.node`` / ``hermes.engine``, ``hermes.cached_tokens`` (the
  engine's prefix/KV hit, where it reports one), ``hermes.retries``; events ``hermes.
  dispatched`` (released to the engine) and ``hermes.first_token``. A request that goes to
  an engine carries its span's context onward (``Submit.traceparent``: the node sends it as
  the ``traceparent`` header of its OpenAI-compatible request).

Re-ranks (``hermes.rerank``), prewarm decisions (``hermes.prewarm``), retries
(``hermes.retry``), failover to another node (``hermes.failover``) and the end of an
inferred run (``hermes.run_end_inferred``) are span events. Prompt and completion text (and a
tool's code and output) are exported only with ``[tracing] capture_content = true``.

Off the hot path: on the event loop the tracer only picks ids and, as a span ends, describes
it as a plain record (a few microseconds) put in a bounded queue (:class:`Tracing`); the
OpenTelemetry SDK, which costs ~50 us to make a span and ~100 us to encode it, makes the real
spans from those records in an export process of its own (:mod:`hermes.gateway.
trace_export`: the SDK's ``BatchSpanProcessor`` and OTLP exporter, ``OTEL_BSP_*`` as usual),
or in a thread of the gateway (``[tracing] process = false``). Records or spans dropped for a
full queue are counted (``hermes_trace_spans_dropped_total``, :class:`TracingCollector`).
With tracing off none of this is installed: dispatch checks one attribute per request.

Turned on by ``[tracing] enabled = true`` or the standard OpenTelemetry variables
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``;
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turn it off); the SDK and the OTLP
exporter come with the ``tracing`` extra (:mod:`hermes.extras`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import subprocess
import sys
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hermes.gateway.runs import RunObserver
from hermes.gateway.state import LiveRun, PendingRequest, UnitInvocation
from hermes.protocol import Done, Submit, Tool, ToolDone

if TYPE_CHECKING:
    from hermes.core.prewarm import PrewarmAction
    from hermes.gateway.config import GatewayConfig, TracingConfig
    from hermes.gateway.context import SchedulerContext

log = logging.getLogger("hermes.gateway.tracing")

#: the W3C trace context (``traceparent``, ``tracestate``) of the HTTP request being handled,
#: set by :class:`TraceContextMiddleware` (installed only with tracing on)
INCOMING: ContextVar[dict[str, str] | None] = ContextVar("hermes_incoming_trace", default=None)

#: OpenAI endpoint -> ``gen_ai.operation.name``
OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings"}
#: events of one kind kept per span at most (re-ranks of a long run: the first ones)
MAX_EVENTS = 32


def tracing_wanted(config: TracingConfig, env: Mapping[str, str] | None = None) -> bool:
    """Whether tracing is on: ``[tracing] enabled``, or an OTLP endpoint in the standard
    OpenTelemetry variables, unless the SDK or the trace exporter is turned off there."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    if config.enabled:
        return True
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


class TraceContextMiddleware:
    """Pure ASGI: keeps the request's ``traceparent`` / ``tracestate`` headers in
    :data:`INCOMING` for the request's task (the run it creates is parented to it)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            carrier = None
            for k, v in scope["headers"]:
                if k == b"traceparent" or k == b"tracestate":
                    if carrier is None:
                        carrier = {}
                    carrier[k.decode()] = v.decode("latin-1")
            if carrier is not None:
                INCOMING.set(carrier)
        await self.app(scope, receive, send)


@dataclass(slots=True, eq=False)
class _RunTrace:
    """What the tracer keeps of one active run: its ids, open units and root events."""

    trace: str  # trace id, 32 hex digits
    root: int  # the root span's id
    parent: int  # the caller's span (0: none)
    parent_flags: int
    links: list[list[Any]]
    #: open unit invocations: id(inv) -> (inv, span id)
    units: dict[int, tuple[UnitInvocation, int]] = field(default_factory=dict)
    events: list[list[Any]] = field(default_factory=list)
    rank: float = math.nan
    reranks: int = 0
    prewarms: int = 0


@dataclass(slots=True, eq=False)
class _RequestTrace:
    """What the tracer keeps of one pending request or tool call until its span is emitted
    (the request's message is dropped once it is done: what the span needs is kept here)."""

    span: int
    op: str  # gen_ai.operation.name
    rank: float  # the run's rank (its key's first part) when it was dispatched
    max_tokens: int | None = None
    backend: str | None = None
    prompt: str | None = None  # content, only when captured
    arguments: str | None = None
    retries: int = 0
    events: list[list[Any]] = field(default_factory=list)
    links: list[list[Any]] = field(default_factory=list)


def _span_id() -> int:
    return random.getrandbits(64) or 1


class RunTracer(RunObserver):
    """Runs, units, requests and tool calls as OpenTelemetry spans (see the module doc).

    It chooses the ids and keeps plain facts while a run goes on; each span is described as
    a record (:data:`hermes.gateway.trace_export.SpanRecord`) when it ends (a unit's and its
    requests' when the unit closes, the root's when the run ends) and handed to ``emit``
    (:class:`Tracing`'s queue), which the export side turns into SDK spans."""

    def __init__(self, ctx: SchedulerContext, emit: Callable[[list[Any]], None], *,
                 capture_content: bool = False, keep_trace_ids: int = 10_000) -> None:
        self.ctx = ctx
        self.emit = emit
        self.capture_content = capture_content
        self._runs: dict[str, _RunTrace] = {}
        #: pending requests' spans (emitted when their unit closes)
        self._reqs: dict[str, _RequestTrace] = {}
        #: run id -> trace id (hex), the last ``keep_trace_ids`` runs (``GET .../timeline``)
        self._trace_ids: OrderedDict[str, str] = OrderedDict()
        self._keep = keep_trace_ids
        clock = ctx.clock
        self._t0, self._scale = clock.start, clock.time_scale

    # ------------------------------------------------------------------ helpers
    def _ns(self, t: float) -> int:
        """Scheduler-clock seconds as epoch nanoseconds (the clock runs ``time_scale`` times
        faster than wall time from the gateway's start)."""
        if self._scale == 1.0:
            return int(t * 1e9)
        return int((self._t0 + (t - self._t0) / self._scale) * 1e9)

    def trace_id(self, run_id: str) -> str | None:
        """The trace id (32 hex digits) of a run traced by this gateway, if it is kept."""
        return self._trace_ids.get(run_id)

    def traceparent(self, run_id: str, request_id: str) -> str | None:
        """The W3C ``traceparent`` of a pending request's span (what its engine gets)."""
        t, r = self._runs.get(run_id), self._reqs.get(request_id)
        return None if t is None or r is None else f"00-{t.trace}-{r.span:016x}-01"

    # ------------------------------------------------------------------ runs and units
    def run_created(self, run: LiveRun) -> None:
        st = run.state
        caller = _caller()
        if caller is not None:
            trace, parent, flags = caller
        else:
            trace, parent, flags = format(random.getrandbits(128) or 1, "032x"), 0, 1
        self._runs[st.run_id] = _RunTrace(trace, _span_id(), parent, flags, [])
        ids = self._trace_ids
        ids[st.run_id] = trace
        if len(ids) > self._keep:
            ids.popitem(last=False)

    def unit_started(self, run: LiveRun, inv: UnitInvocation, now: float) -> None:
        t = self._runs.get(run.run_id)
        if t is not None:
            t.units[id(inv)] = (inv, _span_id())

    def ranks_changed(self, run: LiveRun, now: float) -> None:
        t = self._runs.get(run.run_id)
        if t is None:
            return
        rank = run.state.rank
        if rank == t.rank or (math.isnan(t.rank) and not math.isfinite(rank)):
            return
        if t.reranks < MAX_EVENTS and math.isfinite(rank):
            attrs = {"hermes.rank": rank}
            if math.isfinite(t.rank):
                attrs["hermes.previous_rank"] = t.rank
            t.events.append(["hermes.rerank", self._ns(now), attrs])
            t.reranks += 1
        t.rank = rank

    def run_progress(self, run: LiveRun) -> None:
        t = self._runs.get(run.run_id)
        if t is not None and t.units:
            for key, (inv, span_id) in list(t.units.items()):
                if inv.closed:
                    del t.units[key]
                    self._emit_unit(t, inv, span_id)

    def run_ended(self, run: LiveRun) -> None:
        t = self._runs.pop(run.run_id, None)
        if t is None:
            return
        st = run.state
        end = st.finished if st.finished is not None else self.ctx.now()
        for inv, span_id in t.units.values():
            self._emit_unit(t, inv, span_id, end)
        if run.inferred and run.status == "finished":
            # the gateway decided that this run had ended (idle past its app's usual gaps)
            t.events.append(["hermes.run_end_inferred", self._ns(end),
                             {"hermes.idle_s": max(0.0, self.ctx.now() - end)}])
        attrs: dict[str, Any] = {
            "hermes.run_id": st.run_id, "hermes.app": st.app, "hermes.tenant": st.tenant,
            "hermes.inferred": run.inferred, "hermes.hosted": run.hosted,
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": st.app,
            "openinference.span.kind": "AGENT", "hermes.outcome": run.status,
            "hermes.act_s": end - st.submitted, "hermes.attained_s": st.attained_s,
            "hermes.attained_tokens": st.attained_tokens, "hermes.units": len(run.units)}
        if math.isfinite(st.rank):
            attrs["hermes.rank"] = st.rank
        error = None
        if run.error:
            attrs["error.type"] = "run_failed"
            attrs["hermes.error"] = run.error
            error = run.error if run.status == "failed" else None
        self.emit([f"run {st.app}", t.trace, t.root, t.parent, 1, t.parent_flags, 1,
                   self._ns(st.submitted), self._ns(end), attrs, t.events, t.links, error])

    def _emit_unit(self, t: _RunTrace, inv: UnitInvocation, span_id: int,
                   at: float | None = None) -> None:
        for req in inv.requests:
            entry = self._reqs.pop(req.request_id, None)
            if entry is not None:
                self._emit_request(t, span_id, req, entry, at)
        end = inv.finished if inv.finished is not None else at
        attrs: dict[str, Any] = {"hermes.unit": inv.unit, "hermes.backend": inv.backend,
                                 "hermes.explicit": inv.explicit, "hermes.requests": len(inv.requests),
                                 "openinference.span.kind": "CHAIN"}
        if inv.upstream:
            attrs["hermes.upstream"] = inv.upstream
        if inv.duration_s is not None:
            attrs["hermes.duration_s"] = inv.duration_s
        start = self._ns(inv.started)
        self.emit([f"unit {inv.unit}", t.trace, span_id, t.root, 0, 1, 0, start,
                   self._ns(end) if end is not None else start, attrs, [], [], None])

    # ------------------------------------------------------------------ requests
    def sent(self, req: PendingRequest) -> None:
        """``req`` goes to its node (first send, a retry or a failover): its span gets an id
        (or a ``hermes.retry`` / ``hermes.failover`` event), and an LLM request carries the
        span's context to its engine."""
        entry = self._reqs.get(req.request_id)
        t = self._runs.get(req.run.run_id)
        if t is None:
            return
        msg = req.msg
        if entry is None:
            entry = self._reqs[req.request_id] = self._new_request(req)
        else:
            # a retry after the node said so, or a move off a node that died
            name = "hermes.retry" if req.retries > entry.retries else "hermes.failover"
            entry.retries = req.retries
            if len(entry.events) < MAX_EVENTS:
                entry.events.append([name, self._ns(self.ctx.now()), {
                    "hermes.node": req.node or "", "hermes.engine": req.engine or ""}])
        if isinstance(msg, Submit):
            msg.traceparent = f"00-{t.trace}-{entry.span:016x}-01"

    def _new_request(self, req: PendingRequest) -> _RequestTrace:
        msg = req.msg
        rt = _RequestTrace(_span_id(), "chat", req.key[0] if req.key else math.nan)
        if INCOMING.get() is not None:
            caller = _caller()
            if caller is not None:  # the caller's own span for this call (an agent's step)
                rt.links.append([caller[0], caller[1]])
        if isinstance(msg, Submit):
            rt.op = OPERATIONS.get(msg.endpoint, msg.endpoint)
            mt = msg.body.get("max_tokens") or msg.body.get("max_completion_tokens")
            rt.max_tokens = mt if isinstance(mt, int) else None
            if self.capture_content:
                body = msg.body
                rt.prompt = json.dumps(
                    body.get("messages") if msg.endpoint == "chat"
                    else [{"role": "user", "content": body.get("prompt", body.get("input"))}],
                    default=str)
        elif isinstance(msg, Tool):
            rt.op, rt.backend = "execute_tool", msg.backend
            if self.capture_content:
                rt.arguments = msg.code if msg.code is not None else json.dumps(msg.command)
        return rt

    def _emit_request(self, t: _RunTrace, unit_span: int, req: PendingRequest,
                      entry: _RequestTrace, at: float | None) -> None:
        span_id, events, links, rank0 = entry.span, entry.events, entry.links, entry.rank
        res = req.result
        sent = req.sent_at
        attrs: dict[str, Any] = {"hermes.request_id": req.request_id,
                                 "hermes.policy": self.ctx.config.scheduler.policy,
                                 "hermes.node": req.node or "",
                                 "hermes.retries": req.retries + req.fault_retries}
        if math.isfinite(rank0):
            attrs["hermes.rank"] = rank0  # the run's rank when the request was dispatched
        if req.kind == "tool":
            name, kind = f"execute_tool {req.inv.unit}", 0
            attrs.update({"gen_ai.operation.name": "execute_tool",
                          "gen_ai.tool.name": req.inv.unit, "gen_ai.tool.call.id": req.request_id,
                          "openinference.span.kind": "TOOL"})
            if entry.backend is not None:
                attrs["hermes.backend"] = entry.backend
            if entry.arguments is not None:
                attrs["gen_ai.tool.call.arguments"] = entry.arguments
        else:
            op = entry.op
            name, kind = f"{op} {req.model or ''}".rstrip(), 2
            attrs.update({"gen_ai.operation.name": op, "gen_ai.request.model": req.model or "",
                          "hermes.engine": req.engine or "", "openinference.span.kind": "LLM"})
            if entry.max_tokens is not None:
                attrs["gen_ai.request.max_tokens"] = entry.max_tokens
            if entry.prompt is not None:
                attrs["gen_ai.input.messages"] = entry.prompt
        if isinstance(res, Done):
            attrs.update({"gen_ai.usage.input_tokens": res.input_tokens,
                          "gen_ai.usage.output_tokens": res.output_tokens,
                          "hermes.queue_s": res.queue_s, "hermes.service_s": res.service_s,
                          "hermes.engine": res.engine})
            if res.finish_reason:
                attrs["gen_ai.response.finish_reasons"] = [res.finish_reason]
            resp = res.response
            if isinstance(resp, dict):
                if isinstance(resp.get("id"), str):
                    attrs["gen_ai.response.id"] = resp["id"]
                if isinstance(resp.get("model"), str):
                    attrs["gen_ai.response.model"] = resp["model"]
                cached = _cached_tokens(resp)
                if cached is not None:
                    attrs["hermes.cached_tokens"] = cached
                    attrs["gen_ai.usage.cache_read.input_tokens"] = cached
            released = sent + res.queue_s
            events = [["hermes.dispatched", self._ns(released), {}], *events]
            if res.ttft_s is not None:
                attrs["hermes.ttft_s"] = res.ttft_s
                events.insert(1, ["hermes.first_token", self._ns(released + res.ttft_s), {}])
            if self.capture_content:
                attrs["gen_ai.output.messages"] = json.dumps(
                    [{"role": "assistant", "content": res.text,
                      "finish_reason": res.finish_reason}])
        elif isinstance(res, ToolDone):
            attrs.update({"hermes.queue_s": res.queue_s, "hermes.service_s": res.duration_s,
                          "hermes.exit_code": res.exit_code, "hermes.cold": res.cold,
                          "hermes.timed_out": res.timed_out})
            events = [["hermes.dispatched", self._ns(sent + res.queue_s), {}], *events]
            if self.capture_content:
                attrs["gen_ai.tool.call.result"] = res.stdout
        error = None
        if req.error is not None:
            attrs["error.type"] = "request_failed"
            error = req.error
        end = req.finished_at if req.finished_at is not None else at
        start = self._ns(sent)
        self.emit([name, t.trace, span_id, unit_span, 0, 1, kind, start,
                   self._ns(end) if end is not None else start, attrs, events, links, error])

    # ------------------------------------------------------------------ prewarm
    def prewarm_action(self, action: PrewarmAction, now: float) -> None:
        """A prewarm decision of the planner: an event of its run's span."""
        t = self._runs.get(action.run_id)
        if t is None or t.prewarms >= MAX_EVENTS:
            return
        t.prewarms += 1
        t.events.append(["hermes.prewarm", self._ns(now), {
            "hermes.action": action.action, "hermes.resource": action.resource,
            "hermes.unit": action.unit, "hermes.used": action.used,
            "hermes.prefetch": action.prefetch}])

    def close(self) -> None:
        """The gateway stops: the runs still active are exported as they are (their open
        units and requests ending now, the root's outcome ``active_at_shutdown``)."""
        now = self.ctx.now()
        for run_id in list(self._runs):
            t = self._runs.pop(run_id)
            for inv, span_id in t.units.values():
                self._emit_unit(t, inv, span_id, now)
            self.emit([f"run {run_id}", t.trace, t.root, t.parent, 1, t.parent_flags, 1,
                       self._ns(now), self._ns(now), {"hermes.run_id": run_id,
                                                      "hermes.outcome": "active_at_shutdown"},
                       t.events, t.links, None])
        self._reqs.clear()


def _caller() -> tuple[str, int, int] | None:
    """``(trace id hex, span id, flags)`` of the request's valid ``traceparent``, if any (read
    by the W3C propagator of ``opentelemetry-api``)."""
    carrier = INCOMING.get()
    if not carrier:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    sc = trace.get_current_span(TraceContextTextMapPropagator().extract(carrier)).get_span_context()
    if not sc.is_valid:
        return None
    return format(sc.trace_id, "032x"), sc.span_id, int(sc.trace_flags) & 1


def _cached_tokens(resp: dict[str, Any]) -> int | None:
    """The prompt tokens the engine served from its prefix cache (OpenAI's
    ``usage.prompt_tokens_details.cached_tokens``), when it reports them."""
    usage = resp.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else None


# ----------------------------------------------------------------------------- export side
class Tracing:
    """Tracing of one gateway: the bounded queue of span records (``OTEL_BSP_MAX_QUEUE_SIZE``,
    default 2048; a record that finds it full is dropped and counted), a thread that hands
    them every 0.2 s to the exporting side, and that side: a child process (``python -m
    hermes.gateway.trace_export``, fed msgpack batches; ``[tracing] process = true``, the
    default) or, in this process, a :class:`~hermes.gateway.trace_export.SpanBuilder`
    (``process = false``, and always with the ``memory`` exporter, whose spans tests read from
    :attr:`exporter`). Both end in the SDK's ``BatchSpanProcessor``."""

    INTERVAL_S = 0.2

    def __init__(self, config: TracingConfig) -> None:
        from hermes.extras import require

        require("tracing")
        from hermes.gateway import trace_export

        self.config = config
        self.inline = config.exporter == "memory" or not config.process
        # built here, also for a child's: a bad protocol or a missing gRPC exporter is a
        # startup error of the gateway, not a silent child's
        exporter = trace_export.make_exporter(config.exporter, config.endpoint, config.protocol)
        self.exporter: Any = exporter if self.inline else None
        self.builder: Any = None
        self._reader: Any = None
        if self.inline:
            meters, self._reader = trace_export.counting_meters()
            self.builder = trace_export.SpanBuilder(exporter, config.service_name, meters)
        try:
            self.max_queue = max(1, int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE", "2048")))
        except ValueError:
            raise ValueError("OTEL_BSP_MAX_QUEUE_SIZE must be an integer, got "
                             f"{os.environ['OTEL_BSP_MAX_QUEUE_SIZE']!r}") from None
        self.queue: deque[list[Any]] = deque()
        self.dropped = 0
        self.tracer: RunTracer | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.child_counts: dict[str, float] = {}
        self._broken = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ gateway side
    def emit(self, record: list[Any]) -> None:
        """Queue one span record (the event loop's only cost beyond making the record)."""
        if len(self.queue) >= self.max_queue:
            self.dropped += 1
            return
        self.queue.append(record)

    def attach(self, sched: Any) -> RunTracer:
        """Observe ``sched`` (a :class:`~hermes.gateway.scheduler.LiveScheduler`) and start
        the export side."""
        rt = RunTracer(sched.ctx, self.emit, capture_content=self.config.capture_content,
                       keep_trace_ids=sched.config.scheduler.keep_finished_runs)
        sched.registry.add_observer(rt)
        sched.dispatch.trace = rt
        sched.prewarm.on_action = rt.prewarm_action
        self.tracer = rt
        if not self.inline:
            self._start_process()
        self._thread = threading.Thread(target=self._loop, name="hermes-trace-queue", daemon=True)
        self._thread.start()
        return rt

    def _start_process(self) -> None:
        c = self.config
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hermes.gateway.trace_export", c.exporter, c.service_name,
             c.endpoint, c.protocol], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        threading.Thread(target=self._read_counts, name="hermes-trace-counts",
                         daemon=True).start()

    def _read_counts(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        for line in proc.stdout:
            try:
                got = json.loads(line)
            except ValueError:
                continue
            if "error" in got:
                log.warning("trace export: %s", got["error"])
            else:
                self.child_counts = got

    def _loop(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            self._drain()

    def _drain(self) -> None:
        """Hand what is queued to the exporting side (the queue thread, or a flush)."""
        with self._lock:
            q = self.queue
            batch = []
            while q:
                batch.append(q.popleft())
            if not batch:
                return
            if self.builder is not None:
                self.builder.add(batch)
                return
            self._send(batch)

    def _send(self, batch: list[list[Any]]) -> None:
        import msgspec

        from hermes.gateway.trace_export import FRAME

        proc = self.proc
        if proc is None or proc.stdin is None or self._broken:
            self.dropped += len(batch)
            return
        body = msgspec.msgpack.encode(batch)
        try:
            proc.stdin.write(FRAME.pack(len(body)) + body)
            proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self._broken = True
            self.dropped += len(batch)
            log.error("the trace export process exited (code %s): spans are dropped from now on",
                      proc.poll())

    def flush(self) -> None:
        """Everything queued goes to the exporter now (in-process: exported when this returns)."""
        self._drain()
        if self.builder is not None:
            self.builder.flush()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """The gateway's clean shutdown: active runs are exported as they are, the queue is
        drained and the exporter flushed (the export process finishes what it has, then
        exits)."""
        if self.tracer is not None:
            self.tracer.close()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._drain()
        if self.builder is not None:
            self.builder.flush()
            self.builder.shutdown()
        proc = self.proc
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("the trace export process did not finish in %.0f s: killed", timeout_s)
                proc.kill()
                proc.wait()

    def counts(self) -> dict[str, float]:
        """Spans exported, dropped (a full queue here or in the export side's processor) and
        queued now."""
        from hermes.gateway.trace_export import processor_counts

        got = (processor_counts(self._reader) if self._reader is not None
               else dict(self.child_counts))
        return {"exported": float(got.get("exported", 0.0)),
                "dropped": float(got.get("dropped", 0.0)) + self.dropped,
                "queued": float(got.get("queued", 0.0)) + len(self.queue)}


def build_tracing(config: GatewayConfig) -> Tracing | None:
    """The gateway's tracing, or None when it is off (:func:`tracing_wanted`)."""
    if not tracing_wanted(config.tracing):
        return None
    return Tracing(config.tracing)


class TracingCollector:
    """Prometheus collector: ``hermes_trace_spans_{exported,dropped}_total`` and
    ``hermes_trace_queue_spans``."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        c = self.tracing.counts()
        yield CounterMetricFamily("hermes_trace_spans_exported",
                                  "Spans of runs handed to the trace exporter", value=c["exported"])
        yield CounterMetricFamily("hermes_trace_spans_dropped",
                                  "Spans of runs dropped: an export queue was full "
                                  "(OTEL_BSP_MAX_QUEUE_SIZE)", value=c["dropped"])
        yield GaugeMetricFamily("hermes_trace_queue_spans",
                                "Spans waiting to be exported", value=c["queued"])

    def describe(self) -> list[Any]:
        return []


def install_tracing(app: Any, config: GatewayConfig) -> None:
    """``app.state.tracing``: the gateway's :class:`Tracing` (None when off); with it on, the
    middleware that reads the callers' trace context and the counters on ``/metrics``."""
    tracing = build_tracing(config)
    app.state.tracing = tracing
    if tracing is not None:
        app.add_middleware(TraceContextMiddleware)
        app.state.metrics.add_collector(TracingCollector(tracing))

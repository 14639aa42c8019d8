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
from typing import TYPE_CHECKING, Any

from hermes.gateway.runs import RunObserver
from hermes.gateway.state import LiveRun, PendingRequest, UnitInvocation
from hermes.gateway.trace_export import LLM, RUN, TOOL, UNIT
from hermes.protocol import Done, Submit, Tool, ToolDone, max_output_tokens

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


class _RunTrace:
    """What the tracer keeps of one active run: its ids, open units and root events."""

    __slots__ = ("events", "links", "parent", "parent_flags", "prewarms", "rank", "ranks",
                 "root", "trace", "units")

    def __init__(self, trace: str, root: int, parent: int, parent_flags: int) -> None:
        self.trace = trace  # trace id, 32 hex digits
        self.root = root  # the root span's id
        self.parent = parent  # the caller's span (0: none)
        self.parent_flags = parent_flags
        #: open unit invocations: id(inv) -> (inv, span id)
        self.units: dict[int, tuple[UnitInvocation, int]] = {}
        self.events: list[list[Any]] = []  # prewarm decisions, the inferred end
        self.ranks: list[float] = []  # re-ranks: ns, rank, ns, rank, ... (MAX_EVENTS at most)
        self.rank = math.nan
        self.prewarms = 0
        self.links: list[list[Any]] = []


class _RequestTrace:
    """What the tracer keeps of one pending request or tool call until its span is emitted
    (the request's message is dropped once it is done: what the span needs is kept here)."""

    __slots__ = ("arguments", "backend", "events", "links", "max_tokens", "op", "prompt",
                 "rank", "retries", "span")

    def __init__(self, span: int, rank: float) -> None:
        self.span = span
        self.rank = rank  # the run's rank (its key's first part) when it was dispatched
        self.op = "chat"  # gen_ai.operation.name
        self.max_tokens: int | None = None
        self.backend: str | None = None
        self.prompt: str | None = None  # content, only when captured
        self.arguments: str | None = None
        self.retries = 0
        self.events: list[list[Any]] = []
        self.links: list[list[Any]] = []


def _span_id() -> int:
    return random.getrandbits(64) or 1


class RunTracer(RunObserver):
    """Runs, units, requests and tool calls as OpenTelemetry spans (see the module doc).

    It chooses the ids and keeps plain facts while a run goes on; as a span ends it is
    described by one compact record of those facts (:mod:`hermes.gateway.trace_export`:
    ``RUN``, ``UNIT``, ``LLM``, ``TOOL``; a unit's and its requests' when the unit closes, the
    root's when the run ends) handed to ``emit`` (:class:`Tracing`'s queue). Attribute names
    and span shapes are the export side's: the event loop pays for the facts alone."""

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
        self._policy = ctx.config.scheduler.policy
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
        rid = run.state.run_id
        caller = _caller() if INCOMING.get() is not None else None
        if caller is not None:
            t = _RunTrace(caller[0], _span_id(), caller[1], caller[2])
        else:
            t = _RunTrace(f"{random.getrandbits(128) or 1:032x}", _span_id(), 0, 1)
        self._runs[rid] = t
        ids = self._trace_ids
        ids[rid] = t.trace
        if len(ids) > self._keep:
            # O(1); a plain dict's first key is found by scanning past the deleted ones
            ids.popitem(last=False)

    def unit_started(self, run: LiveRun, inv: UnitInvocation, now: float) -> None:
        t = self._runs.get(run.state.run_id)
        if t is not None:
            t.units[id(inv)] = (inv, _span_id())

    def ranks_changed(self, run: LiveRun, now: float) -> None:
        t = self._runs.get(run.state.run_id)
        if t is None:
            return
        rank = run.state.rank
        if rank != t.rank and (rank - rank == 0.0):  # changed, and finite
            t.rank = rank
            if len(t.ranks) < 2 * MAX_EVENTS:
                t.ranks += (self._ns(now), rank)

    def run_progress(self, run: LiveRun) -> None:
        t = self._runs.get(run.state.run_id)
        if t is not None and t.units:
            for key, (inv, span_id) in list(t.units.items()):
                if inv.closed:
                    del t.units[key]
                    self._emit_unit(t, inv, span_id)

    def run_ended(self, run: LiveRun) -> None:
        st = run.state
        t = self._runs.pop(st.run_id, None)
        if t is None:
            return
        end = st.finished if st.finished is not None else self.ctx.now()
        for inv, span_id in t.units.values():
            self._emit_unit(t, inv, span_id, end)
        end_ns = self._ns(end)
        if run.inferred and run.status == "finished":
            # the gateway decided that this run had ended (idle past its app's usual gaps)
            t.events.append(["hermes.run_end_inferred", end_ns,
                             {"hermes.idle_s": max(0.0, self.ctx.now() - end)}])
        self.emit([RUN, t.trace, t.root, t.parent, t.parent_flags, self._ns(st.submitted),
                   end_ns, st.run_id, st.app, st.tenant, run.inferred, run.hosted, run.status,
                   end - st.submitted, st.attained_s, st.attained_tokens, len(run.units),
                   st.rank if st.rank - st.rank == 0.0 else None, run.error, t.ranks,
                   t.events, t.links])

    def _emit_unit(self, t: _RunTrace, inv: UnitInvocation, span_id: int,
                   at: float | None = None) -> None:
        reqs = self._reqs
        for req in inv.requests:
            entry = reqs.pop(req.request_id, None)
            if entry is not None:
                self._emit_request(t, span_id, req, entry, at)
        end = inv.finished if inv.finished is not None else at
        start = self._ns(inv.started)
        self.emit([UNIT, t.trace, span_id, t.root, start,
                   self._ns(end) if end is not None else start, inv.unit, inv.backend,
                   inv.explicit, len(inv.requests), inv.upstream, inv.duration_s])

    # ------------------------------------------------------------------ requests
    def sent(self, req: PendingRequest) -> None:
        """``req`` goes to its node (first send, a retry or a failover): its span gets an id
        (or a ``hermes.retry`` / ``hermes.failover`` event), and an LLM request carries the
        span's context to its engine."""
        t = self._runs.get(req.run.state.run_id)
        if t is None:
            return
        entry = self._reqs.get(req.request_id)
        if entry is None:
            entry = self._reqs[req.request_id] = self._new_request(req)
        else:
            # a retry after the node said so, or a move off a node that died
            name = "hermes.retry" if req.retries > entry.retries else "hermes.failover"
            entry.retries = req.retries
            if len(entry.events) < MAX_EVENTS:
                entry.events.append([name, self._ns(self.ctx.now()), {
                    "hermes.node": req.node or "", "hermes.engine": req.engine or ""}])
        msg = req.msg
        if type(msg) is Submit:
            msg.traceparent = f"00-{t.trace}-{entry.span:016x}-01"

    def _new_request(self, req: PendingRequest) -> _RequestTrace:
        msg = req.msg
        rt = _RequestTrace(_span_id(), req.key[0] if req.key else math.nan)
        if INCOMING.get() is not None:
            caller = _caller()
            if caller is not None:  # the caller's own span for this call (an agent's step)
                rt.links.append([caller[0], caller[1]])
        if isinstance(msg, Submit):
            rt.op = OPERATIONS.get(msg.endpoint, msg.endpoint)
            body = msg.engine_body()
            rt.max_tokens = max_output_tokens(body)
            if self.capture_content:
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
        res = req.result
        sent = req.sent_at
        start = self._ns(sent)
        end = req.finished_at if req.finished_at is not None else at
        end_ns = self._ns(end) if end is not None else start
        rank = entry.rank if entry.rank - entry.rank == 0.0 else None
        retries = req.retries + req.fault_retries
        if req.kind == "tool":
            tool = res if isinstance(res, ToolDone) else None
            self.emit([TOOL, t.trace, entry.span, unit_span, start, end_ns, req.request_id,
                       self._policy, req.node or "", retries, rank, req.inv.unit, entry.backend,
                       None if tool is None else self._ns(sent + tool.queue_s),
                       None if tool is None else tool.queue_s,
                       None if tool is None else tool.duration_s,
                       None if tool is None else tool.exit_code,
                       None if tool is None else tool.cold,
                       None if tool is None else tool.timed_out,
                       req.error, entry.events, entry.links, entry.arguments,
                       tool.stdout if tool is not None and self.capture_content else None])
            return
        done = res if isinstance(res, Done) else None
        released = first = cached = resp_id = resp_model = output = None
        if done is not None:
            released = self._ns(sent + done.queue_s)
            if done.ttft_s is not None:
                first = self._ns(sent + done.queue_s + done.ttft_s)
            resp = done.response
            if resp is not None:
                cached = _cached_tokens(resp)
                resp_id, resp_model = resp.get("id"), resp.get("model")
            if self.capture_content:
                output = json.dumps([{"role": "assistant", "content": done.text,
                                      "finish_reason": done.finish_reason}])
        self.emit([LLM, t.trace, entry.span, unit_span, start, end_ns, req.request_id,
                   self._policy, req.node or "", req.engine or "", retries, rank, entry.op,
                   req.model or "", entry.max_tokens,
                   None if done is None else done.input_tokens,
                   None if done is None else done.output_tokens,
                   None if done is None else done.queue_s,
                   None if done is None else done.service_s,
                   None if done is None else done.ttft_s,
                   None if done is None else done.finish_reason, resp_id, resp_model, cached,
                   released, first, req.error, entry.events, entry.links, entry.prompt, output])

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
            self.emit([RUN, t.trace, t.root, t.parent, t.parent_flags, self._ns(now),
                       self._ns(now), run_id, "", "", False, False, "active_at_shutdown",
                       None, None, None, None, None, None, t.ranks, t.events, t.links])
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
        self.queue: deque[bytes] = deque()
        import msgspec

        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder(list[Any]).decode
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
        """Queue one span record, encoded at once (msgpack, ~1 us): the queue holds bytes,
        which the garbage collector does not track. Lists and dicts that waited there up to
        0.2 s were promoted to the old generation and made full collections longer and more
        frequent."""
        if len(self.queue) >= self.max_queue:
            self.dropped += 1
            return
        self.queue.append(self._encode(record))

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
                self.builder.add(map(self._decode, batch))
                return
            self._send(batch)

    def _send(self, batch: list[bytes]) -> None:
        from msgspec import Raw

        from hermes.gateway.trace_export import FRAME

        proc = self.proc
        if proc is None or proc.stdin is None or self._broken:
            self.dropped += len(batch)
            return
        body = self._encode([Raw(b) for b in batch])  # a msgpack array of the records
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

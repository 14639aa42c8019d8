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

Spans are made on the event loop (microseconds each) and exported off it: the SDK's
``BatchSpanProcessor`` (a background thread, a bounded queue: ``OTEL_BSP_MAX_QUEUE_SIZE``,
``OTEL_BSP_SCHEDULE_DELAY``, ...); spans it drops for a full queue are counted
(``hermes_trace_spans_dropped_total``, :class:`TracingCollector`). With tracing off none of
this is installed: dispatch checks one attribute per request.

Turned on by ``[tracing] enabled = true`` or the standard OpenTelemetry variables
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``;
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turn it off); the SDK and the OTLP
exporter come with the ``tracing`` extra (:mod:`hermes.extras`).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping
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
class _RunSpans:
    """What the tracer keeps of one active run."""

    root: Any  # opentelemetry.trace.Span
    ctx: Any  # the context with ``root`` in it (the units' parent)
    #: open unit invocations: id(inv) -> (inv, span, context with the span)
    units: dict[int, tuple[UnitInvocation, Any, Any]] = field(default_factory=dict)
    rank: float = math.nan
    reranks: int = 0
    prewarms: int = 0


class RunTracer(RunObserver):
    """Runs, units, requests and tool calls as OpenTelemetry spans (see the module doc)."""

    def __init__(self, ctx: SchedulerContext, provider: Any, *, capture_content: bool = False,
                 keep_trace_ids: int = 10_000) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.ctx = ctx
        self.provider = provider
        self.tracer = provider.get_tracer("hermes.gateway")
        self.capture_content = capture_content
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self._runs: dict[str, _RunSpans] = {}
        #: request id -> [its span, its retries so far] (ended when its unit closes, or its
        #: run ends)
        self._reqs: dict[str, list[Any]] = {}
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

    # ------------------------------------------------------------------ runs and units
    def run_created(self, run: LiveRun) -> None:
        st = run.state
        carrier = INCOMING.get()
        parent = self._propagator.extract(carrier) if carrier else None
        root = self.tracer.start_span(
            f"run {st.app}", context=parent, kind=self._trace.SpanKind.SERVER,
            start_time=self._ns(st.submitted),
            attributes={"hermes.run_id": st.run_id, "hermes.app": st.app,
                        "hermes.tenant": st.tenant, "hermes.inferred": run.inferred,
                        "hermes.hosted": run.hosted, "gen_ai.operation.name": "invoke_agent",
                        "gen_ai.agent.name": st.app, "openinference.span.kind": "AGENT"})
        self._runs[st.run_id] = _RunSpans(root, self._trace.set_span_in_context(root))
        ids = self._trace_ids
        ids[st.run_id] = format(root.get_span_context().trace_id, "032x")
        if len(ids) > self._keep:
            ids.popitem(last=False)

    def unit_started(self, run: LiveRun, inv: UnitInvocation, now: float) -> None:
        t = self._runs.get(run.run_id)
        if t is None:
            return
        attrs: dict[str, Any] = {"hermes.unit": inv.unit, "hermes.backend": inv.backend,
                                 "hermes.explicit": inv.explicit,
                                 "openinference.span.kind": "CHAIN"}
        if inv.upstream:
            attrs["hermes.upstream"] = inv.upstream
        span = self.tracer.start_span(f"unit {inv.unit}", context=t.ctx,
                                      start_time=self._ns(inv.started), attributes=attrs)
        t.units[id(inv)] = (inv, span, self._trace.set_span_in_context(span))

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
            t.root.add_event("hermes.rerank", attrs, timestamp=self._ns(now))
            t.reranks += 1
        t.rank = rank

    def run_progress(self, run: LiveRun) -> None:
        t = self._runs.get(run.run_id)
        if t is not None and t.units:
            for key, (inv, span, _) in list(t.units.items()):
                if inv.closed:
                    del t.units[key]
                    self._end_unit(inv, span)

    def run_ended(self, run: LiveRun) -> None:
        t = self._runs.pop(run.run_id, None)
        if t is None:
            return
        st = run.state
        end = st.finished if st.finished is not None else self.ctx.now()
        for inv, span, _ in t.units.values():
            self._end_unit(inv, span, end)
        root = t.root
        if run.inferred and run.status == "finished":
            # the gateway decided that this run had ended (idle past its app's usual gaps)
            root.add_event("hermes.run_end_inferred", {"hermes.idle_s": max(
                0.0, self.ctx.now() - end)}, timestamp=self._ns(end))
        attrs: dict[str, Any] = {"hermes.outcome": run.status, "hermes.act_s": end - st.submitted,
                                 "hermes.attained_s": st.attained_s,
                                 "hermes.attained_tokens": st.attained_tokens,
                                 "hermes.units": len(run.units)}
        if math.isfinite(st.rank):
            attrs["hermes.rank"] = st.rank
        if run.error:
            attrs["error.type"] = "run_failed"
            attrs["hermes.error"] = run.error
        root.set_attributes(attrs)
        if run.status == "failed":
            root.set_status(self._trace.Status(self._trace.StatusCode.ERROR, run.error or ""))
        root.end(end_time=self._ns(end))

    def _end_unit(self, inv: UnitInvocation, span: Any, at: float | None = None) -> None:
        for req in inv.requests:
            entry = self._reqs.pop(req.request_id, None)
            if entry is not None:
                self._end_request(req, entry[0], at)
        end = inv.finished if inv.finished is not None else at
        span.set_attribute("hermes.requests", len(inv.requests))
        if inv.duration_s is not None:
            span.set_attribute("hermes.duration_s", inv.duration_s)
        span.end(end_time=self._ns(end) if end is not None else None)

    # ------------------------------------------------------------------ requests
    def sent(self, req: PendingRequest) -> None:
        """``req`` goes to its node (first send, a retry or a failover): its span starts (or
        gets a ``hermes.retry`` / ``hermes.failover`` event), and an LLM request carries the
        span's context to the engine."""
        entry = self._reqs.get(req.request_id)
        msg = req.msg
        if entry is None:
            t = self._runs.get(req.run.run_id)
            if t is None:
                return
            unit = t.units.get(id(req.inv))
            parent = unit[2] if unit is not None else t.ctx
            span = self._start_request(req, parent)
            self._reqs[req.request_id] = [span, 0]
        else:
            span = entry[0]
            # a retry after the node said so, or a move off a node that died
            name = "hermes.retry" if req.retries > entry[1] else "hermes.failover"
            entry[1] = req.retries
            span.add_event(name, {"hermes.node": req.node or "", "hermes.engine": req.engine or ""},
                           timestamp=self._ns(self.ctx.now()))
            span.set_attributes({"hermes.retries": req.retries + req.fault_retries,
                                 "hermes.node": req.node or "",
                                 "hermes.engine": req.engine or ""})
        if isinstance(msg, Submit):
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier, self._trace.set_span_in_context(span))
            msg.traceparent = carrier.get("traceparent")

    def _start_request(self, req: PendingRequest, parent: Any) -> Any:
        msg = req.msg
        key0 = req.key[0] if req.key else math.nan
        attrs: dict[str, Any] = {"hermes.request_id": req.request_id,
                                 "hermes.policy": self.ctx.config.scheduler.policy,
                                 "hermes.node": req.node or "", "hermes.retries": 0}
        if math.isfinite(key0):
            attrs["hermes.rank"] = key0
        links = None
        carrier = INCOMING.get()
        if carrier:
            # the caller's own span for this call (an agent's LLM step): linked
            caller = self._trace.get_current_span(self._propagator.extract(carrier))
            sc = caller.get_span_context()
            if sc.is_valid:
                links = [self._trace.Link(sc)]
        if isinstance(msg, Tool):
            attrs.update({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": req.inv.unit,
                          "gen_ai.tool.call.id": req.request_id, "hermes.backend": msg.backend,
                          "openinference.span.kind": "TOOL"})
            if self.capture_content:
                attrs["gen_ai.tool.call.arguments"] = (msg.code if msg.code is not None
                                                       else json.dumps(msg.command))
            name = f"execute_tool {req.inv.unit}"
            kind = self._trace.SpanKind.INTERNAL
        else:
            op = OPERATIONS.get(msg.endpoint, msg.endpoint) if isinstance(msg, Submit) else "chat"
            attrs.update({"gen_ai.operation.name": op, "gen_ai.request.model": req.model or "",
                          "hermes.engine": req.engine or "", "openinference.span.kind": "LLM"})
            if isinstance(msg, Submit):
                body = msg.body
                mt = body.get("max_tokens") or body.get("max_completion_tokens")
                if isinstance(mt, int):
                    attrs["gen_ai.request.max_tokens"] = mt
                if self.capture_content:
                    attrs["gen_ai.input.messages"] = json.dumps(
                        body.get("messages") if msg.endpoint == "chat"
                        else [{"role": "user", "content": body.get("prompt", body.get("input"))}],
                        default=str)
            name = f"{op} {req.model or ''}".rstrip()
            kind = self._trace.SpanKind.CLIENT
        return self.tracer.start_span(name, context=parent, kind=kind, attributes=attrs,
                                      links=links, start_time=self._ns(req.sent_at))

    def _end_request(self, req: PendingRequest, span: Any, at: float | None) -> None:
        res = req.result
        attrs: dict[str, Any] = {"hermes.retries": req.retries + req.fault_retries}
        sent = req.sent_at
        if isinstance(res, Done):
            attrs.update({"gen_ai.usage.input_tokens": res.input_tokens,
                          "gen_ai.usage.output_tokens": res.output_tokens,
                          "hermes.queue_s": res.queue_s, "hermes.service_s": res.service_s,
                          "hermes.engine": res.engine})
            if res.finish_reason:
                attrs["gen_ai.response.finish_reasons"] = [res.finish_reason]
            if res.ttft_s is not None:
                attrs["hermes.ttft_s"] = res.ttft_s
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
            span.add_event("hermes.dispatched", timestamp=self._ns(released))
            if res.ttft_s is not None:
                span.add_event("hermes.first_token", timestamp=self._ns(released + res.ttft_s))
            if self.capture_content:
                attrs["gen_ai.output.messages"] = json.dumps(
                    [{"role": "assistant", "content": res.text,
                      "finish_reason": res.finish_reason}])
        elif isinstance(res, ToolDone):
            attrs.update({"hermes.queue_s": res.queue_s, "hermes.service_s": res.duration_s,
                          "hermes.exit_code": res.exit_code, "hermes.cold": res.cold,
                          "hermes.timed_out": res.timed_out})
            span.add_event("hermes.dispatched", timestamp=self._ns(sent + res.queue_s))
            if self.capture_content:
                attrs["gen_ai.tool.call.result"] = res.stdout
        if req.error is not None:
            attrs["error.type"] = "request_failed"
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, req.error))
        span.set_attributes(attrs)
        end = req.finished_at if req.finished_at is not None else at
        span.end(end_time=self._ns(end) if end is not None else None)

    # ------------------------------------------------------------------ prewarm
    def prewarm_action(self, action: PrewarmAction, now: float) -> None:
        """A prewarm decision of the planner: an event of its run's span."""
        t = self._runs.get(action.run_id)
        if t is None or t.prewarms >= MAX_EVENTS:
            return
        t.prewarms += 1
        t.root.add_event("hermes.prewarm", {
            "hermes.action": action.action, "hermes.resource": action.resource,
            "hermes.unit": action.unit, "hermes.used": action.used,
            "hermes.prefetch": action.prefetch}, timestamp=self._ns(now))

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self) -> None:
        """End the spans of runs still active (their state as it is) and flush what is
        queued to the exporter (a clean shutdown loses nothing queued)."""
        for run_id in list(self._runs):
            t = self._runs.pop(run_id)
            for _, span, _ in t.units.values():
                span.end()
            t.root.set_attribute("hermes.outcome", "active_at_shutdown")
            t.root.end()
        for span, _ in self._reqs.values():
            span.end()
        self._reqs.clear()
        self.provider.force_flush()
        self.provider.shutdown()


def _cached_tokens(resp: dict[str, Any]) -> int | None:
    """The prompt tokens the engine served from its prefix cache (OpenAI's
    ``usage.prompt_tokens_details.cached_tokens``), when it reports them."""
    usage = resp.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else None


# ----------------------------------------------------------------------------- setup
@dataclass(eq=False)
class Tracing:
    """Tracing of one gateway: the SDK's provider and processor, the exporter, the drop
    counter's reader and (once the scheduler exists) the :class:`RunTracer`."""

    provider: Any
    exporter: Any
    metric_reader: Any
    config: TracingConfig
    tracer: RunTracer | None = None

    def attach(self, sched: Any) -> RunTracer:
        """Observe ``sched`` (a :class:`~hermes.gateway.scheduler.LiveScheduler`)."""
        rt = RunTracer(sched.ctx, self.provider, capture_content=self.config.capture_content,
                       keep_trace_ids=sched.config.scheduler.keep_finished_runs)
        sched.registry.add_observer(rt)
        sched.dispatch.trace = rt
        sched.prewarm.on_action = rt.prewarm_action
        self.tracer = rt
        return rt

    def shutdown(self) -> None:
        """Flush and stop (the gateway's clean shutdown)."""
        if self.tracer is not None:
            self.tracer.shutdown()
        else:
            self.provider.shutdown()

    def counts(self) -> dict[str, float]:
        """Spans exported, dropped (queue full) and queued now (the SDK's processor metrics)."""
        out = {"exported": 0.0, "dropped": 0.0, "queued": 0.0}
        data = self.metric_reader.get_metrics_data()
        for rm in getattr(data, "resource_metrics", ()) or ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        if m.name == "otel.sdk.processor.span.processed":
                            err = p.attributes.get("error.type")
                            if err is None:
                                out["exported"] += p.value
                            else:
                                out["dropped"] += p.value
                        elif m.name == "otel.sdk.processor.span.queue.size":
                            out["queued"] += p.value
        return out


def make_exporter(config: TracingConfig) -> Any:
    """The span exporter ``[tracing] exporter`` names: ``otlp`` (OTLP over HTTP/protobuf, or
    gRPC when ``protocol`` or ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`` says ``grpc``; the
    endpoint from ``[tracing] endpoint`` or the ``OTEL_EXPORTER_OTLP_*`` variables),
    ``memory`` (kept in this process: tests), ``none`` (made and dropped: the SDK's cost
    alone)."""
    from hermes.extras import require

    require("tracing")
    if config.exporter == "memory":
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        return InMemorySpanExporter()
    if config.exporter == "none":
        from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

        class _Drop(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        return _Drop()
    env = os.environ
    protocol = (config.protocol or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            from hermes.extras import MissingExtraError

            raise MissingExtraError(
                "OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc, which is not "
                "installed: pip install opentelemetry-exporter-otlp-proto-grpc (or use "
                "protocol http/protobuf)") from None
        return GrpcExporter(endpoint=config.endpoint or None)
    if protocol != "http/protobuf":
        raise ValueError(f"tracing protocol must be http/protobuf or grpc, not {protocol!r}")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    endpoint = config.endpoint or None
    if endpoint and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"  # the base URL, as the variable takes
    return OTLPSpanExporter(endpoint=endpoint)


def build_tracing(config: GatewayConfig, exporter: Any | None = None) -> Tracing | None:
    """The gateway's tracing, or None when it is off (:func:`tracing_wanted`)."""
    tc = config.tracing
    if exporter is None and not tracing_wanted(tc):
        return None
    exporter = exporter if exporter is not None else make_exporter(tc)
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attrs = {"service.name": tc.service_name} if tc.service_name else {}
    resource = Resource.create(attrs)  # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES too
    if tc.service_name and os.environ.get("OTEL_SERVICE_NAME"):
        resource = Resource.create({})  # the variable names the service
    # the processor counts what it exported and dropped only with the SDK's own metrics on
    os.environ.setdefault("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter, meter_provider=meters))
    return Tracing(provider=provider, exporter=exporter, metric_reader=reader, config=tc)


class TracingCollector:
    """Prometheus collector: ``hermes_trace_spans_{exported,dropped}_total`` and
    ``hermes_trace_queue_spans`` (the batch processor's queue)."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        c = self.tracing.counts()
        yield CounterMetricFamily("hermes_trace_spans_exported",
                                  "Spans of runs handed to the trace exporter", value=c["exported"])
        yield CounterMetricFamily("hermes_trace_spans_dropped",
                                  "Spans of runs dropped: the export queue was full "
                                  "(OTEL_BSP_MAX_QUEUE_SIZE)", value=c["dropped"])
        yield GaugeMetricFamily("hermes_trace_queue_spans",
                                "Spans waiting in the export queue", value=c["queued"])

    def describe(self) -> list[Any]:
        return []


def install_tracing(app: Any, config: GatewayConfig) -> None:
    """``app.state.tracing``: the gateway's :class:`Tracing` (None when off); with it on, the
    middleware that reads the callers' trace context and the drop counter on ``/metrics``."""
    tracing = build_tracing(config)
    app.state.tracing = tracing
    if tracing is not None:
        app.add_middleware(TraceContextMiddleware)
        app.state.metrics.add_collector(TracingCollector(tracing))

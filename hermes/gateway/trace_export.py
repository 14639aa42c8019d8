"""The exporting half of run tracing: span records in, OpenTelemetry spans out.

The gateway (:mod:`hermes.gateway.tracing`) describes each finished span as a plain record
(``RUN``, ``UNIT``, ``LLM``, ``TOOL``: a list of numbers and strings, its ids chosen by the
gateway, so that a request's context can go to its engine before the span ends);
:func:`expand` names the facts (the GenAI conventions, ``hermes.*``) as a
:data:`SpanRecord`. :class:`SpanBuilder`
makes real spans of them with the OpenTelemetry SDK (its tracer, with the record's ids
through :class:`_GivenIds`, an SDK ``IdGenerator``) and hands them to a
``BatchSpanProcessor`` whose exporter sends them on (OTLP/HTTP or gRPC, per the standard
``OTEL_*`` variables).

Why a second half: the SDK costs ~50 us to make a span and ~100 us to encode it in Python,
~0.4 ms for the three spans of a one-request run: more than half of what the whole gateway
spends on such a request. Made from records in **another process** (``python -m
hermes.gateway.trace_export``, fed length-prefixed msgpack batches on its stdin; it writes
its counters as a JSON line on stdout every second), that work leaves the gateway's event
loop, its GIL and its CPU; in-process (a thread of the gateway: tests, ``process = false``) it
is the same code.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

#: ``[name, trace_id (32 hex), span_id, parent_id (0: none), parent_remote, parent_flags,
#: kind, start_ns, end_ns, attributes, events [[name, ns, attributes]], links [[trace hex,
#: span id]], error message or None]``
SpanRecord = list[Any]

#: the gateway's records (:class:`hermes.gateway.tracing.RunTracer`): the facts of one span,
#: positionally, its first item one of these kinds; :func:`expand` names them (what the
#: attributes are called is decided here, off the gateway's event loop)
RUN, UNIT, LLM, TOOL = 0, 1, 2, 3

KINDS = ("INTERNAL", "SERVER", "CLIENT")
FRAME = struct.Struct("!I")  # the byte length of the msgpack batch that follows


def expand(rec: list[Any]) -> SpanRecord:
    """A gateway record -> the span it describes (name, ids, attributes, events)."""
    kind = rec[0]
    if kind == RUN:
        (_, trace, span, parent, flags, start, end, run_id, app, tenant, inferred, hosted,
         outcome, act_s, attained_s, attained_tokens, units, rank, error, ranks, events,
         links) = rec
        attrs: dict[str, Any] = {
            "hermes.run_id": run_id, "hermes.app": app, "hermes.tenant": tenant,
            "hermes.inferred": inferred, "hermes.hosted": hosted, "hermes.outcome": outcome,
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": app,
            "openinference.span.kind": "AGENT"}
        _put(attrs, "hermes.act_s", act_s)
        _put(attrs, "hermes.attained_s", attained_s)
        _put(attrs, "hermes.attained_tokens", attained_tokens)
        _put(attrs, "hermes.units", units)
        _put(attrs, "hermes.rank", rank)
        if error:
            attrs["hermes.error"] = error
            attrs["error.type"] = "run_failed"
        evs, prev = [], None
        for i in range(0, len(ranks), 2):  # re-ranks: (ns, rank) pairs
            ev = {"hermes.rank": ranks[i + 1]}
            if prev is not None:
                ev["hermes.previous_rank"] = prev
            evs.append(["hermes.rerank", ranks[i], ev])
            prev = ranks[i + 1]
        evs = sorted(evs + list(events), key=lambda e: e[1])
        return [f"run {app or run_id}", trace, span, parent, 1, flags, 1, start, end, attrs,
                evs, links, error if outcome == "failed" else None]
    if kind == UNIT:
        (_, trace, span, parent, start, end, unit, backend, explicit, n, upstream,
         duration_s) = rec
        attrs = {"hermes.unit": unit, "hermes.backend": backend, "hermes.explicit": explicit,
                 "hermes.requests": n, "openinference.span.kind": "CHAIN"}
        _put(attrs, "hermes.upstream", upstream)
        _put(attrs, "hermes.duration_s", duration_s)
        return [f"unit {unit}", trace, span, parent, 0, 1, 0, start, end, attrs, [], [], None]
    if kind == LLM:
        (_, trace, span, parent, start, end, request_id, policy, node, engine, retries, rank,
         op, model, max_tokens, input_tokens, output_tokens, queue_s, service_s, ttft_s,
         finish_reason, resp_id, resp_model, cached, released, first, error, events, links,
         prompt, output) = rec
        attrs = {"hermes.request_id": request_id, "hermes.policy": policy, "hermes.node": node,
                 "hermes.engine": engine, "hermes.retries": retries,
                 "gen_ai.operation.name": op, "gen_ai.request.model": model,
                 "openinference.span.kind": "LLM"}
        for key, value in (("hermes.rank", rank), ("gen_ai.request.max_tokens", max_tokens),
                           ("gen_ai.usage.input_tokens", input_tokens),
                           ("gen_ai.usage.output_tokens", output_tokens),
                           ("hermes.queue_s", queue_s), ("hermes.service_s", service_s),
                           ("hermes.ttft_s", ttft_s), ("hermes.cached_tokens", cached),
                           ("gen_ai.usage.cache_read.input_tokens", cached),
                           ("gen_ai.input.messages", prompt),
                           ("gen_ai.output.messages", output)):
            _put(attrs, key, value)
        if finish_reason:
            attrs["gen_ai.response.finish_reasons"] = [finish_reason]
        if isinstance(resp_id, str):
            attrs["gen_ai.response.id"] = resp_id
        if isinstance(resp_model, str):
            attrs["gen_ai.response.model"] = resp_model
        if error is not None:
            attrs["error.type"] = "request_failed"
        evs = list(events)
        if first is not None:
            evs.insert(0, ["hermes.first_token", first, {}])
        if released is not None:
            evs.insert(0, ["hermes.dispatched", released, {}])
        evs.sort(key=lambda e: e[1])
        return [f"{op} {model}".rstrip(), trace, span, parent, 0, 1, 2, start, end, attrs, evs,
                links, error]
    if kind == TOOL:
        (_, trace, span, parent, start, end, request_id, policy, node, retries, rank, unit,
         backend, released, queue_s, duration_s, exit_code, cold, timed_out, error, events,
         links, arguments, stdout) = rec
        attrs = {"hermes.request_id": request_id, "hermes.policy": policy, "hermes.node": node,
                 "hermes.retries": retries, "gen_ai.operation.name": "execute_tool",
                 "gen_ai.tool.name": unit, "gen_ai.tool.call.id": request_id,
                 "openinference.span.kind": "TOOL"}
        for key, value in (("hermes.rank", rank), ("hermes.backend", backend),
                           ("hermes.queue_s", queue_s), ("hermes.service_s", duration_s),
                           ("hermes.exit_code", exit_code), ("hermes.cold", cold),
                           ("hermes.timed_out", timed_out),
                           ("gen_ai.tool.call.arguments", arguments),
                           ("gen_ai.tool.call.result", stdout)):
            _put(attrs, key, value)
        if error is not None:
            attrs["error.type"] = "request_failed"
        evs = list(events)
        if released is not None:
            evs.insert(0, ["hermes.dispatched", released, {}])
        evs.sort(key=lambda e: e[1])
        return [f"execute_tool {unit}", trace, span, parent, 0, 1, 0, start, end, attrs, evs,
                links, error]
    return rec  # a span record already


def _put(attrs: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        attrs[key] = value


class _GivenIds:
    """An SDK ``IdGenerator`` that answers the ids of the record being built (set just before
    each span starts; one thread builds)."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        self.random = RandomIdGenerator()
        self.trace_id = 0
        self.span_id = 0

    def generate_trace_id(self) -> int:
        return self.trace_id or self.random.generate_trace_id()

    def generate_span_id(self) -> int:
        return self.span_id or self.random.generate_span_id()


class SpanBuilder:
    """Records -> SDK spans -> ``processor`` (see the module docstring)."""

    def __init__(self, exporter: Any, service_name: str = "hermes-gateway",
                 meter_provider: Any | None = None) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import IdGenerator

        ids = _GivenIds()
        gen = type("GivenIds", (IdGenerator,), {
            "generate_trace_id": lambda self: ids.generate_trace_id(),
            "generate_span_id": lambda self: ids.generate_span_id()})()
        attrs = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
        self.provider = TracerProvider(resource=Resource.create(attrs), id_generator=gen)
        self.processor = BatchSpanProcessor(exporter, meter_provider=meter_provider)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("hermes.gateway")
        self.exporter = exporter
        self._ids = ids
        self._trace = trace
        self._empty = Context()
        self._lock = threading.Lock()

    def add(self, records: Iterable[SpanRecord]) -> None:
        """Make and end one span per record."""
        trace = self._trace
        with self._lock:
            for rec in map(expand, records):
                (name, trace_hex, span_id, parent_id, remote, flags, kind, start, end, attrs,
                 events, links, error) = rec
                trace_id = int(trace_hex, 16)
                self._ids.trace_id, self._ids.span_id = trace_id, span_id
                if parent_id:
                    ctx = trace.set_span_in_context(trace.NonRecordingSpan(trace.SpanContext(
                        trace_id, parent_id, is_remote=bool(remote),
                        trace_flags=trace.TraceFlags(flags))))
                else:
                    ctx = self._empty
                span = self.tracer.start_span(
                    name, context=ctx, kind=trace.SpanKind[KINDS[kind]], attributes=attrs,
                    links=[trace.Link(trace.SpanContext(int(t, 16), s, is_remote=True))
                           for t, s in links] or None,
                    start_time=start)
                for ev_name, ts, ev_attrs in events:
                    span.add_event(ev_name, ev_attrs or None, timestamp=ts)
                if error is not None:
                    span.set_status(trace.Status(trace.StatusCode.ERROR, error))
                span.end(end_time=end)
            self._ids.trace_id = self._ids.span_id = 0

    def flush(self, timeout_ms: int = 30_000) -> bool:
        return bool(self.provider.force_flush(timeout_ms))

    def shutdown(self) -> None:
        self.provider.shutdown()


def processor_counts(reader: Any) -> dict[str, float]:
    """Spans exported, dropped (queue full) and queued now, from the SDK's own processor
    metrics (``otel.sdk.processor.span.*``) read by ``reader`` (an ``InMemoryMetricReader``)."""
    out = {"exported": 0.0, "dropped": 0.0, "queued": 0.0}
    data = reader.get_metrics_data()
    for rm in getattr(data, "resource_metrics", ()) or ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    if m.name == "otel.sdk.processor.span.processed":
                        key = "exported" if p.attributes.get("error.type") is None else "dropped"
                        out[key] += p.value
                    elif m.name == "otel.sdk.processor.span.queue.size":
                        out["queued"] += p.value
    return out


def counting_meters() -> tuple[Any, Any]:
    """``(meter_provider, reader)`` for a processor whose counts :func:`processor_counts` reads
    (the SDK records them only with ``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED``: turned on
    here, by the one that builds tracing)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    os.environ.setdefault("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


def make_exporter(kind: str, endpoint: str = "", protocol: str = "") -> Any:
    """The span exporter ``[tracing] exporter`` names: ``otlp`` (OTLP over HTTP/protobuf, or
    gRPC when ``protocol`` or ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`` says ``grpc``; the
    endpoint from ``endpoint`` or the ``OTEL_EXPORTER_OTLP_*`` variables), ``memory`` (kept in
    this process: tests), ``none`` (made and dropped: what building spans costs alone)."""
    from hermes.extras import MissingExtraError, require

    require("tracing")
    if kind == "memory":
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        return InMemorySpanExporter()
    if kind == "none":
        from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

        class _Drop(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        return _Drop()
    if kind != "otlp":
        raise ValueError(f"tracing exporter must be otlp, memory or none, not {kind!r}")
    env = os.environ
    protocol = (protocol or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            raise MissingExtraError(
                "OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc, which is not "
                "installed: pip install opentelemetry-exporter-otlp-proto-grpc (or use "
                "protocol http/protobuf)") from None
        return GrpcExporter(endpoint=endpoint or None)
    if protocol != "http/protobuf":
        raise ValueError(f"tracing protocol must be http/protobuf or grpc, not {protocol!r}")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    url = endpoint or None
    if url and not url.rstrip("/").endswith("/v1/traces"):
        url = url.rstrip("/") + "/v1/traces"  # the base URL, as OTEL_EXPORTER_OTLP_ENDPOINT
    return OTLPSpanExporter(endpoint=url)


def main() -> int:
    """The export process: ``python -m hermes.gateway.trace_export EXPORTER SERVICE_NAME
    [ENDPOINT [PROTOCOL]]``; batches on stdin until it closes, then a flush."""
    import msgspec

    kind, service = sys.argv[1], sys.argv[2]
    with contextlib.suppress(OSError):
        os.nice(10)  # the gateway's work first: on a busy machine this process waits
    endpoint = sys.argv[3] if len(sys.argv) > 3 else ""
    protocol = sys.argv[4] if len(sys.argv) > 4 else ""
    meters, reader = counting_meters()
    builder = SpanBuilder(make_exporter(kind, endpoint, protocol), service, meters)
    decode = msgspec.msgpack.Decoder(list[list[Any]]).decode
    stdin = sys.stdin.buffer
    stop = threading.Event()

    def say(what: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the gateway stopped reading (it exits)
            print(json.dumps(what), flush=True)

    def report() -> None:
        while not stop.wait(1.0):
            say(processor_counts(reader))

    threading.Thread(target=report, daemon=True).start()
    while True:
        head = stdin.read(FRAME.size)
        if len(head) < FRAME.size:
            break
        (n,) = FRAME.unpack(head)
        body = stdin.read(n)
        if len(body) < n:
            break
        try:
            builder.add(decode(body))
        except Exception as exc:  # a bad record must not end the exporter
            say({"error": f"{type(exc).__name__}: {exc}"})
    stop.set()
    builder.flush()
    builder.shutdown()
    say({**processor_counts(reader), "final": True, "t": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

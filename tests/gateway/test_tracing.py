"""Traces of runs (hermes.gateway.tracing) with the OpenTelemetry SDK's in-memory exporter: the
tree of a run (root, units, requests, tools), the GenAI attributes, the caller's traceparent,
the context sent on to an OpenAI-compatible engine, content only on opt-in, the timeline,
drops counted, a clean shutdown flushing, and nothing installed with tracing off."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk.trace")

from hermes.gateway.config import GatewayConfig, TracingConfig  # noqa: E402
from hermes.gateway.server import BackgroundServer, gateway_state  # noqa: E402
from hermes.gateway.tracing import build_tracing, tracing_wanted  # noqa: E402

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{CALLER}-01"
MEMORY = {"enabled": True, "exporter": "memory"}


def _spans(srv: BackgroundServer) -> list[Any]:
    tracing = gateway_state(srv).tracing
    tracing.flush()
    return list(tracing.exporter.get_finished_spans())


def _named(srv: BackgroundServer, name: str, n: int = 1) -> list[Any]:
    """The spans called ``name`` once there are ``n`` (a one-request run ends, and its spans
    are made, just after its answer has left)."""
    deadline = time.monotonic() + 10
    while True:
        got = [s for s in _spans(srv) if s.name == name]
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def _hex(i: int, n: int) -> str:
    return format(i, f"0{n}x")


def _chat(http: httpx.Client, headers: dict[str, str], text: str = "hi") -> httpx.Response:
    r = http.post("/v1/chat/completions", headers=headers, json={
        "model": "llama-2-7b", "max_tokens": 8,
        "messages": [{"role": "system", "content": "You check claims."},
                     {"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r


def test_a_run_is_one_trace_joined_to_the_callers(make_gateway, capsys) -> None:  # noqa: ANN001
    srv = make_gateway(tracing=MEMORY)
    http = httpx.Client(base_url=srv.url, timeout=30)
    run_id = http.post("/v1/runs", json={"app": "coder"},
                       headers={"traceparent": TRACEPARENT}).json()["run_id"]
    h = {"X-Hermes-Run": run_id, "X-Hermes-Unit": "plan"}
    _chat(http, h, "secret prompt text")
    threads = [threading.Thread(target=_chat, args=(http, {**h, "X-Hermes-Unit": "verify"}))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    r = http.post(f"/v1/runs/{run_id}/tools", json={
        "unit": "execute_code", "backend": "docker:python:3.10-slim", "code": "print(6 * 7)"})
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
    assert http.post(f"/v1/runs/{run_id}/finish").status_code == 200

    spans = [s for s in _spans(srv) if s.context.trace_id == int(TRACE, 16)]
    (root,) = [s for s in spans if s.name == "run coder"]
    # the caller's span is the run's parent: the run is part of the agent's own trace
    assert root.parent is not None and _hex(root.parent.span_id, 16) == CALLER
    assert root.attributes["hermes.run_id"] == run_id
    assert root.attributes["hermes.app"] == "coder" and root.attributes["hermes.tenant"] == "default"
    assert root.attributes["hermes.inferred"] is False
    assert root.attributes["hermes.outcome"] == "finished"
    assert any(e.name == "hermes.rerank" for e in root.events)
    units = [s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id]
    assert {u.name for u in units} == {"unit plan", "unit verify", "unit execute_code"}
    under: dict[str, list[Any]] = {}  # unit name -> the spans under its invocations
    for u in units:
        under.setdefault(u.name, []).extend(
            s for s in spans if s.parent is not None and s.parent.span_id == u.context.span_id)
    assert [s.name for s in under["unit plan"]] == ["chat llama-2-7b"]
    assert [s.name for s in under["unit verify"]] == ["chat llama-2-7b"] * 2
    (tool,) = under["unit execute_code"]
    assert tool.name == "execute_tool execute_code"
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["hermes.exit_code"] == 0
    assert len(spans) == 1 + len(units) + 3 + 1
    llm = under["unit plan"][0]
    a = llm.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "llama-2-7b"
    # the engine's own counts, as the run document has them
    doc_req = http.get(f"/v1/runs/{run_id}").json()["units"][0]["requests"][0]
    assert a["gen_ai.usage.input_tokens"] == doc_req["input_tokens"] > 0
    assert a["gen_ai.usage.output_tokens"] == doc_req["output_tokens"] > 0
    assert list(a["gen_ai.response.finish_reasons"]) in (["length"], ["stop"])
    assert a["hermes.policy"] == "hermes" and "hermes.rank" in a
    assert a["hermes.engine"] == "sim0" and a["hermes.node"] == "embedded"
    assert a["hermes.queue_s"] >= 0 and a["hermes.service_s"] > 0 and a["hermes.retries"] == 0
    assert [e.name for e in llm.events] == ["hermes.dispatched", "hermes.first_token"]
    # the tree's times nest: each child inside its parent
    assert root.start_time <= llm.start_time <= llm.end_time <= root.end_time
    # prompt and completion text are never exported unless asked for
    text = json.dumps([dict(s.attributes) for s in spans])
    assert "secret prompt" not in text and "gen_ai.input.messages" not in text
    assert "gen_ai.output.messages" not in text and "6 * 7" not in text

    # a request without a traceparent: its run is its own trace (a root span, no parent)
    _chat(http, {"X-Hermes-Run": "none"})
    (own,) = _named(srv, "run default")
    assert own.parent is None and own.context.trace_id != int(TRACE, 16)

    # the timeline of the finished run, with its trace id
    tl = http.get(f"/v1/runs/{run_id}/timeline").json()
    assert tl["trace_id"] == TRACE
    assert [u["unit"] for u in tl["units"]][0] == "plan"
    assert tl["units"][-1]["unit"] == "execute_code"
    req = tl["units"][0]["requests"][0]
    assert req["queued"] <= req["dispatched"] <= req["first_token"] <= req["done"]
    assert tl["units"][-1]["requests"][0]["kind"] == "tool"
    # ... and as the terminal draws it
    from hermes.cli import main

    capsys.readouterr()
    assert main(["runs", "show", run_id, "--timeline", "--url", srv.url]) == 0
    drawn = capsys.readouterr().out
    for what in ("plan", "verify", "execute_code", "└ llm sim0", "└ tool embedded", TRACE,
                 "waiting (queued at its node)", "█"):
        assert what in drawn, what
    metrics = http.get("/metrics").text
    assert "hermes_trace_spans_dropped_total 0.0" in metrics
    assert "hermes_trace_spans_exported_total" in metrics


def test_content_is_exported_only_when_the_operator_opts_in(make_gateway) -> None:  # noqa: ANN001
    srv = make_gateway(tracing={**MEMORY, "capture_content": True})
    http = httpx.Client(base_url=srv.url, timeout=30)
    _chat(http, {"X-Hermes-Run": "none"}, "opted-in prompt")
    (llm,) = _named(srv, "chat llama-2-7b")
    assert "opted-in prompt" in llm.attributes["gen_ai.input.messages"]
    assert json.loads(llm.attributes["gen_ai.output.messages"])[0]["role"] == "assistant"


class _EngineProbe:
    """An OpenAI-compatible server (aiohttp, its own thread and loop) that answers every
    completion and keeps the ``traceparent`` header each one came with."""

    def __init__(self) -> None:
        from aiohttp import web

        self.seen: list[str | None] = []
        self.fail_next = 0  # answer this many completions with 503 first

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "probe-model"}]})

        async def chat(request: web.Request) -> web.Response:
            self.seen.append(request.headers.get("traceparent"))
            if self.fail_next > 0:
                self.fail_next -= 1
                return web.json_response({"error": {"message": "overloaded"}}, status=503)
            return web.json_response({
                "id": "chatcmpl-1", "object": "chat.completion", "model": "probe-model",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                          "prompt_tokens_details": {"cached_tokens": 2}}})

        async def health(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.add_routes([web.get("/v1/models", models), web.post("/v1/chat/completions", chat),
                        web.get("/health", health)])
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def probe() -> Iterator[_EngineProbe]:
    p = _EngineProbe()
    yield p
    p.close()


def test_the_context_goes_on_to_an_openai_compatible_engine(make_gateway, probe) -> None:  # noqa: ANN001
    srv = make_gateway(tracing=MEMORY, time_scale=1.0, engines=[
        {"name": "e0", "kind": "openai", "url": probe.url, "model": "probe-model"}])
    http = httpx.Client(base_url=srv.url, timeout=30)
    r = http.post("/v1/chat/completions", headers={"traceparent": TRACEPARENT}, json={
        "model": "probe-model", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200, r.text
    (llm,) = _named(srv, "chat probe-model")
    # the engine got the request span's context: its own spans would be the request's children
    assert probe.seen == [f"00-{_hex(llm.context.trace_id, 32)}-{_hex(llm.context.span_id, 16)}-01"]
    assert _hex(llm.context.trace_id, 32) == TRACE  # inferred run, still the caller's trace
    assert llm.attributes["hermes.cached_tokens"] == 2  # the engine's prefix-cache hit
    assert llm.attributes["gen_ai.response.id"] == "chatcmpl-1"


def test_a_retry_is_an_event_of_the_request_span(make_gateway, probe) -> None:  # noqa: ANN001
    srv = make_gateway(tracing=MEMORY, time_scale=1.0, engines=[
        {"name": "e0", "kind": "openai", "url": probe.url, "model": "probe-model"}])
    probe.fail_next = 1  # the engine answers 503 once: the node says retry, the gateway does
    http = httpx.Client(base_url=srv.url, timeout=30)
    r = http.post("/v1/chat/completions", headers={"X-Hermes-Run": "none"}, json={
        "model": "probe-model", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200, r.text
    (llm,) = _named(srv, "chat probe-model")
    assert llm.attributes["hermes.retries"] == 1
    assert {e.name for e in llm.events} == {"hermes.retry", "hermes.dispatched",
                                            "hermes.first_token"}
    ctx = f"00-{_hex(llm.context.trace_id, 32)}-{_hex(llm.context.span_id, 16)}-01"
    assert probe.seen == [ctx, ctx]  # both attempts: the same request span


def test_tracing_off_installs_nothing(gateway) -> None:  # noqa: ANN001
    st = gateway_state(gateway)
    assert st.tracing is None
    sched = st.scheduler
    assert sched.dispatch.trace is None and sched.prewarm.on_action is None
    assert not any(type(o).__name__ == "RunTracer" for o in sched.registry.observers)
    assert not any(m.cls.__name__ == "TraceContextMiddleware"
                   for m in gateway.server.config.app.user_middleware)  # type: ignore[union-attr]


def test_the_standard_variables_turn_tracing_on_and_off() -> None:
    off = TracingConfig()
    assert not tracing_wanted(off, {})
    assert tracing_wanted(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing_wanted(off, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"})
    on = TracingConfig(enabled=True)
    assert tracing_wanted(on, {})
    assert not tracing_wanted(on, {"OTEL_SDK_DISABLED": "true"})
    assert not tracing_wanted(on, {"OTEL_TRACES_EXPORTER": "none"})


def test_a_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes.extras import MissingExtraError

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(MissingExtraError, match=r"hermes-gateway\[tracing\]"):
        build_tracing(GatewayConfig(tracing=TracingConfig(enabled=True)))


def test_full_queues_drop_spans_and_count_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from hermes.gateway.trace_export import SpanBuilder, counting_meters, processor_counts
    from hermes.gateway.tracing import Tracing

    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
    # the gateway's queue: records past its bound are dropped and counted, not waited for
    tracing = Tracing(TracingConfig(enabled=True, exporter="memory"))
    for i in range(10):
        tracing.emit(_record(i))
    assert tracing.counts()["dropped"] == 6 and tracing.counts()["queued"] == 4
    tracing.shutdown()
    assert len(tracing.exporter.get_finished_spans()) == 4

    gate = threading.Event()

    class Stuck(SpanExporter):  # a receiver that does not answer: the SDK's queue fills
        def export(self, spans: Any) -> SpanExportResult:
            gate.wait(10)
            return SpanExportResult.SUCCESS

    meters, reader = counting_meters()
    builder = SpanBuilder(Stuck(), meter_provider=meters)
    builder.add([_record(i) for i in range(20)])
    counts = processor_counts(reader)
    assert counts["dropped"] >= 10 and counts["queued"] <= 4
    gate.set()
    builder.shutdown()


def _record(i: int) -> list[Any]:
    return [f"s{i}", TRACE, i + 1, 0, 0, 1, 0, 1_000, 2_000, {"i": i}, [], [], None]


def test_the_export_process_sends_otlp(make_gateway, otlp_receiver) -> None:  # noqa: ANN001
    """The default: spans made in an export process of their own, sent over OTLP/HTTP (read
    back here with the protocol's own protobuf messages)."""
    srv = make_gateway(tracing={"enabled": True, "endpoint": otlp_receiver.url})
    tracing = gateway_state(srv).tracing
    assert tracing.proc is not None and tracing.exporter is None
    http = httpx.Client(base_url=srv.url, timeout=30)
    _chat(http, {"X-Hermes-Run": "none", "traceparent": TRACEPARENT})
    srv.stop()  # a clean shutdown: the export process flushes, then exits
    assert tracing.proc.returncode == 0
    spans = {s.name: s for s in otlp_receiver.spans()}
    assert set(spans) == {"run default", "unit default", "chat llama-2-7b"}
    assert {s.trace_id.hex() for s in spans.values()} == {TRACE}
    assert spans["run default"].parent_span_id.hex() == CALLER
    assert spans["chat llama-2-7b"].parent_span_id == spans["unit default"].span_id


class _OtlpReceiver:
    """OTLP/HTTP on loopback: keeps every ExportTraceServiceRequest it is sent."""

    def __init__(self) -> None:
        import http.server

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.requests: list[Any] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list[Any]:
        return [s for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans
                for s in ss.spans]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def otlp_receiver() -> Iterator[_OtlpReceiver]:
    r = _OtlpReceiver()
    yield r
    r.close()


def test_a_clean_shutdown_flushes_what_is_queued(make_gateway, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # nothing leaves by itself
    srv = make_gateway(tracing=MEMORY)
    http = httpx.Client(base_url=srv.url, timeout=30)
    _chat(http, {"X-Hermes-Run": "none"})
    tracing = gateway_state(srv).tracing
    assert tracing.exporter.get_finished_spans() == ()
    srv.stop()
    names = sorted(s.name for s in tracing.exporter.get_finished_spans())
    assert names == ["chat llama-2-7b", "run default", "unit default"]


def test_the_overview_dashboard_links_a_run_to_its_trace() -> None:
    """The Grafana link searches the trace backend for the attribute the root span carries."""
    from pathlib import Path
    from urllib.parse import unquote

    repo = Path(__file__).resolve().parents[2]
    d = json.loads((repo / "deploy/grafana/dashboards/hermes-overview.json").read_text())
    names = {v["name"]: v for v in d["templating"]["list"]}
    assert names["traces"]["type"] == "datasource" and names["traces"]["query"] == "tempo"
    assert names["run"]["type"] == "textbox"
    (link,) = d["links"]
    left = json.loads(unquote(link["url"].split("left=", 1)[1]))
    assert left["datasource"] == "${traces}"
    assert left["queries"][0]["query"] == '{ span.hermes.run_id = "${run}" }'


def test_prewarm_decisions_reranks_and_an_inferred_end_are_events_of_the_run() -> None:
    """The tracer's records, named by the export side (no gateway: its hooks called as the
    registry and the prewarm planner call them)."""
    from hermes.core.prewarm import PrewarmAction
    from hermes.core.state import RunState
    from hermes.gateway.context import SchedulerClock
    from hermes.gateway.state import LiveRun
    from hermes.gateway.trace_export import expand
    from hermes.gateway.tracing import RunTracer

    class Ctx:
        config = GatewayConfig()
        clock = SchedulerClock(1.0)

        def now(self) -> float:
            return time.time()

    records: list[list[Any]] = []
    tracer = RunTracer(Ctx(), records.append)  # type: ignore[arg-type]
    t0 = time.time()
    st = RunState(run_id="run-1", app="agent", submitted=t0, tenant="acme")
    run = LiveRun(state=st, inferred=True)
    tracer.run_created(run)
    for rank in (0.5, 0.5, 0.25, float("inf")):  # a repeat and a non-finite rank: no event
        st.rank = rank
        tracer.ranks_changed(run, time.time())
    tracer.prewarm_action(PrewarmAction("start", "docker:python:3.10-slim", "run-1",
                                        "execute_code", pid=7), time.time())
    tracer.prewarm_action(PrewarmAction("start", "kv:m/acme/other/u", "run-9", "u", pid=8),
                          time.time())  # another run's: not this one's
    st.finished, run.status = t0 + 2.0, "finished"
    tracer.run_ended(run)
    (root,) = [expand(r) for r in records]
    name, trace, _, parent, _, _, _, start, end, attrs, events, _, error = root
    assert name == "run agent" and parent == 0 and error is None and len(trace) == 32
    assert end - start == 2_000_000_000
    assert attrs["hermes.inferred"] is True and attrs["hermes.tenant"] == "acme"
    assert [e[0] for e in events] == ["hermes.rerank", "hermes.rerank", "hermes.prewarm",
                                      "hermes.run_end_inferred"]
    assert events[1][2] == {"hermes.rank": 0.25, "hermes.previous_rank": 0.5}
    assert events[2][2]["hermes.resource"] == "docker:python:3.10-slim"
    assert events[2][2]["hermes.action"] == "start"
    assert tracer.trace_id("run-1") == trace

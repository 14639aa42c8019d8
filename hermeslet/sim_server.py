"""The built-in simulated engine served standalone with vLLM's HTTP surface.

``hermeslet sim-engine --port P`` runs this app on uvicorn (127.0.0.1 by default). Endpoints:
``POST /v1/completions`` and ``/v1/chat/completions`` (``stream: true`` as server-sent events
in OpenAI's chunk format, ``stream_options.include_usage`` honoured), ``POST /v1/embeddings``
(an engine started with ``--task embed``), ``GET /v1/models`` (the
base model and loaded LoRA adapters, with ``parent``), ``POST /v1/messages`` (Anthropic's
Messages API, plain and streamed, translated to the engine's chat completions and back as
vLLM does: :mod:`hermes.anthropic_wire`), the ``priority`` field (vLLM's
``--scheduling-policy priority``), ``POST /v1/load_lora_adapter`` / ``unload_lora_adapter``,
``GET /metrics`` (vLLM metric names, and ``hermes_sim_requests_total`` by route) and
``GET /health``. Errors use OpenAI's error JSON.
A client that disconnects aborts its request in the engine, as in vLLM.

The bodies are the engine's own objects (:attr:`GenChunk.chunk` for each server-sent event,
:attr:`GenResult.response` for a whole answer: tool calls, logprobs, ``n`` choices), with this
server's request id and the model name the client asked for; with
``stream_options.include_usage`` each chunk has ``usage: null`` and a last chunk carries the
usage. What the engine generates (lengths, text, tool calls, structured outputs, token
counting) is documented in :mod:`hermeslet.engines.sim_engine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from hermes import anthropic_wire as wire
from hermes.anthropic_wire import MessagesBody, MessagesError, validate_body
from hermeslet.engines.base import EngineError, GenChunk, GenResult, Task
from hermeslet.engines.sim_engine import SimEngine
from hermeslet.engines.sim_output import AgentBehaviour


def error_response(status: int, message: str, type_: str | None = None) -> JSONResponse:
    """OpenAI's error shape."""
    types = {400: "BadRequestError", 404: "NotFoundError", 499: "RequestAborted"}
    return JSONResponse(
        {"error": {"message": message, "type": type_ or types.get(status, "InternalServerError"),
                   "param": None, "code": status}},
        status_code=status,
    )


class _EngineCollector:
    """Prometheus collector reading the engine's state at scrape time (vLLM names)."""

    def __init__(self, engine: SimEngine, served: dict[str, int]) -> None:
        self.engine = engine
        self.served = served

    def collect(self) -> Iterator[Metric]:
        m = self.engine.stats()
        labels = ["model_name", "engine"]
        vals = [self.engine.model, "0"]

        def gauge(name: str, doc: str, v: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(vals, v)
            return g

        def counter(name: str, doc: str, v: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(vals, v)
            return c

        yield gauge("vllm:num_requests_running", "Requests in the running batch.", m.running or 0)
        yield gauge("vllm:num_requests_waiting", "Requests waiting.", m.waiting or 0)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = full).", m.kv_usage or 0.0)
        x = m.extra
        yield counter("vllm:prefix_cache_queries", "Prefix-cache tokens queried.",
                      x["prefix_cache_queries"])
        yield counter("vllm:prefix_cache_hits", "Prefix-cache tokens hit.",
                      x["prefix_cache_hits"])
        yield counter("vllm:prompt_tokens", "Prompt tokens.", x["prompt_tokens"])
        yield counter("vllm:generation_tokens", "Generated tokens.", x["generation_tokens"])
        yield counter("vllm:request_success", "Finished requests.", x["request_success"])
        by_route = CounterMetricFamily("hermes_sim_requests", "Requests received, by route.",
                                       labels=["route"])
        for route, n in sorted(self.served.items()):
            by_route.add_metric([route], n)
        yield by_route


def create_app(engine: SimEngine) -> FastAPI:
    """The FastAPI app serving ``engine`` (started and stopped with the app)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        yield
        await engine.close()

    app = FastAPI(title="Hermes simulated engine (vLLM-compatible)", lifespan=lifespan)
    registry = CollectorRegistry(auto_describe=False)
    served: dict[str, int] = {}  # requests received by route (hermes_sim_requests_total)
    registry.register(_EngineCollector(engine, served))
    app.state.engine = engine

    def count(request: Request) -> None:
        """(not a middleware: Starlette's would hide a client's disconnect from the routes)"""
        served[request.url.path] = served.get(request.url.path, 0) + 1

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        now = int(time.time())
        data = [{"id": engine.model, "object": "model", "created": now, "owned_by": "hermes",
                 "root": engine.model, "parent": None, "max_model_len":
                 engine.cost.kv_capacity_tokens}]
        data += [{"id": name, "object": "model", "created": now, "owned_by": "hermes",
                  "root": name, "parent": engine.model} for name in engine.loras]
        return {"object": "list", "data": data}

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: Request) -> Response:
        body = await _json(request)
        if isinstance(body, Response):
            return body
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return error_response(400, "both 'lora_name' and 'lora_path' must be provided.")
        try:
            engine.load_lora(name)
        except EngineError as e:
            return error_response(e.status or 400, str(e))
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: Request) -> Response:
        body = await _json(request)
        if isinstance(body, Response):
            return body
        name = body.get("lora_name")
        if not name:
            return error_response(400, "'lora_name' must be provided.")
        try:
            engine.unload_lora(name)
        except EngineError as e:
            return error_response(e.status or 404, str(e))
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(request, "completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _serve(request, "chat")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await _serve(request, "embeddings")

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        """Anthropic's Messages API, answered as vLLM does: translated to a chat completion
        of the engine, and back (:mod:`hermes.anthropic_wire`); errors in Anthropic's shape."""
        count(request)
        try:
            body = validate_body(await request.body(), MessagesBody)
        except MessagesError as e:
            return JSONResponse(wire.error_body(e.status, str(e)), status_code=e.status)
        assert isinstance(body, MessagesBody)
        try:
            chat = {**wire.to_chat(body), "model": body.model}
        except MessagesError as e:
            return JSONResponse(wire.error_body(e.status, str(e)), status_code=e.status)
        mid = "msg_" + (request.headers.get("x-request-id") or uuid.uuid4().hex)
        gen = engine.generate("chat", chat, body.stream, request_id=mid)
        if body.stream:
            try:
                first = await anext(gen)
            except EngineError as e:
                code = e.status or 500
                return JSONResponse(wire.error_body(code, str(e)), status_code=wire.status(code))
            tr = wire.MessageStreamer(message_id=mid, model=body.model,
                                      input_tokens=wire.count_tokens(body),
                                      stop_sequences=body.stop_sequences)
            return StreamingResponse(_message_events(tr, first, gen),
                                     media_type="text/event-stream")
        try:
            res = await _collect(gen)
        except EngineError as e:
            code = e.status or 500
            return JSONResponse(wire.error_body(code, str(e)), status_code=wire.status(code))
        return JSONResponse(wire.from_chat(res.response or {}, message_id=mid, model=body.model,
                                           stop_sequences=body.stop_sequences))

    async def _json(request: Request) -> dict[str, Any] | Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return error_response(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return error_response(400, "request body must be a JSON object")
        return body

    async def _serve(request: Request, endpoint: str) -> Response:
        count(request)
        body = await _json(request)
        if isinstance(body, Response):
            return body
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return error_response(400, "'model' is required")
        prio = body.get("priority")
        if prio is not None and not isinstance(prio, int):
            return error_response(400, "'priority' must be an integer")
        prefix = {"chat": "chatcmpl-", "completions": "cmpl-"}.get(endpoint, "embd-")
        rid = prefix + (request.headers.get("x-request-id") or uuid.uuid4().hex)
        stream = bool(body.get("stream")) and endpoint != "embeddings"
        gen = engine.generate(endpoint, body, stream, request_id=rid, priority=prio)
        if stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            try:  # surface validation errors as HTTP errors, not mid-stream
                first = await anext(gen)
            except EngineError as e:
                return error_response(e.status or 500, str(e))
            return StreamingResponse(
                _sse(endpoint, rid, model, first, gen, include_usage),
                media_type="text/event-stream",
            )
        task = asyncio.ensure_future(_collect(gen))
        try:
            while True:  # abort in the engine if the client goes away
                done, _ = await asyncio.wait({task}, timeout=0.25)
                if done:
                    break
                if await request.is_disconnected():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, EngineError):
                        await task
                    return error_response(499, "client disconnected")
            res = task.result()
        except EngineError as e:
            return error_response(e.status or 500, str(e))
        return JSONResponse(_answer(endpoint, rid, model, res))

    return app


async def _collect(gen: AsyncIterator[GenChunk | GenResult]) -> GenResult:
    res: GenResult | None = None
    async for x in gen:
        if isinstance(x, GenResult):
            res = x
    assert res is not None
    return res


def _answer(endpoint: str, rid: str, model: str, res: GenResult) -> dict[str, Any]:
    """The engine's whole answer with this server's id and the model asked for."""
    out = dict(res.response or {})
    out["model"] = model
    if endpoint != "embeddings":
        out["id"] = rid
    return out


async def _sse(endpoint: str, rid: str, model: str, first: GenChunk | GenResult,
               gen: AsyncGenerator[GenChunk | GenResult, None], include_usage: bool
               ) -> AsyncIterator[bytes]:
    """The engine's chunks as server-sent events, then the usage chunk (when asked) and
    ``[DONE]``; an engine error mid-stream is an error event."""
    def event(d: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(d).encode() + b"\n\n"

    obj = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
    try:
        item: GenChunk | GenResult | None = first
        while item is not None:
            if isinstance(item, GenChunk):
                if item.chunk is not None:
                    d = {**item.chunk, "id": rid, "model": model}
                    if include_usage:
                        d["usage"] = None
                    yield event(d)
                item = await anext(gen, None)
                continue
            if include_usage:
                created = int((item.response or {}).get("created") or time.time())
                yield event({"id": rid, "object": obj, "created": created, "model": model,
                             "choices": [], "usage": {
                                 "prompt_tokens": item.input_tokens,
                                 "completion_tokens": item.output_tokens,
                                 "total_tokens": item.input_tokens + item.output_tokens}})
            break
        yield b"data: [DONE]\n\n"
    except EngineError as e:
        err = {"error": {"message": str(e), "type": "InternalServerError", "code": 500}}
        yield event(err)
    finally:
        await gen.aclose()  # client gone: aborts the request in the engine


async def _message_events(tr: wire.MessageStreamer, first: GenChunk | GenResult,
                          gen: AsyncGenerator[GenChunk | GenResult, None]
                          ) -> AsyncIterator[bytes]:
    """The engine's chat chunks as Anthropic's event stream; an engine error mid-stream is an
    ``error`` event."""
    def event(kind: str, data: dict[str, Any]) -> bytes:
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()

    try:
        for e in tr.start():
            yield event(*e)
        item: GenChunk | GenResult | None = first
        while isinstance(item, GenChunk):
            for e in tr.feed_chunk(item.chunk) if item.chunk is not None else \
                    tr.feed_text(item.text):
                yield event(*e)
            item = await anext(gen, None)
        if item is not None:
            for e in tr.finish(item.finish_reason, input_tokens=item.input_tokens,
                               output_tokens=item.output_tokens):
                yield event(*e)
    except EngineError as e:
        yield event("error", wire.error_body(e.status or 500, str(e)))
    finally:
        await gen.aclose()  # client gone: aborts the request in the engine


def serve(*, host: str = "127.0.0.1", port: int = 8000, setup: str = "llama2-7b-a100",
          time_scale: float = 1.0, model: str = "llama-2-7b", seed: int = 0,
          max_num_seqs: int | None = None, kv_cache_gb: float | None = None,
          cpu_cache_gb: float = 0.0, log_level: str = "warning", task: Task = "generate",
          behaviour: AgentBehaviour | None = None) -> None:
    """Run the standalone server (blocking): ``hermeslet sim-engine``."""
    import uvicorn

    from hermes.core.costmodel import get_cost_model

    cost = get_cost_model(setup)
    if max_num_seqs is not None:
        cost = cost.with_overrides(max_num_seqs=max_num_seqs)
    engine = SimEngine(name="sim", model=model, cost=cost, time_scale=time_scale, seed=seed,
                       kv_cache_gb=kv_cache_gb, cpu_cache_gb=cpu_cache_gb, task=task,
                       behaviour=behaviour)
    from hermes import evloop

    # uvloop + httptools where installed (uvicorn[standard]): the engine server's own per-request
    # overhead is the floor of ``hermes bench gateway``'s direct path
    uvicorn.run(create_app(engine), host=host, port=port, log_level=log_level,
                access_log=log_level == "debug", loop=evloop.loop_name(), http="auto")

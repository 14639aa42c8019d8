"""The OpenAI-compatible endpoint: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

An agent written against the OpenAI SDK works by changing its base URL; two headers tie its
requests to a Hermes run so that the scheduler can rank them by the whole application:

- ``X-Hermes-Run: RUN_ID`` (from ``POST /v1/runs``) and ``X-Hermes-Unit: UNIT`` (the unit the
  request belongs to, e.g. ``verify_claims``; default ``default``);
- ``X-Hermes-App: APP`` without a run: a run of ``APP`` is created and its id returned in the
  ``X-Hermes-Run`` response header (finish it with ``POST /v1/runs/{id}/finish``, or it is
  finished after ``run_idle_timeout_s`` without requests);
- no header: the request is a one-unit run of app ``default``;
- for a run created by the request (``X-Hermes-App``, or none): ``X-Hermes-K: 0.3`` its
  prewarming knob K (0..1; the run's own, ahead of the tenant's, app's and default K) and
  ``X-Hermes-Deadline-S: 30`` its deadline in seconds from now (as ``k`` and ``deadline_s``
  of ``POST /v1/runs``); a bad value is a 400 that names the header.

Both endpoints stream with ``stream: true`` (server-sent events in OpenAI's chunk format,
``stream_options.include_usage`` honoured). Errors use OpenAI's JSON shape
``{"error": {"message", "type", "param", "code"}}``: 400 for a bad body (``param`` names the
field), 404 for an unknown run or model, 409 for a run that is no longer active.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.background import BackgroundTask

from hermes.gateway.auth import tenant_for
from hermes.gateway.run_params import parse_deadline_s, parse_knob
from hermes.gateway.scheduler import (
    LiveRun,
    LiveScheduler,
    PendingRequest,
    SchedulerError,
)
from hermes.protocol import Done

router = APIRouter()

RUN_HEADER = "X-Hermes-Run"
UNIT_HEADER = "X-Hermes-Unit"
APP_HEADER = "X-Hermes-App"
K_HEADER = "X-Hermes-K"
DEADLINE_HEADER = "X-Hermes-Deadline-S"
DEFAULT_APP = "default"
DEFAULT_UNIT = "default"
MAX_TOKENS = 131_072  # upper bound of max_tokens (longer is a client error, not a long job)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
                413: "invalid_request_error", 415: "invalid_request_error",
                409: "conflict_error", 422: "invalid_request_error", 429: "rate_limit_error",
                499: "cancelled", 502: "api_error", 503: "service_unavailable", 504: "timeout"}


def error_response(status: int, message: str, *, param: str | None = None,
                   code: str | None = None, type_: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """An error in OpenAI's shape (used by every gateway endpoint)."""
    body = {"error": {"message": message, "type": type_ or _ERROR_TYPES.get(status, "api_error"),
                      "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def scheduler_error(e: SchedulerError) -> JSONResponse:
    return error_response(e.status, str(e), code=e.code, param=e.param)


def validation_error(e: ValidationError, status: int = 400) -> JSONResponse:
    """The first validation error, with ``param`` naming the offending field."""
    err = e.errors()[0]
    param = ".".join(str(p) for p in err["loc"]) or None
    return error_response(status, f"{param}: {err['msg']}" if param else err["msg"],
                          param=param, code="invalid_value" if err["type"] != "missing" else "missing")


# ---------------------------------------------------------------------------------- bodies
class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    n: int | None = Field(default=None, ge=1, le=128)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer", "function"]
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)


class CompletionBody(_Body):
    prompt: str | list[str] | list[int] = Field(min_length=1)


class EmbeddingBody(BaseModel):
    """``POST /v1/embeddings``: OpenAI's fields; anything else passes on to the engine."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(default=None, ge=1, le=65_536)
    user: str | None = None


# ---------------------------------------------------------------------------------- routing
def _sched(request: Request) -> LiveScheduler:
    return request.app.state.scheduler


async def _bind_run(sched: LiveScheduler, request: Request) -> tuple[LiveRun, str]:
    """The run and unit a request belongs to, from its headers (see the module docstring)."""
    h = request.headers
    unit = h.get(UNIT_HEADER) or DEFAULT_UNIT
    run_id = h.get(RUN_HEADER)
    if run_id:
        return sched.active_run(run_id), unit
    app = h.get(APP_HEADER)
    k = _run_header(h, K_HEADER, parse_knob)
    deadline_s = _run_header(h, DEADLINE_HEADER, parse_deadline_s)
    tenant = tenant_for(request, h.get("X-Hermes-Tenant"))
    if app:
        return sched.create_run(app, tenant=tenant, k=k, deadline_s=deadline_s), unit
    return sched.create_run(DEFAULT_APP, tenant=tenant, k=k, deadline_s=deadline_s,
                            auto_finish=True), unit


def _run_header(h: Any, name: str, parse: Callable[[str], float]) -> float | None:
    """A header setting a parameter of the run the request creates (``None`` when absent),
    validated as the same field of ``POST /v1/runs`` is (:mod:`hermes.gateway.run_params`)."""
    raw = h.get(name)
    if raw is None:
        return None
    try:
        return parse(raw)
    except ValueError as e:
        raise SchedulerError(f"header {name}: {e}, got {raw!r}") from None


async def _parse(request: Request, cls: type[_Body]) -> _Body | JSONResponse:
    """The body as ``cls``, parsed and validated in one pass (pydantic reads the JSON itself:
    no intermediate dicts), or the 400 that says what is wrong with it."""
    try:
        return cls.model_validate_json(await request.body())
    except ValidationError as e:
        return _body_error(e)


def _body_error(e: ValidationError) -> JSONResponse:
    """The 400 for a body that failed validation: not JSON, not an object, or a field."""
    kind = e.errors()[0]
    if kind["type"] == "json_invalid":
        return error_response(400, "the request body is not valid JSON", code="invalid_json")
    if kind["type"] == "model_type" and not kind["loc"]:
        return error_response(400, "the request body must be a JSON object",
                              code="invalid_json")
    return validation_error(e, 400)


class _BadField(ValueError):
    """A request field the gateway refuses before anything is queued: ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _check_schema(param: str, schema: Any) -> None:
    """A tool's ``parameters`` (or a ``json_schema``'s ``schema``): a JSON Schema object whose
    top level describes an object, as OpenAI requires; ``properties`` maps names to schemas."""
    if not isinstance(schema, dict):
        raise _BadField(param, "must be a JSON Schema object")
    if schema.get("type", "object") != "object":
        raise _BadField(f"{param}.type", f"must be 'object', got {schema.get('type')!r}")
    props = schema.get("properties", {})
    if not isinstance(props, dict) or not all(isinstance(v, dict | bool) for v in props.values()):
        raise _BadField(f"{param}.properties", "must map property names to schemas")
    req = schema.get("required", [])
    if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
        raise _BadField(f"{param}.required", "must be a list of property names")


def check_agent_fields(data: dict[str, Any]) -> None:
    """``tools``, ``tool_choice`` and ``response_format`` of a chat body, checked at the edge
    so that every engine behind the gateway gets only well-formed ones and a client learns
    which field is wrong (:class:`_BadField`). The values themselves go on unchanged."""
    tools = data.get("tools")
    names: set[str] = set()
    if tools is not None:
        if not isinstance(tools, list):
            raise _BadField("tools", "must be a list of tools")
        for i, t in enumerate(tools):
            where = f"tools[{i}]"
            if not isinstance(t, dict) or t.get("type") != "function":
                raise _BadField(f"{where}.type", "only 'function' tools are supported")
            fn = t.get("function")
            if not isinstance(fn, dict):
                raise _BadField(f"{where}.function", "must be an object with a name")
            name = fn.get("name")
            if not isinstance(name, str) or not _TOOL_NAME.match(name):
                raise _BadField(f"{where}.function.name",
                                "must be 1-64 letters, digits, '_' or '-'")
            if "parameters" in fn:
                _check_schema(f"{where}.function.parameters", fn["parameters"])
            names.add(name)
    choice = data.get("tool_choice")
    if choice is not None:
        if isinstance(choice, str):
            if choice not in ("none", "auto", "required"):
                raise _BadField("tool_choice", "must be 'none', 'auto', 'required' or a "
                                "named function")
            if choice == "required" and not names:
                raise _BadField("tool_choice", "'required' needs tools")
        elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
            if choice["function"].get("name") not in names:
                raise _BadField("tool_choice.function.name", "names no tool of the request")
        else:
            raise _BadField("tool_choice", "must be a string or {'type': 'function', "
                            "'function': {'name': ...}}")
    fmt = data.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind not in ("text", "json_object", "json_schema"):
            raise _BadField("response_format.type",
                            "must be 'text', 'json_object' or 'json_schema'")
        if kind == "json_schema":
            js = fmt.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("name"), str):
                raise _BadField("response_format.json_schema",
                                "must be an object with a 'name' and a 'schema'")
            if "schema" in js:
                _check_schema("response_format.json_schema.schema", js["schema"])


def _engine_body(body: _Body) -> dict[str, Any]:
    """What the node forwards to the engine: the request without model/stream options."""
    data = body.model_dump(exclude_none=True, exclude={"model", "stream", "stream_options"})
    if isinstance(body, ChatBody):
        data["messages"] = [m.model_dump(exclude_none=True) for m in body.messages]
        if "max_completion_tokens" in data and "max_tokens" not in data:
            data["max_tokens"] = data.pop("max_completion_tokens")
    return data


async def handle_completion(request: Request,
                            endpoint: Literal["chat", "completions"]) -> Response:
    """One completion request, from body to answer: bind it to its run and unit (headers),
    queue it by the run's rank, wait or stream (the FastAPI routes below and the fast path,
    :mod:`hermes.gateway.fastpath`, both call this)."""
    sched = _sched(request)
    parsed = await _parse(request, ChatBody if endpoint == "chat" else CompletionBody)
    if isinstance(parsed, JSONResponse):
        return parsed
    body = parsed
    extra = body.model_extra
    if extra and ("tools" in extra or "tool_choice" in extra or "response_format" in extra):
        try:
            check_agent_fields(extra)
        except _BadField as e:
            return error_response(400, str(e), param=e.param, code="invalid_value")
    run: LiveRun | None = None
    try:
        model = await sched.serving_model(body.model, strict=True)
        run, unit = await _bind_run(sched, request)
        inv = sched.unit_for_request(run, unit, f"llm:{model}")
        req = await sched.submit_llm(run, inv, model=model, endpoint=endpoint,
                                     body=_engine_body(body), stream=body.stream)
    except SchedulerError as e:
        if run is not None and run.auto_finish:
            sched.fail_run(run.run_id, str(e))
        return scheduler_error(e)
    headers = {RUN_HEADER: run.run_id, UNIT_HEADER: unit}
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(
            _sse(sched, run, req, endpoint, body.model, include_usage),
            media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"},
        )
    try:
        done = await sched.wait(req)
    except SchedulerError as e:
        if run.auto_finish:
            sched.fail_run(run.run_id, str(e))
        return scheduler_error(e)
    finally:
        if not req.future.done():  # the client went away (task cancelled)
            sched.abandon(req)
    assert isinstance(done, Done)
    response = JSONResponse(_completion(endpoint, req.request_id, body.model, done),
                            headers=headers)
    if run.auto_finish:
        response.background = BackgroundTask(_finish_after_response, sched, run)
    return response


async def _finish_after_response(sched: LiveScheduler, run: LiveRun) -> None:
    """End a one-request run (no Hermes headers) once its answer has left.

    Finishing a run writes its record and durable document, learns from it and updates the
    metrics: work the client need not wait for (at concurrency 1 it was a fifth of the
    latency the gateway added). The answer is written first; the ``sleep(0)`` lets the
    coalesced write (:mod:`hermes.gateway.httpproto`) leave before the bookkeeping runs, which
    is still before the loop polls for the client's next request, so a ``GET /v1/runs/{id}``
    sent after the answer sees the run finished. One-request runs are stored when they end,
    so it is this write that moves after the answer (there is nothing in such a run to
    resume); a run left active by a failure here is finished by the idle sweep."""
    await asyncio.sleep(0)
    if run.status in ("queued", "running"):
        sched.finish_run(run.run_id)


def _usage(done: Done) -> dict[str, int]:
    return {"prompt_tokens": done.input_tokens, "completion_tokens": done.output_tokens,
            "total_tokens": done.input_tokens + done.output_tokens}


def _completion(endpoint: str, rid: str, model: str, done: Done) -> dict[str, Any]:
    created = int(time.time())
    if done.response and isinstance(done.response.get("choices"), list):
        resp = dict(done.response)
        resp["model"] = model
        resp.setdefault("usage", _usage(done))
        return resp
    if endpoint == "chat":
        return {
            "id": f"chatcmpl-{rid}", "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": done.text},
                         "logprobs": None, "finish_reason": done.finish_reason or "stop"}],
            "usage": _usage(done),
        }
    return {
        "id": f"cmpl-{rid}", "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": done.text, "logprobs": None,
                     "finish_reason": done.finish_reason or "stop"}],
        "usage": _usage(done),
    }


async def _sse(sched: LiveScheduler, run: LiveRun, req: PendingRequest, endpoint: str,
               model: str, include_usage: bool) -> AsyncIterator[bytes]:
    """Server-sent events in OpenAI's chunk format, ending with ``data: [DONE]``.

    An engine's own chunks (:attr:`Token.chunk`) are forwarded as they are, every field of
    every choice (tool-call deltas, logprobs, refusals, reasoning, extensions), with only what
    the gateway owns rewritten: ``id`` (the gateway's request id), ``model`` (the name the
    client asked for) and ``usage`` (``null`` on each chunk and one usage chunk at the end,
    with ``stream_options.include_usage``, as OpenAI; absent otherwise). An engine that
    streams text alone gets its chunks built from that text."""
    created = int(time.time())
    chat = endpoint == "chat"
    cid = f"{'chatcmpl' if chat else 'cmpl'}-{req.request_id}"
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None, *, first: bool = False,
              usage: dict | None = None, empty: bool = False) -> bytes:
        if empty:
            choices: list[dict[str, Any]] = []
        elif chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        else:
            choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
        data: dict[str, Any] = {"id": cid, "object": obj, "created": created, "model": model,
                                "choices": choices}
        if include_usage:
            data["usage"] = usage
        return f"data: {json.dumps(data)}\n\n".encode()

    def forward(raw: dict[str, Any]) -> bytes | None:
        """The engine's chunk with the gateway's id, model and usage; ``None`` for the
        engine's own usage-only chunk (the gateway sends its own at the end)."""
        choices = raw.get("choices")
        if not choices and raw.get("usage"):
            return None
        data = {**raw, "id": cid, "model": model}
        if include_usage:
            data["usage"] = None
        else:
            data.pop("usage", None)
        return f"data: {json.dumps(data)}\n\n".encode()

    completed = False
    try:
        raw_finished = False  # the engine's own chunks carried a finish_reason
        first = True
        async for tok in sched.stream(req):
            if tok.chunk is not None:
                out = forward(tok.chunk)
                if out is not None:
                    raw_finished = raw_finished or any(
                        c.get("finish_reason") for c in tok.chunk.get("choices") or ())
                    first = False
                    yield out
                continue
            if first and chat:
                yield chunk(None, None, first=True)
            first = False
            yield chunk(tok.text, None)
        done = req.result
        assert isinstance(done, Done)
        if not raw_finished:
            if first and chat:
                yield chunk(None, None, first=True)
            yield chunk(None, done.finish_reason or "stop")
        if include_usage:
            yield chunk(None, None, usage=_usage(done), empty=True)
        yield b"data: [DONE]\n\n"
        completed = True
        if run.auto_finish and run.status in ("queued", "running"):
            sched.finish_run(run.run_id)
    except SchedulerError as e:
        if run.auto_finish:
            sched.fail_run(run.run_id, str(e))
        err = {"error": {"message": str(e), "type": _ERROR_TYPES.get(e.status, "api_error"),
                         "param": None, "code": e.code}}
        yield f"data: {json.dumps(err)}\n\n".encode()
        completed = True
    finally:
        if not completed:  # client disconnected mid-stream
            sched.abandon(req)
            if run.auto_finish:
                sched.fail_run(run.run_id, "client disconnected")


@router.post("/v1/chat/completions", tags=["openai"])
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions (``stream: true`` for server-sent events)."""
    return await handle_completion(request, "chat")


@router.post("/v1/completions", tags=["openai"])
async def completions(request: Request) -> Response:
    """OpenAI text completions (``stream: true`` for server-sent events)."""
    return await handle_completion(request, "completions")


@router.post("/v1/embeddings", tags=["openai"])
async def embeddings(request: Request) -> Response:
    """OpenAI embeddings, served by an engine whose model embeds (``task = "embed"``; the
    embedded default has the built-in ``sim-embed``). A request is one LLM call of its run and
    unit like any other (it is queued by the run's rank); a chat model is refused (400)."""
    sched = _sched(request)
    try:
        body = EmbeddingBody.model_validate_json(await request.body())
    except ValidationError as e:
        return _body_error(e)
    if isinstance(body.input, list) and not body.input:
        return error_response(400, "input: must not be empty", param="input",
                              code="invalid_value")
    run: LiveRun | None = None
    try:
        model = await sched.serving_model(body.model, strict=True, task="embed")
        run, unit = await _bind_run(sched, request)
        inv = sched.unit_for_request(run, unit, f"llm:{model}")
        req = await sched.submit_llm(run, inv, model=model, endpoint="embeddings",
                                     body=body.model_dump(exclude_none=True, exclude={"model"}))
        done = await sched.wait(req)
    except SchedulerError as e:
        if run is not None and run.auto_finish:
            sched.fail_run(run.run_id, str(e))
        return scheduler_error(e)
    assert isinstance(done, Done)
    out = dict(done.response or {})
    out["model"] = body.model
    out.setdefault("object", "list")
    out.setdefault("usage", {"prompt_tokens": done.input_tokens,
                             "total_tokens": done.input_tokens})
    response = JSONResponse(out, headers={RUN_HEADER: run.run_id, UNIT_HEADER: unit})
    if run.auto_finish:
        response.background = BackgroundTask(_finish_after_response, sched, run)
    return response


def _model_obj(model: str, created: int) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": created, "owned_by": "hermes"}


@router.get("/v1/models/{model:path}", tags=["openai"])
async def get_model(request: Request, model: str) -> Response:
    """One served model (404 in OpenAI's shape if no connected engine serves it)."""
    sched = _sched(request)
    if not sched.nodes:
        await sched.wait_for_nodes(5.0)
    if model not in sched.served_models():
        return error_response(404, f"The model {model!r} does not exist", param="model",
                              code="model_not_found")
    return JSONResponse(_model_obj(model, int(time.time())))


@router.get("/v1/models", tags=["openai"])
async def models(request: Request) -> dict[str, Any]:
    """The models served by the connected engines (base models and loaded LoRA adapters)."""
    sched = _sched(request)
    if not sched.nodes:
        await sched.wait_for_nodes(5.0)
    created = int(time.time())
    return {"object": "list", "data": [_model_obj(m, created) for m in sched.served_models()]}

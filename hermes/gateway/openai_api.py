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

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
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
    return error_response(e.status, str(e), code=e.code)


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
        kind = e.errors()[0]
        if kind["type"] == "json_invalid":
            return error_response(400, "the request body is not valid JSON", code="invalid_json")
        if kind["type"] == "model_type" and not kind["loc"]:
            return error_response(400, "the request body must be a JSON object",
                                  code="invalid_json")
        return validation_error(e, 400)


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


@router.get("/v1/models", tags=["openai"])
async def models(request: Request) -> dict[str, Any]:
    """The models served by the connected engines (base models and loaded LoRA adapters)."""
    sched = _sched(request)
    if not sched.nodes:
        await sched.wait_for_nodes(5.0)
    created = int(time.time())
    return {"object": "list",
            "data": [{"id": m, "object": "model", "created": created, "owned_by": "hermes"}
                     for m in sched.served_models()]}

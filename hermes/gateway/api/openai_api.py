"""The OpenAI-compatible endpoint: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/v1/models``.

An agent written against the OpenAI SDK works by changing its base URL: its requests are
bound to runs so that the scheduler can rank them by the whole application
(:mod:`hermes.gateway.api.binding`): named by ``X-Hermes-*`` headers (``X-Hermes-Run``,
``X-Hermes-Unit``, ``X-Hermes-App``, ``X-Hermes-K``, ``X-Hermes-Deadline-S``), or inferred
from the traffic itself (session ids, conversation continuation) when it sends none.

The completion endpoints stream with ``stream: true`` (server-sent events in OpenAI's chunk
format, ``stream_options.include_usage`` honoured). Errors use OpenAI's JSON shape
``{"error": {"message", "type", "param", "code"}}`` (:mod:`hermes.gateway.api.errors`): 400
for a bad body (``param`` names the field), 404 for an unknown run or model, 409 for a run
that is no longer active. The edge parses and answers; the scheduler's services do the rest.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hermes.gateway.api.appstate import scheduler_of
from hermes.gateway.api.binding import (
    BoundCall,
    answer,
    call_abandoned,
    call_answered,
    call_ended,
    chat_replies,
    submit_call,
    wait_call,
)
from hermes.gateway.api.errors import error_response, scheduler_error
from hermes.gateway.api.openai_bodies import (
    EmbeddingBody,
    engine_body,
    parse_completion_body,
    validate_body,
)
from hermes.gateway.errors import SchedulerError, error_type
from hermes.gateway.resolve import ChatReplies
from hermes.gateway.scheduler import LiveScheduler
from hermes.protocol import Done

router = APIRouter()


async def handle_completion(request: Request,
                            endpoint: Literal["chat", "completions"]) -> Response:
    """One completion request, from body to answer: bind it to its run and unit (headers),
    queue it by the run's rank, wait or stream (the FastAPI routes below and the fast path,
    :mod:`hermes.gateway.api.fastpath`, both call this)."""
    sched = scheduler_of(request)
    parsed = await parse_completion_body(request, endpoint)
    if isinstance(parsed, JSONResponse):
        return parsed
    body = parsed
    try:
        ebody = engine_body(body)
        call = await submit_call(sched, request, model=body.model, endpoint=endpoint,
                                 body=ebody, stream=body.stream,
                                 client_body={**ebody, "model": body.model})
    except SchedulerError as e:
        return scheduler_error(e)
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(
            _sse(sched, call, endpoint, body.model, include_usage),
            media_type="text/event-stream", headers={**call.headers, "Cache-Control": "no-cache"},
        )
    try:
        done = await wait_call(sched, call)
    except SchedulerError as e:
        return scheduler_error(e)
    content = completion_object(endpoint, call.req.request_id, body.model, done)
    return answer(sched, call, content,
                  replies=chat_replies(content) if endpoint == "chat" else None)


def _usage(done: Done) -> dict[str, int]:
    return {"prompt_tokens": done.input_tokens, "completion_tokens": done.output_tokens,
            "total_tokens": done.input_tokens + done.output_tokens}


def completion_object(endpoint: str, rid: str, model: str, done: Done) -> dict[str, Any]:
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


class ChunkWriter:
    """Server-sent events of one streamed completion in OpenAI's chunk format.

    An engine's own chunks (:attr:`Token.chunk`) are forwarded as they are, every field of
    every choice (tool-call deltas, logprobs, refusals, reasoning, extensions), with only what
    the gateway owns rewritten: ``id`` (the gateway's request id), ``model`` (the name the
    client asked for) and ``usage`` (``null`` on each chunk and one usage chunk at the end,
    with ``stream_options.include_usage``, as OpenAI; absent otherwise). An engine that
    streams text alone gets its chunks built from that text. (The all-in-one gateway and an
    edge, :mod:`hermes.gateway.edge.front`, write the same events.)"""

    __slots__ = ("cid", "obj", "chat", "created", "model", "include_usage")

    def __init__(self, rid: str, endpoint: str, model: str, include_usage: bool) -> None:
        self.chat = endpoint == "chat"
        self.cid = f"{'chatcmpl' if self.chat else 'cmpl'}-{rid}"
        self.obj = "chat.completion.chunk" if self.chat else "text_completion"
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    def chunk(self, text: str | None, finish: str | None, *, first: bool = False,
              usage: dict[str, int] | None = None, empty: bool = False) -> bytes:
        if empty:
            choices: list[dict[str, Any]] = []
        elif self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        else:
            choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
        data: dict[str, Any] = {"id": self.cid, "object": self.obj, "created": self.created,
                                "model": self.model, "choices": choices}
        if self.include_usage:
            data["usage"] = usage
        return f"data: {json.dumps(data)}\n\n".encode()

    def forward(self, raw: dict[str, Any]) -> bytes | None:
        """The engine's chunk with the gateway's id, model and usage; ``None`` for the
        engine's own usage-only chunk (the gateway sends its own at the end)."""
        choices = raw.get("choices")
        if not choices and raw.get("usage"):
            return None
        data = {**raw, "id": self.cid, "model": self.model}
        if self.include_usage:
            data["usage"] = None
        else:
            data.pop("usage", None)
        return f"data: {json.dumps(data)}\n\n".encode()

    def usage(self, done: Done) -> bytes:
        return self.chunk(None, None, usage=_usage(done), empty=True)


async def _sse(sched: LiveScheduler, call: BoundCall, endpoint: str, model: str,
               include_usage: bool) -> AsyncIterator[bytes]:
    """Server-sent events in OpenAI's chunk format (:class:`ChunkWriter`), ending with
    ``data: [DONE]``."""
    req = call.req
    w = ChunkWriter(req.request_id, endpoint, model, include_usage)
    chunk, forward, chat = w.chunk, w.forward, w.chat

    completed = False
    replies = ChatReplies() if chat and call.wants_reply else None
    try:
        raw_finished = False  # the engine's own chunks carried a finish_reason
        first = True
        async for tok in sched.stream(req):
            if replies is not None:
                replies.feed(tok.chunk, tok.text)
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
            yield w.usage(done)
        call_answered(sched, call, None if replies is None else replies.messages())
        yield b"data: [DONE]\n\n"
        completed = True
        call_ended(sched, call)
    except SchedulerError as e:
        call_ended(sched, call, str(e))
        err = {"error": {"message": str(e), "type": error_type(e.status),
                         "param": None, "code": e.code}}
        yield f"data: {json.dumps(err)}\n\n".encode()
        completed = True
    finally:
        if not completed:  # client disconnected mid-stream
            call_abandoned(sched, call)


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
    sched = scheduler_of(request)
    body = validate_body(await request.body(), EmbeddingBody)
    if isinstance(body, JSONResponse):
        return body
    try:
        call = await submit_call(sched, request, model=body.model, endpoint="embeddings",
                                 body=body.model_dump(exclude_none=True, exclude={"model"}),
                                 task="embed")
        done = await wait_call(sched, call)
    except SchedulerError as e:
        return scheduler_error(e)
    return answer(sched, call, embeddings_object(body.model, done))


def embeddings_object(model: str, done: Done) -> dict[str, Any]:
    """The embeddings answer of a node's ``done`` (the engine's list object, the model the
    client asked for, usage from the counts when the engine gave none). (The all-in-one
    gateway and an edge, :mod:`hermes.gateway.edge.front`, answer with it.)"""
    out = dict(done.response or {})
    out["model"] = model
    out.setdefault("object", "list")
    out.setdefault("usage", {"prompt_tokens": done.input_tokens,
                             "total_tokens": done.input_tokens})
    return out


def _model_obj(model: str, created: int) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": created, "owned_by": "hermes"}


@router.get("/v1/models/{model:path}", tags=["openai"])
async def get_model(request: Request, model: str) -> Response:
    """One served model (404 in OpenAI's shape if no connected engine serves it)."""
    sched = scheduler_of(request)
    if not sched.nodes:
        await sched.wait_for_nodes(5.0)
    if model not in sched.served_models():
        return error_response(404, f"The model {model!r} does not exist", param="model",
                              code="model_not_found")
    return JSONResponse(_model_obj(model, int(time.time())))


@router.get("/v1/models", tags=["openai"])
async def models(request: Request) -> dict[str, Any]:
    """The models served by the connected engines (base models and loaded LoRA adapters)."""
    sched = scheduler_of(request)
    if not sched.nodes:
        await sched.wait_for_nodes(5.0)
    created = int(time.time())
    return {"object": "list", "data": [_model_obj(m, created) for m in sched.served_models()]}

"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

The Anthropic SDK, Claude Code, the Claude Agent SDK and every tool built on them work by
pointing their base URL at the gateway (``ANTHROPIC_BASE_URL``). Authentication is the
gateway's own: ``X-API-Key: KEY`` (what the SDK sends) or ``Authorization: Bearer KEY``; an
``anthropic-version`` header, when sent, must be a date (the gateway speaks the 2023-06-01
protocol every SDK asks for).

A request goes the chat endpoint's way through the scheduler: bound to a run and unit as every
OpenAI request is (:func:`hermes.gateway.api.binding.submit_call`: ``X-Hermes-*`` headers, or
inferred from the conversation it continues, or a session id such as Claude Code's
``X-Claude-Code-Session-Id`` header or the ``_session_`` part of its ``metadata.user_id``),
ranked by its run, served by an engine of the model. The body is checked
(:mod:`hermes.gateway.api.anthropic_bodies`) and goes to the engine in one of two forms
(:attr:`hermes.protocol.Submit.native`), chosen where the engine is known, at its node: as
sent, to an engine that serves ``/v1/messages`` itself (``messages_api = "native"``: vLLM),
whose ``message`` or events pass back untranslated (with the gateway's message id and the
model asked for); translated to a chat completion (:mod:`hermes.anthropic_wire`) for the
others, the built-in engine included, whose answer is translated back: a ``message``, or
(``stream: true``) Anthropic's event stream as server-sent events (``event: TYPE`` /
``data: JSON``). Every error on these routes takes Anthropic's shape,
``{"type": "error", "error": {"type", "message"}}``, the gateway's own too (401, 413, 429, a
503 without engines as 529 ``overloaded_error``: :func:`hermes.gateway.errors.wire_error`).

``count_tokens`` answers ``{"input_tokens": N}``, the gateway's estimate
(:func:`hermes.anthropic_wire.count_tokens`): no engine is asked.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hermes.anthropic_wire import (
    CountTokensBody,
    EventContent,
    MessagesBody,
    MessagesError,
    MessageStreamer,
    assistant_reply,
    count_tokens,
    error_body,
    from_chat,
    status,
    to_chat,
)
from hermes.gateway.api.anthropic_bodies import check_version, parse_body, resolver_body
from hermes.gateway.api.appstate import scheduler_of
from hermes.gateway.api.binding import (
    BoundCall,
    answer,
    call_abandoned,
    call_answered,
    call_ended,
    submit_call,
    wait_call,
)
from hermes.gateway.api.openai_api import completion_object
from hermes.gateway.errors import SchedulerError
from hermes.gateway.scheduler import LiveScheduler
from hermes.protocol import Done

router = APIRouter()

VERSION_HEADER = "anthropic-version"


def _error(code: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(code, message), status_code=status(code))


def _refused(e: MessagesError | SchedulerError) -> JSONResponse:
    return _error(e.status, str(e))


async def _parse(request: Request, cls: type[MessagesBody] | type[CountTokensBody]
                 ) -> MessagesBody | CountTokensBody | JSONResponse:
    try:
        check_version(request.headers.get(VERSION_HEADER))
        body = parse_body(await request.body(), cls)
    except MessagesError as e:
        return _refused(e)
    assert isinstance(body, cls)
    return body


@router.post("/v1/messages", tags=["anthropic"])
async def create_message(request: Request) -> Response:
    """Create a message (``stream: true`` for Anthropic's event stream)."""
    sched = scheduler_of(request)
    parsed = await _parse(request, MessagesBody)
    if isinstance(parsed, JSONResponse):
        return parsed
    assert isinstance(parsed, MessagesBody)
    body = parsed
    raw = json.loads(await request.body())  # valid: parsed above
    native = {"endpoint": "messages",
              "body": {k: v for k, v in raw.items() if k not in ("model", "stream")}}
    try:
        chat = to_chat(body)
        call = await submit_call(sched, request, model=body.model, endpoint="chat", body=chat,
                                 stream=body.stream, client_body=resolver_body(body, chat),
                                 messages=chat["messages"], native=native)
    except (MessagesError, SchedulerError) as e:
        return _refused(e)
    message_id = f"msg_{call.req.request_id}"
    headers = {**call.headers, "request-id": call.req.request_id}
    if body.stream:
        streamer = MessageStreamer(message_id=message_id, model=body.model,
                                   input_tokens=count_tokens(body),
                                   stop_sequences=body.stop_sequences)
        return StreamingResponse(_events(sched, call, streamer), media_type="text/event-stream",
                                 headers={**headers, "Cache-Control": "no-cache"})
    try:
        done = await wait_call(sched, call)
    except SchedulerError as e:
        return _refused(e)
    if isinstance(done.response, dict) and done.response.get("type") == "message":
        message = {**done.response, "id": message_id, "model": body.model}  # served natively
    else:
        completion = completion_object("chat", call.req.request_id, body.model, done)
        message = from_chat(completion, message_id=message_id, model=body.model,
                            stop_sequences=body.stop_sequences)
    response = answer(sched, call, message, replies=assistant_reply(message["content"]))
    response.headers["request-id"] = call.req.request_id
    return response


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def _events(sched: LiveScheduler, call: BoundCall, tr: MessageStreamer
                  ) -> AsyncIterator[bytes]:
    """Anthropic's event stream of a streamed request: the engine's own events when it serves
    ``/v1/messages`` itself (the message's ``id`` and ``model`` the gateway's), else the chat
    chunks translated (:class:`MessageStreamer`). The resolver is told the reply before
    ``message_stop`` leaves, so that a client continuing at once finds the run; a failure
    mid-stream is an ``error`` event (Anthropic's shape) and fails a one-request run; a client
    that went away has its request abandoned at its node."""
    completed = False
    started = False  # message_start has left (the engine's or the translation's)
    native: EventContent | None = None
    try:
        async for tok in sched.stream(call.req):
            ev = tok.chunk
            if ev is not None and "type" in ev and "choices" not in ev:  # Anthropic's event
                if native is None:
                    native = EventContent()
                started = True
                kind = str(ev["type"])
                if kind == "message_start":
                    ev = {**ev, "message": {**(ev.get("message") or {}), "id": tr.message_id,
                                            "model": tr.model}}
                elif kind == "message_stop":
                    call_answered(sched, call, assistant_reply(native.content))
                native.feed(ev)
                yield _sse(kind, ev)
                continue
            if not started:
                started = True
                for e in tr.start():
                    yield _sse(*e)
            events = tr.feed_chunk(ev) if ev is not None else tr.feed_text(tok.text)
            for e in events:
                yield _sse(*e)
        if native is None:
            if not started:
                for e in tr.start():
                    yield _sse(*e)
            done = call.req.result
            assert isinstance(done, Done)
            final = tr.finish(done.finish_reason, input_tokens=done.input_tokens,
                              output_tokens=done.output_tokens)
            call_answered(sched, call, assistant_reply(tr.content))
            for e in final:
                yield _sse(*e)
        completed = True
        call_ended(sched, call)
    except SchedulerError as e:
        call_ended(sched, call, str(e))
        yield _sse("error", error_body(e.status, str(e)))
        completed = True
    finally:
        if not completed:  # client disconnected mid-stream
            call_abandoned(sched, call)


@router.post("/v1/messages/count_tokens", tags=["anthropic"])
async def count_message_tokens(request: Request) -> Response:
    """The prompt's tokens (the gateway's estimate: 4 characters a token; no engine is
    asked), ``{"input_tokens": N}``; the model must be served (404 otherwise)."""
    sched = scheduler_of(request)
    parsed = await _parse(request, CountTokensBody)
    if isinstance(parsed, JSONResponse):
        return parsed
    try:
        await sched.serving_model(parsed.model, strict=True)
        n = count_tokens(parsed)
    except (MessagesError, SchedulerError) as e:
        return _refused(e)
    return JSONResponse({"input_tokens": n})

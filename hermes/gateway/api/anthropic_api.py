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

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hermes.anthropic_wire import (
    CountTokensBody,
    MessagesError,
    assistant_reply,
    count_tokens,
    error_body,
    status,
)
from hermes.gateway.api.anthropic_answers import (
    VERSION_HEADER,
    MessageEvents,
    message_object,
    message_request,
)
from hermes.gateway.api.anthropic_bodies import check_version, parse_body
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
from hermes.gateway.errors import SchedulerError
from hermes.gateway.scheduler import LiveScheduler
from hermes.protocol import Done

router = APIRouter()


def _error(code: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(code, message), status_code=status(code))


def _refused(e: MessagesError | SchedulerError) -> JSONResponse:
    return _error(e.status, str(e))


async def _parse(request: Request, cls: type[CountTokensBody]
                 ) -> CountTokensBody | JSONResponse:
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
    try:
        m = message_request(await request.body(), request.headers.get(VERSION_HEADER))
        call = await submit_call(sched, request, model=m.body.model, endpoint="chat",
                                 body=m.chat, stream=m.body.stream, client_body=m.evidence,
                                 messages=m.chat["messages"], native=m.native)
    except (MessagesError, SchedulerError) as e:
        return _refused(e)
    rid = call.req.request_id
    headers = {**call.headers, "request-id": rid}
    if m.body.stream:
        events = MessageEvents(rid, m.body, lambda reply: call_answered(sched, call, reply))
        return StreamingResponse(_events(sched, call, events), media_type="text/event-stream",
                                 headers={**headers, "Cache-Control": "no-cache"})
    try:
        done = await wait_call(sched, call)
    except SchedulerError as e:
        return _refused(e)
    message = message_object(done, rid, m.body)
    response = answer(sched, call, message, replies=assistant_reply(message["content"]))
    response.headers["request-id"] = rid
    return response


async def _events(sched: LiveScheduler, call: BoundCall, events: MessageEvents
                  ) -> AsyncIterator[bytes]:
    """Anthropic's event stream of a streamed request (:class:`MessageEvents`). A failure
    mid-stream is an ``error`` event (Anthropic's shape) and fails a one-request run; a client
    that went away has its request abandoned at its node."""
    completed = False
    try:
        async for tok in sched.stream(call.req):
            for out in events.feed(tok):
                yield out
        done = call.req.result
        assert isinstance(done, Done)
        for out in events.finish(done):
            yield out
        completed = True
        call_ended(sched, call)
    except SchedulerError as e:
        call_ended(sched, call, str(e))
        yield events.error(e.status, str(e))
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

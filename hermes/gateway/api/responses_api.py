"""OpenAI's Responses API: ``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items``.

A request is translated to a chat-completions body (:mod:`hermes.gateway.responses`) and goes
the chat endpoint's way through the scheduler: bound to a run and unit as every OpenAI request
is (:func:`hermes.gateway.api.binding.bind_run`: ``X-Hermes-*`` headers, or inferred: the run of
the response ``previous_response_id`` names, of a session id, or of the conversation the
``input`` continues), ranked by its run, served by an engine of the model; the answer is
translated back (``stream: true``: the Responses event stream as server-sent events,
``event: TYPE`` / ``data: JSON``). Stored responses (``store``, default true) are kept per
tenant (the API key's, :func:`hermes.gateway.auth.tenant_for`) in a
:class:`~hermes.gateway.responses.ResponseStore` on ``app.state.responses``, with the
conversation each ended with, so that ``previous_response_id`` continues it; an unknown,
expired or other tenant's id is a 404 naming ``previous_response_id``.

Engines that serve ``/v1/responses`` themselves are not passed the body natively yet: see
:func:`hermes.gateway.api.responses_answers.engine_request`, the one place that decides
what the engine gets (the request, the answer and the event stream are written there, for
the all-in-one gateway and an edge alike).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

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
from hermes.gateway.api.errors import error_response, scheduler_error
from hermes.gateway.api.responses_answers import (
    ResponseEvents,
    delete_stored,
    response_answer,
    response_request,
    store_unavailable,
    stored_items,
    stored_response,
)
from hermes.gateway.auth import tenant_for
from hermes.gateway.errors import SchedulerError
from hermes.gateway.responses import (
    DEFAULT_MAX_STORED,
    DEFAULT_RETENTION_S,
    ResponsesError,
    ResponseStorage,
    ResponseStore,
)
from hermes.gateway.scheduler import LiveScheduler
from hermes.gateway.shared import StoreUnavailable
from hermes.protocol import Done

router = APIRouter()

RETENTION_S = DEFAULT_RETENTION_S  # how long a stored response can be read or continued
MAX_STORED = DEFAULT_MAX_STORED  # stored responses per tenant (its oldest dropped)


def response_store(request: Request) -> ResponseStorage:
    """The gateway's response store (``app.state.responses``: in Redis with a shared store,
    :mod:`hermes.gateway.shared`; else in memory, created on first use)."""
    state = request.app.state
    store = getattr(state, "responses", None)
    if store is None:
        store = state.responses = ResponseStore(max_age_s=RETENTION_S, max_items=MAX_STORED)
    return store


def _error(e: ResponsesError) -> JSONResponse:
    return error_response(e.status, str(e), param=e.param, code=e.code)


@router.post("/v1/responses", tags=["openai"])
async def create_response(request: Request) -> Response:
    """Create a model response (``stream: true`` for the Responses event stream)."""
    sched = scheduler_of(request)
    tenant = tenant_for(request, None)
    store = response_store(request)
    try:
        r = response_request(await request.body(), store, tenant)
    except ResponsesError as e:
        return _error(e)
    except StoreUnavailable as e:
        return store_unavailable(e)
    try:
        call = await submit_call(sched, request, model=r.req.model, endpoint=r.endpoint,
                                 body=r.body, stream=r.req.stream, client_body=r.raw,
                                 messages=r.body["messages"])
    except SchedulerError as e:
        return scheduler_error(e)
    if r.req.stream:
        events = ResponseEvents(r, store, tenant, lambda reply, response_id: call_answered(
            sched, call, reply, response_id=response_id))
        return StreamingResponse(
            _events(sched, call, events),
            media_type="text/event-stream", headers={**call.headers, "Cache-Control": "no-cache"})
    try:
        done = await wait_call(sched, call)
    except SchedulerError as e:
        return scheduler_error(e)
    resp, reply = response_answer(done, call.req.request_id, r, store, tenant,
                                  call.run.run_id)
    return answer(sched, call, resp, replies=reply,
                  response_id=resp["id"] if r.req.store else None)


async def _events(sched: LiveScheduler, call: BoundCall, events: ResponseEvents
                  ) -> AsyncIterator[bytes]:
    """The Responses event stream of a streamed request (:class:`ResponseEvents`: the
    response is stored before its last event leaves, so that a client continuing it at once
    finds it); a header-less run is finished after it (failed on an error, and on a client
    that went away, whose request is abandoned at its node)."""
    completed = False
    try:
        for out in events.start():
            yield out
        async for tok in sched.stream(call.req):
            for out in events.feed(tok):
                yield out
        done = call.req.result
        assert isinstance(done, Done)
        for out in events.finish(done, call.run.run_id):
            yield out
        completed = True
        call_ended(sched, call)
    except SchedulerError as e:
        call_ended(sched, call, str(e))
        for out in events.fail(str(e)):
            yield out
        completed = True
    finally:
        if not completed:  # client disconnected mid-stream
            call_abandoned(sched, call)


@router.get("/v1/responses/{response_id}", tags=["openai"])
async def get_response(request: Request, response_id: str) -> Response:
    """A stored response (404 when unknown, expired, not stored or another tenant's)."""
    return stored_response(response_store(request), tenant_for(request, None), response_id)


@router.delete("/v1/responses/{response_id}", tags=["openai"])
async def delete_response(request: Request, response_id: str) -> Response:
    """Delete a stored response (it can no longer be read or continued)."""
    return delete_stored(response_store(request), tenant_for(request, None), response_id)


@router.get("/v1/responses/{response_id}/input_items", tags=["openai"])
async def list_input_items(request: Request, response_id: str, limit: int = 20,
                           order: str = "desc", after: str | None = None) -> Response:
    """The input items of a stored response, as a list object (``order`` ``desc``, newest
    first, by default as OpenAI; ``after``: an item id to page on; ``limit`` 1 to 100)."""
    return stored_items(response_store(request), tenant_for(request, None), response_id,
                        limit=limit, order=order, after=after)

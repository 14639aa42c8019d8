"""OpenAI's Responses API from request to answer, as every front end writes it: the
all-in-one gateway (:mod:`hermes.gateway.api.responses_api`) and an edge with a shared
response store (:mod:`hermes.gateway.edge.front`), which differ only in where a node's
tokens and answer come from.

- :func:`response_request`: the body checked (:func:`~hermes.gateway.responses.parse_request`),
  the conversation ``previous_response_id`` continues read from the store, and the chat body
  the engine gets (:func:`engine_request`, the one place deciding it);
- :func:`response_answer`: the ``response`` of a node's ``done``, stored (``store``, default
  true) with the conversation it ends, so that ``previous_response_id`` continues it;
- :class:`ResponseEvents`: a streamed answer as the Responses event stream, the response
  stored and the reply told (``on_reply``) before the last event leaves, so that a client
  continuing at once finds both;
- :func:`stored_response`, :func:`delete_stored`, :func:`stored_items`: the answers of
  ``GET``/``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from starlette.responses import JSONResponse

from hermes.core import strict_json
from hermes.gateway.api.errors import error_response
from hermes.gateway.api.openai_api import completion_object
from hermes.gateway.responses import (
    ResponsesError,
    ResponsesRequest,
    ResponseStorage,
    ResponseStreamer,
    assistant_message,
    from_chat,
    input_items,
    input_messages,
    new_response_id,
    parse_request,
    to_chat,
)
from hermes.gateway.shared import StoreUnavailable
from hermes.protocol import Done, Token

#: what the resolver is told of a call's reply: (the assistant message, the stored
#: response's id or None)
OnReply = Callable[[dict[str, Any], str | None], None]


def parse_json(raw: bytes) -> Any:
    """The body as strict JSON (:mod:`hermes.core.strict_json`: a lone surrogate, NaN or
    deep nesting is a 400 naming where, not a 500 after the work), else ResponsesError."""
    try:
        return strict_json.loads(raw)
    except strict_json.StrictJSONError as e:
        raise ResponsesError(f"the request body is not valid JSON ({e})", param=e.path or None,
                             code="invalid_json") from None


def engine_request(req: ResponsesRequest, history: list[dict[str, Any]]
                   ) -> tuple[Literal["chat"], dict[str, Any]]:
    """The endpoint and body the engine gets: the one place to add pass-through. Always
    chat completions today. An engine that serves ``/v1/responses`` itself (recent vLLM,
    OpenAI) could get the body as it is, with ``previous_response_id`` resolved into
    ``input`` from the store (engines do not share the gateway's store), once the node
    protocol has a ``responses`` endpoint (:class:`hermes.protocol.Submit`) and engines
    advertise it in their hello; its answer and events would then pass back untranslated."""
    return "chat", to_chat(req, history)


@dataclass(slots=True)
class ResponseRequest:
    """A checked ``POST /v1/responses``: the request, the body as sent (what the run
    resolver reads), the engine's endpoint and body, and the chat conversation so far
    (``previous_response_id``'s, then this request's input)."""

    req: ResponsesRequest
    raw: dict[str, Any]
    endpoint: Literal["chat"]
    body: dict[str, Any]
    conversation: list[dict[str, Any]]


def response_request(raw: bytes, store: ResponseStorage, tenant: str | None
                     ) -> ResponseRequest:
    """The request of body ``raw`` for ``tenant``, or the :class:`ResponsesError` to answer
    (400 naming the field; 404 ``previous_response_not_found`` for an unknown, expired or
    other tenant's ``previous_response_id``). A shared store that cannot answer raises
    :class:`~hermes.gateway.shared.StoreUnavailable`."""
    data = parse_json(raw)
    req = parse_request(data)
    assert isinstance(data, dict)
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        prev = store.get(tenant, req.previous_response_id)
        if prev is None:
            raise ResponsesError(f"Previous response with id {req.previous_response_id!r} "
                                 "not found.", param="previous_response_id", status=404,
                                 code="previous_response_not_found")
        history = prev.conversation
    endpoint, body = engine_request(req, history)
    return ResponseRequest(req, data, endpoint, body, [*history, *input_messages(req)])


def keep(store: ResponseStorage, tenant: str | None, r: ResponseRequest,
         resp: dict[str, Any], reply: dict[str, Any], run_id: str | None) -> None:
    """Store a response when the request asks (``store``); a shared store that does not
    answer leaves it unstored (the answer still goes out: it is generated; the store logs
    and counts the outage)."""
    if not r.req.store:
        return
    try:
        store.put(tenant, resp, input_items(r.req), [*r.conversation, reply], run_id=run_id)
    except StoreUnavailable:
        pass


def response_answer(done: Done, rid: str, r: ResponseRequest, store: ResponseStorage,
                    tenant: str | None, run_id: str | None
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``response`` of the node's ``done`` of request ``rid`` and its assistant message,
    the response stored (:func:`keep`) under ``run_id``."""
    chat = completion_object("chat", rid, r.req.model, done)
    resp = from_chat(chat, r.req, response_id=new_response_id(), created_at=time.time())
    reply = assistant_message(resp)
    keep(store, tenant, r, resp, reply, run_id)
    return resp, reply


def sse(event: dict[str, Any]) -> bytes:
    """One server-sent event of the Responses stream."""
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


class ResponseEvents:
    """The Responses event stream of one streamed request: :meth:`start`, :meth:`feed` each
    token, :meth:`finish` with the node's ``done`` (the response stored, ``on_reply`` told,
    before the last events), or :meth:`fail`."""

    __slots__ = ("tr", "r", "store", "tenant", "on_reply")

    def __init__(self, r: ResponseRequest, store: ResponseStorage, tenant: str | None,
                 on_reply: OnReply) -> None:
        self.tr = ResponseStreamer(r.req, created_at=time.time())
        self.r = r
        self.store = store
        self.tenant = tenant
        self.on_reply = on_reply

    def start(self) -> list[bytes]:
        return [sse(ev) for ev in self.tr.start()]

    def feed(self, tok: Token) -> list[bytes]:
        tr = self.tr
        events = tr.feed_chunk(tok.chunk) if tok.chunk is not None else tr.feed_text(tok.text)
        return [sse(ev) for ev in events]

    def finish(self, done: Done, run_id: str | None) -> list[bytes]:
        tr = self.tr
        final = tr.finish(done.finish_reason, input_tokens=done.input_tokens,
                          output_tokens=done.output_tokens)
        assert tr.response is not None
        reply = assistant_message(tr.response)
        keep(self.store, self.tenant, self.r, tr.response, reply, run_id)
        self.on_reply(reply, tr.response["id"] if self.r.req.store else None)
        return [sse(ev) for ev in final]

    def fail(self, message: str) -> list[bytes]:
        return [sse(ev) for ev in self.tr.fail(message)]


# ------------------------------------------------------------------ stored responses
def store_unavailable(e: StoreUnavailable) -> JSONResponse:
    """The 503 of a shared store that cannot answer (the client retries)."""
    return error_response(503, f"{e}; retry later", code="store_unavailable",
                          headers={"Retry-After": "1"})


def _not_found(response_id: str) -> JSONResponse:
    return error_response(404, f"Response with id {response_id!r} not found.",
                          code="response_not_found")


def stored_response(store: ResponseStorage, tenant: str | None, response_id: str
                    ) -> JSONResponse:
    """A stored response (404 when unknown, expired, not stored or another tenant's)."""
    try:
        entry = store.get(tenant, response_id)
    except StoreUnavailable as e:
        return store_unavailable(e)
    if entry is None:
        return _not_found(response_id)
    return JSONResponse(entry.response)


def delete_stored(store: ResponseStorage, tenant: str | None, response_id: str
                  ) -> JSONResponse:
    """Delete a stored response (it can no longer be read or continued)."""
    try:
        deleted = store.delete(tenant, response_id)
    except StoreUnavailable as e:
        return store_unavailable(e)
    if not deleted:
        return _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def stored_items(store: ResponseStorage, tenant: str | None, response_id: str, *,
                 limit: int, order: str, after: str | None) -> JSONResponse:
    """The input items of a stored response, as a list object (``order`` ``desc``, newest
    first, by default as OpenAI; ``after``: an item id to page on; ``limit`` 1 to 100)."""
    if not 1 <= limit <= 100:
        return error_response(400, "limit: must be between 1 and 100", param="limit")
    if order not in ("asc", "desc"):
        return error_response(400, "order: expected 'asc' or 'desc'", param="order")
    try:
        entry = store.get(tenant, response_id)
    except StoreUnavailable as e:
        return store_unavailable(e)
    if entry is None:
        return _not_found(response_id)
    items = entry.input_items if order == "asc" else entry.input_items[::-1]
    if after is not None:
        ids = [it.get("id") for it in items]
        if after not in ids:
            return error_response(400, f"after: no input item {after!r}", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return JSONResponse({"object": "list", "data": page,
                         "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None,
                         "has_more": len(items) > limit})

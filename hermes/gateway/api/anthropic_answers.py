"""Anthropic's Messages API from request to answer, as every front end writes it: the
all-in-one gateway (:mod:`hermes.gateway.api.anthropic_api`) and an edge
(:mod:`hermes.gateway.edge.front`), which differ only in where a node's tokens and answer come
from (the scheduler in the same process, or the node straight to the edge).

- :func:`message_request`: the ``anthropic-version`` header and the body checked
  (:mod:`hermes.gateway.api.anthropic_bodies`), the chat form the engine gets, the request as
  sent for an engine that serves ``/v1/messages`` itself (``native``) and the evidence the run
  resolver reads;
- :func:`message_object`: the ``message`` of a node's ``done`` (the engine's own, with the
  gateway's id and the model asked for, or the chat completion translated);
- :class:`MessageEvents`: a streamed answer's tokens as Anthropic's server-sent events (the
  engine's own events passed on, or the chat chunks translated), the reply told (``on_reply``)
  before the last event leaves so that a client continuing at once finds its run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hermes.anthropic_wire import (
    EventContent,
    MessagesBody,
    MessageStreamer,
    assistant_reply,
    count_tokens,
    error_body,
    from_chat,
    to_chat,
)
from hermes.gateway.api.anthropic_bodies import check_version, parse_body, resolver_body
from hermes.gateway.api.openai_api import completion_object
from hermes.protocol import Done, Token

#: the header naming the protocol version (a date)
VERSION_HEADER = "anthropic-version"


@dataclass(slots=True)
class MessageRequest:
    """A checked ``POST /v1/messages``: the body, its chat form (what a translating engine
    gets), the request as sent (``native``: for an engine serving ``/v1/messages`` itself,
    :attr:`hermes.protocol.Submit.native`) and what the run resolver reads (``evidence``)."""

    body: MessagesBody
    chat: dict[str, Any]
    native: dict[str, Any]
    evidence: dict[str, Any]


def message_request(raw: bytes, version: str | None) -> MessageRequest:
    """The request of ``raw`` (the body) and ``version`` (the ``anthropic-version`` header),
    or the :class:`~hermes.anthropic_wire.MessagesError` naming what is wrong."""
    check_version(version)
    body = parse_body(raw, MessagesBody)
    assert isinstance(body, MessagesBody)
    sent = json.loads(raw)  # valid: parsed above
    native = {"endpoint": "messages",
              "body": {k: v for k, v in sent.items() if k not in ("model", "stream")}}
    chat = to_chat(body)
    return MessageRequest(body, chat, native, resolver_body(body, chat))


def message_object(done: Done, rid: str, body: MessagesBody) -> dict[str, Any]:
    """The ``message`` answering ``body`` from the node's ``done`` of request ``rid``."""
    message_id = f"msg_{rid}"
    if isinstance(done.response, dict) and done.response.get("type") == "message":
        return {**done.response, "id": message_id, "model": body.model}  # served natively
    completion = completion_object("chat", rid, body.model, done)
    return from_chat(completion, message_id=message_id, model=body.model,
                     stop_sequences=body.stop_sequences)


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event of Anthropic's stream."""
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class MessageEvents:
    """The event stream of one streamed request ``rid``: :meth:`feed` each token,
    :meth:`finish` with the node's ``done``, or :meth:`error`. The engine's own events (it
    serves ``/v1/messages``) pass on with the gateway's message id and the model asked for;
    chat chunks or text are translated (:class:`~hermes.anthropic_wire.MessageStreamer`).
    ``on_reply`` gets the assistant's reply before ``message_stop`` leaves."""

    __slots__ = ("tr", "on_reply", "native", "started")

    def __init__(self, rid: str, body: MessagesBody,
                 on_reply: Callable[[dict[str, Any]], None]) -> None:
        self.tr = MessageStreamer(message_id=f"msg_{rid}", model=body.model,
                                  input_tokens=count_tokens(body),
                                  stop_sequences=body.stop_sequences)
        self.on_reply = on_reply
        self.native: EventContent | None = None
        self.started = False  # message_start has left (the engine's or the translation's)

    def feed(self, tok: Token) -> list[bytes]:
        tr = self.tr
        ev = tok.chunk
        if ev is not None and "type" in ev and "choices" not in ev:  # Anthropic's event
            if self.native is None:
                self.native = EventContent()
            self.started = True
            kind = str(ev["type"])
            if kind == "message_start":
                ev = {**ev, "message": {**(ev.get("message") or {}), "id": tr.message_id,
                                        "model": tr.model}}
            elif kind == "message_stop":
                self.on_reply(assistant_reply(self.native.content))
            self.native.feed(ev)
            return [sse(kind, ev)]
        out: list[bytes] = []
        if not self.started:
            self.started = True
            out.extend(sse(*e) for e in tr.start())
        events = tr.feed_chunk(ev) if ev is not None else tr.feed_text(tok.text)
        out.extend(sse(*e) for e in events)
        return out

    def finish(self, done: Done) -> list[bytes]:
        """The last events (none when the engine sent its own: its ``message_stop`` was)."""
        if self.native is not None:
            return []
        tr = self.tr
        out = [] if self.started else [sse(*e) for e in tr.start()]
        self.started = True
        final = tr.finish(done.finish_reason, input_tokens=done.input_tokens,
                          output_tokens=done.output_tokens)
        self.on_reply(assistant_reply(tr.content))
        out.extend(sse(*e) for e in final)
        return out

    @staticmethod
    def error(status: int, message: str) -> bytes:
        """A failure after the stream started: an ``error`` event in Anthropic's shape."""
        return sse("error", error_body(status, message))

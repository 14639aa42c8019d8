"""A chat completion as a Responses ``response`` object (:func:`from_chat`), and a streamed
one as the Responses typed event stream (:class:`ResponseStreamer`).
"""

from __future__ import annotations

import copy
import time
from typing import Any

from hermes.gateway.responses.request import (
    ResponsesRequest,
    function_tools,
    new_id,
    new_response_id,
    output_part,
    text_format,
)


# ---------------------------------------------------------------------------------- from chat
def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [output_part(text)]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def _usage(input_tokens: int, output_tokens: int, cached: int = 0,
           reasoning: int = 0) -> dict[str, Any]:
    return {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": input_tokens + output_tokens}


def _usage_of_chat(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return _usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                  int(cached), int(reasoning))


def _status_of(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    """The response status and ``incomplete_details`` of a chat finish reason."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def response_object(req: ResponsesRequest, *, response_id: str, created_at: float,
                    status: str, output: list[dict[str, Any]],
                    usage: dict[str, Any] | None = None,
                    incomplete_details: dict[str, Any] | None = None,
                    error: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``response`` object: the output and usage with the request's settings echoed."""
    return {
        "id": response_id, "object": "response", "created_at": int(created_at),
        "status": status, "background": False, "error": error,
        "incomplete_details": incomplete_details, "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens, "model": req.model, "output": output,
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None}, "store": req.store,
        "temperature": req.temperature, "text": {"format": text_format(req)},
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": function_tools(req), "top_p": req.top_p,
        "truncation": req.truncation or "disabled", "usage": usage, "user": req.user,
        "metadata": req.metadata or {},
    }


def from_chat(chat: dict[str, Any], req: ResponsesRequest, *, response_id: str | None = None,
              created_at: float | None = None) -> dict[str, Any]:
    """The ``response`` for an engine's ``chat.completion``: a message item for its text
    (also when it is empty and there is nothing else), a ``function_call`` item per tool call
    (the chat ``id`` is the ``call_id``), status ``incomplete`` when it stopped at
    ``max_output_tokens``."""
    choices = chat.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    status, details = _status_of(choice.get("finish_reason"))
    output: list[dict[str, Any]] = []
    text = message.get("content")
    calls = message.get("tool_calls") or []
    refusal = message.get("refusal")
    if text or not (calls or refusal):
        output.append(_message_item(new_id("msg"), text or "",
                                    "incomplete" if status == "incomplete" else "completed"))
    if refusal:
        output.append({"type": "message", "id": new_id("msg"), "status": "completed",
                       "role": "assistant", "content": [{"type": "refusal", "refusal": refusal}]})
    for tc in calls:
        fn = tc.get("function") or {}
        output.append(_call_item(new_id("fc"), tc.get("id") or new_id("call"),
                                 fn.get("name") or "", fn.get("arguments") or "", "completed"))
    return response_object(
        req, response_id=response_id or new_response_id(),
        created_at=created_at if created_at is not None else time.time(), status=status,
        output=output, usage=_usage_of_chat(chat.get("usage")) or _usage(0, 0),
        incomplete_details=details)


def assistant_message(response: dict[str, Any]) -> dict[str, Any]:
    """The chat message a response's output is (the conversation's next turn): its text and
    its function calls as ``tool_calls`` with the same call ids, so that a later
    ``function_call_output`` answers them."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in response.get("output") or ():
        if item.get("type") == "message":
            texts.extend(p.get("text") or p.get("refusal") or "" for p in item.get("content") or ())
        elif item.get("type") == "function_call":
            calls.append({"id": item["call_id"], "type": "function",
                          "function": {"name": item["name"], "arguments": item["arguments"]}})
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
    if calls:
        msg["tool_calls"] = calls
    return msg


# ---------------------------------------------------------------------------------- streaming
class ResponseStreamer:
    """The Responses event stream of one streamed chat completion.

    :meth:`start` gives ``response.created`` and ``response.in_progress``; :meth:`feed_chunk`
    (an engine's ``chat.completion.chunk``) and :meth:`feed_text` (a plain text piece) give
    the item events; :meth:`finish` closes what is open and gives ``response.completed`` (or
    ``response.incomplete``); :meth:`fail` gives ``response.failed``. Items are opened and
    closed in order, as OpenAI streams them: text opens a message item
    (``response.output_item.added``, ``response.content_part.added``, then
    ``response.output_text.delta`` per piece); a tool call (by its chunk ``index``) opens a
    ``function_call`` item (``response.output_item.added`` with the name and empty
    arguments, then ``response.function_call_arguments.delta`` per piece); starting another
    item closes the open one (``response.output_text.done``, ``response.content_part.done``,
    ``response.output_item.done``, or ``response.function_call_arguments.done`` and
    ``response.output_item.done``). Every event has the next ``sequence_number`` (from 0).
    A late piece for an item already closed (an engine interleaving parallel tool calls) is
    kept in the final response but gets no event."""

    def __init__(self, req: ResponsesRequest, *, response_id: str | None = None,
                 created_at: float | None = None) -> None:
        self.req = req
        self.response_id = response_id or new_response_id()
        self.created_at = created_at if created_at is not None else time.time()
        self.output: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.response: dict[str, Any] | None = None  # the final response, once finished
        self._seq = 0
        self._open: int | None = None  # output index of the open item
        self._calls: dict[int, int] = {}  # chunk tool-call index -> output index
        self._generated_call_ids: set[int] = set()
        self._chunk_usage: dict[str, Any] | None = None

    # -------------------------------------------------------------- events
    def _event(self, type_: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": type_, "sequence_number": self._seq, **fields}
        self._seq += 1
        return ev

    def _snapshot(self, status: str, **kw: Any) -> dict[str, Any]:
        return response_object(self.req, response_id=self.response_id,
                               created_at=self.created_at, status=status,
                               output=copy.deepcopy(self.output), **kw)

    def start(self) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress``."""
        return [self._event("response.created", response=self._snapshot("in_progress")),
                self._event("response.in_progress", response=self._snapshot("in_progress"))]

    def feed_chunk(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one ``chat.completion.chunk`` (its first choice)."""
        if isinstance(chunk.get("usage"), dict):
            self._chunk_usage = chunk["usage"]
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text(delta["content"])
            for pos, tc in enumerate(delta.get("tool_calls") or ()):
                events += self._tool(tc, pos)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def feed_text(self, text: str) -> list[dict[str, Any]]:
        """The events of a plain text piece (an engine that streams text alone)."""
        return self._text(text) if text else []

    def _open_message(self) -> list[dict[str, Any]]:
        events = self._close()
        idx = len(self.output)
        item = _message_item(new_id("msg"), "", "in_progress")
        self.output.append(item)
        self._open = idx
        events.append(self._event("response.output_item.added", output_index=idx,
                                  item={**item, "content": []}))
        events.append(self._event("response.content_part.added", item_id=item["id"],
                                  output_index=idx, content_index=0, part=output_part("")))
        return events

    def _text(self, piece: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open is None or self.output[self._open]["type"] != "message":
            events += self._open_message()
        idx = self._open
        assert idx is not None
        item = self.output[idx]
        item["content"][0]["text"] += piece
        events.append(self._event("response.output_text.delta", item_id=item["id"],
                                  output_index=idx, content_index=0, delta=piece, logprobs=[]))
        return events

    def _tool(self, tc: dict[str, Any], pos: int) -> list[dict[str, Any]]:
        key = tc.get("index", pos)
        fn = tc.get("function") or {}
        events: list[dict[str, Any]] = []
        idx = self._calls.get(key)
        if idx is None:
            events += self._close()
            idx = len(self.output)
            call_id = tc.get("id")
            if not call_id:
                call_id = new_id("call")
                self._generated_call_ids.add(idx)
            item = _call_item(new_id("fc"), call_id, fn.get("name") or "", "", "in_progress")
            self.output.append(item)
            self._calls[key] = idx
            self._open = idx
            events.append(self._event("response.output_item.added", output_index=idx,
                                      item=dict(item)))
        item = self.output[idx]
        if tc.get("id") and idx in self._generated_call_ids:
            item["call_id"] = tc["id"]
            self._generated_call_ids.discard(idx)
        if fn.get("name") and not item["name"]:
            item["name"] = fn["name"]
        args = fn.get("arguments")
        if args:
            item["arguments"] += args
            if self._open == idx:
                events.append(self._event("response.function_call_arguments.delta",
                                          item_id=item["id"], output_index=idx, delta=args))
        return events

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        """Close the open item (if any)."""
        idx = self._open
        if idx is None:
            return []
        self._open = None
        item = self.output[idx]
        item["status"] = status
        if item["type"] == "message":
            part = item["content"][0]
            return [
                self._event("response.output_text.done", item_id=item["id"], output_index=idx,
                            content_index=0, text=part["text"], logprobs=[]),
                self._event("response.content_part.done", item_id=item["id"], output_index=idx,
                            content_index=0, part=copy.deepcopy(part)),
                self._event("response.output_item.done", output_index=idx,
                            item=copy.deepcopy(item)),
            ]
        return [
            self._event("response.function_call_arguments.done", item_id=item["id"],
                        output_index=idx, arguments=item["arguments"]),
            self._event("response.output_item.done", output_index=idx, item=copy.deepcopy(item)),
        ]

    def finish(self, finish_reason: str | None = None, *, input_tokens: int | None = None,
               output_tokens: int | None = None) -> list[dict[str, Any]]:
        """Close the open item and end with ``response.completed`` or, stopped at
        ``max_output_tokens``, ``response.incomplete``. Token counts: the ones given (the
        node's :class:`~hermes.protocol.Done`), else the engine's usage chunk."""
        reason = finish_reason or self.finish_reason or "stop"
        status, details = _status_of(reason)
        events: list[dict[str, Any]] = []
        if not self.output:
            events += self._open_message()
        if self._open is not None and self.output[self._open]["type"] == "message":
            events += self._close("incomplete" if status == "incomplete" else "completed")
        else:
            events += self._close()
        usage = _usage_of_chat(self._chunk_usage) or _usage(0, 0)
        if input_tokens is not None and output_tokens is not None:
            usage = _usage(input_tokens, output_tokens,
                           usage["input_tokens_details"]["cached_tokens"],
                           usage["output_tokens_details"]["reasoning_tokens"])
        self.response = self._snapshot(status, usage=usage, incomplete_details=details)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        events.append(self._event(kind, response=copy.deepcopy(self.response)))
        return events

    def fail(self, message: str, code: str = "server_error") -> list[dict[str, Any]]:
        """End with ``response.failed`` (the items so far, the open one ``incomplete``)."""
        if self._open is not None:
            self.output[self._open]["status"] = "incomplete"
            self._open = None
        self.response = self._snapshot("failed", error={"code": code, "message": message})
        return [self._event("response.failed", response=copy.deepcopy(self.response))]

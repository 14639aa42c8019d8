"""OpenAI's Responses API translated to and from chat completions, and the response store.

Agent frameworks (openai-agents, pydantic-ai's ``OpenAIResponsesModel``, LiteLLM
``responses()``) speak the Responses API by default; the engines behind Hermes speak chat
completions. This package is the pure half of ``POST /v1/responses``
(:mod:`hermes.gateway.api.responses_api` is the HTTP half): no FastAPI, no I/O.

- :func:`parse_request` validates a Responses body (:class:`ResponsesRequest`); every client
  error is a :class:`ResponsesError` whose ``param`` names the field as OpenAI does
  (``tools[1].type``, ``input[0].content[2].image_url``, ``text.format.schema``).
- :func:`to_chat` turns it into the chat-completions body the engine gets: ``instructions`` as a
  first system message, then the conversation of the ``previous_response_id`` chain, then the
  input items (``function_call`` items become an assistant message with ``tool_calls``,
  ``function_call_output`` items ``tool`` messages).
- :func:`from_chat` turns the engine's ``chat.completion`` into a ``response`` object;
  :class:`ResponseStreamer` turns its ``chat.completion.chunk`` stream (or plain text pieces)
  into the Responses typed event stream.
- :class:`ResponseStore` keeps stored responses per tenant, with the chat conversation each
  ended with, so that ``previous_response_id`` continues it (retention by age and count).

Modules: :mod:`~hermes.gateway.responses.request` (parsing, input items, tools, the chat
body), :mod:`~hermes.gateway.responses.output` (the response object and the event stream),
:mod:`~hermes.gateway.responses.store`; their public names are this package's.
"""

from __future__ import annotations

from hermes.gateway.responses.output import (
    ResponseStreamer,
    assistant_message,
    from_chat,
    response_object,
)
from hermes.gateway.responses.request import (
    DEFAULT_MAX_STORED,
    DEFAULT_RETENTION_S,
    MAX_OUTPUT_TOKENS,
    PASS_THROUGH,
    RESPONSES_ONLY,
    UNSUPPORTED,
    ResponsesError,
    ResponsesRequest,
    input_items,
    input_messages,
    new_response_id,
    parse_request,
    to_chat,
)
from hermes.gateway.responses.store import ResponseStorage, ResponseStore, StoredResponse

__all__ = [
    "DEFAULT_MAX_STORED", "DEFAULT_RETENTION_S", "MAX_OUTPUT_TOKENS", "PASS_THROUGH",
    "RESPONSES_ONLY", "UNSUPPORTED", "ResponseStorage", "ResponseStore", "ResponseStreamer", "ResponsesError",
    "ResponsesRequest", "StoredResponse", "assistant_message", "from_chat", "input_items",
    "input_messages", "new_response_id", "parse_request", "response_object", "to_chat",
]

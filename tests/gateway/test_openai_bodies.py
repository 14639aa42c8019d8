"""What the gateway forwards to the engine of a validated completion body (engine_body)."""

from __future__ import annotations

from typing import Any

import msgspec

from hermes.gateway.api.openai_bodies import (
    ChatBody,
    CompletionBody,
    engine_body,
    validate_body,
)

TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
CHAT: dict[str, Any] = {
    "model": "m", "stream": False, "stream_options": None, "temperature": None, "user": None,
    "max_completion_tokens": 16, "seed": 7, "logprobs": True,
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL], "name": None},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "default": None}}}}}],
}


def _parsed(body: dict[str, Any], cls: type) -> Any:
    got = validate_body(msgspec.json.encode(body), cls)
    assert isinstance(got, cls), got
    return got


def test_a_validated_chat_body_is_forwarded_from_its_json_as_its_model_would_be() -> None:
    """From the JSON object: the gateway's own fields and ``null`` fields (of the body and of
    its messages) are left out, ``max_completion_tokens`` is ``max_tokens``, the rest (nested
    ``null`` of a tool's schema, unknown fields) goes on as sent; the same as the dump of its
    model (the path of a body built in code)."""
    parsed = _parsed(CHAT, ChatBody)
    got = engine_body(parsed)
    assert got == {
        "max_tokens": 16, "seed": 7, "logprobs": True, "tools": CHAT["tools"],
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "assistant", "tool_calls": [TOOL_CALL]},
                     {"role": "tool", "tool_call_id": "c1", "content": "42"}]}
    built = ChatBody.model_validate(CHAT)  # no JSON object kept: dumped from the model
    assert engine_body(built) == got


def test_a_chat_body_keeps_max_tokens_when_both_are_sent() -> None:
    parsed = _parsed({**CHAT, "max_tokens": 9}, ChatBody)
    got = engine_body(parsed)
    assert got["max_tokens"] == 9 and got["max_completion_tokens"] == 16


def test_a_completions_body_is_forwarded_without_the_gateways_fields() -> None:
    body = {"model": "m", "prompt": [1, 2, 3], "stream": True, "stream_options": {"x": 1},
            "max_tokens": 4, "echo": None, "best_of": 2}
    parsed = _parsed(body, CompletionBody)
    got = engine_body(parsed)
    assert got == {"prompt": [1, 2, 3], "max_tokens": 4, "best_of": 2}
    assert engine_body(CompletionBody.model_validate(body)) == got

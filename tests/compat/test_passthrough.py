"""What an upstream engine streams reaches the client unchanged, field by field.

The same request (a ``seed`` makes the upstream's answer a function of the body) goes once
straight to a ``hermeslet sim-engine`` process and once through the gateway, whose embedded
HermesLet drives that process as an ``openai``-kind engine. Every chunk must match except what
the gateway owns: ``id`` (its request id), ``model`` (the name the client asked for),
``created`` and ``usage``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.compat.conftest import CHAT_MODEL

OWNED = {"id", "model", "created", "usage", "system_fingerprint"}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]


def _sse(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def _strip(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chunks without the fields the gateway owns, and without the usage-only chunk."""
    return [{k: v for k, v in c.items() if k not in OWNED} for c in chunks if c.get("choices")]


@pytest.mark.parametrize("tool_choice", ["required", "auto",
                                         {"type": "function", "function": {"name": "add"}}])
def test_streamed_tool_calls_arrive_as_the_engine_sent_them(upstreams, http_gateway,
                                                            tool_choice) -> None:  # noqa: ANN001
    body = {"model": CHAT_MODEL, "stream": True, "seed": 7, "max_tokens": 200,
            "messages": [{"role": "user", "content": "weather in Paris, and 2+3?"}],
            "tools": TOOLS, "tool_choice": tool_choice, "logprobs": True, "top_logprobs": 2,
            "stream_options": {"include_usage": True}}
    direct = _sse(upstreams.chat, body)
    via = _sse(http_gateway.url, body)
    assert _strip(via) == _strip(direct)
    calls = [tc for c in via for ch in c["choices"]
             for tc in (ch["delta"].get("tool_calls") or [])]
    assert calls, "the engine called no tool: the test would compare nothing"
    assert all(tc["id"].startswith("call_") for tc in calls if "id" in tc)
    finishes = [ch["finish_reason"] for c in via for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == ["tool_calls"]
    # what the gateway owns: one id of its own, the client's model, usage last
    assert len({c["id"] for c in via}) == 1 and via[0]["id"] != direct[0]["id"]
    assert {c["model"] for c in via} == {CHAT_MODEL}
    assert via[-1]["choices"] == [] and via[-1]["usage"]["completion_tokens"] > 0
    assert direct[-1]["usage"] == via[-1]["usage"]


def test_non_streamed_answer_is_the_engines(upstreams, http_gateway) -> None:  # noqa: ANN001
    body = {"model": CHAT_MODEL, "seed": 3, "max_tokens": 200, "n": 2,
            "messages": [{"role": "user", "content": "add 2 and 3"}],
            "tools": TOOLS, "tool_choice": "required", "logprobs": True}
    direct = httpx.post(upstreams.chat + "/v1/chat/completions", json=body, timeout=30).json()
    via = httpx.post(http_gateway.url + "/v1/chat/completions", json=body, timeout=30).json()
    assert via["choices"] == direct["choices"]
    assert [c["index"] for c in via["choices"]] == [0, 1]
    assert via["usage"] == direct["usage"]

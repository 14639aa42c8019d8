"""The ``openai`` SDK: chat and Responses tool loops (plain and streamed), embeddings and
structured outputs, on both paths."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.compat.agents import (
    CHAT_MODEL,
    EMBED_MODEL,
    MAX_TOKENS,
    MAX_TURNS,
    ONE_ROUND,
    PROMPT,
    CityReport,
    ToolLog,
    chat_tools,
    responses_tools,
)


@pytest.fixture
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url, api_key="any", max_retries=0) as c:
        yield c


def _chat_turn(client: openai.OpenAI, messages: list[dict[str, Any]],
               extra: dict[str, Any] | None) -> tuple[str, str | None, list[dict[str, Any]]]:
    """One non-streamed turn: (finish reason, content, tool calls as message params)."""
    r = client.chat.completions.create(model=CHAT_MODEL, messages=messages, tools=chat_tools(),
                                       max_tokens=MAX_TOKENS, extra_body=extra)
    choice = r.choices[0]
    calls = [{"id": tc.id, "type": "function",
              "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
             for tc in choice.message.tool_calls or []]
    return choice.finish_reason, choice.message.content, calls


def _chat_stream_turn(client: openai.OpenAI, messages: list[dict[str, Any]],
                      extra: dict[str, Any] | None
                      ) -> tuple[str, str | None, list[dict[str, Any]]]:
    """One streamed turn, tool calls accumulated from their deltas by index."""
    stream = client.chat.completions.create(
        model=CHAT_MODEL, messages=messages, tools=chat_tools(), max_tokens=MAX_TOKENS,
        stream=True, stream_options={"include_usage": True}, extra_body=extra)
    content, finish, usage = "", None, None
    calls: dict[int, dict[str, Any]] = {}
    for chunk in stream:
        usage = chunk.usage or usage
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": "", "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
                call["id"] += d.id or ""
                if d.function:
                    call["function"]["name"] += d.function.name or ""
                    call["function"]["arguments"] += d.function.arguments or ""
            finish = ch.finish_reason or finish
    assert usage is not None and usage.completion_tokens > 0
    assert sorted(calls) == list(range(len(calls)))
    return finish, content or None, [calls[i] for i in sorted(calls)]


def _chat_loop(client: openai.OpenAI, turn: Any, extra: dict[str, Any] | None
               ) -> tuple[ToolLog, int, str]:
    """Drive a tool loop to its final answer: (the tool calls, rounds, the answer)."""
    log = ToolLog()
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    for rounds in range(MAX_TURNS):
        finish, content, calls = turn(client, messages, extra)
        if not calls:
            assert finish == "stop" and content, (finish, content)
            return log, rounds, content
        assert finish == "tool_calls"
        assert all(c["id"].startswith("call_") for c in calls)
        assert len({c["function"]["name"] for c in calls}) == len(calls)
        messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"],
                      "content": log.execute(c["function"]["name"], c["function"]["arguments"])}
                     for c in calls]
    raise AssertionError(f"no final answer after {MAX_TURNS} turns")


@pytest.mark.parametrize("extra", [ONE_ROUND, None], ids=["one-round", "default"])
def test_chat_tool_loop(client: openai.OpenAI, extra: dict[str, Any] | None) -> None:
    log, rounds, _ = _chat_loop(client, _chat_turn, extra)
    assert log.calls and rounds >= 1
    if extra is ONE_ROUND:
        assert rounds == 1


def test_chat_stream_tool_loop(client: openai.OpenAI) -> None:
    log, rounds, _ = _chat_loop(client, _chat_stream_turn, ONE_ROUND)
    assert log.calls and rounds == 1


def _function_calls(output: list[Any]) -> list[Any]:
    return [item for item in output if item.type == "function_call"]


def test_responses_tool_loop(client: openai.OpenAI) -> None:
    log = ToolLog()
    r = client.responses.create(model=CHAT_MODEL, input=PROMPT, tools=responses_tools(),
                                max_output_tokens=MAX_TOKENS, extra_body=ONE_ROUND)
    for _ in range(MAX_TURNS):
        assert r.status == "completed", r
        calls = _function_calls(r.output)
        if not calls:
            break
        outputs = [{"type": "function_call_output", "call_id": c.call_id,
                    "output": log.execute(c.name, c.arguments)} for c in calls]
        r = client.responses.create(model=CHAT_MODEL, previous_response_id=r.id, input=outputs,
                                    tools=responses_tools(), max_output_tokens=MAX_TOKENS,
                                    extra_body=ONE_ROUND)
    assert log.calls and r.output_text.strip()
    assert not _function_calls(r.output)
    assert r.usage is not None and r.usage.output_tokens > 0


def _streamed_response(client: openai.OpenAI, **kw: Any) -> Any:
    """A streamed response: its events parse and end with ``response.completed``, whose
    response agrees with the streamed text and function-call arguments."""
    text, args = "", {}
    events = list(client.responses.create(model=CHAT_MODEL, stream=True, tools=responses_tools(),
                                          max_output_tokens=MAX_TOKENS, extra_body=ONE_ROUND,
                                          **kw))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for e in events:
        if e.type == "response.output_text.delta":
            text += e.delta
        elif e.type == "response.function_call_arguments.done":
            args[e.item_id] = e.arguments
    final = events[-1].response
    assert final.output_text == text
    assert {c.id: c.arguments for c in _function_calls(final.output)} == args
    return final


def test_responses_stream_tool_loop(client: openai.OpenAI) -> None:
    log = ToolLog()
    r = _streamed_response(client, input=PROMPT)
    for _ in range(MAX_TURNS):
        calls = _function_calls(r.output)
        if not calls:
            break
        outputs = [{"type": "function_call_output", "call_id": c.call_id,
                    "output": log.execute(c.name, c.arguments)} for c in calls]
        r = _streamed_response(client, input=outputs, previous_response_id=r.id)
    assert log.calls and r.output_text.strip() and not _function_calls(r.output)


def test_embeddings(client: openai.OpenAI) -> None:
    texts = ["the weather in Paris", "the weather in Paris today", "integer addition"]
    r = client.embeddings.create(model=EMBED_MODEL, input=texts)
    vecs = [d.embedding for d in sorted(r.data, key=lambda d: d.index)]
    assert len(vecs) == 3 and len({len(v) for v in vecs}) == 1
    dot = [sum(x * y for x, y in zip(vecs[0], v, strict=True)) for v in vecs]
    assert dot[0] == pytest.approx(1.0, abs=1e-5)  # L2-normalised
    assert dot[1] > dot[2]  # similar texts, similar vectors
    short = client.embeddings.create(model=EMBED_MODEL, input="x", dimensions=32)
    assert len(short.data[0].embedding) == 32


def test_structured_output_parse(client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(
        model=CHAT_MODEL, max_tokens=MAX_TOKENS, response_format=CityReport,
        messages=[{"role": "user", "content": "Report on Paris as JSON."}])
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, CityReport)
    assert CityReport.model_validate_json(choice.message.content) == choice.message.parsed


def test_json_object_mode(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=CHAT_MODEL, max_tokens=MAX_TOKENS, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Any JSON object."}])
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_extension_fields_reach_the_engine(client: openai.OpenAI, api: str) -> None:
    """A body field the gateway does not know (``extra_body``) is passed on to the engine:
    ``sim_agent.max_tool_rounds: 0`` makes the first turn text although tools are given."""
    no_tools = {"sim_agent": {"max_tool_rounds": 0}}
    if api == "chat":
        r = client.chat.completions.create(
            model=CHAT_MODEL, messages=[{"role": "user", "content": PROMPT}], tools=chat_tools(),
            max_tokens=MAX_TOKENS, extra_body=no_tools)
        calls = r.choices[0].message.tool_calls
        assert not calls, f"sim_agent did not reach the engine: it called {calls}"
        assert r.choices[0].finish_reason == "stop"
    else:
        resp = client.responses.create(model=CHAT_MODEL, input=PROMPT, tools=responses_tools(),
                                       max_output_tokens=MAX_TOKENS, extra_body=no_tools)
        calls = _function_calls(resp.output)
        assert not calls, f"sim_agent did not reach the engine: it called {calls}"
        assert resp.output_text.strip()

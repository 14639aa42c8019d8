"""Anthropic's Messages API at the edge (``hermes.gateway.api.anthropic_api``): the translation
to chat and back (pure), the event stream's order on the wire, runs found by Claude Code's
session evidence, and every error on these routes in Anthropic's shape, the security
middleware's (401, 413) and FastAPI's own (404, 405) included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes.anthropic_wire import (
    MessagesBody,
    MessagesError,
    MessageStreamer,
    assistant_reply,
    from_chat,
    status,
    to_chat,
)
from hermes.gateway.api.anthropic_bodies import parse_body
from hermes.gateway.errors import wire_error
from hermes.gateway.resolve.canon import canonical_message
from hermeslet.engines.sim_output import VOCAB

MODEL = "llama-2-7b"
WEATHER = {"name": "get_weather", "description": "Weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


def body(**kw: Any) -> MessagesBody:
    raw = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    b = parse_body(json.dumps({**raw, **kw}).encode(), MessagesBody)
    assert isinstance(b, MessagesBody)
    return b


def refused(**kw: Any) -> str:
    with pytest.raises(MessagesError) as e:
        body(**kw)
    assert e.value.status == 400 and e.value.type == "invalid_request_error"
    return str(e.value)


# ---------------------------------------------------------------------------------- pure
def test_translation_to_chat() -> None:
    png = {"type": "base64", "media_type": "image/png", "data": "iVBO"}
    b = body(
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Look:"},
                                         {"type": "image", "source": png}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Zürich"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": "sunny"},
                             {"type": "image", "source": {"type": "url",
                                                          "url": "https://x/y.png"}}]},
                {"type": "text", "text": "And tomorrow?", "cache_control": {"type": "ephemeral"}}]},
        ],
        tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["END"], temperature=0.5, top_k=5, metadata={"user_id": "u1"},
        thinking={"type": "enabled", "budget_tokens": 2048}, sim_agent={"tool_call_p": 0.0})
    chat = to_chat(b)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {"role": "user", "content": [
            {"type": "text", "text": "Look:"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Zürich"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            {"type": "text", "text": "And tomorrow?"}]},
    ]
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": WEATHER["input_schema"],
        "description": "Weather in a city."}}]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert (chat["stop"], chat["temperature"], chat["top_k"], chat["max_tokens"]) == (
        ["END"], 0.5, 5, 64)
    assert chat["sim_agent"] == {"tool_call_p": 0.0}  # unknown fields pass on, as on chat
    assert not {"thinking", "metadata", "system", "stop_sequences"} & set(chat)
    named = to_chat(body(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}))
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert to_chat(body(tool_choice={"type": "none"}))["tool_choice"] == "none"


def test_bad_fields_are_named() -> None:
    assert refused(max_tokens=None) == "max_tokens: Input should be a valid integer"
    assert refused(max_tokens="5").startswith("max_tokens: ")  # strict: no "5" for 5
    assert refused(messages=[]).startswith("messages: ")
    assert refused(messages=[{"role": "robot", "content": "x"}]).startswith(
        "messages.0.role: ")
    assert refused(messages=[{"role": "user", "content": [{"type": "video"}]}]).startswith(
        "messages.0.content.0: a content block's type is")
    assert refused(messages=[{"role": "user", "content": [
        {"type": "tool_use", "id": "a", "name": "b", "input": {}}]}]).startswith(
        "messages.0.content.0: a tool_use block cannot be in a user turn")
    assert refused(messages=[{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "a"}]}]).startswith("messages.0.content.0: ")
    assert refused(temperature=2).startswith("temperature: ")
    assert refused(top_p=0).startswith("top_p: ")
    assert refused(stop_sequences="END").startswith("stop_sequences: ")
    assert refused(tools=[{**WEATHER, "name": "a b"}]).startswith("tools.0.name: ")
    assert refused(tools=[{"name": "x"}]) == "tools.0.input_schema: Field required"
    assert refused(tools=[{"type": "web_search_20250305", "name": "web_search"}]).startswith(
        "tools.0.type: the server tool")
    assert refused(tools=[WEATHER, WEATHER]).startswith("tools.1.name: tool names must be")
    assert refused(tool_choice={"type": "any"}) == "tool_choice.type: 'any' needs tools"
    assert refused(tools=[WEATHER], tool_choice={"type": "tool"}).startswith(
        "tool_choice.name: ")
    assert refused(system=5).startswith("system: ")
    assert refused(metadata={"user_id": 7}).startswith("metadata.user_id: ")
    with pytest.raises(MessagesError, match="not valid JSON"):
        parse_body(b"{", MessagesBody)


def test_answers_and_stop_reasons() -> None:
    def chat(finish: str, **msg: Any) -> dict[str, Any]:
        return {"choices": [{"index": 0, "finish_reason": finish,
                             "message": {"role": "assistant", **msg}}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3}}

    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}}
    m = from_chat(chat("tool_calls", content=None, tool_calls=[call]), message_id="msg_1",
                  model=MODEL, stop_sequences=None)
    assert m == {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL,
                 "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather",
                              "input": {"city": "Lima"}}],
                 "stop_reason": "tool_use", "stop_sequence": None,
                 "usage": {"input_tokens": 7, "output_tokens": 3}}
    reason = [from_chat(c, message_id="m", model=MODEL, stop_sequences=["END"])["stop_reason"]
              for c in (chat("stop", content="a"), chat("length", content="a"))]
    assert reason == ["end_turn", "max_tokens"]
    matched = chat("stop", content="a")
    matched["choices"][0]["stop_reason"] = "END"  # vLLM names the stop string it met
    m = from_chat(matched, message_id="m", model=MODEL, stop_sequences=["END"])
    assert (m["stop_reason"], m["stop_sequence"]) == ("stop_sequence", "END")
    # what the client sends back translates to the reply the resolver indexed
    echoed = to_chat(body(messages=[{"role": "user", "content": "x"},
                                    {"role": "assistant", "content": m["content"]},
                                    {"role": "user", "content": "y"}]))["messages"][1]
    assert canonical_message(echoed) == canonical_message(assistant_reply(m["content"]))


def test_streamer_events_follow_anthropics_order() -> None:
    tr = MessageStreamer(message_id="msg_1", model=MODEL, input_tokens=9, stop_sequences=None)
    chunks = [{"delta": {"role": "assistant", "content": ""}}, {"delta": {"content": "Hi"}},
              {"delta": {"tool_calls": [{"index": 0, "id": "c0", "type": "function",
                                         "function": {"name": "a", "arguments": ""}}]}},
              {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"x":'}}]}},
              {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}},
              {"delta": {"tool_calls": [{"index": 1, "id": "c1", "type": "function",
                                         "function": {"name": "b", "arguments": "{}"}}]}},
              {"delta": {}, "finish_reason": "tool_calls"}]
    events = tr.start()
    for c in chunks:
        events += tr.feed_chunk({"choices": [{"index": 0, **c}]})
    events += tr.finish(None, input_tokens=9, output_tokens=6)
    brief = [(k, d.get("index"), (d.get("delta") or d.get("content_block") or {}).get("type"))
             for k, d in events]
    assert brief == [
        ("message_start", None, None), ("ping", None, None),
        ("content_block_start", 0, "text"), ("content_block_delta", 0, "text_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "tool_use"), ("content_block_delta", 1, "input_json_delta"),
        ("content_block_delta", 1, "input_json_delta"), ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None), ("message_delta", None, None),
        ("message_stop", None, None)]
    assert events[5][1]["content_block"] == {"type": "tool_use", "id": "c0", "name": "a",
                                             "input": {}}
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2][1]["usage"] == {"input_tokens": 9, "output_tokens": 6}
    assert tr.content == [{"type": "text", "text": "Hi"},
                          {"type": "tool_use", "id": "c0", "name": "a", "input": {"x": 1}},
                          {"type": "tool_use", "id": "c1", "name": "b", "input": {}}]


def test_error_shape_by_path() -> None:
    assert wire_error("/v1/messages", 413, "too big") == (413, {
        "type": "error", "error": {"type": "request_too_large", "message": "too big"}})
    assert wire_error("/v1/messages/count_tokens", 503, "busy")[0] == 529 == status(503)
    assert wire_error("/v1/messages", 503, "busy")[1]["error"]["type"] == "overloaded_error"
    assert wire_error("/v1/chat/completions", 401, "no")[1]["error"]["type"] == \
        "authentication_error"  # OpenAI's shape elsewhere
    assert "type" not in wire_error("/v1/chat/completions", 401, "no")[1]


# ---------------------------------------------------------------------------------- live
def sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"]
        out.append((lines["event"], data))
    return out


def test_stream_on_the_wire_and_stop_sequences(gateway: Any) -> None:
    ask = {"model": MODEL, "max_tokens": 1024, "stream": True,
           "messages": [{"role": "user", "content": "Say something."}]}
    with httpx.Client(base_url=gateway.url, timeout=30,
                      headers={"anthropic-version": "2023-06-01"}) as http:
        r = http.post("/v1/messages", json=ask)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse(r.text)
        kinds = [k for k, _ in events]
        assert kinds[:3] == ["message_start", "ping", "content_block_start"]
        assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert set(kinds[3:-3]) == {"content_block_delta"}
        text = "".join(d["delta"]["text"] for k, d in events if k == "content_block_delta")
        final = events[-2][1]
        assert text and final["delta"]["stop_reason"] == "end_turn"
        assert final["usage"]["output_tokens"] == len(text.split())  # a word a token
        # every word is a stop sequence: the answer stops at its first, and names it
        stops = [" " + w for w in VOCAB]
        r = http.post("/v1/messages", json={**ask, "stream": False, "stop_sequences": stops})
        m = r.json()
        assert m["stop_reason"] == "stop_sequence" and m["stop_sequence"] in stops
        assert m["content"] == []
        r = http.post("/v1/messages", json={**ask, "stop_sequences": stops})
        assert sse(r.text)[-2][1]["delta"]["stop_reason"] == "stop_sequence"


def test_claude_code_session_evidence_names_the_run(gateway: Any) -> None:
    """Unrelated first turns (nothing to continue) share a run when they carry one Claude Code
    session: its header, or the ``_session_`` part of its ``metadata.user_id``."""
    def ask(text: str, **kw: Any) -> str:
        headers = kw.pop("headers", {})
        r = http.post("/v1/messages", headers=headers, json={
            "model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": text}],
            **kw})
        assert r.status_code == 200, r.text
        return r.headers["x-hermes-run"]

    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        s1 = {"x-claude-code-session-id": "0b6f7c1e-1c7e-4d6e-9a51-6a1f0c5d2e11"}
        s2 = {"x-claude-code-session-id": "5d0c2b8a-8f3e-4a57-bb1d-2f0e6c4a9d73"}
        a, b, c = ask("list the files", headers=s1), ask("read main.py", headers=s1), \
            ask("list the files", headers=s2)
        assert a == b != c
        uid = "user_3f2a_account_9c1d_session_7e2b1f04-5a6c-4d3e-8b9f-0a1b2c3d4e5f"
        d = ask("grep TODO", metadata={"user_id": uid})
        e = ask("run the tests", metadata={"user_id": uid})
        assert d == e and d not in (a, c)


def _create_key(auth_file: Path, tenant: str) -> str:
    out = subprocess.run([sys.executable, "-m", "hermes.cli", "keys", "create", "--tenant",
                          tenant, "--auth-file", str(auth_file)], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip().splitlines()[0].split()[-1]


def test_gateway_errors_take_anthropics_shape(make_gateway: Any, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    key = _create_key(auth, "alice")
    srv = make_gateway(auth_file=str(auth), max_body_bytes=4096)
    ask = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}

    def error(r: httpx.Response, status: int, kind: str) -> str:
        assert r.status_code == status, r.text
        j = r.json()
        assert j["type"] == "error" and j["error"]["type"] == kind and set(j) == {"type", "error"}
        msg: str = j["error"]["message"]
        return msg

    with httpx.Client(base_url=srv.url, timeout=30) as http:
        assert "API key" in error(http.post("/v1/messages", json=ask), 401,
                                  "authentication_error")
        error(http.post("/v1/messages", json=ask, headers={"x-api-key": key + "x"}), 401,
              "authentication_error")
        for h in ({"x-api-key": key}, {"Authorization": f"Bearer {key}"}):
            r = http.post("/v1/messages", json=ask, headers=h)
            assert r.status_code == 200 and r.json()["type"] == "message", r.text
        h = {"x-api-key": key}
        big = {**ask, "messages": [{"role": "user", "content": "x" * 5000}]}
        error(http.post("/v1/messages", json=big, headers=h), 413, "request_too_large")
        assert "anthropic-version" in error(http.post(
            "/v1/messages", json=ask, headers={**h, "anthropic-version": "latest"}), 400,
            "invalid_request_error")
        error(http.get("/v1/messages", headers=h), 405, "invalid_request_error")
        error(http.post("/v1/messages/batches", json=ask, headers=h), 404, "not_found_error")
        assert http.post("/v1/chat/completions", json={}).json()["error"]["code"] == \
            "invalid_api_key"  # OpenAI's shape on OpenAI's routes


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(max_size=5),
                     lambda kids: st.lists(kids, max_size=3)
                     | st.dictionaries(st.text(max_size=5), kids, max_size=3), max_leaves=8)
_block = st.fixed_dictionaries({"type": st.sampled_from(
    ["text", "image", "tool_use", "tool_result", "thinking", "document", 3])},
    optional={"text": _json, "id": _json, "name": _json, "input": _json, "tool_use_id": _json,
              "content": _json | st.lists(st.fixed_dictionaries(
                  {"type": st.sampled_from(["text", "image"])},
                  optional={"text": _json, "source": _json}), max_size=2),
              "source": _json | st.fixed_dictionaries(
                  {"type": st.sampled_from(["base64", "url", "file"])},
                  optional={"media_type": _json, "data": _json, "url": _json})})
_turn = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "x"]),
                               "content": st.text(max_size=5) | st.lists(_block, max_size=3)})


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(messages=st.lists(_turn, max_size=3) | _json,
       extra=st.dictionaries(st.sampled_from(
           ["system", "tools", "tool_choice", "stop_sequences", "metadata", "max_tokens",
            "temperature", "top_k", "stream"]), _json, max_size=3))
def test_any_body_is_answered_or_refused_by_name(messages: Any, extra: dict[str, Any]) -> None:
    """Whatever the body, the edge either translates it or raises :class:`MessagesError`
    (a 400 naming the field), never anything else (which would be a 500)."""
    raw = {"model": MODEL, "max_tokens": 16, "messages": messages, **extra}
    try:
        b = parse_body(json.dumps(raw).encode(), MessagesBody)
        assert isinstance(b, MessagesBody)
        chat = to_chat(b)
    except MessagesError as e:
        assert e.status == 400 and str(e)
        return
    assert chat["messages"] and chat["max_tokens"] == b.max_tokens

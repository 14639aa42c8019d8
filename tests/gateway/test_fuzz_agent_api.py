"""Bad input to the agent-facing operations (``/v1/responses``, ``/v1/embeddings``,
``/v1/models/{id}``, chat with tools): a property-based fuzz against a real gateway, no 5xx,
every error in OpenAI's shape with a message; and the specific cases the issue names, each a
4xx naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes.gateway.config import load_config
from hermes.gateway.server import BackgroundServer, start_background

MODEL = "llama-2-7b"
EMBED = "sim-embed"


@pytest.fixture(scope="module")
def agent_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    tmp = tmp_path_factory.mktemp("fuzz-agent")
    srv = start_background(load_config(
        None, environ={}, port=0, bind="", kb=str(tmp / "kb"), state_dir=str(tmp / "state"),
        time_scale=200.0, log_level="error", max_body_bytes=65536))
    yield srv
    srv.stop()


_text = st.text(max_size=30)
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                  st.floats(allow_nan=False, allow_infinity=False), _text)
_any = st.recursive(_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(_text, c, max_size=3),
                    max_leaves=6)
_schema = st.one_of(
    st.just({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}),
    st.just({"type": "object", "properties": {"s": {"type": "string", "enum": ["a", "b"]}}}),
    st.just({"type": "string"}), st.just({"type": "object", "properties": "nope"}), _any)
_fn_tool = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "web_search", "nope"])},
    optional={"name": st.one_of(st.just("f"), _text, _any), "parameters": _schema,
              "strict": _any, "description": _any})
_item = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "robot"]),
                           "content": st.one_of(_text, _any)}),
    st.fixed_dictionaries({"type": st.just("function_call_output"),
                           "call_id": st.one_of(_text, _any), "output": st.one_of(_text, _any)}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": _text,
                           "name": st.one_of(_text, _any), "arguments": st.one_of(_text, _any)}),
    _any)
_responses = st.fixed_dictionaries(
    {}, optional={
        "model": st.one_of(st.just(MODEL), st.just(EMBED), _any),
        "input": st.one_of(_text, st.lists(_item, max_size=3), _any),
        "instructions": st.one_of(_text, _any), "tools": st.one_of(st.lists(_fn_tool, max_size=2), _any),
        "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required"]), _any),
        "text": st.one_of(st.just({"format": {"type": "json_schema", "name": "x",
                                              "schema": {"type": "object"}}}), _any),
        "max_output_tokens": st.one_of(st.integers(-2, 40), _any),
        "previous_response_id": st.one_of(st.just("resp_nope"), _any),
        "stream": st.one_of(st.booleans(), _any), "store": _any, "metadata": _any})
_embeddings = st.fixed_dictionaries(
    {}, optional={"model": st.one_of(st.just(EMBED), st.just(MODEL), _any),
                  "input": st.one_of(_text, st.lists(_text, max_size=3),
                                     st.lists(st.integers(-5, 70000), max_size=4), _any),
                  "dimensions": st.one_of(st.integers(-3, 100), _any),
                  "encoding_format": st.one_of(st.sampled_from(["float", "base64"]), _any)})
_chat_tools = st.fixed_dictionaries(
    {"model": st.just(MODEL), "max_tokens": st.just(32),
     "messages": st.just([{"role": "user", "content": "go"}])},
    optional={"tools": st.one_of(st.lists(st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries(
            {"name": st.one_of(st.just("f"), _text)}, optional={"parameters": _schema})}),
        max_size=2), _any),
        "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required"]), _any),
        "response_format": st.one_of(st.just({"type": "json_object"}), _any),
        "stream": st.booleans(), "n": st.one_of(st.integers(-1, 3), _any),
        "logprobs": _any, "stop": _any, "seed": _any})


@pytest.mark.slow
@given(path=st.sampled_from(["responses", "embeddings", "chat/completions"]), data=st.data(),
       raw=st.one_of(st.none(), st.binary(max_size=48)))
@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_agent_api_fuzz_no_server_error(agent_gateway: BackgroundServer, path: str, data,  # noqa: ANN001
                                        raw: bytes | None) -> None:
    strategy = {"responses": _responses, "embeddings": _embeddings,
                "chat/completions": _chat_tools}[path]
    body = data.draw(strategy)
    content = raw if raw is not None else json.dumps(body).encode()
    with httpx.stream("POST", f"{agent_gateway.url}/v1/{path}", content=content, timeout=30,
                      headers={"content-type": "application/json"}) as r:
        text = r.read().decode(errors="replace")
    assert r.status_code < 500, (path, body, r.status_code, text[:500])
    if r.status_code >= 400:
        err = json.loads(text)["error"]
        assert err["message"] and set(err) == {"message", "type", "param", "code"}, text


@pytest.mark.slow
@given(model=st.text(min_size=1, max_size=40))
@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_model_lookup_fuzz(agent_gateway: BackgroundServer, model: str) -> None:
    from urllib.parse import quote

    r = httpx.get(f"{agent_gateway.url}/v1/models/{quote(model, safe='')}", timeout=30)
    assert r.status_code in (200, 404), (model, r.status_code, r.text)


# ---------------------------------------------------------------------------------- specifics
@pytest.mark.parametrize(("path", "body", "param"), [
    ("responses", {"model": MODEL, "input": "x",
                   "tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]},
     "tools[0].parameters"),
    ("responses", {"model": MODEL, "input": "x", "previous_response_id": "resp_nope"},
     "previous_response_id"),
    ("responses", {"model": MODEL, "input": "x", "text": {"format": {"type": "xml"}}},
     "text.format.type"),
    ("embeddings", {"model": MODEL, "input": "x"}, "model"),
    ("embeddings", {"model": EMBED, "input": []}, "input"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                          "response_format": {"type": "json_schema"}}, "response_format"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                          "tools": [{"type": "function", "function": {
                              "name": "f", "parameters": {"type": "object",
                                                          "properties": "nope"}}}]}, "tools"),
])
def test_bad_agent_input_is_a_4xx_naming_the_field(gateway: BackgroundServer, path: str,  # noqa: ANN001
                                                   body: dict, param: str) -> None:
    r = httpx.post(f"{gateway.url}/v1/{path}", json=body, timeout=30)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["param"] is not None and err["param"].startswith(param), err

"""The Anthropic SDK against the gateway's Messages API (``/v1/messages``), on every path: the
built-in engine in the gateway's process; an ``openai``-kind engine over HTTP that gets the
request translated to chat completions; and the same server as an engine that serves
``/v1/messages`` itself (``messages_api = "native"``), which gets it as sent: a tool loop,
plain and streamed,
with tool arguments valid against their ``input_schema``; the agent's loop is one inferred run
(``GET /v1/runs``); a bad request is Anthropic's error shape, raised by the SDK as its own
error class with the gateway's message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hermes.gateway.server import BackgroundServer
from tests.compat.agents import (
    CHAT_MODEL,
    DESCRIPTIONS,
    MAX_TOKENS,
    MAX_TURNS,
    ONE_ROUND,
    SCHEMAS,
    ToolLog,
)
from tests.compat.conftest import PATHS, Upstreams, _gateway

TOOLS = [{"name": n, "description": DESCRIPTIONS[n], "input_schema": s}
         for n, s in SCHEMAS.items()]


@pytest.fixture(scope="module")
def native_gateway(tmp_path_factory: pytest.TempPathFactory,
                   upstreams: Upstreams) -> Iterator[BackgroundServer]:
    """A gateway whose ``openai``-kind engine serves ``/v1/messages`` itself
    (``messages_api = "native"``): the request passes through untranslated."""
    engines = [{"name": "up-native", "kind": "openai", "url": upstreams.chat,
                "model": CHAT_MODEL, "messages_api": "native"}]
    srv = _gateway(str(tmp_path_factory.mktemp("gw-native")), engines=engines)
    yield srv
    srv.stop()


def upstream_requests(url: str) -> dict[str, float]:
    """Requests the upstream engine server received, by route (its /metrics)."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in fam.samples:
            if sample.name == "hermes_sim_requests_total":
                out[sample.labels["route"]] = sample.value
    return out


@pytest.fixture(params=[*PATHS, "native"])
def gateway(request: pytest.FixtureRequest, upstreams: Upstreams) -> Iterator[Any]:
    """Each path: the built-in engine, an engine that gets the request translated to chat,
    and one that gets it as sent (the upstream's request counts say which route served)."""
    before = upstream_requests(upstreams.chat)
    yield request.getfixturevalue(f"{request.param}_gateway")
    after = upstream_requests(upstreams.chat)
    grew = {r for r in after if after[r] > before.get(r, 0)}
    want = {"embedded": set(), "http": {"/v1/chat/completions"},
            "native": {"/v1/messages"}}[request.param]
    assert grew <= want, (request.param, before, after)  # no other route served
    if "tool_loop" in request.node.name:  # it reached the engine: by the expected route
        assert grew == want, (request.param, before, after)


class RunHeaders:
    """The ``X-Hermes-Run`` of every answer (read from the SDK's raw responses)."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def saw(self, headers: Any) -> None:
        self.runs.append(headers["x-hermes-run"])


def client(gateway: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="any", max_retries=0)


def results(log: ToolLog, content: list[Any]) -> list[dict[str, Any]]:
    """Run each ``tool_use`` block (its input validated against the tool's schema)."""
    return [{"type": "tool_result", "tool_use_id": b.id, "content": str(log.call(b.name, b.input))}
            for b in content if b.type == "tool_use"]


def one_run(gateway: Any, rec: RunHeaders, app_system: str, turns: int) -> None:
    """Every call of the loop went to one inferred run, the only run of its app, which holds
    one unit invocation per model turn."""
    assert len(rec.runs) == turns and len(set(rec.runs)) == 1, rec.runs
    with httpx.Client(base_url=gateway.url, timeout=10) as http:
        run = http.get(f"/v1/runs/{rec.runs[0]}").json()
        assert run["inferred"] is True, run
        listed = http.get("/v1/runs", params={"app": run["app"]}).json()["runs"]
    assert [r["run_id"] for r in listed] == [rec.runs[0]], (app_system, listed)
    assert len(run["units"]) == turns


def test_tool_loop_plain(gateway: Any) -> None:
    rec, log = RunHeaders(), ToolLog()
    system = "You are a weather agent."  # an app of its own (its runs are this test's)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris? And 2+3?"}]
    with client(gateway) as c:
        for _ in range(MAX_TURNS):
            raw = c.messages.with_raw_response.create(
                model=CHAT_MODEL, max_tokens=MAX_TOKENS, system=system, messages=messages,
                tools=TOOLS, extra_body=ONE_ROUND)
            rec.saw(raw.headers)
            msg = raw.parse()
            assert msg.type == "message" and msg.role == "assistant" and msg.model == CHAT_MODEL
            assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0
            messages.append({"role": "assistant", "content": msg.content})
            if msg.stop_reason != "tool_use":
                break
            messages.append({"role": "user", "content": results(log, msg.content)})
    assert msg.stop_reason == "end_turn" and msg.content[0].type == "text"
    assert log.calls
    one_run(gateway, rec, system, turns=len(messages) // 2)


def test_tool_loop_streamed(gateway: Any) -> None:
    rec, log = RunHeaders(), ToolLog()
    system = [{"type": "text", "text": "You are a streaming weather agent."}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Lima? And 2+3?"}]
    with client(gateway) as c:
        for _ in range(MAX_TURNS):
            kinds: list[str] = []
            with c.messages.stream(model=CHAT_MODEL, max_tokens=MAX_TOKENS, system=system,
                                   messages=messages, tools=TOOLS, extra_body=ONE_ROUND) as s:
                rec.saw(s.response.headers)
                for ev in s:
                    kinds.append(ev.type)
                    if ev.type == "content_block_start" and ev.content_block.type == "tool_use":
                        assert ev.content_block.id and ev.content_block.name in SCHEMAS
                msg = s.get_final_message()
            assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
            assert "message_delta" in kinds
            messages.append({"role": "assistant", "content": msg.content})
            if msg.stop_reason != "tool_use":
                break
            assert all(b.type == "tool_use" for b in msg.content)
            messages.append({"role": "user", "content": results(log, msg.content)})
    assert msg.stop_reason == "end_turn" and msg.content[0].text
    assert log.calls
    one_run(gateway, rec, system[0]["text"], turns=len(messages) // 2)


def test_bad_requests_get_anthropic_errors(gateway: Any) -> None:
    user = [{"role": "user", "content": "hi"}]
    with anthropic.Anthropic(base_url=gateway.url, api_key="any", max_retries=0) as c:
        with pytest.raises(anthropic.BadRequestError) as e:
            c.messages.create(model=CHAT_MODEL, max_tokens=16, messages=[
                {"role": "user", "content": [{"type": "tool_result"}]}])
        assert e.value.status_code == 400
        assert e.value.body == {"type": "error", "error": {
            "type": "invalid_request_error",
            "message": "messages.0.content.0.tool_use_id: Field required"}}
        with pytest.raises(anthropic.BadRequestError, match="tool_choice.name"):
            c.messages.create(model=CHAT_MODEL, max_tokens=16, messages=user, tools=TOOLS,
                              tool_choice={"type": "tool", "name": "nope"})
        with pytest.raises(anthropic.BadRequestError, match=r"tools\.0\.input_schema"):
            c.messages.create(model=CHAT_MODEL, max_tokens=16, messages=user,
                              tools=[{"name": "t", "input_schema": {"type": "string"}}])
        with pytest.raises(anthropic.BadRequestError, match="temperature"):
            c.messages.create(model=CHAT_MODEL, max_tokens=16, messages=user,
                              extra_body={"temperature": 1.5})
        with pytest.raises(anthropic.NotFoundError, match="no-such-model"):
            c.messages.create(model="no-such-model", max_tokens=16, messages=user)
        # the engine's own refusal (prompt + max_tokens beyond its KV capacity), relayed
        with pytest.raises(anthropic.BadRequestError, match="KV tokens") as e:
            c.messages.create(model=CHAT_MODEL, max_tokens=131_072, messages=user, timeout=30)
        assert e.value.body["error"]["type"] == "invalid_request_error"
        n = c.messages.count_tokens(model=CHAT_MODEL, messages=user, tools=TOOLS)
        assert n.input_tokens > 0

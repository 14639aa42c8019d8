"""``openai-agents``: an agent with two function tools runs to its final answer, with the
default Responses model and with the chat completions model, ``Runner.run`` and
``Runner.run_streamed``, on both paths."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from agents.items import ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI

from tests.compat import agents as shared
from tests.compat.agents import CHAT_MODEL, MAX_TOKENS, ONE_ROUND, PROMPT, ToolLog

MODELS = ("responses", "chat")


def make_agent(log: ToolLog, model: Any) -> Agent:
    """An agent with the two shared tools, which record their calls in ``log``."""

    @function_tool
    def get_weather(city: str, unit: Literal["c", "f"]) -> str:
        """The current weather in a city."""
        log.record("get_weather", city=city, unit=unit)
        return shared.get_weather(city, unit)

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        log.record("add", a=a, b=b)
        return shared.add(a, b)

    return Agent(name="assistant", instructions="Answer with the tools' help.",
                 tools=[get_weather, add], model=model,
                 model_settings=ModelSettings(max_tokens=MAX_TOKENS, extra_body=ONE_ROUND))


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=base_url, api_key="any", max_retries=0) as c:
        yield c


def agent_model(kind: str, client: AsyncOpenAI) -> Any:
    """The agent's model: the SDK's default (a model name resolved against the default client,
    Responses API) or an explicit chat completions model."""
    set_tracing_disabled(True)
    if kind == "responses":
        set_default_openai_client(client, use_for_tracing=False)
        set_default_openai_api("responses")
        return CHAT_MODEL
    return OpenAIChatCompletionsModel(model=CHAT_MODEL, openai_client=client)


def check(result: Any, log: ToolLog) -> None:
    """A tool ran for every call the model made (no call failed and was retried), and the
    final output is text."""
    calls = [i for i in result.new_items if isinstance(i, ToolCallItem)]
    outputs = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert log.calls and len(calls) == len(outputs) == len(log.calls)
    assert isinstance(result.final_output, str) and result.final_output.strip()
    assert len(result.raw_responses) >= 2  # the tool round(s), then the answer


@pytest.mark.parametrize("kind", MODELS)
async def test_run(client: AsyncOpenAI, kind: str) -> None:
    log = ToolLog()
    result = await Runner.run(make_agent(log, agent_model(kind, client)), PROMPT)
    check(result, log)
    if kind == "chat":  # sim_agent reaches the engine: one tool round exactly
        assert len(result.raw_responses) == 2


@pytest.mark.parametrize("kind", MODELS)
async def test_run_streamed(client: AsyncOpenAI, kind: str) -> None:
    log = ToolLog()
    result = Runner.run_streamed(make_agent(log, agent_model(kind, client)), PROMPT)
    kinds: dict[str, int] = {}
    async for event in result.stream_events():
        kinds[event.type] = kinds.get(event.type, 0) + 1
    assert result.is_complete
    assert kinds.get("raw_response_event") and kinds.get("run_item_stream_event")
    check(result, log)


@pytest.mark.parametrize("kind", MODELS)
async def test_agent_in_one_hermes_run(embedded_gateway: Any, kind: str) -> None:
    """A client-driven run (``POST /v1/runs`` without ``input``): every model call of the agent
    carries ``X-Hermes-Run`` and is one request of that run."""
    async with httpx.AsyncClient(base_url=embedded_gateway.url, timeout=30) as http:
        created = await http.post("/v1/runs", json={"app": "weather_agent"})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        assert created.json()["hosted"] is False
        async with AsyncOpenAI(base_url=embedded_gateway.url + "/v1", api_key="any",
                               max_retries=0, default_headers={"X-Hermes-Run": run_id}) as c:
            log = ToolLog()
            result = await Runner.run(make_agent(log, agent_model(kind, c)), PROMPT)
        check(result, log)
        finished = await http.post(f"/v1/runs/{run_id}/finish")
        assert finished.status_code == 200, finished.text
        run = (await http.get(f"/v1/runs/{run_id}")).json()
    assert run["state"] == "finished" and run["app"] == "weather_agent"
    requests = [r for u in run["units"] for r in u["requests"]]
    assert len(requests) == len(result.raw_responses)
    assert all(r["state"] == "done" and r["output_tokens"] > 0 for r in requests)
    assert {(u["unit"], u["backend"]) for u in run["units"]} == {("default", f"llm:{CHAT_MODEL}")}
    assert {(r["kind"], r["node"]) for r in requests} == {("llm", "embedded")}

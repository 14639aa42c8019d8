"""``pydantic-ai``: an agent with two tools, on ``OpenAIChatModel`` and ``OpenAIResponsesModel``
(``run_sync``, ``run``, ``run_stream``) and with structured output, on both paths."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import pytest
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.messages import ModelResponse, RetryPromptPart, ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

from tests.compat import agents as shared
from tests.compat.agents import CHAT_MODEL, MAX_TOKENS, ONE_ROUND, PROMPT, CityReport, ToolLog

MODELS = {"chat": OpenAIChatModel, "responses": OpenAIResponsesModel}
SETTINGS = ModelSettings(max_tokens=MAX_TOKENS, extra_body=ONE_ROUND)


@pytest.fixture(params=list(MODELS))
def model(request: pytest.FixtureRequest, base_url: str) -> Iterator[Any]:
    provider = OpenAIProvider(base_url=base_url, api_key="any")
    yield MODELS[request.param](CHAT_MODEL, provider=provider)


def make_agent(model: Any, log: ToolLog, output_type: Any = str) -> Agent:
    agent = Agent(model, output_type=output_type, model_settings=SETTINGS,
                  instructions="Answer with the tools' help.")

    @agent.tool_plain
    def get_weather(city: str, unit: Literal["c", "f"]) -> str:
        """The current weather in a city."""
        log.record("get_weather", city=city, unit=unit)
        return shared.get_weather(city, unit)

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two integers."""
        log.record("add", a=a, b=b)
        return shared.add(a, b)

    return agent


def check(messages: list[Any], log: ToolLog) -> None:
    """Every call of the two tools ran (no argument failed validation and was retried)."""
    parts = [p for m in messages for p in m.parts]
    assert not [p for p in parts if isinstance(p, RetryPromptPart)]
    calls = [p for p in parts if isinstance(p, ToolCallPart) and p.tool_name in shared.IMPLS]
    assert log.calls and len(calls) == len(log.calls)


def test_run_sync(model: Any) -> None:
    log = ToolLog()
    result = make_agent(model, log).run_sync(PROMPT)
    assert isinstance(result.output, str) and result.output.strip()
    check(result.all_messages(), log)


async def test_run(model: Any) -> None:
    log = ToolLog()
    result = await make_agent(model, log).run(PROMPT)
    assert isinstance(result.output, str) and result.output.strip()
    check(result.all_messages(), log)
    responses = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
    if isinstance(model, OpenAIChatModel):  # sim_agent reaches the engine: one tool round
        assert len(responses) == 2


async def test_run_stream(model: Any) -> None:
    log = ToolLog()
    async with make_agent(model, log).run_stream(PROMPT) as result:
        pieces = [t async for t in result.stream_text(delta=True)]
    assert pieces and "".join(pieces).strip()
    check(result.all_messages(), log)


@pytest.mark.parametrize("mode", ["tool", "native"])
async def test_structured_output(model: Any, mode: str) -> None:
    """``output_type`` as pydantic-ai's default output tool (``final_result``) and as native
    structured output (``response_format`` / ``text.format`` with the JSON schema)."""
    log = ToolLog()
    output_type = CityReport if mode == "tool" else NativeOutput(CityReport)
    result = await make_agent(model, log, output_type).run("Report on Paris.")
    assert isinstance(result.output, CityReport)
    parts = [p for m in result.all_messages() for p in m.parts]
    assert not [p for p in parts if isinstance(p, RetryPromptPart)]

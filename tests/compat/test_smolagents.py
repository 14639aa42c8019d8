"""smolagents' ``ToolCallingAgent`` on ``OpenAIModel`` (plain and streamed) and its
structured output (``response_format``), on both paths, each agent run found as one run.

smolagents sends its history rewritten as text: earlier tool calls as assistant
``Calling tools: [{'id': 'call_...', ...}]`` messages, their results as user
``Observation:`` messages, so the gateway finds the run by the tool-call ids it issued."""

from __future__ import annotations

import json
from typing import Any

import pytest
from smolagents import OpenAIModel, ToolCallingAgent, tool

from tests.compat.agents import CHAT_MODEL, MAX_TOKENS, ONE_ROUND, CityReport, ToolLog
from tests.compat.runs import RunLog, assert_runs

#: the built-in engine picks any of the agent's tools, ``final_answer`` included (about one
#: agent run in six ends at its first call): three agent runs make a continued one sure enough
TASKS = ("What is the weather in Paris in celsius, and what is 2 + 3?",
         "What is the weather in Lima in celsius, and what is 4 + 5?",
         "What is the weather in Osaka in celsius, and what is 6 + 7?")


def make_tools(log: ToolLog) -> list[Any]:
    @tool
    def get_weather(city: str, unit: str) -> str:
        """The current weather in a city.

        Args:
            city: a city name
            unit: "c" or "f"
        """
        log.calls.append(("get_weather", {"city": city, "unit": unit}))  # smolagents checked
        return f"{city}: 21 degrees, sunny"

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first integer
            b: the second integer
        """
        log.record("add", a=a, b=b)  # validated against the matrix's schema
        return a + b

    return [get_weather, add]


def model(base_url: str, runs: RunLog) -> OpenAIModel:
    return OpenAIModel(model_id=CHAT_MODEL, api_base=base_url, api_key="any",
                       client_kwargs={"max_retries": 0, "http_client": runs.client()},
                       max_tokens=MAX_TOKENS, extra_body=ONE_ROUND)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calling_agent(base_url: str, stream: bool) -> None:
    runs = RunLog()
    m = model(base_url, runs)
    called = 0
    for task in TASKS:
        runs.next_run()
        log = ToolLog()
        agent = ToolCallingAgent(tools=make_tools(log), model=m, max_steps=4,
                                 stream_outputs=stream, verbosity_level=0)
        agent.run(task)
        called += any(getattr(s, "tool_calls", None) for s in agent.memory.steps)
    # the built-in engine now and then answers smolagents' first turn in text (seen in 2 of 6
    # runs of this module, not understood): at least one agent run of three calls tools
    assert called >= 1, "no agent run made a tool call"
    assert max(len(r) for r in runs.per_run) >= 2  # a tool round trip continued a run
    assert_runs(base_url, runs.per_run, agent_runs=len(TASKS))


def test_structured_output(base_url: str) -> None:
    runs = RunLog()
    m = model(base_url, runs)
    fmt = {"type": "json_schema", "json_schema": {"name": "CityReport", "strict": True,
                                                  "schema": CityReport.model_json_schema()}}
    msg = m.generate([{"role": "user", "content": [{"type": "text", "text": "Report on Paris."}]}],
                     response_format=fmt)
    CityReport.model_validate(json.loads(msg.content))
    assert_runs(base_url, runs.per_run, agent_runs=1)

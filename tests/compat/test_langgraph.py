"""LangGraph's prebuilt ReAct agent (``create_react_agent`` over ``ChatOpenAI``): invoked,
streamed token by token, and with a structured response, on both paths; each agent run found
as one run."""

from __future__ import annotations

import warnings

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

with warnings.catch_warnings():  # moved to langchain.agents in LangGraph 1.x, still shipped
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent

from tests.compat.agents import CHAT_MODEL, MAX_TOKENS, ONE_ROUND, CityReport, ToolLog
from tests.compat.runs import RunLog, assert_runs

TASKS = ("What is the weather in Paris in celsius, and what is 2 + 3?",
         "What is the weather in Lima in celsius, and what is 4 + 5?")


def make_agent(base_url: str, runs: RunLog, log: ToolLog, *, stream: bool = False,
               response_format: type | None = None):  # noqa: ANN201
    @tool
    def get_weather(city: str, unit: str) -> str:
        """The current weather in a city (unit: "c" or "f")."""
        log.calls.append(("get_weather", {"city": city, "unit": unit}))
        return f"{city}: 21 degrees, sunny"

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        log.record("add", a=a, b=b)
        return a + b

    llm = ChatOpenAI(base_url=base_url, api_key="any", model=CHAT_MODEL, max_tokens=MAX_TOKENS,
                     max_retries=0, extra_body=ONE_ROUND, streaming=stream,
                     http_client=runs.client())
    kw = {} if response_format is None else {"response_format": response_format}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_react_agent(llm, [get_weather, add], **kw)


@pytest.mark.parametrize("stream", [False, True])
def test_react_agent(base_url: str, stream: bool) -> None:
    runs = RunLog()
    for task in TASKS:
        runs.next_run()
        log = ToolLog()
        agent = make_agent(base_url, runs, log, stream=stream)
        inputs = {"messages": [("user", task)]}
        if stream:
            tokens = [chunk for chunk, _ in agent.stream(inputs, stream_mode="messages")]
            assert len(tokens) > 2
            assert any(isinstance(t, ToolMessage) for t in tokens)
        else:
            out = agent.invoke(inputs)
            assert any(isinstance(m, ToolMessage) for m in out["messages"])
            final = out["messages"][-1]
            assert isinstance(final, AIMessage) and not final.tool_calls
        assert log.calls
    assert_runs(base_url, runs.per_run, agent_runs=len(TASKS))


def test_react_agent_structured_response(base_url: str) -> None:
    runs = RunLog()
    log = ToolLog()
    agent = make_agent(base_url, runs, log, response_format=CityReport)
    out = agent.invoke({"messages": [("user", "Report on the weather in Paris.")]})
    assert isinstance(out["structured_response"], CityReport)
    assert_runs(base_url, runs.per_run, agent_runs=1)

"""``langchain-openai``'s ``ChatOpenAI``: invoke, stream, a ``bind_tools`` loop and
``with_structured_output``, on both paths."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI

from tests.compat.agents import (
    CHAT_MODEL,
    MAX_TOKENS,
    MAX_TURNS,
    ONE_ROUND,
    PROMPT,
    CityReport,
    ToolLog,
    chat_tools,
)


@pytest.fixture
def llm(base_url: str) -> ChatOpenAI:
    return ChatOpenAI(base_url=base_url, api_key="any", model=CHAT_MODEL, max_tokens=MAX_TOKENS,
                      max_retries=0, extra_body=ONE_ROUND)


def test_invoke(llm: ChatOpenAI) -> None:
    msg = llm.invoke("Say something.")
    assert isinstance(msg, AIMessage) and msg.content.strip()
    assert msg.response_metadata["finish_reason"] == "stop"
    assert msg.usage_metadata and msg.usage_metadata["output_tokens"] > 0


def test_stream(llm: ChatOpenAI) -> None:
    chunks = list(llm.stream("Say something."))
    assert len(chunks) > 1 and all(isinstance(c, AIMessageChunk) for c in chunks)
    whole = chunks[0]
    for c in chunks[1:]:
        whole += c
    assert whole.content.strip()
    assert whole.response_metadata["finish_reason"] == "stop"


def test_bind_tools_loop(llm: ChatOpenAI) -> None:
    log = ToolLog()
    agent = llm.bind_tools(chat_tools())
    messages: list = [HumanMessage(PROMPT)]
    for rounds in range(MAX_TURNS):  # noqa: B007
        msg = agent.invoke(messages)
        messages.append(msg)
        if not msg.tool_calls:
            break
        assert not msg.invalid_tool_calls
        for tc in msg.tool_calls:
            messages.append(ToolMessage(log.call(tc["name"], tc["args"]),
                                        tool_call_id=tc["id"]))
    assert rounds == 1 and log.calls
    final = messages[-1]
    assert isinstance(final, AIMessage) and final.content.strip() and not final.tool_calls


# not ``json_mode``: it asks for any JSON object and puts the schema in the prompt only, which
# a simulated model does not read
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output(llm: ChatOpenAI, method: str) -> None:
    structured = llm.with_structured_output(CityReport, method=method)
    report = structured.invoke("Report on Paris as JSON.")
    assert isinstance(report, CityReport)


def test_structured_output_default_method(llm: ChatOpenAI) -> None:
    """``ChatOpenAI``'s default is ``json_schema`` (``response_format``)."""
    report = llm.with_structured_output(CityReport).invoke("Report on Paris.")
    assert isinstance(report, CityReport)

"""AutoGen AgentChat as a client of the gateway, run by its own venv's python (autogen-core
pins protobuf 5).

``python autogen_client.py BASE_URL MODE``; MODE ``agent`` (an ``AssistantAgent`` with two
tools that reflects on their results), ``stream`` (the same with the model client streaming,
``run_stream``) or ``structured`` (``output_content_type``: ``response_format``). Prints one
JSON object: the ``X-Hermes-Run`` of every model call per agent run (``runs``), the tool calls
executed (``tools``, per agent run) and the final message's type (``final``)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_agentchat.messages import ToolCallExecutionEvent
from autogen_core.models import ModelFamily
from autogen_ext.models.openai import OpenAIChatCompletionClient
from pydantic import BaseModel

try:  # openai 3.x speaks httpx2 (httpx's successor)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]

MODEL = "llama-2-7b"
ONE_ROUND = {"sim_agent": {"tool_call_p": 0.0}}
TASKS = ["What is the weather in Paris in celsius, and what is 2 + 3?",
         "What is the weather in Lima in celsius, and what is 4 + 5?"]


class CityReport(BaseModel):
    city: str
    temperature_c: int
    sunny: bool


async def get_weather(city: str, unit: str) -> str:
    """The current weather in a city (unit: "c" or "f")."""
    return f"{city}: 21 degrees, sunny"


async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main(base_url: str, mode: str) -> dict[str, Any]:
    runs: list[list[str]] = []

    async def hook(r: httpx.Response) -> None:
        if "x-hermes-run" in r.headers:
            runs[-1].append(r.headers["x-hermes-run"])

    client = OpenAIChatCompletionClient(
        model=MODEL, base_url=base_url, api_key="any", max_retries=0, max_tokens=256,
        extra_body=ONE_ROUND, http_client=httpx.AsyncClient(event_hooks={"response": [hook]}),
        model_info={"vision": False, "function_calling": True, "json_output": True,
                    "structured_output": True, "family": ModelFamily.UNKNOWN})
    out: dict[str, Any] = {"runs": runs, "tools": [], "final": []}
    if mode == "structured":
        runs.append([])
        agent = AssistantAgent("reporter", model_client=client, output_content_type=CityReport)
        result = await agent.run(task="Report on the weather in Paris.")
        last = result.messages[-1]
        out["final"].append(type(last).__name__)
        out["report"] = last.content.model_dump()
        return out
    for task in TASKS:
        runs.append([])
        agent = AssistantAgent("assistant", model_client=client, tools=[get_weather, add],
                               reflect_on_tool_use=True, model_client_stream=mode == "stream")
        executed: list[str] = []
        result = None
        if mode == "stream":
            chunks = 0
            async for ev in agent.run_stream(task=task):
                if isinstance(ev, TaskResult):
                    result = ev
                else:
                    chunks += type(ev).__name__ == "ModelClientStreamingChunkEvent"
            out.setdefault("chunks", []).append(chunks)
        else:
            result = await agent.run(task=task)
        assert result is not None
        for m in result.messages:
            if isinstance(m, ToolCallExecutionEvent):
                executed += [r.name for r in m.content if not r.is_error]
        out["tools"].append(executed)
        out["final"].append(type(result.messages[-1]).__name__)
    await client.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))

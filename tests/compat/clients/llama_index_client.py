"""llama-index as a client of the gateway, run by its own venv's python (it pins openai 2).

``python llama_index_client.py BASE_URL MODE``; MODE ``agent`` (a FunctionAgent's tool loop,
``agent.run``), ``stream`` (the same agent streamed, parallel tool calls allowed) or
``structured`` (``structured_predict``: a forced tool call). Prints one JSON object: the
``X-Hermes-Run`` of every model call per agent run (``runs``); per agent run, the tool-call ids
the gateway sent (``sent``: read from the raw answer bytes by a transport that tees them), the
calls the agent asked for (``asked``) and the results it produced (``results``: id, tool name,
whether the tool ran); ``parallel``: model turns that sent more than one call."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from typing import Any

import httpx
from llama_index.core.agent.workflow import AgentOutput, FunctionAgent, ToolCallResult
from llama_index.core.prompts import PromptTemplate
from llama_index.llms.openai_like import OpenAILike
from pydantic import BaseModel

MODEL = "llama-2-7b"
ONE_ROUND = {"sim_agent": {"tool_call_p": 0.0}}
TASKS = [f"What is the weather in {c} in celsius, and what is 2 + 3?"
         for c in ("Paris", "Lima", "Osaka", "Quito", "Dakar", "Hanoi", "Perth", "Turin")]


class CityReport(BaseModel):
    city: str
    temperature_c: int
    sunny: bool


def get_weather(city: str, unit: str) -> str:
    """The current weather in a city (unit: "c" or "f")."""
    return f"{city}: 21 degrees, sunny"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


CALL_ID = re.compile(rb'"id":\s*"(call_[A-Za-z0-9]+)"')


class _Tee(httpx.AsyncByteStream):
    def __init__(self, inner: Any, sink: list[bytes]) -> None:
        self.inner, self.sink = inner, sink

    async def __aiter__(self):  # noqa: ANN204
        async for b in self.inner:
            self.sink.append(b)
            yield b

    async def aclose(self) -> None:
        await self.inner.aclose()


class TeeTransport(httpx.AsyncBaseTransport):
    """Keeps the bytes of every answer, as the server sent them."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.bodies: list[list[bytes]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        resp = await self.inner.handle_async_request(request)
        sink: list[bytes] = []
        self.bodies.append(sink)
        return httpx.Response(resp.status_code, headers=resp.headers,
                              stream=_Tee(resp.stream, sink), extensions=resp.extensions)

    def sent(self) -> list[list[str]]:
        """The tool-call ids of each answer since the last call (then forgotten)."""
        out = []
        for sink in self.bodies:
            ids: list[str] = []
            for m in CALL_ID.findall(b"".join(sink)):
                if m.decode() not in ids:
                    ids.append(m.decode())
            out.append(ids)
        self.bodies = []
        return out


def main(base_url: str, mode: str) -> dict[str, Any]:
    runs: list[list[str]] = []
    tee = TeeTransport()

    def hook(r: httpx.Response) -> None:
        if "x-hermes-run" in r.headers:
            runs[-1].append(r.headers["x-hermes-run"])

    async def ahook(r: httpx.Response) -> None:
        hook(r)

    llm = OpenAILike(model=MODEL, api_base=base_url, api_key="any", is_chat_model=True,
                     is_function_calling_model=True, context_window=4096, max_tokens=256,
                     max_retries=0, additional_kwargs={"extra_body": ONE_ROUND},
                     http_client=httpx.Client(event_hooks={"response": [hook]}),
                     async_http_client=httpx.AsyncClient(event_hooks={"response": [ahook]},
                                                         transport=tee))
    out: dict[str, Any] = {"runs": runs, "sent": [], "asked": [], "results": [], "parallel": 0}
    if mode == "structured":
        runs.append([])
        report = llm.structured_predict(CityReport, PromptTemplate("Report on {city}."),
                                        city="Paris")
        out["report"] = report.model_dump()
        return out

    async def agent_runs() -> None:
        tasks = TASKS if mode == "stream" else TASKS[:2]
        for task in tasks:
            runs.append([])
            agent = FunctionAgent(tools=[get_weather, add], llm=llm,
                                  streaming=mode == "stream", allow_parallel_tool_calls=True)
            asked: list[str] = []
            results: list[list[Any]] = []
            handler = agent.run(user_msg=task)
            async for ev in handler.stream_events():
                if isinstance(ev, AgentOutput) and ev.tool_calls:
                    asked += [c.tool_id for c in ev.tool_calls]
                elif isinstance(ev, ToolCallResult):
                    results.append([ev.tool_id, ev.tool_name, not ev.tool_output.is_error])
            final = await handler
            sent = tee.sent()
            out["parallel"] += sum(len(ids) > 1 for ids in sent)
            out["sent"].append([i for ids in sent for i in ids])
            out["asked"].append(asked)
            out["results"].append(results)
            out.setdefault("final", []).append(str(final))
            if mode == "stream" and out["parallel"] >= 1 and len(runs) >= 2:
                break

    asyncio.run(agent_runs())
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))

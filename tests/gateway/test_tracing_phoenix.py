"""Traces of runs in a real trace backend (slow tier): Arize Phoenix, an LLM-app trace store
that takes OTLP, started from its own venv (``.ci/phoenix.sh``; ``HERMES_PHOENIX`` names its
``phoenix`` executable). The gateway exports over OTLP/HTTP from its export process; the test
reads the spans back through Phoenix's own REST API and checks, for a header-less agent run
driven by the OpenAI Agents SDK (its own tracing upload off) and for a hosted run sent with a
client ``traceparent``: one root per run, its units, requests and tools, the GenAI
attributes, and the join to the client's trace."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes.procs import free_port, stop_group

pytestmark = pytest.mark.slow

TRACE = "5bf92f3577b34da6a3ce929d0e0e4737"
CALLER = "10f067aa0ba902b8"


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = os.environ.get("HERMES_PHOENIX")
    if not exe:
        pytest.skip("HERMES_PHOENIX is not set (.ci/phoenix.sh builds Phoenix's venv)")
    port, grpc = free_port(), free_port()
    work = tmp_path_factory.mktemp("phoenix")
    env = {**os.environ, "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(grpc),
           "PHOENIX_HOST": "127.0.0.1", "PHOENIX_WORKING_DIR": str(work),
           "PHOENIX_TELEMETRY_ENABLED": "false", "DO_NOT_TRACK": "1"}
    log = (Path(work) / "phoenix.log").open("wb")
    proc = subprocess.Popen([exe, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_group(proc)
            pytest.fail(f"Phoenix did not start: {(Path(work) / 'phoenix.log').read_text()[-2000:]}")
        time.sleep(0.5)
    yield url
    stop_group(proc)


def _spans(phoenix: str, **params: Any) -> list[dict[str, Any]]:
    """Spans of Phoenix's default project, through its REST API (every page)."""
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        q = {"limit": 1000, **params, **({"cursor": cursor} if cursor else {})}
        r = httpx.get(f"{phoenix}/v1/projects/default/spans", params=q, timeout=30)
        r.raise_for_status()
        body = r.json()
        out += body["data"]
        cursor = body.get("next_cursor")
        if not cursor:
            return out


def _until(what: str, check: Any, limit_s: float = 60.0) -> Any:
    deadline = time.monotonic() + limit_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)


def _tree(spans: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The one root of a trace's spans, and each span's children by span id."""
    ids = {s["context"]["span_id"] for s in spans}
    roots = [s for s in spans if s["parent_id"] not in ids]
    assert len(roots) == 1, [s["name"] for s in roots]
    children: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        children.setdefault(s["parent_id"], []).append(s)
    return roots[0], children


def _check_llm(span: dict[str, Any], model: str) -> None:
    a = span["attributes"]
    assert span["name"] == f"chat {model}" and span["span_kind"] == "LLM"
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == model
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert a["gen_ai.response.finish_reasons"]
    assert a["hermes.policy"] == "hermes" and "hermes.queue_s" in a
    assert a["hermes.engine"] == "sim0" and a["hermes.node"] == "embedded"


def test_agent_and_hosted_runs_in_phoenix(make_gateway, phoenix) -> None:  # noqa: ANN001
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    srv = make_gateway(
        tracing={"enabled": True, "endpoint": phoenix},
        tools={"docker_steps": "runner"},
        # an inferred run closes soon after its last request (scheduler seconds, x50 here)
        identity={"close_min_s": 5.0, "close_max_s": 10.0, "close_prior_s": 5.0})

    # 1. a header-less agent run: the OpenAI Agents SDK, its own tracing upload off
    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"{city}: 21 degrees, sunny"

    client = AsyncOpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    agent = Agent(name="weather", instructions="You answer weather questions with the tool.",
                  tools=[get_weather],
                  model=OpenAIChatCompletionsModel(model="llama-2-7b", openai_client=client))
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=6))
    assert result.final_output and calls  # the model called the tool, then answered

    roots = _until("the agent run's root span", lambda: [
        s for s in _spans(phoenix, parent_id="null")
        if s["attributes"].get("hermes.inferred") is True], limit_s=90)
    assert len(roots) == 1
    trace = roots[0]["context"]["trace_id"]
    spans = _spans(phoenix, trace_id=trace)
    root, children = _tree(spans)
    assert root["parent_id"] is None  # no traceparent: the run is its own trace
    assert root["name"].startswith("run ") and root["attributes"]["hermes.outcome"] == "finished"
    assert root["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert any(e["name"] == "hermes.run_end_inferred" for e in root["events"])
    units = children[root["context"]["span_id"]]
    assert units and all(u["name"].startswith("unit ") for u in units)
    llm = [s for u in units for s in children.get(u["context"]["span_id"], [])]
    assert len(llm) >= 2  # the tool call's turn and the answer's: one run
    for s in llm:
        _check_llm(s, "llama-2-7b")
    assert not any("gen_ai.input.messages" in s["attributes"] for s in spans)

    # 2. a hosted run (POST /v1/runs), sent with the client's own trace context
    http = httpx.Client(base_url=srv.url, timeout=60)
    r = http.post("/v1/runs", json={"app": "code_generation", "input": {"seed": 3}},
                  headers={"traceparent": f"00-{TRACE}-{CALLER}-01"})
    assert r.status_code == 201, r.text
    run_id = r.json()["run_id"]
    _until("the hosted run's end", lambda: http.get(f"/v1/runs/{run_id}").json()["state"]
           in ("finished", "failed"), limit_s=120)
    assert http.get(f"/v1/runs/{run_id}").json()["state"] == "finished"
    doc = http.get(f"/v1/runs/{run_id}").json()
    n_requests = sum(1 for u in doc["units"] for q in u["requests"] if q["kind"] == "llm")
    n_tools = sum(1 for u in doc["units"] for q in u["requests"] if q["kind"] == "tool")
    assert n_tools >= 1

    def hosted_spans() -> list[dict[str, Any]] | None:
        got = _spans(phoenix, trace_id=TRACE)
        return got if any(s["name"] == "run code_generation" for s in got) else None

    spans = _until("the hosted run's spans", hosted_spans, limit_s=60)
    root, children = _tree(spans)
    assert root["name"] == "run code_generation" and root["parent_id"] == CALLER  # joined
    assert root["attributes"]["hermes.run_id"] == run_id
    assert root["attributes"]["hermes.hosted"] is True
    units = children[root["context"]["span_id"]]
    assert len(units) == len(doc["units"])  # one span per unit invocation
    assert sorted(u["attributes"]["hermes.unit"] for u in units) == sorted(
        u["unit"] for u in doc["units"])
    below = [s for u in units for s in children.get(u["context"]["span_id"], [])]
    tools = [s for s in below if s["span_kind"] == "TOOL"]
    llm = [s for s in below if s["span_kind"] == "LLM"]
    assert len(tools) == n_tools and len(llm) == n_requests
    for s in llm:
        _check_llm(s, "llama-2-7b")
    for s in tools:
        assert s["attributes"]["gen_ai.operation.name"] == "execute_tool"
        assert s["attributes"]["hermes.exit_code"] == 0
    srv.stop()

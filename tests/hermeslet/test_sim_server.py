"""The sim-engine as a real server process, exercised with httpx and the real openai client."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(60)


def metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def test_completions_and_chat_with_openai_client(sim_url):
    c = client(sim_url)
    r = c.completions.create(model="sim-7b", prompt="a" * 20, max_tokens=9, extra_body={"ignore_eos": True})
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (5, 9)
    assert len(r.choices[0].text.split()) == 9 and r.choices[0].finish_reason == "length"
    ids = c.completions.create(model="sim-7b", prompt=[1, 2, 3, 4, 5, 6, 7], max_tokens=2)
    assert ids.usage.prompt_tokens == 7
    ch = c.chat.completions.create(
        model="sim-7b", max_tokens=4, extra_body={"ignore_eos": True},
        messages=[{"role": "system", "content": "s" * 16}, {"role": "user", "content": "hi"}])
    assert ch.choices[0].message.role == "assistant"
    assert len(ch.choices[0].message.content.split()) == 4
    assert ch.usage.prompt_tokens == 5 + 2 * 4  # ceil(18/4) + 4 per message
    assert [m.id for m in c.models.list().data] == ["sim-7b"]


def test_streaming_chat_and_completions(sim_url):
    c = client(sim_url)
    chunks = list(c.chat.completions.create(
        model="sim-7b", max_tokens=30, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": "stream please"}]))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert len(text.split()) == 30
    assert chunks[-1].usage.completion_tokens == 30
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    comp = list(c.completions.create(model="sim-7b", prompt="p", max_tokens=6, stream=True, extra_body={"ignore_eos": True}))
    assert len("".join(ch.choices[0].text for ch in comp).split()) == 6
    # raw SSE framing, as vLLM sends it
    with httpx.stream("POST", sim_url + "/v1/completions",
                      json={"model": "sim-7b", "prompt": "p", "max_tokens": 3,
                            "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"
    assert json.loads(lines[0][6:])["object"] == "text_completion"


def test_errors_use_openai_shape(sim_url):
    c = client(sim_url)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="nope", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="sim-7b", prompt="x", max_tokens=0)
    r = httpx.post(sim_url + "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == 400


def test_lora_load_and_unload(sim_url):
    c = client(sim_url)
    r = httpx.post(sim_url + "/v1/load_lora_adapter",
                   json={"lora_name": "sql", "lora_path": "/adapters/sql"})
    assert r.status_code == 200
    assert httpx.post(sim_url + "/v1/load_lora_adapter",
                      json={"lora_name": "sql", "lora_path": "/x"}).status_code == 400
    models = {m.id: m for m in c.models.list().data}
    assert set(models) == {"sim-7b", "sql"} and models["sql"].parent == "sim-7b"
    assert c.completions.create(model="sql", prompt="q", max_tokens=2, extra_body={"ignore_eos": True}).usage.completion_tokens == 2
    assert httpx.post(sim_url + "/v1/unload_lora_adapter",
                      json={"lora_name": "sql"}).status_code == 200
    assert httpx.post(sim_url + "/v1/unload_lora_adapter",
                      json={"lora_name": "sql"}).status_code == 404
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="sql", prompt="q", max_tokens=2)


def test_metrics_count_tokens_and_prefix_hits(sim_url):
    before = metrics(sim_url)
    c = client(sim_url)
    system = {"role": "system", "content": "You verify claims. " * 20}
    for q in ("one", "two", "three"):
        c.chat.completions.create(model="sim-7b", max_tokens=5, extra_body={"ignore_eos": True},
                                  messages=[system, {"role": "user", "content": q}])
    after = metrics(sim_url)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 15
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 3
    q = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    h = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert q > 0 and 0 < h < q  # the 2nd and 3rd requests reuse the system prompt
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0


async def test_running_gauge_and_priority_order(serial_sim_url):
    """One request at a time: a later, lower `priority` value is served before an earlier one."""
    url = serial_sim_url
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    order: list[str] = []

    async def req(name: str, prio: int, n: int) -> None:
        await c.completions.create(model="sim-7b", prompt="p", max_tokens=n,
                                   extra_body={"priority": prio, "ignore_eos": True})
        order.append(name)

    async with httpx.AsyncClient() as h:
        async def gauges_reach(running: int, waiting: int) -> dict[str, float]:
            # each request is seen queued before the next is sent (a loaded machine may
            # delay any of them), and the first one, ~5 s alone, is still running
            deadline = time.monotonic() + 4.0
            while True:
                text = (await h.get(url + "/metrics")).text
                m = {s.name: s.value for f in text_string_to_metric_families(text)
                     for s in f.samples}
                got = (m["vllm:num_requests_running"], m["vllm:num_requests_waiting"])
                if got == (running, waiting):
                    return m
                assert time.monotonic() < deadline, f"running/waiting {got}"
                await asyncio.sleep(0.01)

        first = asyncio.create_task(req("first", 0, 400))
        await gauges_reach(1, 0)
        low = asyncio.create_task(req("low", 10, 3))
        await gauges_reach(1, 1)
        high = asyncio.create_task(req("high", 1, 3))
        m = await gauges_reach(1, 2)
    assert m["vllm:kv_cache_usage_perc"] > 0
    await asyncio.gather(first, low, high)
    assert order == ["first", "high", "low"]


async def test_client_disconnect_aborts_in_engine(sim_url):
    async with httpx.AsyncClient(base_url=sim_url) as h:
        t = asyncio.create_task(h.post("/v1/completions", json={
            "model": "sim-7b", "prompt": "p", "max_tokens": 100_000 // 4, "ignore_eos": True}))
        await asyncio.sleep(0.3)
        assert metrics(sim_url)["vllm:num_requests_running"] == 1
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        for _ in range(20):
            await asyncio.sleep(0.1)
            if metrics(sim_url)["vllm:num_requests_running"] == 0:
                break
        assert metrics(sim_url)["vllm:num_requests_running"] == 0


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {
        "q": {"type": "string", "minLength": 3}, "k": {"type": "integer", "minimum": 1,
                                                       "maximum": 5}},
        "required": ["q"]}}}


def test_tool_calls_streamed_accumulate_to_the_non_streamed_answer(sim_url):
    """The same seeded request streamed and not: tool-call deltas accumulated by index are
    the calls of the whole answer (ids, names, JSON arguments); a tool loop ends in text."""
    import jsonschema

    c = client(sim_url)
    kw = {"model": "sim-7b", "tools": [WEATHER, SEARCH], "seed": 7, "n": 2,
          "messages": [{"role": "user", "content": "weather in Paris?"}]}
    whole = c.chat.completions.create(**kw)
    chunks = list(c.chat.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({ch.id for ch in chunks}) == 1
    for choice in whole.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        calls: dict[int, dict] = {}
        finish = None
        for ch in chunks:
            for cc in ch.choices:
                if cc.index != choice.index:
                    continue
                finish = cc.finish_reason or finish
                for d in cc.delta.tool_calls or ():
                    acc = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                    acc["id"] = d.id or acc["id"]
                    acc["name"] += d.function.name or ""
                    acc["arguments"] += d.function.arguments or ""
        assert finish == "tool_calls"
        got = [calls[i] for i in sorted(calls)]
        assert got == [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
                       for t in choice.message.tool_calls]
        tools = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, SEARCH)}
        for call in got:
            jsonschema.validate(json.loads(call["arguments"]), tools[call["name"]])
    # the loop: tool results go back; with tool_call_p 0 the model answers in text
    call = whole.choices[0].message.tool_calls[0]
    msgs = [*kw["messages"], whole.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    answer = c.chat.completions.create(model="sim-7b", tools=[WEATHER, SEARCH], messages=msgs,
                                       extra_body={"sim_agent": {"tool_call_p": 0.0}})
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content
    assert not answer.choices[0].message.tool_calls
    with pytest.raises(openai.BadRequestError, match="sim_agent.tool_call_p"):
        c.chat.completions.create(model="sim-7b", messages=msgs,
                                  extra_body={"sim_agent": {"tool_call_p": 2}})


def test_parse_with_a_pydantic_response_format(sim_url):
    from typing import Literal

    from pydantic import BaseModel, Field

    class Step(BaseModel):
        action: Literal["search", "answer"]
        detail: str = Field(max_length=40)

    class Plan(BaseModel):
        goal: str
        steps: list[Step] = Field(min_length=1, max_length=4)
        confidence: float = Field(ge=0, le=1)
        owner: str | None = None

    c = client(sim_url)
    for seed in range(3):
        r = c.chat.completions.parse(model="sim-7b", response_format=Plan, seed=seed,
                                     messages=[{"role": "user", "content": "plan a trip"}])
        plan = r.choices[0].message.parsed
        assert isinstance(plan, Plan) and 1 <= len(plan.steps) <= 4
        assert r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens == -(-len(r.choices[0].message.content) // 4)


def test_embeddings_with_the_openai_client(sim_url):
    from tests.hermeslet.conftest import running_sim

    with running_sim("--time-scale", "50", "--model", "emb-7b", "--task", "embed") as url:
        c = client(url)
        r = c.embeddings.create(model="emb-7b", input=["the cat sat", "the cat sat down",
                                                       "quantum lattice gauge"])
        vecs = [d.embedding for d in r.data]  # the client asks for base64 and decodes it
        assert [d.index for d in r.data] == [0, 1, 2] and all(len(v) == 256 for v in vecs)
        dot = [sum(a * b for a, b in zip(vecs[0], v, strict=True)) for v in vecs]
        assert dot[0] == pytest.approx(1.0, abs=1e-5) and dot[1] > 0.5 > dot[2]
        assert r.usage.prompt_tokens == 3 + 4 + 6 and r.usage.total_tokens == 13
        small = c.embeddings.create(model="emb-7b", input="the cat sat", dimensions=32,
                                    encoding_format="float")
        assert len(small.data[0].embedding) == 32
        with pytest.raises(openai.BadRequestError, match="emb-7b.*does not support chat"):
            c.chat.completions.create(model="emb-7b",
                                      messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="sim-7b.*does not support embeddings"):
        client(sim_url).embeddings.create(model="sim-7b", input="hi")

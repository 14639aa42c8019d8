"""The OpenAI HTTP adapter against a real sim-engine process, alone and behind a HermesLet."""

from __future__ import annotations

import asyncio

import pytest

from hermes import protocol as P
from hermeslet.engines.base import EngineError, GenChunk, GenResult
from hermeslet.engines.openai_http import OpenAIHTTPEngine
from tests.hermeslet.test_agent import running, submit
from tests.hermeslet.test_sim_server import metrics

pytestmark = pytest.mark.timeout(60)


async def drain(engine, endpoint, body, stream, rid="r", priority=None):
    items = []
    async for x in engine.generate(endpoint, body, stream, request_id=rid, priority=priority):
        items.append(x)
    return items


async def test_generate_plain_and_streamed(sim_url):
    e = OpenAIHTTPEngine(sim_url, name="o")
    await e.start()
    assert e.model == "sim-7b"  # learnt from /v1/models
    try:
        [res] = await drain(e, "completions", {"prompt": "abcdefgh", "max_tokens": 6, "ignore_eos": True}, False)
        assert isinstance(res, GenResult)
        assert (res.input_tokens, res.output_tokens) == (2, 6)
        assert res.response["object"] == "text_completion"
        items = await drain(e, "chat", {"messages": [{"role": "user", "content": "hey"}],
                                        "max_tokens": 25, "ignore_eos": True}, True, rid="s")
        chunks, final = items[:-1], items[-1]
        assert all(isinstance(c, GenChunk) for c in chunks) and len(chunks) >= 2
        assert final.output_tokens == 25 and final.input_tokens == 1 + 4
        assert "".join(c.text for c in chunks) == final.text
        assert len(final.text.split()) == 25
        with pytest.raises(EngineError) as ei:
            await drain(e, "completions", {"model": "nope", "prompt": "x"}, False)
        assert ei.value.status == 404 and not ei.value.retryable
        m = await e.metrics()
        assert m.running == 0 and m.kv_usage == 0.0
        assert await e.health()
    finally:
        await e.close()


async def test_priority_passed_through_orders_engine_queue(serial_sim_url):
    e = OpenAIHTTPEngine(serial_sim_url, name="o", use_priority=True)
    await e.start()
    order: list[str] = []

    async def go(rid, prio, n):
        await drain(e, "completions", {"prompt": "p", "max_tokens": n, "ignore_eos": True}, False, rid, prio)
        order.append(rid)

    try:
        first = asyncio.create_task(go("first", 0, 50))
        await asyncio.sleep(0.05)
        rest = [asyncio.create_task(go("b", 7, 2)), asyncio.create_task(go("a", 3, 2))]
        await asyncio.sleep(0.05)
        await asyncio.gather(first, *rest)
        assert order == ["first", "a", "b"]
    finally:
        await e.close()


async def test_hermeslet_over_http_engine_counts_and_cancel(serial_sim_url):
    e = OpenAIHTTPEngine(serial_sim_url, name="http", max_inflight=2)
    async with running([e]) as (sched, _, hello, _):
        assert hello.engines[0].model == "sim-7b" and hello.engines[0].kind == "openai"
        await sched.send(submit("ok", [0.0], model="sim-7b", prompt="q" * 12, max_tokens=4))
        done = await sched.recv("done")
        assert (done.input_tokens, done.output_tokens) == (3, 4)
        await sched.send(submit("long", [0.0], model="sim-7b", max_tokens=5000))
        await asyncio.sleep(0.3)
        assert metrics(serial_sim_url)["vllm:num_requests_running"] == 1
        await sched.send(P.Cancel(request_ids=["long"]))
        f = await sched.recv("failed")
        assert f.request_id == "long" and f.error == "cancelled"
        for _ in range(20):  # closing the HTTP stream aborts the request at the engine
            await asyncio.sleep(0.1)
            if metrics(serial_sim_url)["vllm:num_requests_running"] == 0:
                break
        assert metrics(serial_sim_url)["vllm:num_requests_running"] == 0

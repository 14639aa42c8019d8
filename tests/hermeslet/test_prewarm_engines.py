"""LoRA and KV-prefix prewarmers against the built-in engine's real HTTP server (vLLM's API)."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from hermeslet.prewarmers import DnnHook, KVPrefixPrewarmer, LoraPrewarmer, NodePrewarmer


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    m = re.search(rf"^{re.escape(name)}(?:_total)?{{[^}}]*}} ([0-9.e+]+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def _models(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(url + "/v1/models", timeout=5).json()["data"]}


def test_lora_prewarmer_loads_within_max_loras_and_unloads(sim_url):
    pw = LoraPrewarmer(sim_url, max_loras=2, paths={n: f"/adapters/{n}" for n in "abc"})

    async def go() -> None:
        assert await pw.load("a") > 0.0
        assert await pw.load("a") == 0.0  # already resident
        await pw.load("b")
        await pw.load("c")  # beyond max_loras: the least recently used (a) is unloaded
        assert {"b", "c"} <= _models(sim_url) and "a" not in _models(sim_url)
        assert await pw.unload("b")
        assert "b" not in _models(sim_url)
        with pytest.raises(ValueError, match="no path known"):
            await pw.load("zzz")
        await pw.unload("c")

    asyncio.run(go())
    assert pw.counters.started == 3


def test_node_prewarmer_routes_lora_signal_and_requests_use_the_adapter(sim_url):
    node = NodePrewarmer(loras={"sim-7b": LoraPrewarmer(sim_url, paths={"t1": "/a/t1"})})

    async def go() -> None:
        ok, detail = await node.handle("lora:sim-7b@t1", "start")
        assert ok and detail.startswith("warmup_s=")
        r = httpx.post(sim_url + "/v1/completions", timeout=10,
                       json={"model": "t1", "prompt": "hello", "max_tokens": 2})
        assert r.status_code == 200
        ok, _ = await node.handle("lora:sim-7b@t1", "release")
        assert ok
        ok, detail = await node.handle("lora:other@x", "start")
        assert not ok and "no prewarmer" in detail

    asyncio.run(go())
    assert node.stats()["lora_sim-7b_started"] == 1


def test_kv_prefix_prewarm_makes_the_units_request_hit(sim_url):
    system = f"You are the verifier of claims number {time.time_ns()}. " + "Check facts. " * 40
    pw = KVPrefixPrewarmer(sim_url, "sim-7b")
    body = {"model": "sim-7b", "max_tokens": 2,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": "claim: the sky is green"}]}
    hits0 = _metric(sim_url, "vllm:prefix_cache_hits")
    dt = asyncio.run(pw.warm(system))
    assert dt > 0
    hits1 = _metric(sim_url, "vllm:prefix_cache_hits")
    assert hits1 == hits0  # the prewarm itself computed the prefix (a miss)
    assert httpx.post(sim_url + "/v1/chat/completions", json=body, timeout=10).status_code == 200
    hits2 = _metric(sim_url, "vllm:prefix_cache_hits")
    assert hits2 - hits1 >= 100  # the unit's request found the system prompt's KV
    # control: the same request shape with a prompt nobody prewarmed hits nothing
    cold = dict(body, messages=[{"role": "system", "content": system.replace("verifier", "judge")},
                                body["messages"][1]])
    assert httpx.post(sim_url + "/v1/chat/completions", json=cold, timeout=10).status_code == 200
    assert _metric(sim_url, "vllm:prefix_cache_hits") == hits2


def test_dnn_hook_measures_load_time():
    hook = DnnHook(load_fn=lambda: time.sleep(0.05) or {"weights": 1})
    node = NodePrewarmer(dnn={"resnet50": hook})

    async def go() -> None:
        ok, detail = await node.handle("dnn:resnet50", "start")
        assert ok and float(detail.split("=")[1]) >= 0.05
        ok, detail = await node.handle("dnn:resnet50", "start")  # already loaded
        assert ok and float(detail.split("=")[1]) == 0.0
        ok, _ = await node.handle("dnn:resnet50", "release")
        assert ok and hook.model is None

    asyncio.run(go())
    assert hook.loads == 1 and hook.load_s is not None and hook.load_s >= 0.05


def test_hermeslet_cli_builds_prewarmers_for_http_engines(sim_url):
    from hermeslet.cli import _parser as build_parser
    from hermeslet.cli import build_agent

    args = build_parser().parse_args(
        ["run", "--scheduler", "tcp://127.0.0.1:1", "--engine", f"openai:{sim_url}",
         "--model", "sim-7b", "--prewarm", "--enable-lora", "--max-loras", "3"])
    agent = build_agent(args)
    pw = agent.prewarmer
    assert pw is not None and pw.containers is None
    assert set(pw.prefixes) == {"sim-7b"} and pw.loras["sim-7b"].max_loras == 3
    assert build_agent(build_parser().parse_args(
        ["run", "--scheduler", "tcp://127.0.0.1:1"])).prewarmer is None

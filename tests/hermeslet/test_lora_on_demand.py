"""LoRA adapters a HermesLet can load (``--lora-path``) are served whether loaded or not:
announced in ``hello`` so the scheduler routes their requests to the right engine, loaded when
a request is released without its adapter loaded (a cold start), and the scheduler's prewarms
of them are counted used or wasted. Against real sim-engine HTTP servers (vLLM's LoRA API), a
real HermesLet and, for routing, a real LiveScheduler over the in-process link."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from hermes.gateway.config import load_config
from hermes.gateway.scheduler import LiveScheduler, ModelNotFound
from hermeslet.agent import HermesLet
from hermeslet.engines.openai_http import OpenAIHTTPEngine
from hermeslet.lora_lookahead import LoraLookahead
from hermeslet.prewarmers import LoraPrewarmer, NodePrewarmer
from tests.hermeslet.conftest import running_sim
from tests.hermeslet.test_lora_lookahead import adapters, agent_on, lora_submit, results

pytestmark = pytest.mark.timeout(40)


@pytest.fixture
def two_bases():
    """Two sim-engine servers with different base models (no adapters loaded)."""
    with running_sim("--time-scale", "50", "--model", "base-a") as a, \
            running_sim("--time-scale", "50", "--model", "base-b") as b:
        yield [a, b]


def loaded(url: str, base: str) -> set[str]:
    data = httpx.get(url + "/v1/models", timeout=5).json()["data"]
    return {m["id"] for m in data if m["id"] != base}


async def test_loadable_adapter_is_announced_routed_and_loaded_on_demand(two_bases, tmp_path: Path):
    """Adapter ``z`` is loadable on base-b's engine only: the scheduler knows it from the
    hello and sends its request to that engine, which loads it first; a second request finds
    it loaded. Without the announcement the scheduler refuses ``z`` (strict) and the node has
    no engine that serves it."""
    url_a, url_b = two_bases
    pn = NodePrewarmer(loras={"base-a": LoraPrewarmer(url_a, max_loras=2),
                              "base-b": LoraPrewarmer(url_b, max_loras=2,
                                                      paths={"z": "/adapters/z"})})
    cfg = load_config(None, environ={}, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"), time_scale=50.0, log_level="warning")
    sched = LiveScheduler(cfg)
    await sched.start()
    engines = [OpenAIHTTPEngine(url_a, name="ea", max_inflight=2),
               OpenAIHTTPEngine(url_b, name="eb", max_inflight=2)]
    agent = HermesLet("n1", "inproc-link", engines, link=sched.inproc_link("n1"),
                      heartbeat_s=0.1, prewarmer=pn)
    task = asyncio.create_task(agent.run())
    try:
        assert await sched.wait_for_nodes(10)
        hello = agent.hello()
        assert {e.name: e.loras for e in hello.engines} == {"ea": [], "eb": ["z"]}
        assert sched.resolve_model("z", strict=True) == "z"
        assert sched._pick_engine("z")[1].name == "eb"
        with pytest.raises(ModelNotFound):
            sched.resolve_model("nope", strict=True)
        for i in range(2):
            run = sched.create_run("default")
            inv = sched.unit_for_request(run, "llm", "llm:base-b")
            req = await sched.submit_llm(run, inv, model="z", endpoint="completions",
                                         body={"prompt": f"hi {i}", "max_tokens": 3, "ignore_eos": True})
            done = await sched.wait(req, timeout=15)
            assert done.output_tokens == 3 and done.engine == "eb"
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)
        await sched.stop()
    assert loaded(url_b, "base-b") == {"z"} and loaded(url_a, "base-a") == set()
    pw = pn.loras["base-b"]
    assert pw.counters.cold_starts == 1 and pw.counters.warm_hits == 1
    assert pw.counters.started == 0  # no scheduler prewarm


async def test_prewarmed_adapter_is_used_or_wasted(url):
    """A prewarm whose adapter a request then finds loaded is used; one unloaded before any
    request came is wasted, with the seconds it sat loaded."""
    pn = NodePrewarmer(loras={"sim-7b": LoraPrewarmer(
        url, max_loras=2, paths={n: f"/adapters/{n}" for n in "abc"})})
    pw = pn.loras["sim-7b"]
    ok, detail = await pn.handle("lora:sim-7b@a", "start")
    assert ok and detail.startswith("warmup_s=")
    assert await pw.ensure("a") == 0.0  # the request finds it loaded
    assert (pw.counters.started, pw.counters.used, pw.counters.warm_hits) == (1, 1, 1)
    await pn.handle("lora:sim-7b@b", "start")
    await asyncio.sleep(0.05)
    waited = await pw.ensure("c")  # a request of c: loads it, unloading a (LRU), then b
    assert waited > 0.0 and pw.counters.cold_starts == 1
    assert pw.counters.wasted == 0  # a was unloaded, but it had been used
    await pw.ensure("a")  # loads a again: b (prewarmed, never used) goes
    assert loaded(url, "sim-7b") == {"c", "a"}
    assert pw.counters.wasted == 1 and pw.counters.wasted_backend_s >= 0.05
    assert pw.counters.used == 1 and pw.counters.cold_starts == 2


async def test_failed_lookahead_load_backs_off(url):
    """A lookahead load that fails is not tried again at every enqueue: five requests of the
    adapter queued within a second cost one failed load; after the backoff it is tried again.
    The requests themselves try to load it when released, and fail with the reason."""
    dead = str(httpx.URL(url).copy_with(port=1))  # nothing listens on port 1
    pn = NodePrewarmer(loras={"sim-7b": LoraPrewarmer(dead, max_loras=2,
                                                      paths={"a": "/adapters/a"})})
    pn.lora_lookahead = LoraLookahead(pn)
    pw = pn.loras["sim-7b"]
    async with agent_on(url, pn) as (sched, _):
        await sched.send(lora_submit("r0", 0, "sim-7b", max_tokens=250))
        for i in range(5):
            await sched.send(lora_submit(f"a{i}", 1 + i, "a"))
            await asyncio.sleep(0.05)
        await pn.lora_lookahead.idle()
        assert pw.lookahead.failed == 1
        await asyncio.sleep(1.1)
        await sched.send(lora_submit("a5", 10, "a"))
        await asyncio.sleep(0.1)
        await pn.lora_lookahead.idle()
        assert pw.lookahead.failed == 2
        res = await results(sched, 7)
    assert res["r0"].type == "done"
    failed = [res[f"a{i}"] for i in range(6)]
    assert all(r.type == "failed" and r.status == 404 for r in failed)
    assert all("loading LoRA adapter 'a' failed" in r.error for r in failed)
    assert adapters(url) == set()



async def test_rekey_and_cancel_move_the_lookahead(url):
    """One adapter slot: the head's adapter is loaded while a base-model request runs. A
    rekey that puts another adapter's request first loads that one at once (not at the next
    release), and cancelling that request brings back the next one's."""
    from hermes import protocol as P

    pn = NodePrewarmer(loras={"sim-7b": LoraPrewarmer(
        url, max_loras=1, paths={n: f"/adapters/{n}" for n in "abc"})})
    pn.lora_lookahead = LoraLookahead(pn)
    async with agent_on(url, pn) as (sched, agent):
        await sched.send(lora_submit("r0", 0, "sim-7b", max_tokens=250))
        for i, a in enumerate("abc"):
            await sched.send(lora_submit(f"r{a}", 1 + i, a))
        await asyncio.sleep(0.2)
        await pn.lora_lookahead.idle()
        assert adapters(url) == {"a"}
        await sched.send(P.Rekey(keys={"rc": [0.5]}))
        await asyncio.sleep(0.2)
        await pn.lora_lookahead.idle()
        assert "r0" in agent.slots["http"].inflight  # no release happened in between
        assert adapters(url) == {"c"}
        await sched.send(P.Cancel(request_ids=["rc"]))
        await asyncio.sleep(0.2)
        await pn.lora_lookahead.idle()
        assert "r0" in agent.slots["http"].inflight
        assert adapters(url) == {"a"}
        res = await results(sched, 4)
    assert res["rc"].type == "failed" and res["rc"].error == "cancelled"
    assert all(res[r].type == "done" for r in ("r0", "ra", "rb"))


async def test_request_waits_for_an_inflight_adapter_to_finish(url):
    """One adapter slot, two requests of different adapters in flight at once: the second
    one's load waits until the first request finishes (its adapter may then go), instead of
    reaching the engine without its adapter (404)."""
    pn = NodePrewarmer(loras={"sim-7b": LoraPrewarmer(
        url, max_loras=1, paths={n: f"/adapters/{n}" for n in "ab"})})
    async with agent_on(url, pn, window=2) as (sched, agent):
        await sched.send(lora_submit("ra", 0, "a", max_tokens=60))
        await sched.send(lora_submit("rb", 1, "b"))
        await asyncio.sleep(0.2)
        assert set(agent.slots["http"].inflight) == {"ra", "rb"} and adapters(url) == {"a"}
        res = await results(sched, 2)
    assert res["ra"].type == "done" and res["rb"].type == "done", res
    pw = pn.loras["sim-7b"]
    assert adapters(url) == {"b"} and pw.counters.cold_starts == 2


async def test_a_requests_load_may_unload_a_head_adapter_but_a_prewarm_may_not(url):
    """Two slots holding the queue head's adapters x and y: a prewarm (or lookahead) load of
    w is refused, but a released request's own load of z unloads the least recently used head
    adapter (the head waits for the window that request holds)."""
    pn = NodePrewarmer(loras={"sim-7b": LoraPrewarmer(
        url, max_loras=2, paths={n: f"/adapters/{n}" for n in "xyzw"})})
    pw = pn.loras["sim-7b"]
    await pw.load("x")
    await pw.load("y")
    pn.set_in_use("http", "sim-7b", {"z"}, {"x", "y"})
    with pytest.raises(RuntimeError, match="in use"):
        await pw.load("w")
    assert await pw.ensure("z") > 0.0
    assert adapters(url) == {"y", "z"} and pw.counters.cold_starts == 1
    pn.set_in_use("http", "sim-7b", {"y", "z"})  # both in flight now: a third request waits
    pw.timeout_s = 0.3
    with pytest.raises(RuntimeError, match="serve in-flight requests"):
        await pw.ensure("x")


async def test_node_lora_prewarmer_keeps_the_engine_adapters_list(url):
    """Built by ``build_node_prewarmer``, the LoRA prewarmer loads through the engine's
    adapter: the adapter's ``loras`` (what the engine serves, listed in ``hello``) follows the
    runtime loads and unloads, as the server's ``/v1/models`` does."""
    from hermeslet.prewarmers import build_node_prewarmer

    eng = OpenAIHTTPEngine(url, name="http")
    await eng.start()
    try:
        _, pn = build_node_prewarmer([eng], lora=True, max_loras=1,
                                     lora_paths={"a": "/adapters/a", "b": "/adapters/b"})
        pw = pn.loras["sim-7b"]
        assert pw.engine is eng
        await pw.load("a")
        assert eng.loras == ["a"] and eng.serves("a") and adapters(url) == {"a"}
        await pw.load("b")  # one slot: a is unloaded first
        assert eng.loras == ["b"] and not eng.serves("a") and adapters(url) == {"b"}
        assert await pw.unload("b") and eng.loras == [] and adapters(url) == set()
    finally:
        await eng.close()

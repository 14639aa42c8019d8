"""A HermesLet's prewarm metrics (:func:`hermeslet.metrics.prewarm_metrics`) against real parts:
the built-in engine's HTTP server (``hermeslet sim-engine``, vLLM's LoRA and chat API), a real
:class:`~hermeslet.agent.HermesLet` and its :class:`~hermeslet.metrics.MetricsServer`, scraped
over HTTP and parsed with prometheus_client's parser, and the prewarm dashboard's node queries
through a real Prometheus. (The container pool's metrics are checked against a real dockerd in
``test_prewarm_docker.py``.)

The base model's name has underscores, which the flat ``NodePrewarmer.stats()`` keys cannot
tell apart from the key's own separators: the metrics carry it whole in a label.
"""

from __future__ import annotations

import asyncio
import math
import time

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hermeslet.agent import HermesLet
from hermeslet.engines.openai_http import OpenAIHTTPEngine
from hermeslet.metrics import MetricsServer, node_registry
from hermeslet.prewarmers import DnnHook, KVPrefixPrewarmer, LoraPrewarmer, NodePrewarmer
from tests.hermeslet.conftest import running_sim
from tests.hermeslet.test_lora_lookahead import agent_on, lora_submit, node, results
from tests.ops.test_prometheus_dashboards import (  # noqa: F401 (the prometheus fixture)
    SCRAPE_S,
    needs_prewarming_node,
    panel_queries,
    prometheus,
    to_promql,
    wait_scraped,
)

pytestmark = pytest.mark.timeout(60)

BASE = "tiny_base_7b"  # underscores on purpose (see the module docstring)
NODE = "node_p"


@pytest.fixture
def url():
    """A fresh sim-engine serving ``BASE`` (no adapters loaded)."""
    with running_sim("--time-scale", "50", "--model", BASE) as u:
        yield u


Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    """(sample name, its labels) -> value of every sample on a /metrics page."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def val(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of the one sample ``name`` with exactly ``labels`` (None: no such sample)."""
    return samples.get((name, frozenset(labels.items())))


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


async def scrape(port: int) -> Samples:
    async with httpx.AsyncClient() as c:
        r = await c.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert r.status_code == 200
    return parse(r.text)


def adapters(url: str) -> set[str]:
    data = httpx.get(url + "/v1/models", timeout=5).json()["data"]
    return {m["id"] for m in data if m["id"] != BASE}


async def test_kv_lora_and_dnn_prewarms_show_in_the_nodes_metrics(url):
    """Scheduler signals carried out by the node's prewarmer, read back from its /metrics page:
    a KV prefix prewarm counts one ``kv`` start with its measured warm-up; LoRA loads beyond
    ``max_loras`` leave exactly ``max_loras`` adapters loaded (as on the engine); a DNN load
    counts with its load time and shows as loaded until released."""
    lora = LoraPrewarmer(url, max_loras=2, paths={n: f"/adapters/{n}" for n in ("a_1", "b", "c")})
    pw = NodePrewarmer(loras={BASE: lora}, prefixes={BASE: KVPrefixPrewarmer(url, BASE)},
                       dnn={"res_net50": DnnHook(load_fn=lambda: time.sleep(0.05) or {"w": 1})})
    eng = OpenAIHTTPEngine(url, name="e0", model=BASE, max_inflight=2)
    agent = HermesLet(NODE, "inproc://unused", [eng], prewarmer=pw)
    metrics = await MetricsServer(node_registry(agent)).start()
    kv = {"node": NODE, "backend_type": "kv", "target": BASE}
    lo = {"node": NODE, "backend_type": "lora", "target": BASE}
    dnn = {"node": NODE, "backend_type": "dnn", "target": "res_net50"}
    try:
        s0 = await scrape(metrics.port)
        assert val(s0, "hermeslet_prewarm_started_total", **kv) == 0
        assert val(s0, "hermeslet_prewarm_last_warmup_seconds", **kv) is None  # none measured
        assert val(s0, "hermeslet_lora_adapters_loaded", node=NODE, model=BASE) == 0
        assert val(s0, "hermeslet_lora_adapters_max", node=NODE, model=BASE) == 2
        # no container pool on this node: docker is exported at zero, with no target
        assert val(s0, "hermeslet_prewarm_started_total", node=NODE, backend_type="docker",
                   target="") == 0
        assert val(s0, "hermeslet_dnn_model_loaded", node=NODE, model="res_net50") == 0

        prefix = f"You check claims (run {time.time_ns()}). " + "Cite sources. " * 30
        ok, detail = await pw.handle(f"kv:{BASE}/factool/verify", "start", {"prefix": prefix})
        assert ok, detail
        for name in ("a_1", "b", "c"):
            ok, detail = await pw.handle(f"lora:{BASE}@{name}", "start")
            assert ok, detail
        ok, detail = await pw.handle("dnn:res_net50", "start")
        assert ok, detail
        s1 = await scrape(metrics.port)
        on_engine = adapters(url)

        ok, _ = await pw.handle("dnn:res_net50", "release")
        assert ok
        ok, _ = await pw.handle(f"lora:{BASE}@c", "release")
        assert ok
        s2 = await scrape(metrics.port)
    finally:
        await metrics.close()
        await eng.close()

    assert val(s1, "hermeslet_prewarm_started_total", **kv) == 1
    kv_warmup = val(s1, "hermeslet_prewarm_last_warmup_seconds", **kv)
    assert kv_warmup is not None and kv_warmup > 0
    assert kv_warmup == pytest.approx(pw.prefixes[BASE].counters.warmup_s_last)
    # three loads, two slots: the LRU adapter was unloaded, on the engine as in the gauge
    assert val(s1, "hermeslet_prewarm_started_total", **lo) == 3
    assert on_engine == {"b", "c"}
    assert val(s1, "hermeslet_lora_adapters_loaded", node=NODE, model=BASE) == 2 == len(on_engine)
    assert val(s1, "hermeslet_prewarm_last_warmup_seconds", **lo) > 0
    assert val(s1, "hermeslet_prewarm_started_total", **dnn) == 1
    assert val(s1, "hermeslet_prewarm_last_warmup_seconds", **dnn) >= 0.05
    assert val(s1, "hermeslet_dnn_model_loaded", node=NODE, model="res_net50") == 1
    # the lookahead is off: its counters are listed but have no samples
    assert not {n for n in names(s1) if n.startswith("hermeslet_lora_lookahead_")}
    # a_1 was unloaded before any request used it: a wasted prewarm, with its loaded time
    assert val(s1, "hermeslet_prewarm_wasted_total", **lo) == 1
    assert val(s1, "hermeslet_prewarm_wasted_backend_seconds_total", **lo) > 0
    assert val(s1, "hermeslet_prewarm_used_total", **lo) == 0
    # cold starts / warm hits count calls (tool calls, LoRA requests): none for kv
    assert val(s1, "hermeslet_prewarm_cold_starts_total", **kv) is None
    assert val(s1, "hermeslet_prewarm_cold_starts_total", **lo) == 0

    assert val(s2, "hermeslet_lora_adapters_loaded", node=NODE, model=BASE) == 1
    assert adapters(url) == {"b"}
    assert val(s2, "hermeslet_prewarm_wasted_total", **lo) == 2  # c released unused
    assert val(s2, "hermeslet_dnn_model_loaded", node=NODE, model="res_net50") == 0
    assert val(s2, "hermeslet_prewarm_started_total", **dnn) == 1  # a release starts nothing
    assert val(s2, "hermeslet_prewarm_started_total", **kv) == 1


async def test_lora_lookahead_counters_come_from_the_running_agent(url):
    """The queue lookahead of a running HermesLet, counted in its metrics: an adapter loaded
    ahead of its request, one skipped for want of a path; then, on a node whose engine URL is
    dead, a failed load. The lookahead's loads are no prewarms (``started`` stays 0)."""
    pn = node(url, slots=3, paths={"a_1": "/adapters/a_1"})
    pn.loras = {BASE: pn.loras.pop("sim-7b")}  # the helper's base model is not ours
    async with agent_on(url, pn) as (sched, agent):
        await sched.send(lora_submit("r0", 0, BASE, max_tokens=30))
        await sched.send(lora_submit("r1", 1, "nopath"))
        await sched.send(lora_submit("r2", 2, "a_1"))
        res = await results(sched, 3)
        metrics = await MetricsServer(node_registry(agent)).start()
        try:
            s = await scrape(metrics.port)
        finally:
            await metrics.close()
    assert res["r0"].type == "done" and res["r2"].type == "done"
    la = {"node": "node-l", "model": BASE}
    assert val(s, "hermeslet_lora_lookahead_loads_total", **la) == 1
    assert val(s, "hermeslet_lora_lookahead_no_path_total", **la) == 1
    assert val(s, "hermeslet_lora_lookahead_failed_total", **la) == 0
    assert val(s, "hermeslet_lora_adapters_loaded", **la) == 1
    # r2 found a_1 loaded by the lookahead when it was released: a warm hit, no cold start
    lo = {"node": "node-l", "backend_type": "lora", "target": BASE}
    assert val(s, "hermeslet_prewarm_warm_hits_total", **lo) == 1
    assert val(s, "hermeslet_prewarm_cold_starts_total", **lo) == 0
    assert val(s, "hermeslet_prewarm_started_total", node="node-l", backend_type="lora",
               target=BASE) == 0
    assert val(s, "hermeslet_prewarm_last_warmup_seconds", node="node-l", backend_type="lora",
               target=BASE) > 0  # the lookahead's load was measured

    dead = str(httpx.URL(url).copy_with(port=1))  # nothing listens on port 1
    bad = node(dead, slots=2, paths={"a_1": "/adapters/a_1"})
    bad.loras = {BASE: bad.loras.pop("sim-7b")}
    async with agent_on(url, bad) as (sched, agent):
        await sched.send(lora_submit("s0", 0, BASE, max_tokens=20))
        await sched.send(lora_submit("s1", 1, "a_1"))
        await asyncio.sleep(0.1)
        await bad.lora_lookahead.idle()
        await results(sched, 2)
        s = parse(generate_latest(node_registry(agent)).decode())
    assert val(s, "hermeslet_lora_lookahead_failed_total", **la) == 1
    assert val(s, "hermeslet_lora_lookahead_loads_total", **la) == 0
    assert val(s, "hermeslet_lora_adapters_loaded", **la) == 0


async def test_dashboard_queries_of_a_prewarming_node_return_data(url, prometheus):  # noqa: F811
    """The prewarm dashboard's queries that only a prewarming node answers (the general
    dashboard test skips them: its node has no prewarmers), through a real Prometheus scraping
    a running HermesLet with a LoRA lookahead and a KV prefix prewarmer, before and after the
    node worked: the adapter gauge shows the one adapter loaded, the lookahead's load rate
    rises above zero, and the KV warm-up is measured."""
    queries = [(title, expr) for _, title, expr in panel_queries() if needs_prewarming_node(expr)]
    assert len(queries) >= 6
    pn = node(url, slots=2, paths={"a_1": "/adapters/a_1"})
    pn.loras = {BASE: pn.loras.pop("sim-7b")}
    pn.prefixes[BASE] = KVPrefixPrewarmer(url, BASE)
    async with agent_on(url, pn) as (sched, agent):
        metrics = await MetricsServer(node_registry(agent)).start()
        try:
            prom = await asyncio.to_thread(prometheus, {"hermeslet": f"127.0.0.1:{metrics.port}"})
            await asyncio.to_thread(wait_scraped, prom, {"hermeslet"})
            start = time.time()
            await sched.send(lora_submit("r0", 0, BASE, max_tokens=20))
            await sched.send(lora_submit("r1", 1, "a_1"))
            res = await results(sched, 2)
            ok, detail = await pn.handle(f"kv:{BASE}/app/unit", "start",
                                         {"prefix": "Shared system prompt. " * 20})
            assert ok, detail
            await asyncio.to_thread(wait_scraped, prom, {"hermeslet"}, 30.0,
                                    time.time() + SCRAPE_S)
            end = time.time()
            got = {}
            async with httpx.AsyncClient() as c:
                for title, expr in queries:
                    r = await c.get(prom + "/api/v1/query_range", timeout=30, params={
                        "query": to_promql(expr), "start": start, "end": end, "step": 1})
                    body = r.json()
                    assert r.status_code == 200 and body["status"] == "success", (title, body)
                    got[expr] = {s["metric"].get("backend_type", ""): [float(v) for _, v in
                                                                       s["values"]]
                                 for s in body["data"]["result"]}
        finally:
            await metrics.close()
    assert res["r1"].type == "done"  # its adapter was loaded ahead of its release
    empty = [expr for expr, series in got.items()
             if not any(math.isfinite(v) for vs in series.values() for v in vs)]
    assert not empty, empty

    def one(metric: str) -> dict[str, list[float]]:
        (expr,) = [e for e in got if metric in e]
        return got[expr]

    assert one("hermeslet_lora_adapters_loaded")[""][-1] == 1
    assert one("hermeslet_lora_adapters_max")[""][-1] == 2
    assert max(one("hermeslet_lora_lookahead_loads_total")[""]) > 0
    assert max(one("hermeslet_lora_lookahead_failed_total")[""]) == 0
    warmups = one("hermeslet_prewarm_last_warmup_seconds")
    assert warmups["kv"][-1] > 0 and warmups["lora"][-1] > 0

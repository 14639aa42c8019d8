"""HermesLet metrics from an engine's own vLLM-style /metrics, over HTTP: the built-in engine
served by ``hermeslet sim-engine`` (a real server process with vLLM's metric names) behind an
``openai:URL`` adapter, exported by the HermesLet's metrics server."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hermes.procs import free_port
from hermeslet.agent import HermesLet
from hermeslet.engines import make_engine
from hermeslet.metrics import MetricsServer, node_registry


async def test_engine_kv_and_prefix_counters_come_from_the_engines_metrics_page() -> None:
    port = free_port()
    srv = subprocess.Popen([sys.executable, "-m", "hermeslet.cli", "sim-engine", "--port",
                            str(port), "--time-scale", "50", "--model", "m"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert srv.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        eng = make_engine(f"openai:{url}", name="e0", model="m", max_inflight=4)
        await eng.start()
        agent = HermesLet("n1", "inproc://unused", [eng])
        metrics = await MetricsServer(node_registry(agent)).start()
        try:
            system = {"role": "system", "content": "Answer in one word. " * 50}
            for i in range(3):  # same system prompt: the 2nd and 3rd hit the prefix cache
                async for _ in eng.generate("chat", {"model": "m", "max_tokens": 4, "messages": [
                        system, {"role": "user", "content": f"q{i}"}]}, False,
                        request_id=f"r{i}"):
                    pass
            await eng.metrics()  # what the heartbeat loop does every second
            async with httpx.AsyncClient() as c:
                page = (await c.get(f"http://127.0.0.1:{metrics.port}/metrics")).text
                missing = await c.get(f"http://127.0.0.1:{metrics.port}/other")
            engine_page = httpx.get(url + "/metrics").text
        finally:
            await metrics.close()
            await eng.close()
    finally:
        srv.terminate()
        srv.wait(10)
    assert missing.status_code == 404
    ours = {s.name: s.value for f in text_string_to_metric_families(page) for s in f.samples
            if s.labels.get("engine") == "e0"}
    theirs = {s.name: s.value for f in text_string_to_metric_families(engine_page)
              for s in f.samples}
    assert ours["hermeslet_engine_prefix_cache_queries_total"] == \
        theirs["vllm:prefix_cache_queries_total"] > 0
    assert ours["hermeslet_engine_prefix_cache_hits_total"] == \
        theirs["vllm:prefix_cache_hits_total"] > 0
    assert ours["hermeslet_engine_kv_cache_usage_ratio"] == theirs["vllm:kv_cache_usage_perc"]
    assert ours["hermeslet_engine_max_inflight_requests"] == 4
    assert ours["hermeslet_engine_inflight_requests"] == 0

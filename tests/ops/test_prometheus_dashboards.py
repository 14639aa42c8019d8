"""Every dashboard query returns data from a real Prometheus scraping a real gateway and a real
HermesLet process after a short load (the issue's done-when)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from hermes.procs import free_port
from tests.ops.conftest import REPO, drive_load, start_hermeslet, wait_nodes

DASHBOARDS = sorted((REPO / "deploy" / "grafana" / "dashboards").glob("*.json"))
SCRAPE_S = 1
#: series only a node whose prewarmers have worked exports (a LoRA prewarmer, its queue
#: lookahead, a measured warm-up): tests/hermeslet/test_node_prewarm_metrics.py runs the
#: queries naming them against a real Prometheus scraping such a node
NEEDS_PREWARMING_NODE = ("hermeslet_lora_", "hermeslet_prewarm_last_warmup_seconds")


def needs_prewarming_node(expr: str) -> bool:
    return any(name in expr for name in NEEDS_PREWARMING_NODE)


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) for every target of every panel."""
    out = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for t in panel["targets"]:
                out.append((path.name, panel["title"], t["expr"]))
    return out


def to_promql(expr: str) -> str:
    """What Grafana sends: its variables substituted (all apps, a rate window of many
    scrapes: the scrape timeout equals the 1 s interval, and a loaded machine misses scrapes,
    which must not leave a window with fewer than the two samples rate() needs)."""
    return expr.replace("$__rate_interval", f"{30 * SCRAPE_S}s").replace("$app", ".*")


@pytest.fixture
def prometheus(tmp_path: Path):  # noqa: ANN201
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (apt-get install -y prometheus)")
    procs: list[subprocess.Popen] = []

    def start(targets: dict[str, str]) -> str:
        cfg = {"global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": "1s"},
               "scrape_configs": [{"job_name": job, "scrape_interval": f"{SCRAPE_S}s",
                                   "static_configs": [{"targets": [t]}]}
                                  for job, t in targets.items()]}
        (tmp_path / "prometheus.yml").write_text(json.dumps(cfg))  # JSON is YAML
        port = free_port()
        p = subprocess.Popen(
            [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(p)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            assert p.poll() is None, p.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.1)

    yield start
    for p in procs:
        p.terminate()
        p.wait(15)


def wait_scraped(prom: str, jobs: set[str], timeout: float = 30.0, after: float = 0.0) -> None:
    """Until every job has been scraped successfully (Prometheus applies static targets a few
    seconds after it is ready), by a scrape that began after epoch time ``after``."""
    deadline = time.monotonic() + timeout
    while True:
        up = httpx.get(prom + "/api/v1/query", params={"query": "timestamp(up == 1)"}).json()
        if {r["metric"]["job"] for r in up["data"]["result"]
                if float(r["value"][1]) > after} >= jobs:
            return
        assert time.monotonic() < deadline, f"targets never scraped: {up}"
        time.sleep(0.2)


def test_every_dashboard_query_returns_data(make_ops_gateway, prometheus) -> None:  # noqa: ANN001
    queries = panel_queries()
    assert len(DASHBOARDS) == 4 and len(queries) >= 30
    address = f"tcp://127.0.0.1:{free_port()}"
    srv = make_ops_gateway(bind=address, embedded_node=False)
    mport = free_port()
    node = start_hermeslet(address, "node-a", mport)
    try:
        wait_nodes(srv, 1, [node])
        gw = srv.url.removeprefix("http://")
        prom = prometheus({"hermes-gateway": gw, "hermeslet": f"127.0.0.1:{mport}"})
        wait_scraped(prom, {"hermes-gateway", "hermeslet"})
        start = time.time()
        load = drive_load(srv.url, runs=8, chats=8, tools=2)
        # two successful scrapes after the load: a counter born during it (a run's first
        # series) has the two samples rate() needs even if the busy gateway missed scrapes
        for _ in range(2):
            wait_scraped(prom, {"hermes-gateway", "hermeslet"}, after=time.time() + SCRAPE_S)
        end = time.time()
        assert all(r["state"] == "finished" for r in load["runs"]), load["runs"]
        up = httpx.get(prom + "/api/v1/query", params={"query": "up"}).json()["data"]["result"]
        assert {r["metric"]["job"]: r["value"][1] for r in up} == {"hermes-gateway": "1",
                                                                   "hermeslet": "1"}
        empty = []
        for dash, title, expr in queries:
            if needs_prewarming_node(expr):
                continue
            r = httpx.get(prom + "/api/v1/query_range", params={
                "query": to_promql(expr), "start": start, "end": end, "step": 1}, timeout=30)
            body = r.json()
            assert r.status_code == 200 and body["status"] == "success", (dash, title, expr, body)
            values = [float(v) for s in body["data"]["result"] for _, v in s["values"]]
            if not any(math.isfinite(v) for v in values):
                empty.append(f"{dash} / {title}: {expr}")
        assert not empty, "queries without data:\n" + "\n".join(empty)
    finally:
        node.terminate()
        node.wait(15)

"""A gateway that has just (re)started accepts runs before its HermesLets have said hello:
their LLM calls wait for an engine (up to 10 s) instead of failing with 'no engine is
connected' (the race the SIGKILL-restart test hit on a loaded machine)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from hermes.procs import free_port, wait_http
from tests.gateway.gw_procs import kill, start_gateway, start_node, wait_healthy


def test_hosted_run_accepted_before_any_node_waits_for_one(tmp_path: Path) -> None:
    port, zport = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    gw = start_gateway(port, zport, tmp_path / "state", tmp_path / "gw.log",
                       HERMES_TIME_SCALE="10")
    node = None
    try:
        wait_http(url + "/healthz", gw, timeout=60)
        assert httpx.get(url + "/healthz").json()["nodes"] in ([], {})
        r = httpx.post(url + "/v1/runs", json={"app": "factool_kbqa", "input": {"seed": 1}})
        assert r.status_code == 201, r.text
        run_id = r.json()["run_id"]
        time.sleep(1.5)  # the run has started and is waiting for an engine
        node = start_node(zport, "late", tmp_path / "node.log", "--time-scale", "10")
        wait_healthy(url, gw)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            run = httpx.get(f"{url}/v1/runs/{run_id}").json()
            if run["state"] in ("finished", "failed", "cancelled"):
                break
            time.sleep(0.2)
        assert run["state"] == "finished", run
        assert run["units"], run
    finally:
        for p in (node, gw):
            if p is not None:
                kill(p)

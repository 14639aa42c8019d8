"""The scheduler with two HermesLets as separate processes over TCP (no embedded node):
50 concurrent runs, each run's units and tokens accounted for exactly."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx

from hermes.gateway.server import gateway_state
from hermes.procs import free_port

MODEL = "remote-model"
N_RUNS = 50


def test_two_remote_nodes_over_tcp_share_the_load(make_gateway) -> None:  # noqa: ANN001
    address = f"tcp://127.0.0.1:{free_port()}"
    srv = make_gateway(bind=address, embedded_node=False)
    sched = gateway_state(srv).scheduler
    procs = [subprocess.Popen(
        [sys.executable, "-m", "hermeslet.cli", "run", "--scheduler", address, "--node", f"n{i}",
         "--engine", "sim", "--model", MODEL, "--time-scale", "50", "--max-inflight", "4"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(2)]
    try:
        deadline = time.monotonic() + 30
        while len(sched.nodes) < 2:
            assert time.monotonic() < deadline, [p.stderr.read() for p in procs if p.poll() is not None]
            time.sleep(0.05)
        assert httpx.get(srv.url + "/v1/models").json()["data"][0]["id"] == MODEL

        async def scenario() -> list[dict]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
                async def one(i: int) -> dict:
                    run_id = (await http.post("/v1/runs", json={"app": "remote"})).json()["run_id"]
                    for unit, n in (("a", 2 + i % 3), ("b", 1 + i % 5)):
                        r = await http.post("/v1/completions", headers={
                            "X-Hermes-Run": run_id, "X-Hermes-Unit": unit},
                            json={"model": MODEL, "prompt": "x" * 8, "max_tokens": n, "ignore_eos": True})
                        assert r.status_code == 200, r.text
                    return (await http.post(f"/v1/runs/{run_id}/finish")).json()

                return await asyncio.gather(*(one(i) for i in range(N_RUNS)))

        runs = asyncio.run(scenario())
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    sched.flush_learning()
    records = {}
    for line in sched.records_path.read_text().splitlines():
        rec = json.loads(line)
        records[rec["run_id"]] = rec
    assert len({run["run_id"] for run in runs}) == N_RUNS
    for i, run in enumerate(runs):
        assert run["state"] == "finished"
        assert [u["unit"] for u in run["units"]] == ["a", "b"]
        assert [len(u["requests"]) for u in run["units"]] == [1, 1]
        assert [u["requests"][0]["output_tokens"] for u in run["units"]] == [2 + i % 3, 1 + i % 5]
        assert all(u["requests"][0]["input_tokens"] == 2 for u in run["units"])
        assert all(u["requests"][0]["state"] == "done" for u in run["units"])
        # the scheduler's account of the run: every token of both requests, once
        assert run["attained_tokens"] == 2 + (2 + i % 3) + 2 + (1 + i % 5)
        assert run["pending_requests"] == 0
        # and its run record (what the PDGraph learns from) says the same
        rec = records[run["run_id"]]
        assert [(u["unit"], [(r["input_tokens"], r["output_tokens"]) for r in u["requests"]])
                for u in rec["units"]] == [("a", [(2, 2 + i % 3)]), ("b", [(2, 1 + i % 5)])]
    assert len(records) == N_RUNS
    assert sched.requests == {}
    used = {u["requests"][0]["node"] for run in runs for u in run["units"]}
    assert used == {"n0", "n1"}  # dispatch spread the load over both nodes

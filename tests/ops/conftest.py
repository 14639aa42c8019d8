"""Operations fixtures: gateways with the shipped PDGraphs (so estimator policies rank runs),
HermesLet processes with a metrics port, and a short load of real HTTP clients."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes.gateway.config import load_config
from hermes.gateway.server import BackgroundServer, gateway_state, start_background
from hermes.kb import shipped_pdgraphs_dir
from tests.sandbox import require_tool_sandbox

REPO = Path(__file__).resolve().parents[2]
SHIPPED = shipped_pdgraphs_dir()
MODEL = "llama-2-7b"
#: quick benchmark apps at time scale 100 (ACT well under two wall seconds)
QUICK_APPS = ("factool_kbqa", "langchain_mapreduce")


@pytest.fixture
def make_ops_gateway(tmp_path: Path) -> Iterator[Callable[..., BackgroundServer]]:
    started: list[BackgroundServer] = []

    def start(**overrides: Any) -> BackgroundServer:
        n = len(started)
        opts: dict[str, Any] = {
            "port": 0, "bind": "", "kb": str(SHIPPED), "state_dir": str(tmp_path / f"st{n}"),
            "time_scale": 100.0, "log_level": "warning", "rekey_interval_s": 0.1,
        }
        opts.update(overrides)
        srv = start_background(load_config(None, environ={}, **opts))
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


def start_hermeslet(address: str, node: str, metrics_port: int,
                    time_scale: float = 100.0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hermeslet.cli", "run", "--scheduler", address, "--node", node,
         "--engine", "sim", "--model", MODEL, "--time-scale", str(time_scale),
         "--max-inflight", "4", "--metrics-port", str(metrics_port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_nodes(srv: BackgroundServer, n: int, procs: list[subprocess.Popen],
               timeout: float = 30.0) -> None:
    sched = gateway_state(srv).scheduler
    deadline = time.monotonic() + timeout
    while len(sched.nodes) < n:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"hermeslet exited: {p.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError("hermeslet did not connect")
        time.sleep(0.05)


def drive_load(url: str, *, runs: int = 12, chats: int = 10, tools: int = 2,
               seed: int = 0) -> dict[str, Any]:
    """A short mixed load: hosted benchmark runs (half with a tight deadline, half loose),
    OpenAI chat requests with a shared system prompt, tool calls. Returns what it did.
    With tool calls, the calling test skips (with the reason) where there is no tool sandbox."""
    if tools:
        require_tool_sandbox()

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            async def hosted(i: int) -> dict:
                app = QUICK_APPS[i % len(QUICK_APPS)]
                deadline = 5.0 if i % 2 else 3600.0  # model seconds
                r = await http.post("/v1/runs", json={"app": app, "input": {"seed": seed + i},
                                                      "deadline_s": deadline,
                                                      "tenant": f"t{i % 2}"})
                assert r.status_code == 201, r.text
                rid = r.json()["run_id"]
                while True:
                    run = (await http.get(f"/v1/runs/{rid}")).json()
                    if run["state"] not in ("queued", "running"):
                        return run
                    await asyncio.sleep(0.1)

            async def chat(i: int) -> int:
                r = await http.post("/v1/chat/completions", headers={"X-Hermes-App": "chatbot"},
                                    json={"model": MODEL, "max_tokens": 8, "messages": [
                                        {"role": "system", "content": "You are terse. " * 40},
                                        {"role": "user", "content": f"question {i}"}]})
                assert r.status_code == 200, r.text
                return r.json()["usage"]["completion_tokens"]

            async def tool(i: int) -> dict:
                rid = (await http.post("/v1/runs", json={"app": "toolbox"})).json()["run_id"]
                r = await http.post(f"/v1/runs/{rid}/tools", json={
                    "unit": "execute_code", "backend": "docker:python:3.10-slim",
                    "code": "print(6 * 7)", "timeout_s": 30})
                assert r.status_code == 200, r.text
                await http.post(f"/v1/runs/{rid}/finish")
                return r.json()

            results = await asyncio.gather(
                *(hosted(i) for i in range(runs)), *(chat(i) for i in range(chats)),
                *(tool(i) for i in range(tools)))
            return {"runs": results[:runs], "chats": results[runs:runs + chats],
                    "tools": results[runs + chats:]}

    return asyncio.run(go())

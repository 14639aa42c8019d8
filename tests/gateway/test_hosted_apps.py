"""Hosted apps: benchmark apps and user-registered modules run inside the gateway."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from hermes.core.records import read_records
from hermes.gateway.server import gateway_state
from hermes.workloads.registry import get_app
from tests.sandbox import require_tool_sandbox


def _wait(http: httpx.Client, run_id: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = http.get(f"/v1/runs/{run_id}").json()
        if run["state"] not in ("queued", "running"):
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not end")


@pytest.mark.parametrize("app", ["factool_kbqa", "react_fever"])
def test_benchmark_app_runs_its_steps_and_is_learned(gateway, app: str) -> None:  # noqa: ANN001
    http = httpx.Client(base_url=gateway.url)
    sched = gateway_state(gateway).scheduler
    assert sched.pool is None or sched.pool.get(app) is None  # empty knowledge base
    r = http.post("/v1/runs", json={"app": app, "input": {"seed": 7}})
    assert r.status_code == 201 and r.json()["hosted"]
    run = _wait(http, r.json()["run_id"])
    assert run["state"] == "finished", run["error"]

    steps = list(get_app(app).steps(np.random.default_rng(7)))
    res = run["result"]
    assert res["units"] == [s.unit for s in steps]
    assert res["llm_requests"] == sum(len(s.requests) for s in steps)
    assert res["input_tokens"] == sum(c.input_tokens for s in steps for c in s.requests)
    assert res["output_tokens"] == sum(c.output_tokens for s in steps for c in s.requests)
    assert [(u["unit"], u["backend"]) for u in run["units"]] == [(s.unit, s.backend) for s in steps]
    for u, s in zip(run["units"], steps, strict=True):
        assert len(u["requests"]) == len(s.requests)
        if not s.is_llm:
            assert u["duration_s"] == pytest.approx(s.duration_s)
    # model time: the run took at least its tool time and gaps, though time-scaled in wall time
    assert run["act_s"] >= sum((s.duration_s or 0) + s.gap_s for s in steps)

    recs = list(read_records(Path(sched.config.stores.state_dir) / "records.jsonl"))
    assert [r.run_id for r in recs] == [run["run_id"]]
    assert [u.unit for u in recs[0].units] == [s.unit for s in steps]
    graph = http.get(f"/v1/apps/{app}").json()["pdgraph"]
    assert graph["runs"] == 1 and graph["entry"] == {steps[0].unit: 1.0}
    if sched.pool is not None:
        assert sched.pool.get(app) is not None  # the estimator now knows the app


APP_MODULE = '''
from hermes.gateway.hosted import hosted_app


@hosted_app("echo_agent")
async def echo_agent(ctx, input):
    async with ctx.unit("draft") as u:
        a, b = await __import__("asyncio").gather(
            u.complete("x" * 40, max_tokens=3, ignore_eos=True), u.complete("y" * 80, max_tokens=4, ignore_eos=True))
    async with ctx.unit("check", "docker:python:3.10-slim") as u:
        out = await u.tool(code="print('ok')")
    return {"tokens": [a.output_tokens, b.output_tokens], "inputs": [a.input_tokens, b.input_tokens],
            "tool": out.stdout.strip(), "who": input["name"]}


@hosted_app("broken_agent")
async def broken_agent(ctx, input):
    await ctx.complete("only", "z", max_tokens=1)
    raise RuntimeError("boom")
'''


def test_module_hosted_apps(make_gateway, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    require_tool_sandbox()  # its app calls a tool
    (tmp_path / "my_hosted_apps.py").write_text(APP_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_hosted_apps", None)
    srv = make_gateway(modules=["my_hosted_apps"], benchmark=False)
    http = httpx.Client(base_url=srv.url)
    names = {a["name"] for a in http.get("/v1/apps").json()["apps"] if a["hosted"]}
    assert names == {"echo_agent", "broken_agent"}

    run = _wait(http, http.post("/v1/runs", json={"app": "echo_agent",
                                                  "input": {"name": "ada"}}).json()["run_id"])
    assert run["state"] == "finished", run["error"]
    assert run["result"] == {"tokens": [3, 4], "inputs": [10, 20], "tool": "ok", "who": "ada"}
    assert [u["unit"] for u in run["units"]] == ["draft", "check"]
    assert len(run["units"][0]["requests"]) == 2  # fan-out: one invocation, two requests
    assert http.post(f"/v1/runs/{run['run_id']}/finish").status_code == 409

    bad = _wait(http, http.post("/v1/runs", json={"app": "broken_agent", "input": {}}).json()["run_id"])
    assert bad["state"] == "failed" and "boom" in bad["error"]
    recs = list(read_records(Path(gateway_state(srv).config.stores.state_dir) / "records.jsonl"))
    assert [r.app for r in recs] == ["echo_agent"]  # failed runs are not learned from


def test_cancel_stops_a_hosted_run(make_gateway) -> None:  # noqa: ANN001
    srv = make_gateway(time_scale=5.0)
    http = httpx.Client(base_url=srv.url)
    run_id = http.post("/v1/runs", json={"app": "got_docmerge", "input": {"seed": 1}}).json()["run_id"]
    while http.get(f"/v1/runs/{run_id}").json()["state"] == "queued":
        time.sleep(0.01)
    assert http.delete(f"/v1/runs/{run_id}").json()["state"] == "cancelled"
    time.sleep(0.3)
    run = http.get(f"/v1/runs/{run_id}").json()
    assert run["state"] == "cancelled" and run["result"] is None
    assert gateway_state(srv).scheduler.requests == {}  # nothing of it left in flight

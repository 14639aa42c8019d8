"""The app-run API: lifecycle, cancellation, tools, events, apps."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from hermes.core.records import read_records
from hermes.gateway.server import gateway_state
from tests.sandbox import processes_running, require_tool_sandbox

MODEL = "llama-2-7b"  # the embedded simulated engine's model (config default)


def _chat(client: openai.OpenAI, run_id: str, unit: str, max_tokens: int) -> None:
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "q" * 40}], max_tokens=max_tokens, extra_body={"ignore_eos": True},
        extra_headers={"X-Hermes-Run": run_id, "X-Hermes-Unit": unit})


def test_lifecycle_units_timings_act_and_record(gateway) -> None:  # noqa: ANN001
    http = httpx.Client(base_url=gateway.url)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    r = http.post("/v1/runs", json={"app": "qa", "deadline_s": 100, "tenant": "t1"})
    assert r.status_code == 201
    run = r.json()
    run_id = run["run_id"]
    assert run["state"] == "queued" and run["tenant"] == "t1"
    assert run["deadline"] == pytest.approx(run["submitted"] + 100)

    _chat(client, run_id, "plan", 5)
    _chat(client, run_id, "answer", 8)
    _chat(client, run_id, "answer", 3)  # a loop: the same unit again after it completed
    assert http.get(f"/v1/runs/{run_id}").json()["state"] == "running"
    fin = http.post(f"/v1/runs/{run_id}/finish").json()
    assert fin["state"] == "finished"

    got = http.get(f"/v1/runs/{run_id}").json()
    assert [u["unit"] for u in got["units"]] == ["plan", "answer", "answer"]
    assert [u["requests"][0]["output_tokens"] for u in got["units"]] == [5, 8, 3]
    starts = [u["started"] for u in got["units"]]
    ends = [u["finished"] for u in got["units"]]
    assert all(s <= e for s, e in zip(starts, ends, strict=True))
    assert all(e <= s for e, s in zip(ends, starts[1:], strict=False))  # sequential units
    assert got["act_s"] == pytest.approx(got["finished"] - got["submitted"])
    assert got["act_s"] >= ends[-1] - starts[0] > 0
    assert got["attained_tokens"] == sum(
        u["requests"][0]["input_tokens"] + u["requests"][0]["output_tokens"] for u in got["units"])

    # finishing twice is a conflict; the record is in the state dir and learned
    assert http.post(f"/v1/runs/{run_id}/finish").status_code == 409
    state_dir = Path(gateway_state(gateway).config.stores.state_dir)
    recs = [r for r in read_records(state_dir / "records.jsonl") if r.run_id == run_id]
    assert len(recs) == 1
    assert [(u.unit, u.requests[0].output_tokens) for u in recs[0].units] == [
        ("plan", 5), ("answer", 8), ("answer", 3)]
    summary = http.get("/v1/apps/qa").json()["pdgraph"]
    assert summary["runs"] == 1
    assert summary["entry"] == {"plan": 1.0}
    assert summary["units"]["answer"]["visits"] == 2
    assert summary["units"]["answer"]["mean_loops"] == 2
    assert summary["units"]["plan"]["next"] == {"answer": 1.0}


def test_unknown_run_and_bad_bodies(gateway) -> None:  # noqa: ANN001
    http = httpx.Client(base_url=gateway.url)
    r = http.get("/v1/runs/run-nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "run_not_found"
    r = http.post("/v1/runs", json={"app": "x", "deadline_s": -1})
    assert r.status_code == 422 and r.json()["error"]["param"] == "deadline_s"
    r = http.post("/v1/runs", json={})
    assert r.status_code == 422 and r.json()["error"]["param"] == "app"
    r = http.post("/v1/runs", json={"app": "not_hosted_app", "input": {"a": 1}})
    assert r.status_code == 404 and r.json()["error"]["code"] == "app_not_hosted"
    run_id = http.post("/v1/runs", json={"app": "x"}).json()["run_id"]
    r = http.post(f"/v1/runs/{run_id}/tools", json={"unit": "t", "backend": "docker:img"})
    assert r.status_code == 422 and "exactly one" in r.json()["error"]["message"]
    r = http.post(f"/v1/runs/{run_id}/tools", json={"unit": "t", "backend": "nope", "code": "1"})
    assert r.status_code == 422 and "bad backend" in r.json()["error"]["message"]


def test_cancel_drops_queued_requests(make_gateway) -> None:  # noqa: ANN001
    srv = make_gateway(engines=[{"name": "sim0", "model": MODEL, "max_inflight": 1}],
                       time_scale=4.0)
    engine = gateway_state(srv).node.slots["sim0"].engine

    async def until(cond, what: str, limit_s: float = 30.0) -> None:  # noqa: ANN001
        deadline = time.monotonic() + limit_s
        while not await cond():
            assert time.monotonic() < deadline, f"gave up waiting for {what}"
            await asyncio.sleep(0.005)

    async def scenario() -> tuple[list, dict, dict]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
            a = (await http.post("/v1/runs", json={"app": "a"})).json()["run_id"]
            b = (await http.post("/v1/runs", json={"app": "b"})).json()["run_id"]

            async def chat(run_id: str, n: int) -> httpx.Response:
                return await http.post("/v1/completions", json={
                    "model": MODEL, "prompt": "p", "max_tokens": n, "ignore_eos": True}, headers={"X-Hermes-Run": run_id})

            async def pending_b() -> bool:
                return (await http.get(f"/v1/runs/{b}")).json()["pending_requests"] >= 3

            async def blocker_running() -> bool:
                return bool(engine.core.running)

            # the blocker holds the only slot for ~5 s model (~1.2 s wall at scale 4): long
            # enough for b's three requests to queue behind it even on a loaded machine
            blocker = asyncio.create_task(chat(a, 400))
            await until(blocker_running, "the blocker to reach the engine")
            queued = [asyncio.create_task(chat(b, 5)) for _ in range(3)]
            await until(pending_b, "b's three requests to queue")
            assert engine.requests_finished == 0, "the blocker ended before b's requests queued"
            cancelled = (await http.delete(f"/v1/runs/{b}")).json()
            results = await asyncio.gather(blocker, *queued)
            after = (await http.get(f"/v1/runs/{b}")).json()
            return results, cancelled, after

    results, cancelled, after = asyncio.run(scenario())
    assert results[0].status_code == 200
    assert [r.status_code for r in results[1:]] == [409, 409, 409]
    assert all(r.json()["error"]["code"] == "run_cancelled" for r in results[1:])
    assert cancelled["state"] == after["state"] == "cancelled"
    assert all(q["state"] == "failed" for q in after["units"][0]["requests"])
    # the engine only ever served the blocker: the queued requests never reached it
    assert engine.requests_finished == 1
    assert engine.prompt_tokens_total == 1
    # a cancelled run takes no more requests
    r = httpx.post(srv.url + "/v1/completions", headers={"X-Hermes-Run": after["run_id"]},
                   json={"model": MODEL, "prompt": "p", "max_tokens": 1})
    assert r.status_code == 409


def test_tool_calls_and_client_unit_events(gateway) -> None:  # noqa: ANN001
    require_tool_sandbox()
    http = httpx.Client(base_url=gateway.url, timeout=30)
    run_id = http.post("/v1/runs", json={"app": "coder"}).json()["run_id"]
    r = http.post(f"/v1/runs/{run_id}/tools", json={
        "unit": "execute_code", "backend": "docker:python:3.10-slim", "code": "print(6 * 7)",
        "timeout_s": 20})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["exit_code"] == 0 and out["stdout"].strip() == "42" and not out["timed_out"]
    r = http.post(f"/v1/runs/{run_id}/tools", json={
        "unit": "execute_code", "backend": "docker:python:3.10-slim",
        "command": ["python3", "-c", "import sys; sys.exit(3)"]})
    assert r.json()["exit_code"] == 3

    assert http.post(f"/v1/runs/{run_id}/events",
                     json={"unit": "search", "event": "start", "backend": "api:search"}).status_code == 200
    r = http.post(f"/v1/runs/{run_id}/events", json={"unit": "search", "event": "finish"})
    assert r.status_code == 200 and r.json()["finished"] >= r.json()["started"]
    r = http.post(f"/v1/runs/{run_id}/events", json={"unit": "search", "event": "finish"})
    assert r.status_code == 409 and r.json()["error"]["param"] == "unit"
    http.post(f"/v1/runs/{run_id}/finish")
    state_dir = Path(gateway_state(gateway).config.stores.state_dir)
    lines = [json.loads(x) for x in (state_dir / "records.jsonl").read_text().splitlines()]
    rec = next(x for x in lines if x["run_id"] == run_id)
    assert [(u["unit"], u["backend"]) for u in rec["units"]] == [
        ("execute_code", "docker:python:3.10-slim"), ("execute_code", "docker:python:3.10-slim"),
        ("search", "api:search")]
    assert all("requests" not in u and u["duration_s"] >= 0 for u in rec["units"])


def test_cancelling_a_run_kills_its_running_tool_call(gateway) -> None:  # noqa: ANN001
    """``DELETE /v1/runs/{id}`` while a tool call of the run runs: the call's process is
    killed then (not at its ``timeout_s``), its caller is answered with an error naming the
    cancellation, and the run is cancelled."""
    require_tool_sandbox()
    argv = ("sleep", "96.75")  # a command line of its own, to find in /proc

    async def scenario() -> tuple[httpx.Response, dict, float]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
            rid = (await http.post("/v1/runs", json={"app": "tooly"})).json()["run_id"]
            call = asyncio.create_task(http.post(f"/v1/runs/{rid}/tools", json={
                "unit": "exec", "backend": "docker:python:3.10-slim", "command": list(argv),
                "timeout_s": 120}))
            deadline = time.monotonic() + 30
            while not processes_running(*argv):
                assert time.monotonic() < deadline and not call.done()
                await asyncio.sleep(0.05)
            t0 = time.monotonic()
            cancelled = (await http.delete(f"/v1/runs/{rid}")).json()
            answer = await call
            while processes_running(*argv):
                assert time.monotonic() - t0 < 10, "the cancelled run's tool call runs on"
                await asyncio.sleep(0.05)
            return answer, cancelled, time.monotonic() - t0

    answer, cancelled, took = asyncio.run(scenario())
    assert cancelled["state"] == "cancelled"
    assert answer.status_code == 409 and "cancel" in answer.json()["error"]["message"], answer.text
    assert took < 10


def test_apps_get_put_list(gateway) -> None:  # noqa: ANN001
    from hermes.core.profiler import learn
    from hermes.core.records import RequestRecord, RunRecord, UnitRecord

    http = httpx.Client(base_url=gateway.url)
    recs = [RunRecord(app="uploaded", run_id=f"r{i}", submitted=0.0, finished=2.0, units=[
        UnitRecord(unit="a", backend="llm:m", started=0.0, finished=1.0,
                   requests=[RequestRecord(input_tokens=10 + i, output_tokens=5)]),
        UnitRecord(unit="b", backend="api:x", started=1.0, finished=2.0, duration_s=1.0),
    ]) for i in range(3)]
    graph = learn(recs)
    assert http.get("/v1/apps/uploaded").status_code == 404
    r = http.put("/v1/apps/uploaded", content=graph.to_json())
    assert r.status_code == 200 and set(r.json()["pdgraph"]["units"]) == {"a", "b"}
    assert http.get("/v1/apps/uploaded").json()["pdgraph"]["runs"] == 3
    names = {a["name"]: a for a in http.get("/v1/apps").json()["apps"]}
    assert names["uploaded"]["pdgraph"] and not names["uploaded"]["hosted"]
    assert names["factool_kbqa"]["hosted"]
    r = http.put("/v1/apps/other", content=graph.to_json())
    assert r.status_code == 400 and r.json()["error"]["param"] == "app"
    r = http.put("/v1/apps/uploaded", content=b'{"app": "uploaded"}')
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_pdgraph"
    # uploads and learned graphs persist in the state dir, over the read-only shipped directory
    stores = gateway_state(gateway).config.stores
    assert (Path(stores.state_dir) / "pdgraphs" / "uploaded.json").exists()
    assert not (Path(stores.kb) / "uploaded.json").exists()


def test_healthz(gateway) -> None:  # noqa: ANN001
    h = httpx.get(gateway.url + "/healthz").json()
    assert h["status"] == "ok"
    assert h["nodes"]["embedded"]["engines"] == {"sim0": MODEL, "embed0": "sim-embed"}


def test_run_listings_are_newest_first_filtered_and_limited(gateway) -> None:  # noqa: ANN001
    http = httpx.Client(base_url=gateway.url, timeout=30)
    ids = [(app, http.post("/v1/runs", json={"app": app, "tenant": f"t-{app}"}).json()["run_id"])
           for app in ("list-a", "list-b", "list-a", "list-a", "list-b")]
    a_ids = [rid for app, rid in ids if app == "list-a"]
    assert http.post(f"/v1/runs/{a_ids[0]}/finish").json()["state"] == "finished"
    rows = http.get("/v1/runs", params={"app": "list-a", "limit": 2}).json()["runs"]
    assert [r["run_id"] for r in rows] == [a_ids[2], a_ids[1]]
    rows = http.get("/v1/runs", params={"app": "list-a", "state": "finished"}).json()["runs"]
    assert [r["run_id"] for r in rows] == [a_ids[0]]
    admin = http.get("/admin/runs", params={"tenant": "t-list-b", "state": "active"}).json()["runs"]
    assert [r["run_id"] for r in admin] == [rid for app, rid in reversed(ids) if app == "list-b"]

"""Durable state under faults, with real processes over TCP: SIGKILL the gateway during a load
of 100 hosted runs and restart it; SIGKILL one of two HermesLets. Every accepted run must be
accounted for: finished exactly once (with the result a fault-free run gives), or failed with
a reason."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest
from gw_procs import kill, start_gateway, start_node, wait_healthy
from sse_lines import completion_events

from hermes.gateway.run_store import SqliteRunStore
from hermes.procs import free_port
from hermes.workloads.registry import get_app

APP = "factool_kbqa"
SCALE = "10"


def _expected_units(seed: int) -> list[str]:
    return [s.unit for s in get_app(APP).steps(np.random.default_rng(seed))]


async def _submit(url: str, n: int, rate: float, accepted: dict[str, int]) -> None:
    """POST ``n`` hosted runs at ``rate``/s, each retried until accepted (the gateway may be
    down meanwhile); ``accepted``: run id -> seed, for 201s only."""
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as http:
        async def one(seed: int) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    r = await http.post("/v1/runs", json={"app": APP, "input": {"seed": seed}})
                except httpx.HTTPError:  # down, or died before answering: not accepted
                    await asyncio.sleep(0.2)
                    continue
                assert r.status_code == 201, r.text
                accepted[r.json()["run_id"]] = seed
                return

        tasks = []
        for seed in range(n):
            tasks.append(asyncio.create_task(one(seed)))
            await asyncio.sleep(1.0 / rate)
        await asyncio.gather(*tasks)


def _wait_all_ended(url: str, ids: list[str], timeout: float) -> dict[str, dict]:
    out: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=10) as http:
        while time.monotonic() < deadline:
            for rid in ids:
                if rid in out:
                    continue
                r = http.get(f"/v1/runs/{rid}")
                assert r.status_code == 200, f"accepted run {rid} lost: {r.status_code} {r.text}"
                if r.json()["state"] in ("finished", "failed", "cancelled"):
                    out[rid] = r.json()
            if len(out) == len(ids):
                return out
            time.sleep(0.3)
    missing = [rid for rid in ids if rid not in out]
    raise AssertionError(f"{len(missing)} runs never ended, e.g. {missing[:3]}")


def _check_accounted(runs: dict[str, dict], accepted: dict[str, int], records: Path) -> Counter:
    states: Counter = Counter()
    for rid, run in runs.items():
        states[run["state"]] += 1
        if run["state"] == "finished":
            # resumed or not, the run did exactly the work of a fault-free run
            assert run["result"]["units"] == _expected_units(accepted[rid]), rid
        else:
            assert run["state"] == "failed" and run["error"], run
    seen = Counter(json.loads(line)["run_id"] for line in records.read_text().splitlines())
    twice = [rid for rid, n in seen.items() if n > 1]
    assert not twice, f"runs completed twice: {twice[:5]}"
    finished = {rid for rid, r in runs.items() if r["state"] == "finished"}
    assert finished <= set(seen)  # every finished run was recorded (and learned from) once
    return states


@pytest.mark.slow
def test_sigkill_the_gateway_during_100_runs_and_restart(tmp_path: Path) -> None:
    port, zport = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    state = tmp_path / "state"
    env = {"HERMES_TIME_SCALE": SCALE, "HERMES_RECOVERY_GRACE_S": "2"}
    node = start_node(zport, "n0", tmp_path / "node.log", "--time-scale", SCALE,
                      "--max-inflight", "16")
    gw = start_gateway(port, zport, state, tmp_path / "gw1.log", **env)
    gw2 = None
    try:
        wait_healthy(url, gw)
        accepted: dict[str, int] = {}
        ids_before: set[str] = set()

        async def load_kill_restart() -> tuple[int, list[dict]]:
            nonlocal gw2
            load = asyncio.create_task(_submit(url, 100, 40.0, accepted))
            await asyncio.sleep(1.2)
            kill(gw)  # SIGKILL mid-load: runs queued, in flight, half done
            ids_before.update(accepted)
            n_before = len(accepted)
            # what the killed gateway had committed, read with the store's own reader
            docs = SqliteRunStore(state / "state.sqlite3").runs()
            gw2 = start_gateway(port, zport, state, tmp_path / "gw2.log", **env)
            await load  # the rest of the 100 are accepted by the restarted gateway
            return n_before, docs

        n_before, docs = asyncio.run(load_kill_restart())
        assert 20 <= n_before < 100 and len(accepted) == 100, (n_before, len(accepted))
        assert ids_before <= {d["run_id"] for d in docs}  # committed before the 201
        in_progress = [d for d in docs if d["status"] not in ("finished", "failed")]
        assert in_progress, "the kill should interrupt some runs"
        assert any(d["units"] for d in in_progress), "some interrupted runs had progress"
        runs = _wait_all_ended(url, list(accepted), timeout=90)
        states = _check_accounted(runs, accepted, state / "records.jsonl")
        assert states["finished"] == len(accepted), states  # LLM-only app: all resumable
        docs = {d["run_id"]: d for d in (json.loads(x) for (x,) in sqlite3.connect(
            state / "state.sqlite3").execute("SELECT doc FROM runs"))}
        resumed = [rid for rid in accepted if docs[rid].get("recovered")]
        stats = httpx.get(url + "/healthz").json()
        print(f"accepted before the kill {n_before}, interrupted {len(in_progress)}, resumed "
              f"{len(resumed)}, states {dict(states)}, adopted {stats['adopted']}, resent "
              f"{stats['resent']}, cancelled at the node {stats['orphans_cancelled']}")
        assert resumed, "no run was resumed"
        # a resumed run kept the units it had finished before the kill
        assert any(len(runs[rid]["units"]) == len(_expected_units(accepted[rid])) for rid in resumed)
        # new work after the restart still flows
        r = httpx.post(url + "/v1/completions", timeout=30,
                       json={"model": "llama-2-7b", "prompt": "after", "max_tokens": 2})
        assert r.status_code == 200
    finally:
        for p in (gw, gw2, node):
            if p is not None:
                kill(p)


@pytest.mark.slow
def test_sigkill_one_of_two_hermeslets_during_100_runs(tmp_path: Path) -> None:
    port, zport = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    state = tmp_path / "state"
    nodes = [start_node(zport, f"n{i}", tmp_path / f"n{i}.log", "--time-scale", SCALE,
                        "--max-inflight", "4") for i in range(2)]
    gw = start_gateway(port, zport, state, tmp_path / "gw.log", HERMES_TIME_SCALE=SCALE)
    try:
        wait_healthy(url, gw, nodes=2)
        accepted: dict[str, int] = {}

        async def load_and_kill() -> None:
            load = asyncio.create_task(_submit(url, 100, 50.0, accepted))
            await asyncio.sleep(1.5)
            kill(nodes[1])  # its queue and in-flight window die with it
            await load

        asyncio.run(load_and_kill())
        assert len(accepted) == 100
        runs = _wait_all_ended(url, list(accepted), timeout=120)
        states = _check_accounted(runs, accepted, state / "records.jsonl")
        health = httpx.get(url + "/healthz").json()
        print(f"states {dict(states)}, resent (in flight on n1) {health['resent']}")
        assert list(health["nodes"]) == ["n0"]
        assert health["requests_pending"] == 0
        # LLM requests are safe to retry: nothing is lost unless one was lost twice
        assert states["finished"] + states["failed"] == 100 and states["finished"] >= 95, states
        nodes_used = Counter(q["node"] for r in runs.values() for u in r["units"] for q in u["requests"])
        assert nodes_used["n1"] > 0 and nodes_used["n0"] > nodes_used["n1"], nodes_used
        assert health["resent"] > 0  # in-flight requests on the dead node were retried once
    finally:
        for p in (gw, *nodes):
            kill(p)


def test_a_stream_on_a_node_that_dies_is_not_resent(tmp_path: Path) -> None:
    """An LLM request in flight on a node that dies is resent once, unless it has streamed
    part of its answer: a resend would stream that part to the client again. The client gets
    what was streamed once, then an error naming why it was not retried."""
    port, zport = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    n0 = start_node(zport, "n0", tmp_path / "n0.log", "--time-scale", "1")
    gw = start_gateway(port, zport, tmp_path / "state", tmp_path / "gw.log")
    n1 = None
    try:
        wait_healthy(url, gw, nodes=1)
        texts: list[str] = []
        errors: list[str] = []
        with httpx.stream("POST", url + "/v1/completions", timeout=120,
                          json={"model": "llama-2-7b", "prompt": "hi", "max_tokens": 400,
                                "ignore_eos": True, "stream": True}) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data:") and "choices" in line:
                    texts += [c["text"] for c in json.loads(line[5:])["choices"]]
                    break
            n1 = start_node(zport, "n1", tmp_path / "n1.log", "--time-scale", "1")
            wait_healthy(url, gw, nodes=2)
            kill(n0)  # the stream was on n0, the only node when it started
            completion_events(lines, texts, errors)
        assert errors and "not retried (part of the answer was already streamed)" in errors[0], \
            errors
        assert 0 < len(texts) < 400, len(texts)  # cut short, and never restarted from the top
        assert httpx.get(url + "/healthz").json()["resent"] == 0
    finally:
        for p in (gw, n0, n1):
            if p is not None:
                kill(p)

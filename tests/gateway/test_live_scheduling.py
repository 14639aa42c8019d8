"""Live scheduling: rank changes reorder requests already queued at a saturated engine."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import httpx

from hermes.core.policies import base as policy_base
from hermes.core.policies.base import SchedulingPolicy
from hermes.core.state import RunState
from hermes.gateway.server import gateway_state

MODEL = "llama-2-7b"  # the embedded simulated engine's model (config default)


class ProgressPolicy(SchedulingPolicy):
    """Test policy: a run's rank improves by 1 with every unit it finishes."""

    name: ClassVar[str] = "test-progress"

    def rank(self, run: RunState, now: float) -> float:
        return 10.0 - len(run.progress.finished)


def test_improved_rank_overtakes_earlier_queued_requests(make_gateway, monkeypatch) -> None:  # noqa: ANN001
    policy_base.policy_names()  # load the built-in policies first
    monkeypatch.setitem(policy_base._REGISTRY, "test-progress", ProgressPolicy)  # this test only
    srv = make_gateway(policy="test-progress", time_scale=5.0,
                       engines=[{"name": "sim0", "model": MODEL, "max_inflight": 1}])
    state = gateway_state(srv)
    engine = state.node.slots["sim0"].engine
    tags: dict[str, str] = {}  # request id -> tag
    finished: dict[str, float] = {}  # tag -> when the scheduler saw it done (scheduler clock)

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
            ids = {}
            for name in ("a", "b", "c"):  # a arrives first, then b, then c: equal ranks
                ids[name] = (await http.post("/v1/runs", json={"app": name})).json()["run_id"]

            async def call(run: str, tag: str, n: int) -> None:
                r = await http.post("/v1/completions", headers={"X-Hermes-Run": ids[run],
                                                                "X-Hermes-Unit": "work"},
                                    json={"model": MODEL, "prompt": "p", "max_tokens": n, "ignore_eos": True})
                assert r.status_code == 200, r.text
                tags[r.json()["id"].removeprefix("cmpl-")] = tag

            async def pending(run: str) -> int:
                return (await http.get(f"/v1/runs/{ids[run]}")).json()["pending_requests"]

            # saturate the engine (window of 1): a's long request holds it (~1 s wall)
            tasks = [asyncio.create_task(call("a", "a-blocker", 400))]
            while not engine.core.running:
                await asyncio.sleep(0.002)
            for i in range(3):  # a's queued requests, then b's and c's
                tasks.append(asyncio.create_task(call("a", f"a{i}", 2)))
                while await pending("a") < i + 2:
                    await asyncio.sleep(0.002)
            for run in ("b", "c"):
                tasks.append(asyncio.create_task(call(run, run, 2)))
                while await pending(run) < 1:
                    await asyncio.sleep(0.002)
            assert len(engine.core.running) == 1 and not tags  # all of it is still queued
            ranks = {r: (await http.get(f"/v1/runs/{ids[r]}")).json()["rank"] for r in ids}
            assert ranks["a"] == ranks["b"] == ranks["c"]
            # b finishes a unit it runs itself: its rank improves, its queued request moves up
            for event in ("start", "finish"):
                r = await http.post(f"/v1/runs/{ids['b']}/events",
                                    json={"unit": "lookup", "event": event, "backend": "api:kb"})
                assert r.status_code == 200
            assert (await http.get(f"/v1/runs/{ids['b']}")).json()["rank"] < ranks["b"]
            await asyncio.gather(*tasks)
            for run_id in ids.values():
                for unit in (await http.get(f"/v1/runs/{run_id}")).json()["units"]:
                    for req in unit["requests"]:
                        if req["request_id"] in tags:
                            finished[tags[req["request_id"]]] = req["finished"]

    asyncio.run(scenario())
    order = sorted(finished, key=finished.__getitem__)
    # b overtook a's earlier-queued requests; c (no rank change) stays behind them, FCFS
    assert order == ["a-blocker", "b", "a0", "a1", "a2", "c"]
    assert state.scheduler.stats["rekeys_sent"] >= 1

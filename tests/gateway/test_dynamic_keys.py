"""Policies with ``dynamic_keys`` (VTC): queued requests are re-keyed when the state their keys
read changes, not only when their own run's rank does."""

from __future__ import annotations

import asyncio

import httpx

from hermes.gateway.server import gateway_state

MODEL = "llama-2-7b"


def test_vtc_requeues_a_tenants_waiting_requests_when_its_counter_grows(make_gateway) -> None:  # noqa: ANN001
    # the periodic sweep is far away: only event-driven re-keying can reorder the queue
    srv = make_gateway(policy="vtc", time_scale=5.0, rekey_interval_s=120.0,
                       engines=[{"name": "sim0", "model": MODEL, "max_inflight": 1}])
    state = gateway_state(srv)
    engine = state.node.slots["sim0"].engine
    policy = state.scheduler.policy
    finished: dict[str, float] = {}
    # which tenant's requests each run event re-keys (VTC: only its own tenant's)
    sched = state.scheduler.dispatch  # re-keying is dispatch's (hermes.gateway.dispatch)
    touched: list[tuple[str, str]] = []
    rekey_run, recompute = sched._rekey_run, sched._recompute
    trigger: list[str] = []

    def spy_rekey_run(run, now):  # noqa: ANN001, ANN202
        trigger.append(run.state.tenant)
        try:
            return rekey_run(run, now)
        finally:
            trigger.pop()

    def spy_recompute(req, now, changes):  # noqa: ANN001, ANN202
        if trigger:
            touched.append((trigger[-1], req.run.state.tenant))
        return recompute(req, now, changes)

    sched._rekey_run, sched._recompute = spy_rekey_run, spy_recompute

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
            ids = {}
            for name, tenant in (("a1", "a"), ("a2", "a"), ("b", "b")):
                r = await http.post("/v1/runs", json={"app": "vtc-test", "tenant": tenant})
                ids[name] = r.json()["run_id"]

            def headers(run: str) -> dict[str, str]:
                return {"X-Hermes-Run": ids[run], "X-Hermes-Unit": "work"}

            async def blocker() -> None:  # tenant a's streamed request: tokens charge a's counter
                async with http.stream("POST", "/v1/completions", headers=headers("a1"), json={
                        "model": MODEL, "prompt": "p", "max_tokens": 300, "stream": True, "ignore_eos": True}) as r:
                    assert r.status_code == 200
                    async for _ in r.aiter_lines():
                        pass
                finished["a-blocker"] = state.scheduler.now()

            async def call(run: str) -> None:
                r = await http.post("/v1/completions", headers=headers(run),
                                    json={"model": MODEL, "prompt": "p", "max_tokens": 2})
                assert r.status_code == 200, r.text
                finished[run] = state.scheduler.now()

            async def pending(run: str) -> int:
                return (await http.get(f"/v1/runs/{ids[run]}")).json()["pending_requests"]

            tasks = [asyncio.create_task(blocker())]
            while not engine.core.running:
                await asyncio.sleep(0.002)
            for run in ("a2", "b"):  # a2 queues first: FCFS on equal counters would serve it first
                tasks.append(asyncio.create_task(call(run)))
                while await pending(run) < 1:
                    await asyncio.sleep(0.002)
            await asyncio.gather(*tasks)

    asyncio.run(scenario())
    assert policy.counter("a") > policy.counter("b") > 0
    # a's streamed tokens raised a's counter while a2 waited: b overtook it
    assert sorted(finished, key=finished.__getitem__) == ["a-blocker", "b", "a2"]
    # a's events re-keyed a2 (another run of a) but never b's request, and vice versa
    assert ("a", "a") in touched and all(t == r for t, r in touched), touched

"""Engine choice in the live gateway (issue 19): two built-in engines of one model behind one
gateway; a run's second turn goes to the engine holding its conversation under the `prefix`
and `hermes` routers, and to the idle one under `least-loaded` while the first is busy."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

MODEL = "llama-2-7b"
ENGINES = [{"name": "e1", "model": MODEL}, {"name": "e2", "model": MODEL}]


def _engine_of(http: httpx.Client, run_id: str, turn: int) -> str:
    run = http.get(f"/v1/runs/{run_id}").json()
    return run["units"][turn]["requests"][0]["engine"]


@pytest.mark.parametrize(("router", "follows_prefix"), [
    ("least-loaded", False), ("prefix", True), ("hermes", True)])
def test_second_turn_routing(make_gateway, router: str, follows_prefix: bool) -> None:  # noqa: ANN001
    gw = make_gateway(engines=ENGINES, router=router, time_scale=2.0)
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        # a conversation of a few thousand tokens: under `hermes` its held prefix outweighs
        # the one request in flight on its engine (queue_tokens x 1/8 of the window)
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": "You plan trips. " * 1000},
            {"role": "user", "content": "Plan three days in Porto. " * 30}]
        r1 = http.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs,
                                                      "max_tokens": 4, "ignore_eos": True})
        assert r1.status_code == 200, r1.text
        run_id = r1.headers["x-hermes-run"]
        first = _engine_of(http, run_id, 0)
        # another client's long request occupies the engine the conversation is on (the
        # least loaded: both idle, ties to the first)
        long_body = {"model": MODEL, "max_tokens": 3000, "ignore_eos": True, "stream": True,
                     "messages": [{"role": "user", "content": "a long story"}]}
        done = threading.Event()

        def occupy() -> None:  # streams until the test is done, then hangs up (abandoned)
            with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=long_body,
                              headers={"X-Hermes-Run": "none"}, timeout=120) as resp:
                for _ in resp.iter_lines():
                    if done.is_set():
                        return

        t = threading.Thread(target=occupy, daemon=True)
        t.start()
        deadline = time.monotonic() + 10
        sched = gw.server.config.app.state.scheduler
        # the long request is accepted, then dispatched: wait until it has its engine (read
        # between the two, on a loaded machine, it had none yet)
        while not any(r.engine for r in sched.requests.values()) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        (busy,) = [r.engine for r in sched.requests.values()]
        assert busy == first
        msgs += [r1.json()["choices"][0]["message"], {"role": "user", "content": "And day 4?"}]
        r2 = http.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs,
                                                      "max_tokens": 4, "ignore_eos": True})
        assert r2.status_code == 200 and r2.headers["x-hermes-run"] == run_id
        second = _engine_of(http, run_id, 1)
        done.set()
        t.join(timeout=30)
        assert (second == first) is follows_prefix, (router, first, second)
        stats = sched.node_table.router_stats
        if follows_prefix:  # the second turn found its conversation's prefix on its engine
            assert stats.matched_tokens > 0 and stats.hit_ratio > 0.3
        else:
            assert stats.prompt_tokens == stats.matched_tokens == 0  # it reads no prefixes

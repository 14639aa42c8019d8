"""KV prewarms with a queue key wait in the HermesLet's engine queue like the unit's request
(they do not jump a busy engine's queue), and a release of a still-queued one removes it."""

from __future__ import annotations

import asyncio

import pytest

from hermes import protocol as P
from hermeslet.prewarmers import KVPrefixPrewarmer, NodePrewarmer
from tests.hermeslet.test_agent import running, sim, submit

pytestmark = pytest.mark.timeout(30)

PREFIX = "You are the retrieval unit's careful answerer. " * 20
BACKEND = "kv:m7b/t/app/answer"


def prewarm(action: str, pid: int, key: list[float] | None = None) -> P.Prewarm:
    params = {"run_id": "run-x", "unit": "answer", "pid": pid, "prefix": PREFIX}
    if key is not None:
        params["key"] = key
    return P.Prewarm(backend=BACKEND, action=action, params=params)


def node_with_prefixes(engine) -> NodePrewarmer:  # noqa: ANN001
    return NodePrewarmer(prefixes={"m7b": KVPrefixPrewarmer(engine)})


async def until(pred, timeout: float = 10.0) -> None:  # noqa: ANN001
    """Wait until ``pred()`` holds (the agent handles messages on its own schedule)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.01)


async def test_a_keyed_prewarm_is_released_in_key_order_and_acked_not_answered():
    engine = sim(max_inflight=1, time_scale=1.0)
    pw = node_with_prefixes(engine)
    unit_request = P.Submit(  # the unit's own request, carrying the prefix, queued after it
        request_id="b", run_id="run-x", unit="answer", model="m7b", endpoint="chat", key=[3.0],
        body={"max_tokens": 2, "messages": [{"role": "system", "content": PREFIX},
                                            {"role": "user", "content": "q"}]})
    async with running([engine], prewarmer=pw) as (sched, agent, _, released):
        await sched.send(submit("busy", [0.0], max_tokens=30))
        await sched.send(submit("a", [1.0], max_tokens=2))
        await sched.send(unit_request)
        await sched.send(prewarm("start", 1, key=[2.0]))
        await until(lambda: agent.heartbeat().engines["sim"].queued == 3)
        assert agent.holding() == {"busy": "inflight", "a": "queued", "b": "queued"}
        msgs = await sched.collect({"done", "failed", "prewarm_ack"}, 4)
        acks = [m for m in msgs if m.type == "prewarm_ack"]
        assert len(acks) == 1 and acks[0].ok and acks[0].action == "start"
        assert 0 < float(acks[0].detail.removeprefix("warmup_s=")) < 5
        # nothing reaches the scheduler for the prewarm itself
        assert [m.request_id for m in msgs if m.type != "prewarm_ack"] == ["busy", "a", "b"]
        assert [r.split("-")[0] for r in released] == ["busy", "a", "prewarm", "b"]
        assert pw.prefixes["m7b"].counters.started == 1
        # the unit's request found the prefix the prewarm computed right before it
        assert engine.stats().extra["prefix_cache_hits"] >= 1


async def test_a_release_takes_a_queued_prewarm_out_before_the_engine_sees_it():
    engine = sim(max_inflight=1, time_scale=1.0)
    pw = node_with_prefixes(engine)
    async with running([engine], prewarmer=pw) as (sched, agent, _, released):
        await sched.send(submit("busy", [0.0], max_tokens=2000))  # ~25 s: stays in the slot
        await sched.send(prewarm("start", 7, key=[1.0]))
        await until(lambda: agent.heartbeat().engines["sim"].queued == 1)
        await sched.send(prewarm("release", 7))
        acks = await sched.collect({"prewarm_ack"}, 2)
        by_action = {a.action: a for a in acks}
        assert by_action["release"].ok and "removed from the queue" in by_action["release"].detail
        assert by_action["start"].ok and by_action["start"].detail.startswith("cancelled")
        assert agent.heartbeat().engines["sim"].queued == 0
        await sched.send(P.Cancel(request_ids=["busy"]))
        await sched.collect({"failed"}, 1)
        await asyncio.sleep(0.05)  # the freed window would have released it now
        assert released == ["busy"]
        c = pw.prefixes["m7b"].counters  # taken on, then wasted at no engine cost
        assert (c.started, c.wasted, c.wasted_backend_s) == (1, 1, 0.0)


@pytest.mark.parametrize("key", [None, ["soon"]])
async def test_a_prewarm_without_a_usable_key_goes_to_the_engine_at_once(key) -> None:  # noqa: ANN001
    """An older scheduler sends no key (and a malformed one must not take the node down):
    the prewarm is sent straight to the engine, as before, even while the window is full."""
    engine = sim(max_inflight=1, time_scale=1.0)
    pw = node_with_prefixes(engine)
    async with running([engine], prewarmer=pw) as (sched, _, _, released):
        await sched.send(submit("busy", [0.0], max_tokens=2000))  # ~25 s in the only slot
        await sched.send(prewarm("start", 1, key=key))
        ack = await sched.recv("prewarm_ack", timeout=10)  # long before "busy" is done
        assert ack.ok and ack.detail.startswith("warmup_s=")
        assert released == ["busy"]
        await sched.send(submit("next", [1.0], max_tokens=1))  # the node still serves
        await sched.send(P.Cancel(request_ids=["busy"]))
        done = await sched.collect({"done"}, 1)
        assert done[0].request_id == "next"

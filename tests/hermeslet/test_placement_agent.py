"""``HermesLet.apply_placement`` against a fake scheduler (issue 22 item 5): a request the
scheduler sent to an engine the node has since drained or stopped goes to the node's engine of
its model; one whose model no engine serves any more waits on the draining engine; an engine
that fails to start fails its waiting requests and the node serves on without it."""

from __future__ import annotations

import asyncio

from hermeslet.engines.base import EngineAdapter, GenChunk
from hermeslet.engines.sim_engine import SimEngine
from tests.hermeslet.test_agent import running, submit


def sim(name: str, model: str) -> SimEngine:
    return SimEngine(name=name, model=model, max_inflight=1, time_scale=20.0)


class BrokenEngine(SimEngine):
    async def start(self) -> None:
        raise RuntimeError("no GPU memory left")


async def test_stale_engine_choice_and_waiting_on_a_draining_engine() -> None:
    async with running([sim("g0-a", "a"), sim("g0-b", "b")]) as (sched, agent, _, released):
        # b's request is in flight on g0-b and another waits behind it; the new plan has no b
        long = submit("b-long", [0.0], model="b", max_tokens=300)
        long.engine = "g0-b"
        await sched.send(long)
        while "b-long" not in released:
            await asyncio.sleep(0.01)
        nxt = submit("b-next", [1.0], model="b")
        nxt.engine = "g0-b"
        await sched.send(nxt)
        while "b-next" not in agent.holding():
            await asyncio.sleep(0.01)
        applying = asyncio.create_task(agent.apply_placement([sim("g0-a", "a"),
                                                              sim("g1-a", "a")]))
        hello = await sched.recv("hello")
        assert [e.name for e in hello.engines] == ["g0-a", "g1-a"]  # g0-b: no new work
        # sent by a scheduler that had not seen that hello yet: to the drained engine
        stale = submit("b-stale", [2.0], model="b")
        stale.engine = "g0-b"
        await sched.send(stale)
        done = await sched.collect({"done", "failed"}, 3, 30)
        assert [(m.type, m.request_id, m.engine) for m in done] == [
            ("done", "b-long", "g0-b"), ("done", "b-next", "g0-b"), ("done", "b-stale", "g0-b")]
        change = await asyncio.wait_for(applying, 10)
        assert (change.kept, change.drained, change.started, change.moved) == (
            ("g0-a",), ("g0-b",), ("g1-a",), 0)
        # now g0-b is gone: a request still addressed to it goes to an engine of its model
        late = submit("a-late", [0.0], model="a")
        late.engine = "g0-b"
        await sched.send(late)
        (m,) = await sched.collect({"done", "failed"}, 1, 10)
        assert (m.type, m.engine) == ("done", "g0-a")


async def test_engine_that_fails_to_start() -> None:
    engines: list[EngineAdapter] = [sim("g0-a", "a")]
    async with running(engines) as (sched, agent, _, _released):
        broken = BrokenEngine(name="g1-b", model="b", time_scale=20.0)
        change = await agent.apply_placement([engines[0], broken])
        assert change.started == ("g1-b",) and "no GPU memory left" in change.failed["g1-b"]
        assert set(agent.slots) == {"g0-a"}
        hello = await sched.recv("hello", pred=lambda m: len(m.engines) == 1)
        assert [e.name for e in hello.engines] == ["g0-a"]
        await sched.send(submit("a1", [0.0], model="a"))
        (m,) = await sched.collect({"done", "failed"}, 1, 10)
        assert (m.type, m.engine) == ("done", "g0-a")


class HungEngine(SimEngine):
    """An engine that never finishes: a streamed request gets one token, then nothing."""

    async def generate(self, endpoint, body, stream, *, request_id=None, priority=None):  # type: ignore[override]
        if stream:
            yield GenChunk(text="x", n_tokens=1)
        await asyncio.Event().wait()


async def test_a_drain_that_times_out_fails_what_the_engine_holds_and_goes_on() -> None:
    """A drained engine that never finishes its requests cannot hold a placement change up:
    at ``drain_timeout_s`` what it still holds fails, retryable (the gateway resends it to an
    engine of the plan) unless tokens were already streamed (a resend would stream them
    again), and the change goes on. Without the timeout the change waits for ever."""
    hung = HungEngine(name="g0-b", model="b", max_inflight=2, time_scale=20.0)
    async with running([sim("g0-a", "a"), hung], drain_timeout_s=0.5) as (sched, agent, _, released):
        for rid, stream in (("b-quiet", False), ("b-streamed", True), ("b-queued", False)):
            m = submit(rid, [0.0], model="b", stream=stream)
            m.engine = "g0-b"
            await sched.send(m)
        await sched.recv("token", pred=lambda m: m.request_id == "b-streamed")
        assert "b-queued" in agent.holding() and "b-queued" not in released
        applying = asyncio.create_task(agent.apply_placement([sim("g0-a", "a")]))
        failed = {m.request_id: m for m in await sched.collect({"done", "failed"}, 3, 10)}
        change = await asyncio.wait_for(applying, 10)
        assert {r: (m.type, m.retryable) for r, m in failed.items()} == {
            "b-quiet": ("failed", True), "b-streamed": ("failed", False),
            "b-queued": ("failed", True)}
        assert all("0.5 s drain timeout" in m.error for m in failed.values())
        assert (change.drained, change.abandoned) == (("g0-b",), 3)
        assert set(agent.slots) == {"g0-a"} and not agent.draining
        await sched.send(submit("a1", [0.0], model="a"))
        (m,) = await sched.collect({"done", "failed"}, 1, 10)
        assert (m.type, m.engine) == ("done", "g0-a")

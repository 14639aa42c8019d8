"""The embedded HermesLet's in-process link (hermes.inproc): a real HermesLet and its engine on
one side, a recording handler or a real LiveScheduler on the other, no socket in between."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from hermes import protocol as P
from hermes.gateway.config import load_config
from hermes.gateway.scheduler import LiveScheduler, SchedulerError
from hermes.inproc import InprocLink
from hermeslet.agent import HermesLet
from tests.hermeslet.test_agent import sim, submit

pytestmark = pytest.mark.timeout(30)


class Recorder:
    """The scheduler side of a link: keeps every node message, in arrival order."""

    def __init__(self) -> None:
        self.msgs: list[tuple[bytes, object]] = []
        self.arrived = asyncio.Event()

    def __call__(self, identity: bytes, msg: object) -> None:
        self.msgs.append((identity, msg))
        self.arrived.set()

    async def wait_for(self, type_: str, n: int = 1, timeout: float = 10.0) -> list:
        async def _go() -> list:
            while True:
                got = [m for _, m in self.msgs if m.type == type_]
                if len(got) >= n:
                    return got
                self.arrived.clear()
                await self.arrived.wait()
        return await asyncio.wait_for(_go(), timeout)


@contextlib.asynccontextmanager
async def linked_node(link: InprocLink, **engine_kw):
    agent = HermesLet("emb", "inproc-link", [sim(**engine_kw)], link=link, heartbeat_s=0.05)
    task = asyncio.create_task(agent.run())
    try:
        yield agent
    finally:
        agent.stop()
        await asyncio.wait_for(task, 5)


async def test_node_messages_arrive_as_objects_in_order_and_only_a_done_synchronously():
    rec = Recorder()
    link = InprocLink(b"emb", rec)
    async with linked_node(link, time_scale=200):
        (hello,) = await rec.wait_for("hello")
        assert isinstance(hello, P.Hello) and hello.node == "emb"
        assert rec.msgs[0][0] == b"emb"
        for i, key in enumerate(([2.0], [1.0], [3.0])):
            link.deliver(submit(f"r{i}", key, max_tokens=2))
        done = await rec.wait_for("done", 3)
        assert sorted(d.request_id for d in done) == ["r0", "r1", "r2"]
        assert all(d.output_tokens == 2 for d in done)
        await rec.wait_for("heartbeat", 2)  # the heartbeat loop runs over the link too
        # a node message is handed over on a later loop iteration, not inside the send
        before = len(rec.msgs)
        link.send(P.UnitEvent(run_id="x", unit="u", event="start", time=1.0))
        assert len(rec.msgs) == before
        await asyncio.sleep(0)
        assert rec.msgs[-1][1].type == "unit_event"


def _done(rid: str) -> P.Done:
    return P.Done(request_id=rid, input_tokens=1, output_tokens=1, text="", engine="e",
                  queue_s=0.0, service_s=0.0)


async def test_a_done_with_nothing_ahead_is_handled_inside_the_send_and_never_overtakes():
    """A ``done`` goes to the scheduler's handler at once when no message of the node waits
    for the loop; behind a queued one (a streamed token) it waits its turn."""
    rec = Recorder()
    link = InprocLink(b"emb", rec)
    link.send(_done("a"))
    assert [m.request_id for _, m in rec.msgs] == ["a"]  # no loop iteration needed
    link.send(P.Token(request_id="b", text="x", n_tokens=1))
    link.send(_done("b"))
    assert len(rec.msgs) == 1  # behind the token: not before it
    await asyncio.sleep(0)
    assert [(m.type, m.request_id) for _, m in rec.msgs[1:]] == [("token", "b"), ("done", "b")]
    link.send(_done("c"))  # nothing queued any more: at once again
    assert rec.msgs[-1][1].request_id == "c"


async def test_a_submit_reaches_an_idle_node_at_once_and_never_overtakes_queued_messages():
    """While the node's receive loop waits, a submit goes to its intake inside ``deliver``;
    once anything waits in the inbox, submits queue behind it, in order."""
    link = InprocLink(b"emb", Recorder())
    taken: list[str] = []
    link.direct(lambda m: taken.append(m.request_id))
    waiting = asyncio.create_task(link.recv())
    await asyncio.sleep(0)  # the node waits for work
    link.deliver(submit("s1", [1.0], max_tokens=1))
    assert taken == ["s1"] and not waiting.done()
    cancel = P.Cancel(request_ids=["s0"])
    link.deliver(cancel)  # not a submit: through the inbox (the waiter is woken)
    link.deliver(submit("s2", [1.0], max_tokens=1))  # behind the cancel
    assert taken == ["s1"]
    got = await waiting
    assert [m.type for m in got] == ["cancel", "submit"] and got[1].request_id == "s2"
    link.direct(None)  # without an intake: through the inbox
    waiting = asyncio.create_task(link.recv())
    await asyncio.sleep(0)
    link.deliver(submit("s3", [1.0], max_tokens=1))
    assert [m.request_id for m in await waiting] == ["s3"] and taken == ["s1"]


async def test_an_idle_linked_node_starts_a_submit_before_the_deliver_returns():
    """The real HermesLet's intake: the request is at its engine (a task of the node's) when
    ``deliver`` returns, and its ``done`` arrives."""
    rec = Recorder()
    link = InprocLink(b"emb", rec)
    async with linked_node(link, time_scale=200) as node:
        await rec.wait_for("hello")
        for _ in range(100):  # the receive loop is waiting
            await asyncio.sleep(0)
        link.deliver(submit("now", [1.0], max_tokens=2))
        slot = next(iter(node.slots.values()))
        assert "now" in slot.inflight
        (done,) = await rec.wait_for("done")
        assert done.request_id == "now" and done.output_tokens == 2


async def test_retained_messages_are_copied_so_later_changes_do_not_reach_the_node():
    rec = Recorder()
    link = InprocLink(b"emb", rec)
    sub = submit("keep", [5.0], max_tokens=1)
    link.deliver(sub)
    sub.engine = "elsewhere"  # what the scheduler does when it re-sends after a failure
    sub.key = [0.0]
    (got,) = await link.recv()
    assert got is not sub and got.engine is None and got.key == [5.0]
    cancel = P.Cancel(request_ids=["keep"])  # not kept by the scheduler: handed over as is
    link.deliver(cancel)
    assert (await link.recv())[0] is cancel


async def test_close_ends_a_waiting_receive_and_drops_later_messages():
    rec = Recorder()
    link = InprocLink(b"emb", rec)
    waiting = asyncio.create_task(link.recv())
    await asyncio.sleep(0)
    link.close()
    with pytest.raises(ConnectionError):
        await waiting
    link.deliver(P.Resync())
    link.send(P.UnitEvent(run_id="x", unit="u", event="start", time=1.0))
    await asyncio.sleep(0.01)
    assert rec.msgs == []


async def test_live_scheduler_serves_a_linked_node_and_refuses_a_second_link(tmp_path: Path):
    cfg = load_config(None, environ={}, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"), time_scale=100.0, log_level="warning")
    sched = LiveScheduler(cfg)
    await sched.start()
    try:
        link = sched.inproc_link("emb")
        with pytest.raises(SchedulerError, match="already linked"):
            sched.inproc_link("emb")
        async with linked_node(link, time_scale=200):
            assert await sched.wait_for_nodes(5)
            assert sched.nodes["emb"].identity == b"emb"
            run = sched.create_run("default")
            inv = sched.unit_for_request(run, "llm", "llm:m7b")
            req = await sched.submit_llm(run, inv, model="m7b", endpoint="completions",
                                         body={"prompt": "hi there", "max_tokens": 3, "ignore_eos": True})
            done = await sched.wait(req, timeout=10)
            assert done.output_tokens == 3 and req.node == "emb"
    finally:
        await sched.stop()
    assert link.closed


async def test_a_submit_whose_intake_raises_is_answered_failed_not_dropped(monkeypatch):
    """A submit the node could not take (here: its engine lookup raised) is answered
    ``failed``, retryable, over the link; one it already holds when its release raises
    is left queued and still served."""
    rec = Recorder()
    link = InprocLink(b"emb", rec)
    async with linked_node(link, time_scale=200) as agent:
        await rec.wait_for("hello")
        real_pick, real_pump = agent._pick, agent._pump

        def broken_pick(msg):
            if msg.request_id == "bad":
                raise RuntimeError("engine table changed under us")
            return real_pick(msg)

        monkeypatch.setattr(agent, "_pick", broken_pick)
        link.deliver(submit("bad", [1.0], max_tokens=2))
        (failed,) = await rec.wait_for("failed")
        assert failed.request_id == "bad" and failed.retryable
        assert "RuntimeError: engine table changed under us" in failed.error

        calls = {"n": 0}

        def pump_once_broken(slot):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("release failed")
            return real_pump(slot)

        monkeypatch.setattr(agent, "_pump", pump_once_broken)
        link.deliver(submit("held", [1.0], max_tokens=2))  # queued, then the release raised
        assert "held" in agent.holding()
        link.deliver(submit("next", [1.0], max_tokens=2))  # the next release takes it too
        done = await rec.wait_for("done", 2)
        assert sorted(d.request_id for d in done) == ["held", "next"]
        assert [m.request_id for _, m in rec.msgs if m.type == "failed"] == ["bad"]

"""A HermesLet with several scheduler addresses (elected schedulers): it follows the highest
lease epoch, hands a result it could not deliver to the new leader, and rejects a deposed
scheduler's stale epoch (fencing). Real ZeroMQ sockets play the schedulers."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from hermes import protocol as P
from hermes.procs import free_port
from hermeslet.agent import HermesLet
from hermeslet.engines.sim_engine import SimEngine
from hermeslet.follow import LeaderFollower

pytestmark = pytest.mark.timeout(30)


class FakeScheduler:
    """A ROUTER bound at ``address`` playing a scheduler; records what it receives."""

    def __init__(self, ctx: zmq.asyncio.Context, address: str) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(address)
        self.seen: list = []
        self.node_id: bytes | None = None

    async def recv(self, type_: str, timeout: float = 10.0, pred=lambda m: True):
        async def _next():
            while True:
                ident, frame = await self.sock.recv_multipart()
                self.node_id = ident
                msg = P.decode(frame)
                self.seen.append(msg)
                if msg.type == type_ and pred(msg):
                    return msg
        return await asyncio.wait_for(_next(), timeout)

    async def send(self, msg) -> None:
        assert self.node_id is not None
        await self.sock.send_multipart([self.node_id, P.encode(msg)])


def at(ctx: zmq.asyncio.Context, address: str) -> FakeScheduler:
    return FakeScheduler(ctx, address)


def sim(time_scale: float) -> SimEngine:
    return SimEngine(name="sim", model="m7b", max_inflight=4, time_scale=time_scale)


def submit(rid: str, key: list[float], *, max_tokens: int) -> P.Submit:
    return P.Submit(request_id=rid, run_id="run-" + rid, unit="u", model="m7b",
                    endpoint="completions", key=key,
                    body={"prompt": "x" * 40, "max_tokens": max_tokens, "ignore_eos": True})


def stamped(msg: P.Submit, epoch: int) -> P.Submit:
    msg.epoch = epoch
    return msg


async def test_failover_follow_handover_and_stale_epoch_rejected() -> None:
    ctx = zmq.asyncio.Context()
    a_addr, b_addr = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    a = at(ctx, a_addr)  # the leader; b is a standby: not bound yet
    agent = HermesLet("node-f", [a_addr, b_addr], [sim(time_scale=5.0)], ctx=ctx,
                      heartbeat_s=0.2)
    task = asyncio.create_task(agent.run())
    try:
        await a.recv("hello")
        await a.send(P.Leader(epoch=1))
        await a.send(stamped(submit("r1", [1.0], max_tokens=40), 1))  # ~0.1 s of work
        await asyncio.sleep(0.02)
        assert agent.follower.epoch == 1 and agent.holding() == {"r1": "inflight"}
        a.sock.close(linger=0)  # the leader dies (kill -9) while r1 runs
        await asyncio.sleep(0.6)  # r1 finishes with no leader reachable: kept
        b = at(ctx, b_addr)  # the standby takes the lease and binds
        hello = await b.recv("hello")  # the node says hello as soon as it connects
        assert hello.node == "node-f"
        await b.send(P.Leader(epoch=2))
        done = await b.recv("done", pred=lambda m: m.request_id == "r1")
        assert done.output_tokens == 40  # the result reached the new leader, not run again
        assert agent.follower.leader == 1 and agent.follower.epoch == 2
        # the deposed leader wakes up (same address) and tries to dispatch with epoch 1
        old = at(ctx, a_addr)
        await old.recv("heartbeat")  # the node reconnected: heartbeats go to every address
        await old.send(stamped(submit("r2", [0.0], max_tokens=2), 1))
        await old.send(P.Cancel(request_ids=["r1"], epoch=1))
        deadline = asyncio.get_running_loop().time() + 5
        while agent.follower.stale_rejected < 2:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        assert "r2" not in agent.holding()
        assert not [m for m in b.seen + old.seen if getattr(m, "request_id", None) == "r2"]
        # the leader's own messages still work
        await b.send(stamped(submit("r3", [0.0], max_tokens=2), 2))
        assert (await b.recv("done", pred=lambda m: m.request_id == "r3")).output_tokens == 2
        old.sock.close(linger=0)
        b.sock.close(linger=0)
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)
        ctx.term()


def test_follower_decisions() -> None:
    f = LeaderFollower("n", 2)
    assert f.leader is None
    assert f.judge(0, P.Resync(epoch=None)) == "apply" and f.leader == 0  # a lone scheduler
    assert f.judge(1, P.Leader(epoch=3)) == "follow" and (f.leader, f.epoch) == (1, 3)
    assert f.judge(0, P.Rekey(keys={}, epoch=2)) == "stale" and f.stale_rejected == 1
    assert f.judge(1, P.Rekey(keys={}, epoch=3)) == "apply"
    done = P.Done(request_id="x", input_tokens=1, output_tokens=1, text="", engine="e",
                  queue_s=0, service_s=0)
    f.sent(done, now=0.0)
    f.undelivered(P.Failed(request_id="y", error="e"))
    f.undelivered(P.Heartbeat(node="n", engines={}, time=0))  # not a result: not kept
    assert [m.request_id for m in f.for_new_leader(now=1.0)] == ["x", "y"]  # type: ignore[attr-defined]
    assert [m.request_id for m in f.for_new_leader(now=100.0)] == []  # type: ignore[attr-defined]

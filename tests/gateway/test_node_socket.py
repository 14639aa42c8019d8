"""The scheduler's node socket (:class:`hermes.gateway.nodes.NodeTable`), read and written
synchronously on the event loop's readiness callback: a message a node's full pipe cannot take
is kept and sent later, in order (it was dropped without a word), and a message that arrives
while the scheduler sends is read at once (ZeroMQ's descriptor is edge-triggered: a send can
take its signal)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import zmq
import zmq.asyncio

from hermes.gateway.nodes import NodeTable
from hermes.protocol import Cancel, EngineInfo, Hello, decode, encode


def _table(address: str, context: zmq.asyncio.Context | None = None
           ) -> tuple[NodeTable, list[Any]]:
    sc = SimpleNamespace(router="least-loaded", router_index_tokens=1000, bind="")
    config = SimpleNamespace(scheduler=sc, security=SimpleNamespace(curve_dir=None))
    ctx = SimpleNamespace(config=config, metrics=None, now=lambda: 0.0, stats={})
    table = NodeTable(ctx, context or zmq.asyncio.Context.instance(), address)
    got: list[Any] = []
    table.handler = lambda identity, msg: got.append((identity, msg))
    table.bind()
    return table, got


def _node(address: str, *, rcvhwm: int = 1000, context: zmq.asyncio.Context | None = None,
          name: bytes = b"n1") -> zmq.Socket[bytes]:
    sock: zmq.Socket[bytes] = zmq.Socket(context or zmq.asyncio.Context.instance(),
                                         zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, name)
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


_HELLO = Hello(node="n1", engines=[EngineInfo(name="e", model="m", kind="sim", max_inflight=4)])


async def _until(cond: Any, timeout: float = 2.0) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.005)
    return True


@contextlib.asynccontextmanager
async def _connected(address: str) -> AsyncIterator[tuple[NodeTable, zmq.Socket[bytes]]]:
    """A table reading its socket and a node that has said hello (both closed after)."""
    table, got = _table(address)
    task = asyncio.get_running_loop().create_task(table.recv_loop())
    node = _node(address)
    try:
        node.send(encode(_HELLO))
        assert await _until(lambda: got)
        yield table, node
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        node.close(0)
        table.close()


async def test_a_full_pipe_keeps_the_messages_and_sends_them_in_order() -> None:
    address = "inproc://node-socket-full"
    context = zmq.asyncio.Context()
    context.setsockopt(zmq.SNDHWM, 4)  # the sockets it makes: a node's pipe holds 8 at most
    table, got = _table(address, context)
    task = asyncio.get_running_loop().create_task(table.recv_loop())
    node = _node(address, rcvhwm=4, context=context)
    try:
        node.send(encode(_HELLO))
        assert await _until(lambda: got)
        n = 200
        for i in range(n):  # the node reads nothing meanwhile: its pipe fills
            table.send_raw(b"n1", Cancel(request_ids=[f"r{i}"]))
        await asyncio.sleep(0)  # (sent at the end of the loop iteration: _flush_outbox)
        assert len(table._unsent) > 0  # refused (zmq.Again) and kept, not dropped
        assert table.overflowed == 0
        seen: list[str] = []

        def take() -> bool:
            while node.poll(0):
                msg = decode(node.recv())
                assert isinstance(msg, Cancel)
                seen.extend(msg.request_ids)
            return len(seen) >= n

        assert await _until(take, 5.0), f"{len(seen)} of {n} arrived"
        assert seen == [f"r{i}" for i in range(n)]  # every one, in order
        assert not table._unsent
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        node.close(0)
        table.close()
        context.term()


async def test_a_node_that_does_not_read_holds_up_no_other() -> None:
    address = "inproc://node-socket-stuck"
    context = zmq.asyncio.Context()
    context.setsockopt(zmq.SNDHWM, 4)
    table, got = _table(address, context)
    task = asyncio.get_running_loop().create_task(table.recv_loop())
    stuck = _node(address, rcvhwm=4, context=context, name=b"stuck")
    other = _node(address, context=context, name=b"other")
    try:
        stuck.send(encode(_HELLO))
        other.send(encode(_HELLO))
        assert await _until(lambda: len(got) == 2)
        for i in range(50):
            table.send_raw(b"stuck", Cancel(request_ids=[f"s{i}"]))
            table.send_raw(b"other", Cancel(request_ids=[f"o{i}"]))
        await asyncio.sleep(0)  # (sent at the end of the loop iteration)
        assert list(table._unsent) == [b"stuck"]  # only the stuck node's wait
        seen = [decode(other.recv()).request_ids[0] for _ in range(50)]  # type: ignore[union-attr]
        assert seen == [f"o{i}" for i in range(50)]
        await asyncio.sleep(0.05)
        assert table._n_unsent == 50 - 8  # its pipe holds 8 (4 + 4); the rest wait, in order
        stuck.close(0)  # it goes away: what it was owed is dropped (EHOSTUNREACH), counted
        assert await _until(lambda: not table._unsent)
        assert table.unroutable == 50 - 8 and table._n_unsent == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        other.close(0)
        table.close()
        context.term()


async def test_a_message_to_a_gone_node_is_dropped_and_counted() -> None:
    table, _ = _table("inproc://node-socket-gone")
    task = asyncio.get_running_loop().create_task(table.recv_loop())
    try:
        table.send_raw(b"nobody", Cancel(request_ids=["r"]))  # no such peer: EHOSTUNREACH
        await asyncio.sleep(0)  # (sent at the end of the loop iteration)
        assert table.unroutable == 1 and not table._unsent
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        table.close()


@pytest.mark.parametrize("recheck", [True, False])
async def test_a_message_that_arrives_during_a_send_is_read(recheck: bool) -> None:
    """The node's message arrives; before the loop reads it, the scheduler sends (which takes
    the descriptor's signal); it must still be read without any further traffic. With the
    look after each send switched off (``recheck`` False) it is not: the stall this guards
    against, shown to happen."""
    address = f"inproc://node-socket-recheck-{recheck}"
    table, got = _table(address)
    if not recheck:
        table._recheck = lambda: None  # type: ignore[method-assign]
    task = asyncio.get_running_loop().create_task(table.recv_loop())
    node = _node(address)
    try:
        node.send(encode(_HELLO))
        assert await _until(lambda: got)
        await asyncio.sleep(0.05)
        got.clear()
        node.send(encode(Cancel(request_ids=["from-node"])))
        time.sleep(0.05)  # (the loop does not run: nothing is read yet)
        table.send_raw(b"n1", Cancel(request_ids=["to-node"]))
        table._outbox.flush_now()  # its iteration's end before the loop polls: takes the signal
        arrived = await _until(lambda: got, 0.5)
        assert arrived is recheck
        assert decode(node.recv()).request_ids == ["to-node"]  # type: ignore[union-attr]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        node.close(0)
        table.close()


async def test_messages_sent_in_one_loop_iteration_leave_together_in_order() -> None:
    """What :meth:`NodeTable.send_raw` is given in one loop iteration leaves at its end, back
    to back and in order (one wake-up of ZeroMQ's I/O thread instead of one per message):
    nothing has left while the iteration's work goes on, everything has after it."""
    async with _connected("inproc://node-socket-outbox") as (table, node):
        for i in range(20):
            table.send_raw(b"n1", Cancel(request_ids=[f"r{i}"]))
        assert not node.poll(0)  # still in this iteration: nothing sent yet
        await asyncio.sleep(0)
        seen = []
        while node.poll(100):
            seen.extend(decode(node.recv()).request_ids)  # type: ignore[union-attr]
            if len(seen) == 20:
                break
        assert seen == [f"r{i}" for i in range(20)]


async def test_a_lease_lost_before_the_flush_sends_nothing() -> None:
    """Fencing holds for the messages waiting for the end of the loop iteration: the lease
    was held when they were given to :meth:`NodeTable.send_raw`, lost before they leave (a
    scheduler paused in between): none is sent, each is counted as fenced."""
    async with _connected("inproc://node-socket-fenced") as (table, node):
        held = [True]
        table.fence = lambda: held[0]
        for i in range(3):
            table.send_raw(b"n1", Cancel(request_ids=[f"r{i}"]))
        held[0] = False  # lost before the iteration ends
        await asyncio.sleep(0.05)
        assert not node.poll(50)
        assert table.ctx.stats["ha_fenced_sends"] == 3


def test_a_send_outside_an_event_loop_leaves_at_once() -> None:
    """Without a running loop (a synchronous caller) nothing would flush later: the message
    is sent at once."""
    address = "inproc://node-socket-sync"
    table, _ = _table(address)
    node = _node(address)
    try:
        node.send(encode(_HELLO))
        time.sleep(0.05)
        table.send_raw(b"n1", Cancel(request_ids=["now"]))
        assert node.poll(1000)
        assert decode(node.recv()).request_ids == ["now"]  # type: ignore[union-attr]
    finally:
        node.close(0)
        table.close()

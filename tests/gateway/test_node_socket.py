"""The scheduler's node socket (:class:`hermes.gateway.nodes.NodeTable`), read and written
synchronously on the event loop's readiness callback: a message a node's full pipe cannot take
is kept and sent later, in order (it was dropped without a word), and a message that arrives
while the scheduler sends is read at once (ZeroMQ's descriptor is edge-triggered: a send can
take its signal)."""

from __future__ import annotations

import asyncio
import time
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
        table.send_raw(b"n1", Cancel(request_ids=["to-node"]))  # takes the signal
        arrived = await _until(lambda: got, 0.5)
        assert arrived is recheck
        assert decode(node.recv()).request_ids == ["to-node"]  # type: ignore[union-attr]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        node.close(0)
        table.close()

"""Waiting for a settled result without shielding it (:mod:`hermes.gateway.waiting`): the
waiting task is woken by the settler, its own cancellation or timeout never cancels the
future others read, and a second waiter of the same item is served too."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from hermes.gateway.waiting import wait_settled, wake


@dataclass
class Item:
    future: asyncio.Future[Any] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    waiter: asyncio.Future[None] | None = None

    def settle(self, value: Any) -> None:
        self.future.set_result(value)
        wake(self)


def test_the_settler_wakes_the_waiting_task() -> None:
    async def go() -> Any:
        item = Item()
        asyncio.get_running_loop().call_later(0.01, item.settle, "done")
        await wait_settled(item, 5.0)
        assert item.waiter is None
        return item.future.result()

    assert asyncio.run(go()) == "done"


def test_a_timeout_or_a_cancelled_wait_leaves_the_future_alone() -> None:
    async def go() -> None:
        item = Item()
        with pytest.raises(TimeoutError):
            await wait_settled(item, 0.01)
        assert not item.future.done() and item.waiter is None
        task = asyncio.ensure_future(wait_settled(item, 5.0))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not item.future.done() and item.waiter is None
        item.settle(1)  # settled later all the same
        await wait_settled(item, 0.0)  # done already: no wait, no timeout
        assert item.future.result() == 1

    asyncio.run(go())


def test_a_second_waiter_of_the_same_item_is_woken_too() -> None:
    async def go() -> list[Any]:
        item = Item()
        first = asyncio.ensure_future(wait_settled(item, 5.0))
        await asyncio.sleep(0)
        assert item.waiter is not None
        second = asyncio.ensure_future(wait_settled(item, 5.0))
        await asyncio.sleep(0.01)
        item.settle("x")
        return await asyncio.gather(first, second)

    assert asyncio.run(go()) == [None, None]

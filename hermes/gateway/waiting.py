"""Waiting for a result another part of the gateway settles, in one event-loop iteration.

A handler waits for a request's answer (``PendingRequest.future``, settled by the
dispatcher; an edge's ``EdgeCall.future``, settled by its link) and must not cancel that
future when its own wait ends early (a timeout, its client gone): others read it (the
dispatcher's accounting, an edge link's callbacks). ``wait_for(shield(future))`` did that at
the cost of two more loop iterations per answer (the shield's callback, then the wait's,
before the task's own). Instead the waiting task sleeps on a future of its own, ``waiter``,
which the settler wakes (:func:`wake`) right after it sets ``future``: cancelling that wait
cancels only ``waiter``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class Awaited(Protocol):
    """What a handler waits for: the ``future`` its settler sets, and the ``waiter`` the
    waiting task sleeps on meanwhile (None while nobody waits)."""

    future: asyncio.Future[Any]
    waiter: asyncio.Future[None] | None


def wake(item: Awaited) -> None:
    """The settler's part, right after it set ``item.future``: wake the waiting task."""
    w = item.waiter
    if w is not None and not w.done():
        w.set_result(None)


async def wait_settled(item: Awaited, timeout_s: float) -> None:
    """Until ``item.future`` is done (its result or exception is the caller's to read);
    TimeoutError after ``timeout_s`` unless it was done as the time ran out. The future is
    never cancelled here. A second task waiting for the same item waits through
    :func:`asyncio.wait` (a loop iteration more)."""
    fut = item.future
    if fut.done():
        return
    if item.waiter is not None:  # another task waits already: it owns the waiter
        done, _ = await asyncio.wait((fut,), timeout=timeout_s)
        if not done:
            raise TimeoutError
        return
    waiter = item.waiter = asyncio.get_running_loop().create_future()
    try:
        async with asyncio.timeout(timeout_s):
            await waiter
    except TimeoutError:
        if not fut.done():
            raise
    finally:
        item.waiter = None

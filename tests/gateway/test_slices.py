"""SlicedQueue: batches of loop work done a slice at a time (hermes.gateway.slices)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import pytest

from hermes.gateway.slices import SlicedQueue


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_without_a_loop_the_items_are_done_at_once() -> None:
    done: list[int] = []
    q: SlicedQueue[int] = SlicedQueue(done.append, name="t")
    q.extend(range(5))
    assert done == [0, 1, 2, 3, 4] and len(q) == 0 and q.done == 5


def test_a_socket_that_becomes_readable_is_served_between_slices() -> None:
    """40 items of 1 ms in slices of 3 ms: a message that arrives while the first slice runs
    is read before the batch ends (in one callback it waited ~40 ms), and every item is done,
    in order."""
    async def main() -> tuple[list[int], int, int]:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        a.setblocking(False)
        b.setblocking(False)
        done: list[int] = []
        seen_at: list[int] = []

        def item(i: int) -> None:
            if i == 0:
                b.send(b"x")  # a request arrives while the batch is being worked
            _busy(0.001)
            done.append(i)

        def readable() -> None:
            a.recv(16)
            seen_at.append(len(done))

        loop.add_reader(a.fileno(), readable)
        q: SlicedQueue[int] = SlicedQueue(item, name="t", slice_s=0.003)
        q.extend(range(40))
        while len(q) or q.done < 40:
            await asyncio.sleep(0.001)
        loop.remove_reader(a.fileno())
        a.close()
        b.close()
        return done, seen_at[0], q.slices

    done, seen_after, slices = asyncio.run(main())
    assert done == list(range(40))
    assert seen_after < 10, f"the message waited for {seen_after} items"
    assert slices >= 8


def test_a_failing_item_is_logged_and_the_others_go_on(caplog: pytest.LogCaptureFixture) -> None:
    done: list[int] = []

    def work(i: int) -> None:
        if i == 2:
            raise RuntimeError("boom")
        done.append(i)

    async def main() -> None:
        q: SlicedQueue[int] = SlicedQueue(work, name="closing things")
        q.extend(range(5))
        while len(q):
            await asyncio.sleep(0)
        await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR, logger="hermes.gateway.slices"):
        asyncio.run(main())
    assert done == [0, 1, 3, 4]
    assert "closing things: one item failed" in caplog.text


def test_drain_now_does_what_waits_and_nothing_runs_twice() -> None:
    done: list[int] = []

    async def main() -> None:
        q: SlicedQueue[int] = SlicedQueue(lambda i: (_busy(0.001), done.append(i)), name="t",
                                          slice_s=0.0005)
        q.extend(range(10))
        await asyncio.sleep(0)  # one slice: one item (each overruns the slice)
        first = len(done)
        assert 0 < first < 10
        assert q.drain_now() == 10 - first
        assert len(q) == 0
        await asyncio.sleep(0.01)  # the cancelled slice does not run again

    asyncio.run(main())
    assert done == list(range(10))


def test_a_saturated_loop_does_not_starve_the_queue() -> None:
    """Another callback holds the loop 20 ms an iteration (a scheduler at its limit reads a
    socket's whole backlog in one): 2 ms slices alone would take ~100 iterations (2.2 s)
    for 400 items of 0.5 ms; once the oldest item has waited max_wait_s a slice takes as
    long as the rest of the iteration did, so the items are done in well under a second."""
    async def main() -> float:
        loop = asyncio.get_running_loop()
        stop = False

        def hog() -> None:
            _busy(0.02)
            if not stop:
                loop.call_soon(hog)

        loop.call_soon(hog)
        q: SlicedQueue[int] = SlicedQueue(lambda i: _busy(0.0005), name="t", max_wait_s=0.1)
        t0 = time.monotonic()
        q.extend(range(400))
        while len(q):
            await asyncio.sleep(0)
        stop = True
        return time.monotonic() - t0

    took = asyncio.run(main())
    assert took < 1.0, f"the queue took {took:.2f} s behind a saturated loop"


def test_a_large_batch_behind_an_idle_loop_is_never_one_stall() -> None:
    """0.5 s of items at once (thousands of runs closed together), with a 1 ms ticker on
    the loop: the ticker is never held up
    long, also after the batch has waited past max_wait_s (the slice then takes only what
    the rest of the loop took), and every item is done."""
    async def main() -> tuple[float, int]:
        loop = asyncio.get_running_loop()
        gaps: list[float] = []
        last = [time.perf_counter()]
        stop = False

        def tick() -> None:
            now = time.perf_counter()
            gaps.append(now - last[0])
            last[0] = now
            if not stop:
                loop.call_later(0.001, tick)

        loop.call_soon(tick)
        done: list[int] = []
        q: SlicedQueue[int] = SlicedQueue(lambda i: (_busy(0.0005), done.append(i)), name="t",
                                          max_wait_s=0.1)
        q.extend(range(1000))
        while len(q):
            await asyncio.sleep(0.001)
        stop = True
        return max(gaps), len(done)

    worst, n = asyncio.run(main())
    assert n == 1000
    assert worst < 0.05, f"the loop was held {worst * 1e3:.0f} ms at once"

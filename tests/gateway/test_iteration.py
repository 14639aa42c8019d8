""":class:`hermes.gateway.iteration.EndOfIteration`: what a loop iteration adds is handed over
once, in order, at its end; ``flush_now`` hands it over at once; without a loop, each add."""

from __future__ import annotations

import asyncio

from hermes.gateway.iteration import EndOfIteration


def test_one_flush_per_iteration_in_order() -> None:
    flushed: list[list[int]] = []

    async def main() -> None:
        batch = EndOfIteration(flushed.append)
        for i in range(5):
            batch.add(i)
        assert flushed == [] and len(batch) == 5  # not during the iteration
        await asyncio.sleep(0)
        assert flushed == [[0, 1, 2, 3, 4]]
        batch.add(5)
        batch.flush_now()  # (a close)
        assert flushed == [[0, 1, 2, 3, 4], [5]]
        await asyncio.sleep(0)
        assert flushed == [[0, 1, 2, 3, 4], [5]]  # the cancelled call gives nothing more

    asyncio.run(main())


def test_without_a_loop_each_add_is_handed_over_at_once() -> None:
    flushed: list[list[str]] = []
    batch = EndOfIteration(flushed.append)
    batch.add("a")
    batch.add("b")
    assert flushed == [["a"], ["b"]]

"""The live planner's wake-ups (``GatewayPrewarmer._apply``): on the ``prewarm_tick_s`` grid,
prewarms that fall due within one tick share one event-loop wake-up, none is served before
its time, none later than a tick after it, and none is left for a prewarm that ended first."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

import hermes.gateway.prewarm as gp


class _Planner:
    """A planner stand-in: what falls due when (loop time), and when it was asked."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: list[float] = []
        self.asked: list[float] = []
        self.served: list[tuple[float, float]] = []  # (due at, served at)

    def next_due(self) -> float | None:
        return min(self.pending) if self.pending else None

    def due(self, now: float) -> list:
        self.asked.append(now)
        for at in [a for a in self.pending if a <= now]:
            self.pending.remove(at)
            self.served.append((at, now))
        return []


def _prewarmer(tick_s: float) -> tuple[gp.GatewayPrewarmer, _Planner]:
    loop = asyncio.get_running_loop()
    planner = _Planner(loop)
    ctx = SimpleNamespace(now=loop.time, clock=SimpleNamespace(wall_s=lambda s: s))
    pw = gp.GatewayPrewarmer(ctx, None, None, planner, tick_s=tick_s)  # type: ignore[arg-type]
    return pw, planner


async def test_prewarms_due_within_one_tick_share_one_wake_up() -> None:
    pw, planner = _prewarmer(tick_s=0.2)
    loop = asyncio.get_running_loop()
    cell = (int(loop.time() / 0.2) + 1) * 0.2  # a tick of the grid still ahead
    dues = [cell + o for o in (0.03, 0.05, 0.01)]  # within it, the last planned due first
    for at in dues:  # planned at three unit starts
        planner.pending.append(at)
        pw._apply([], loop.time())
        if at == dues[0]:
            first = pw._timer
    assert pw._timer is first  # the later ones fell in its tick: the same wake-up
    assert pw._timer_at == pytest.approx(cell + 0.2)  # the tick's end, after all three
    await asyncio.sleep(pw._timer_at - loop.time() + 0.05)
    assert len(planner.asked) == 1  # one wake-up served all three
    assert sorted(at for at, _ in planner.served) == sorted(dues)
    assert all(at <= served <= at + 0.2 + 0.02 for at, served in planner.served)
    assert pw._timer is None and not planner.pending


async def test_without_a_tick_each_prewarm_wakes_the_loop_at_its_own_time() -> None:
    pw, planner = _prewarmer(tick_s=0.0)
    loop = asyncio.get_running_loop()
    now = loop.time()
    planner.pending.append(now + 0.08)
    pw._apply([], loop.time())
    later = pw._timer
    planner.pending.append(now + 0.02)  # an earlier one replaces the timer
    pw._apply([], loop.time())
    assert pw._timer is not later and pw._timer_at == pytest.approx(now + 0.02)
    await asyncio.sleep(0.2)
    assert len(planner.asked) == 2  # a wake-up each
    assert all(at <= served <= at + 0.05 for at, served in planner.served)


async def test_a_prewarm_that_ends_before_its_time_takes_its_wake_up_along() -> None:
    """The run's next unit came first (its prewarm was resolved unstarted): the wake-up set
    for it moves to the next prewarm due, or goes when none is; the loop is not woken for
    nothing."""
    pw, planner = _prewarmer(tick_s=0.0)
    loop = asyncio.get_running_loop()
    now = loop.time()
    planner.pending += [now + 0.05, now + 0.15]
    pw._apply([], loop.time())
    assert pw._timer_at == pytest.approx(now + 0.05)
    planner.pending.remove(now + 0.05)  # resolved at a unit start
    pw._apply([], loop.time())
    assert pw._timer_at == pytest.approx(now + 0.15) and pw._timer_due == now + 0.15
    planner.pending.clear()  # the run ended
    pw._apply([], loop.time())
    assert pw._timer is None and pw._timer_at is None
    await asyncio.sleep(0.25)
    assert planner.asked == []  # no wake-up at all


def test_the_tick_is_a_setting_with_a_bound() -> None:
    from pydantic import ValidationError

    from hermes.gateway.config import SchedulerConfig

    assert SchedulerConfig().prewarm_tick_s == 0.005
    with pytest.raises(ValidationError, match="prewarm_tick_s"):
        SchedulerConfig(prewarm_tick_s=-1)

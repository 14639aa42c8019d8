"""The event-loop stall monitor (issue 16): it sees a blocked loop and a full collection, and
the gateway serves it on ``GET /admin/loop`` (read and reset)."""

from __future__ import annotations

import asyncio
import gc
import time

import httpx

from hermes.gateway.config import GatewayConfig
from hermes.gateway.looplag import LoopLagMonitor, gc_pauses
from hermes.gateway.server import start_background


def test_monitor_measures_a_stall_and_resets() -> None:
    async def main() -> tuple[dict, dict, dict]:
        mon = LoopLagMonitor(interval_s=0.002)
        mon.start()
        mon.start()  # idempotent
        await asyncio.sleep(0.05)
        quiet = mon.read(reset=True)
        time.sleep(0.08)  # the loop is blocked for 80 ms
        await asyncio.sleep(0.02)
        stalled = mon.read(reset=True)
        await asyncio.sleep(0.02)
        after = mon.read()
        await mon.stop()
        assert not mon.running
        return quiet, stalled, after

    quiet, stalled, after = asyncio.run(main())
    assert quiet["running"] and quiet["samples"] > 5 and quiet["max_pause_ms"] < 60
    # the monitor sees at least the stall minus one interval
    assert 75.0 <= stalled["max_pause_ms"] < 1000.0
    # time.sleep holds the loop without using CPU: the stall is not the loop's work
    assert stalled["max_pause_cpu_ms"] < 40.0 and stalled["max_busy_ms"] < 40.0
    assert after["max_pause_ms"] < 60.0 and after["since_s"] < 1.0


def test_busy_loop_is_told_from_a_waiting_one() -> None:
    """A loop that computes for 60 ms shows it as CPU of the stall and as its busiest sample."""

    async def main() -> dict:
        mon = LoopLagMonitor(interval_s=0.002)
        mon.start()
        await asyncio.sleep(0.02)
        mon.reset()
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.06:  # 60 ms of the loop's own CPU
            pass
        await asyncio.sleep(0.02)
        got = mon.read()
        await mon.stop()
        return got

    got = asyncio.run(main())
    assert got["max_busy_ms"] >= 55.0 and got["max_pause_cpu_ms"] >= 55.0
    assert got["max_pause_process_cpu_ms"] >= got["max_pause_cpu_ms"] - 1.0
    assert got["max_pause_ms"] >= 55.0


def test_gc_pauses_are_counted_per_generation() -> None:
    g = gc_pauses()
    g.reset()
    gc.collect()
    got = g.read()
    assert got["collections"][2] >= 1 and got["max_ms"][2] > 0.0
    assert got["threshold"] == list(gc.get_threshold())


def test_gateway_serves_its_loop_lag() -> None:
    srv = start_background(GatewayConfig())
    try:
        first = httpx.get(srv.url + "/admin/loop", params={"reset": "true"}).json()
        assert first["running"] and first["interval_ms"] == 5.0
        time.sleep(0.1)
        got = httpx.get(srv.url + "/admin/loop").json()
        assert got["samples"] > 0 and 0.0 <= got["max_pause_ms"] < 5000.0
        assert set(got["gc"]) >= {"collections", "max_ms", "frozen", "threshold"}
    finally:
        srv.stop()

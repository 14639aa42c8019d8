"""Event-loop stalls of the gateway process, measured from inside it (issue 16).

A :class:`LoopLagMonitor` task sleeps ``interval_s`` again and again and measures how late it
wakes up: the oversleep is how long the event loop could not run anything (a garbage
collection, a long synchronous call, a loop iteration with too much work in it). It keeps the
longest since the last reset, with the CPU time the loop's thread used meanwhile
(``max_pause_cpu_ms``: close to the pause when the loop itself was busy, e.g. collecting
garbage; far below it when the process was waiting: preempted by other processes on a busy
machine, or waiting for the GIL held by another thread) and the whole process's
(``max_pause_process_cpu_ms``: the loop's plus every other thread's, e.g. the knowledge
base's writer holding the GIL). ``max_busy_ms`` is the longest the loop's thread itself ran
within one sample (the most CPU between two wake-ups of the monitor, whatever the wall
clock): the stall the gateway's own work makes, which a busy machine can stretch but not
create. :func:`gc_pauses` adds what the cyclic garbage collector itself took
(``gc.callbacks``: every collection's duration, the longest per generation), which names the
usual culprit of a long stall.

``GET /admin/loop`` (the admin API's access rules: loopback or ``HERMES_ADMIN_TOKEN``)
answers ``{"max_pause_ms", "max_pause_cpu_ms", "max_pause_process_cpu_ms", "max_busy_ms",
"mean_lag_ms", "samples", "since_s",
"interval_ms", "gc": {...}}``;
``?reset=true`` starts a new window after reading (atomically: nothing is lost between the
read and the reset). ``hermes bench gateway`` reads it before and after each row of load
(``max_pause_ms`` of its rows).

The monitor costs one timer wake-up per ``interval_s`` (5 ms: 200 a second). An otherwise idle
process spends ~2% of a core on them (measured on a 2-core VM, uvloop: a bare ``call_later``
tick at 200 Hz costs 1.5%; 50 ms instead of 5 took an idle HA scheduler from 4.7% to 3.5%);
under load the wake-ups mostly fall in iterations the loop makes anyway, and the difference
was within the noise at 1,000 calls/s (docs/ha.md). It under-reports a stall by at most
``interval_s`` (a stall that begins while the monitor sleeps shows only from the monitor's
due time on).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request

INTERVAL_S = 0.005


class GcPauses:
    """Durations of the cyclic GC's collections (``gc.callbacks``), per generation, since the
    last reset. One per process (the collector is), installed on first use."""

    def __init__(self) -> None:
        self._t0 = 0.0
        self.reset()

    def reset(self) -> None:
        self.count = [0, 0, 0]
        self.total_s = [0.0, 0.0, 0.0]
        self.max_s = [0.0, 0.0, 0.0]
        self.collected = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        dt = time.perf_counter() - self._t0
        g = min(int(info.get("generation", 2)), 2)
        self.count[g] += 1
        self.total_s[g] += dt
        if dt > self.max_s[g]:
            self.max_s[g] = dt
        self.collected += int(info.get("collected", 0))

    def read(self) -> dict[str, Any]:
        return {"collections": list(self.count),
                "max_ms": [round(s * 1e3, 3) for s in self.max_s],
                "total_ms": [round(s * 1e3, 3) for s in self.total_s],
                "collected": self.collected, "frozen": _FROZEN[0],
                "threshold": list(gc.get_threshold())}


_GC: GcPauses | None = None
#: objects :func:`tune_gc` froze (``gc.get_freeze_count()`` walks them all: ~20 ms at
#: 100,000, itself a stall, so it is read once, there)
_FROZEN = [0]


def gc_pauses() -> GcPauses:
    """The process's :class:`GcPauses` (registered in ``gc.callbacks`` on first call)."""
    global _GC
    if _GC is None:
        _GC = GcPauses()
        gc.callbacks.append(_GC)
    return _GC


class LoopLagMonitor:
    """Longest event-loop stall since the last reset (see the module docstring)."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self.reset()

    def reset(self) -> None:
        self.max_s = 0.0
        self.max_cpu_s = 0.0  # CPU the loop's thread used over the longest stall's sleep
        self.max_proc_cpu_s = 0.0  # CPU of the whole process over it
        self.max_busy_s = 0.0  # most CPU the loop's thread used within one sample
        self.sum_s = 0.0
        self.samples = 0
        self.since = time.monotonic()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start watching the running loop (idempotent); the GC callback is installed too."""
        if self.running:
            return
        gc_pauses()
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="hermes-looplag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        interval = self.interval_s
        clock, cpu, pcpu = time.perf_counter, time.thread_time, time.process_time
        sleep = asyncio.sleep
        while True:
            t0, c0, p0 = clock(), cpu(), pcpu()
            await sleep(interval)
            lag = clock() - t0 - interval
            used = cpu() - c0
            if lag < 0.0:
                lag = 0.0
            self.samples += 1
            self.sum_s += lag
            if used > self.max_busy_s:
                self.max_busy_s = used
            if lag > self.max_s:
                self.max_s = lag
                self.max_cpu_s = used
                self.max_proc_cpu_s = pcpu() - p0

    def read(self, *, reset: bool = False) -> dict[str, Any]:
        """The window's figures; ``reset``: start a new window (the GC figures too)."""
        g = gc_pauses()
        out = {"running": self.running, "interval_ms": self.interval_s * 1e3,
               "max_pause_ms": round(self.max_s * 1e3, 3),
               "max_pause_cpu_ms": round(self.max_cpu_s * 1e3, 3),
               "max_pause_process_cpu_ms": round(self.max_proc_cpu_s * 1e3, 3),
               "max_busy_ms": round(self.max_busy_s * 1e3, 3),
               "mean_lag_ms": round(self.sum_s / self.samples * 1e3, 4) if self.samples else 0.0,
               "samples": self.samples, "since_s": round(time.monotonic() - self.since, 3),
               "gc": g.read()}
        if reset:
            self.reset()
            g.reset()
        return out


#: ``gc.set_threshold`` of a serving gateway (see :func:`tune_gc`)
GC_THRESHOLD = (25000, 10, 10)


def tune_gc() -> None:
    """Once the gateway has started (modules, app, knowledge base, recovered runs): collect,
    then ``gc.freeze()`` what survived, so that no later collection walks it again (a full
    collection of an unfrozen started gateway alone takes ~80 ms: 100,000 objects), and set
    :data:`GC_THRESHOLD`.

    Threshold 0 of 25,000 instead of 700: a request's objects are freed by reference counting
    (none of its objects is in a cycle once its run ends), so a young collection seldom finds
    garbage, and what one costs is the young objects still alive when it runs: those of the
    requests in flight, and what the learner's graph rebuilds (off the loop, same process)
    have just built. At 700 one ran every ~10 requests and the collector took ~40-75 us per
    request; at 5,000, once the gateway had learned graphs of its traffic, it took ~15-40 us
    per request at one client and ~100 us at 32 (a collection every ~70 requests there, each
    walking the 32 requests in flight and promoting them, then walked again in generation 1);
    at 25,000, measured side by side on the same warm gateway (``/admin/loop``'s ``gc``
    totals over 2,000 requests after 10,000 header-less ones, two rounds): c32 198 and 226 ms
    -> 60 and 23 ms, c1 89 and 70 ms -> 65 and 36 ms; the longest single collection grows
    (a few tens of ms when a graph rebuild's lists are young), fewer happen. Objects alive
    at startup that later become cyclic garbage are never collected (the frozen generation
    is not): the gateway builds nothing at startup that it replaces often."""
    gc.collect()
    gc.freeze()
    _FROZEN[0] = gc.get_freeze_count()
    gc.set_threshold(*GC_THRESHOLD)


def monitor(app: FastAPI) -> LoopLagMonitor:
    """The app's monitor (``app.state.looplag``), created on first use."""
    mon = getattr(app.state, "looplag", None)
    if mon is None:
        mon = app.state.looplag = LoopLagMonitor()
    return mon


def start(app: Any) -> None:
    """Start the monitor of ``app`` on the running loop (the gateway's startup, server.py)."""
    state = getattr(app, "state", None)
    if state is not None:
        monitor(app).start()


def _router() -> APIRouter:
    from hermes.gateway.api.admin_api import require_admin

    router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)], tags=["admin"])

    @router.get("/loop")
    async def loop_lag(request: Request, reset: bool = False) -> dict[str, Any]:
        """Longest event-loop stall and GC pauses since the last reset (``reset=true``:
        read, then start a new window)."""
        mon = monitor(request.app)
        mon.start()  # a gateway not started by hermes serve (tests): from its first read on
        return mon.read(reset=reset)

    return router


def install(app: FastAPI) -> None:
    """Register ``GET /admin/loop`` and the app's monitor (started by :func:`start`)."""
    monitor(app)
    app.include_router(_router())

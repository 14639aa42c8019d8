"""LoRA queue lookahead on the HermesLet: keep the adapters of each engine's next queued
requests loaded, in the order the agent will release them (issue 5).

The rule is the simulator's (:mod:`hermes.sim.warm`), from :mod:`hermes.core.prewarm`: after
a request is queued and after each release, the agent calls :meth:`LoraLookahead.update` with
the engine's queue head (``LOOKAHEAD_SCAN`` requests per free adapter slot) and the adapters
of its in-flight requests; :func:`~hermes.core.prewarm.head_adapters` picks the adapters to have
loaded (the first ``slots - running`` distinct ones, in release order), and each one that is
not loaded, not being loaded and whose path is known (``--lora-path``) is loaded in the
background by the engine's :class:`~hermeslet.prewarmers.LoraPrewarmer`. The adapters of
in-flight requests and of the head are that prewarmer's ``in_use``: no load unloads them.

A queued request's adapter is its ``model`` when that differs from the engine's base model.
Nothing here blocks the agent's loop: :meth:`update` is synchronous and only starts tasks; a
failed load is logged and counted (``lookahead.failed``), never raised, and the lookahead
does not try that adapter again for a while (1 s after the first failure, doubling up to
:data:`MAX_BACKOFF_S`; a request released with it still loads it itself). Without this, an
adapter whose path is wrong would be loaded again at every enqueue and release.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable

from hermes.core.prewarm import LOOKAHEAD_SCAN, head_adapters
from hermeslet.prewarmers import LoraPrewarmer, NodePrewarmer

log = logging.getLogger("hermeslet.lora_lookahead")

#: longest wait before the lookahead tries an adapter whose load failed again, seconds
MAX_BACKOFF_S = 60.0

#: ``head(n)``: the models of the next ``n`` queued requests, in release order
HeadFn = Callable[[int], Iterable[str]]


class LoraLookahead:
    """The queue lookahead of one node's LoRA prewarmers (``node.loras``, per base model)."""

    def __init__(self, node: NodePrewarmer, *, scan: int = LOOKAHEAD_SCAN) -> None:
        self.node = node
        self.scan = scan
        self._pending: set[tuple[str, str]] = set()  # (base model, adapter) being loaded
        self._tasks: set[asyncio.Task[None]] = set()
        self._no_path: set[tuple[str, str]] = set()
        #: (base model, adapter) whose last load failed -> (not before, current backoff s)
        self._backoff: dict[tuple[str, str], tuple[float, float]] = {}

    def update(self, engine: str, base: str | None, head: HeadFn,
               inflight: Collection[str]) -> list[str]:
        """Recompute the head of ``engine`` (serving ``base``; ``inflight``: the adapters of
        its in-flight requests) and start the loads it needs; returns the adapters whose load
        was started now. Call it from the event loop."""
        pw = self.node.loras.get(base or "")
        if pw is None:
            return []
        try:
            return self._update(pw, engine, base or "", head, inflight)
        except Exception:  # a bug here must not take the agent's loop down
            log.exception("LoRA lookahead for engine %s failed", engine)
            return []

    def _update(self, pw: LoraPrewarmer, engine: str, base: str, head: HeadFn,
                inflight: Collection[str]) -> list[str]:
        want = head_adapters(lambda n: (m if m != base else None for m in head(n)), inflight,
                             pw.max_loras, scan=self.scan)
        self.node.set_in_use(engine, base, inflight, want)
        started: list[str] = []
        now = time.monotonic()
        for a in want:
            if a in pw.loaded or (base, a) in self._pending:
                continue
            retry = self._backoff.get((base, a))
            if retry is not None and now < retry[0]:
                continue
            if not pw.paths.get(a):
                if (base, a) not in self._no_path:
                    self._no_path.add((base, a))
                    pw.lookahead.no_path += 1
                    log.info("LoRA lookahead: no path known for adapter %r (--lora-path)", a)
                continue
            self._pending.add((base, a))
            task = asyncio.get_running_loop().create_task(self._load(pw, base, a),
                                                          name=f"lora-lookahead-{a}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            started.append(a)
        return started

    async def _load(self, pw: LoraPrewarmer, base: str, adapter: str) -> None:
        try:
            await pw.load(adapter, lookahead=True)
            self._backoff.pop((base, adapter), None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            pw.lookahead.failed += 1
            prev = self._backoff.get((base, adapter))
            delay = 1.0 if prev is None else min(MAX_BACKOFF_S, 2.0 * prev[1])
            self._backoff[(base, adapter)] = (time.monotonic() + delay, delay)
            log.warning("LoRA lookahead: loading %r failed (not tried again for %.0f s): %s: %s",
                        adapter, delay, type(exc).__name__, exc)
        finally:
            self._pending.discard((base, adapter))

    async def idle(self) -> None:
        """Wait until the loads started so far have ended (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

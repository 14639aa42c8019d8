"""Request orderings inside one sharing group (smaller key runs first), with a registry.

- ``fcfs``: arrival order (vLLM, AlpaServe-style, MuxServe within a service).
- ``db``: SeaLLM's doubling budget (:mod:`.budget`) with the starvation threshold: a request
  whose wait (time since arrival minus its execution time) reaches ``starvation_factor × L̂_s``
  goes first, the longest-waiting first. The paper gives no value; 10 is ours.
- ``mlfq``: FastServe-style multi-level feedback queue, not service-aware: level
  ``⌊log2(executed/q0 + 1)⌋`` with ``q0 = 0.05 s`` (ours), then arrival order.
- ``rr``: MuxServe-style: the simulator rotates between the group's services, FCFS within
  (this ordering's key is FCFS; ``rotate`` tells the simulator). With ``quotas`` (MuxServe's
  fixed compute shares, set from the rates seen at placement) the next turn goes to the
  service with work that has used the least of its quota (``turns / quota``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from hermes.core.multillm.budget import DoublingBudget


@dataclass(frozen=True)
class Ordering:
    """Base: FCFS. ``key(service, arrival_s, executed_s, now_s)`` orders requests."""

    name: str = "fcfs"
    rotate: bool = False
    quotas: Mapping[str, float] | None = None

    def next_turn(self, have: list[str], turns: Mapping[str, int]) -> str:
        """The service (of ``have``, those with work) whose turn it is (rotating orderings)."""
        if not have:
            raise ValueError("next_turn needs at least one service with work")
        q = self.quotas or {}
        return min(have, key=lambda s: (turns.get(s, 0) / max(q.get(s, 1.0), 1e-9), s))

    def key(self, service: str, arrival_s: float, executed_s: float, now_s: float) -> tuple[float, float]:
        return (0.0, arrival_s)


@dataclass(frozen=True)
class DBOrdering(Ordering):
    """SeaLLM's DB priority per service plus the starvation threshold."""

    name: str = "db"
    budgets: Mapping[str, DoublingBudget] = field(default_factory=dict)
    starvation_factor: float | None = 10.0

    def key(self, service: str, arrival_s: float, executed_s: float, now_s: float) -> tuple[float, float]:
        b = self.budgets[service]
        if self.starvation_factor is not None:
            wait = now_s - arrival_s - executed_s
            if wait >= self.starvation_factor * b.mean_s:
                return (0.0, -wait)
        return (1.0, b.priority(executed_s))


@dataclass(frozen=True)
class MLFQOrdering(Ordering):
    name: str = "mlfq"
    q0_s: float = 0.05

    def key(self, service: str, arrival_s: float, executed_s: float, now_s: float) -> tuple[float, float]:
        return (float(math.floor(math.log2(executed_s / self.q0_s + 1.0))), arrival_s)


def make_ordering(name: str, budgets: Mapping[str, DoublingBudget] | None = None, *,
                  starvation_factor: float | None = 10.0) -> Ordering:
    """The ordering called ``name`` (``fcfs`` | ``db`` | ``mlfq`` | ``rr``)."""
    if name == "fcfs":
        return Ordering()
    if name == "rr":
        return Ordering(name="rr", rotate=True)
    if name == "mlfq":
        return MLFQOrdering()
    if name == "db":
        if budgets is None:
            raise ValueError("the db ordering needs per-service budgets")
        return DBOrdering(budgets=dict(budgets), starvation_factor=starvation_factor)
    raise ValueError(f"unknown ordering {name!r}; known: fcfs, db, mlfq, rr")

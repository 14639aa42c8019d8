"""SamuLLM's running-phase rule: adjust the stages when models finish in another order.

The plan's stages end when their first model finishes; at run time another model may finish
first (the cost model errs). Paper section 4.3, "Dynamic scheduler": when a model finishes
during stage ``i``, move to stage ``i+1`` without searching again. For each unfinished running
model ``M`` with plan ``P``:

1. if stage ``i`` is the last stage ``M`` appears in, ``M`` keeps running until it finishes;
2. else if ``(M, P)`` is in stage ``i+1``, ``M`` keeps running (that pair of the next stage is
   already in place);
3. else the pairs of stage ``i+1`` are placed first, and ``(M, P)`` keeps running only if GPUs
   are left over; otherwise it is stopped.

Pairs of stage ``i+1`` that do not fit yet wait (:attr:`Adjustment.waiting`); a later stage's
pairs are only considered once every pair of the stage before is placed or finished.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hermes.core.cluster.cost import Plan


@dataclass(frozen=True, slots=True)
class Adjustment:
    keep: tuple[tuple[str, Plan], ...]  # running pairs that go on
    start: tuple[tuple[str, Plan], ...]  # pairs of the next stage to start now
    stop: tuple[str, ...]  # running models to stop (their unfinished requests return later)
    waiting: tuple[tuple[str, Plan], ...]  # next-stage pairs that wait for GPUs
    stage: int  # the stage now in force


def on_finish(stages: Sequence[Mapping[str, Plan]], current: int, running: Mapping[str, Plan],
              finished: set[str], n_gpus: int) -> Adjustment:
    """What to do when a model of stage ``current`` finished (rules in the module doc).
    ``running``: the models still running and their plans; ``finished``: every finished model."""
    nxt = current + 1
    if nxt >= len(stages):
        return Adjustment(tuple(running.items()), (), (), (), current)
    later = stages[nxt]

    def appears_after(m: str) -> bool:
        return any(m in s for s in stages[nxt:])

    keep: list[tuple[str, Plan]] = []
    maybe: list[tuple[str, Plan]] = []
    for m, p in running.items():
        if not appears_after(m) or later.get(m) == p:
            keep.append((m, p))
        else:
            maybe.append((m, p))
    free = n_gpus - sum(p.n_gpus for _, p in keep)
    kept = {m for m, _ in keep}
    start: list[tuple[str, Plan]] = []
    waiting: list[tuple[str, Plan]] = []
    for m, p in later.items():
        if m in finished or m in kept:
            continue
        if p.n_gpus <= free:
            start.append((m, p))
            free -= p.n_gpus
        else:
            waiting.append((m, p))
    stop: list[str] = []
    for m, p in maybe:
        if p.n_gpus <= free and m not in {s for s, _ in start}:
            keep.append((m, p))
            free -= p.n_gpus
        else:
            stop.append(m)
    return Adjustment(tuple(keep), tuple(start), tuple(stop), tuple(waiting), nxt)

"""Fan-outs: a program's burst of independent prompts, found by when they arrive.

Map steps, scoring fan-outs and parallel tool-less calls share no conversation and carry no
id, so continuation cannot group them, and each would be a one-request run ranked as a tiny
job of its own, ahead of longer runs, though the program waits for all of them. What does
show is that they arrive together (the later stages, which work on the burst's outputs, join
by dataflow: :mod:`~hermes.gateway.resolve.dataflow`). A first-turn request of a program of
independent prompts (:meth:`~.runend.GapBook.fans_out`: an app that has never shown a
conversation continuation, and has shown a dataflow one or only one-request runs) that
arrives within ``window_s`` of the previous request of that app's open fan-out, with the same
weak id (or none), joins that run; a fan-out takes at most ``max_requests`` requests over
``max_age_s`` from its first.

The price, stated in ``[identity]``'s docs: different users' requests to one such app that
arrive this closely together (a busy endpoint, no ``user`` sent) are grouped too, and ranked
as one job. Pure: the caller passes ``now`` and says which runs are still open.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Burst:
    run: str
    first: float
    last: float
    requests: int


class FanoutBook:
    """The open fan-out of each (program app, weak id) (bounded: ``max_apps`` of them,
    oldest out)."""

    def __init__(self, *, window_s: float, max_age_s: float, max_requests: int,
                 max_apps: int) -> None:
        self.window_s = window_s
        self.max_age_s = max_age_s
        self.max_requests = max_requests
        self.max_apps = max_apps
        self._bursts: OrderedDict[tuple[str, bytes | None], _Burst] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.window_s > 0

    def __len__(self) -> int:
        return len(self._bursts)

    def join(self, app_id: str, affinity: bytes | None, now: float,
             is_open: Callable[[str], bool]) -> str | None:
        """The run key this first turn of ``app_id`` joins, or ``None`` (module doc)."""
        b = self._bursts.get((app_id, affinity))
        if (b is None or not is_open(b.run) or now - b.last > self.window_s
                or now - b.first > self.max_age_s or b.requests >= self.max_requests):
            return None
        b.last = now
        b.requests += 1
        return b.run

    def start(self, app_id: str, run: str, affinity: bytes | None, now: float) -> None:
        """A new run of program app ``app_id`` opens a fan-out (replacing the last of the
        app and weak id)."""
        bursts = self._bursts
        key = (app_id, affinity)
        bursts.pop(key, None)
        bursts[key] = _Burst(run, now, now, 1)
        if len(bursts) > self.max_apps:
            bursts.popitem(last=False)

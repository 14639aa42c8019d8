"""When an inferred run is over: its idle time exceeds what its app's gaps make unlikely.

An agent loop ends at a reply with no tool calls only if no continuation follows, and plain
traffic never says "finished". What it does show is the *gap* of each app: the time between
Hermes answering a request of a run and the run's next request (tool execution, the client's
own work, a person reading). A run idle much longer than its app's gaps is over
(issue 17, item 2):

    idle_close_s(gaps) = clamp(p99(gaps) x margin, min_s, max_s)

With fewer than ``min_gaps`` gaps the figure is shrunk towards a prior: weight
``n / min_gaps`` on the data, the rest on ``prior_s`` (a new app starts patient and
learns), but never below ``margin`` x the longest gap seen so far: one tool call longer than
the prior, once seen, must not split the app's next runs while it learns. An app that has
never shown a *conversation* continuation after ``one_shot_runs`` closed runs is one-shot
traffic (independent prompts): while it has no gap either, its runs close ``min_s`` after
their answer, so that plain request/response traffic does not hold thousands of runs open for
the prior. Gaps before a dataflow continuation (:mod:`~hermes.gateway.resolve.dataflow`: the
next stage of a program of independent prompts) count towards the idle-close figure but do
not make an app conversational.
Pure: the caller passes the gaps; :class:`GapBook` keeps them per app.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any


def p99(values: Sequence[float], *, ordered: bool = False) -> float:
    """The 99th percentile by nearest rank (0.0 for no values); ``ordered``: ``values`` is
    sorted already."""
    if not values:
        return 0.0
    s = values if ordered else sorted(values)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


def idle_close_s(gaps: Sequence[float], *, margin: float = 2.0, min_s: float = 5.0,
                 max_s: float = 600.0, prior_s: float = 60.0, min_gaps: int = 20,
                 ordered: bool = False) -> float:
    """Idle seconds after which an inferred run of an app with these ``gaps`` is closed
    (``ordered``: ``gaps`` is sorted already)."""
    n = len(gaps)
    learned = p99(gaps, ordered=ordered) * margin
    if n < min_gaps:
        w = n / min_gaps
        top = (gaps[-1] if gaps else 0.0) if ordered else max(gaps, default=0.0)
        learned = max(w * learned + (1.0 - w) * prior_s, top * margin)
    return min(max(learned, min_s), max(min_s, max_s))


class GapBook:
    """Per app: the newest ``samples`` gaps and the idle-close figure they give (cached)."""

    def __init__(self, *, samples: int = 1000, max_apps: int = 10_000, margin: float = 2.0,
                 min_s: float = 5.0, max_s: float = 600.0, prior_s: float = 60.0,
                 min_gaps: int = 20, one_shot_runs: int = 20) -> None:
        self.samples = samples
        self.one_shot_runs = one_shot_runs
        self.min_s = min_s
        #: app -> closed runs of it without a conversation continuation, while it has shown
        #: none (bounded)
        self._unconversed: OrderedDict[str, int] = OrderedDict()
        #: apps that have shown a conversation continuation (bounded, least recent out)
        self._conv: OrderedDict[str, None] = OrderedDict()
        self.max_apps = max_apps
        self._kw: dict[str, Any] = {"margin": margin, "min_s": min_s, "max_s": max_s,
                                    "prior_s": prior_s, "min_gaps": min_gaps}
        self._gaps: OrderedDict[str, deque[float]] = OrderedDict()
        #: the same gaps per app, sorted (kept in step by :meth:`add`): every new gap
        #: changes the app's figure, and sorting its window (up to ``samples``) again at the
        #: next sweep was a cost per request of header-less traffic
        self._sorted: dict[str, list[float]] = {}
        self._close: dict[str, float] = {}  # only for apps in self._gaps
        self._prior = idle_close_s((), **self._kw)

    def __len__(self) -> int:
        return len(self._gaps)

    def add(self, app: str, gap: float, *, conversation: bool = True) -> None:
        """One observed gap of ``app`` (seconds); ``conversation``: before a conversation's
        next turn (else a dataflow continuation: the app stays one-shot traffic)."""
        g = self._gaps.get(app)
        if g is None:
            g = self._gaps[app] = deque(maxlen=self.samples)
            ordered = self._sorted[app] = []
            if len(self._gaps) > self.max_apps:
                old, _ = self._gaps.popitem(last=False)
                self._close.pop(old, None)
                self._sorted.pop(old, None)
        else:
            self._gaps.move_to_end(app)
            ordered = self._sorted[app]
        value = max(0.0, gap)
        if len(g) == g.maxlen:  # the oldest leaves the window
            del ordered[bisect_left(ordered, g[0])]
        g.append(value)
        insort(ordered, value)
        self._close.pop(app, None)
        if conversation:
            self._mark_conversational(app)

    def _mark_conversational(self, app: str) -> None:
        self._unconversed.pop(app, None)
        conv = self._conv
        conv[app] = None
        conv.move_to_end(app)
        if len(conv) > self.max_apps:
            conv.popitem(last=False)

    def closed(self, app: str, continued: bool) -> None:
        """A run of ``app`` was closed; ``continued``: some request of it came after an answer
        of it (a conversation's next turn), not only with its first (one-shot detection: a
        fan-out of prompts sent at once, or a program's stages joined by dataflow, is still
        one-shot traffic)."""
        if continued or app in self._conv:
            return
        counts = self._unconversed
        counts[app] = counts.get(app, 0) + 1
        counts.move_to_end(app)
        if len(counts) > self.max_apps:
            counts.popitem(last=False)

    def one_shot(self, app: str) -> bool:
        """``app`` has closed ``one_shot_runs`` runs and never shown a conversation
        continuation (dataflow continuations allowed)."""
        return self._unconversed.get(app, 0) >= self.one_shot_runs

    def conversational(self, app: str) -> bool:
        """Some run of ``app`` has shown a conversation continuation."""
        return app in self._conv

    def fans_out(self, app: str) -> bool:
        """``app`` is a program of independent prompts, whose first turns may come as a burst
        (:mod:`~hermes.gateway.resolve.fanout`): no conversation continuation seen, and either
        a dataflow continuation (a gap that was not a conversation's) or one-shot runs. A new
        app is neither: co-arriving first turns of a chat app stay separate runs."""
        return app not in self._conv and (app in self._gaps or self.one_shot(app))

    def snapshot(self) -> dict[str, Any]:
        """The gaps, one-shot counts and conversational apps, JSON-serialisable
        (:meth:`restore`)."""
        return {"gaps": {a: list(g) for a, g in self._gaps.items()},
                "single": dict(self._unconversed), "conv": list(self._conv)}

    def restore(self, data: dict[str, Any]) -> None:
        """Put back a :meth:`snapshot` (entries already present are kept; a snapshot from
        before dataflow, without ``conv``, had gaps only of conversations)."""
        gaps_of = data.get("gaps") or {}
        for app, gaps in gaps_of.items():
            if app not in self._gaps:
                for g in gaps[-self.samples:]:
                    self.add(app, float(g), conversation=False)
        conv = data.get("conv")
        for app in (gaps_of if conv is None else conv):
            self._mark_conversational(str(app))
        for app, n in (data.get("single") or {}).items():
            if app not in self._conv:
                self._unconversed[app] = max(self._unconversed.get(app, 0), int(n))

    def gaps(self, app: str) -> list[float]:
        return list(self._gaps.get(app, ()))

    def close_after(self, app: str) -> float:
        """:func:`idle_close_s` of the app's gaps (recomputed only after new gaps; the prior,
        uncached, for an app with none: only apps with gaps take memory)."""
        v = self._close.get(app)
        if v is None:
            gaps = self._gaps.get(app)
            if gaps is None:
                return self.min_s if self.one_shot(app) else self._prior
            v = self._close[app] = idle_close_s(self._sorted[app], ordered=True, **self._kw)
        return v

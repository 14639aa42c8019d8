"""Which finished runs of a busy app are learned from: about ``runs_per_s`` a second per app.

Learning a run costs its record (a pydantic ``RunRecord``, a line in the records log and in the
knowledge base's) and a :meth:`~hermes.core.profiler.Profiler.add`. An app's graph reads only
the last 1,000 runs of its profiler's sample lists, and a version is rebuilt up to
``stores.learn_max_new_runs`` runs apart, so most runs of an app ending hundreds a second were
overwritten before any graph read them; learning each cost the HA scheduler ~15% of its CPU at
625 runs a second (docs/ha.md). A uniform random sample keeps the proportions the graph's
counts estimate (its branch probabilities, its entry unit).

Pure: the caller passes the clock reading and how many runs of the app it has learned; the
draws come from the sampler's own seeded generator (which runs are kept is not a secret).
"""

from __future__ import annotations

import random

#: seconds over which an app's run-end rate is measured
RATE_WINDOW_S = 1.0


class _EndRate:
    """One app's run ends since ``since``, and the share of its runs kept now."""

    __slots__ = ("since", "ends", "keep")

    def __init__(self, since: float) -> None:
        self.since = since
        self.ends = 0
        self.keep = 1.0


class RunSampler:
    """Keeps every run of an app until ``sample_after`` of them were learned; after that each
    with probability ``runs_per_s`` / the app's run-end rate over the last window of at least
    :data:`RATE_WINDOW_S` (every run in its first window). ``runs_per_s`` 0: every run."""

    def __init__(self, runs_per_s: float, sample_after: int, seed: int = 0) -> None:
        self.runs_per_s = runs_per_s
        self.sample_after = sample_after
        self._rates: dict[str, _EndRate] = {}
        self._rng = random.Random(seed)

    def keep(self, app: str, learned: int, now: float) -> bool:
        """Whether the run of ``app`` that ends at ``now`` is learned from (``learned``: runs
        of the app learned so far)."""
        if not self.runs_per_s or learned < self.sample_after:
            return True
        w = self._rates.get(app)
        if w is None:
            w = self._rates[app] = _EndRate(now)
        w.ends += 1
        elapsed = now - w.since
        if elapsed >= RATE_WINDOW_S:
            w.keep = min(1.0, self.runs_per_s * elapsed / w.ends)
            w.since, w.ends = now, 0
        return w.keep >= 1.0 or self._rng.random() < w.keep

    def forget(self, app: str) -> None:
        """Drop ``app``'s window (the caller forgot the app: it is bounded by the caller's)."""
        self._rates.pop(app, None)

    def __len__(self) -> int:
        """Apps with a window."""
        return len(self._rates)

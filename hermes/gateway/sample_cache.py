"""Memoized demand samples for the live scheduler.

The estimator-driven policies draw Monte Carlo samples of a run's remaining demand at every
refresh point (``DemandEstimator.sample(progress, n)``), which costs milliseconds to hundreds
of milliseconds of CPU per call on the gateway's event loop. Many calls ask about the *same*
state: every new run of an app arrives in the empty state and starts its first unit with no
service attained, and a one-request run (no headers) of a known app repeats the same few
states. :class:`CachingEstimatorPool` wraps the :class:`~hermes.core.estimator.EstimatorPool`
the policy is given and returns, for a state it has already sampled with the same estimator,
the same samples: an identically distributed estimate, without the work.

The cache key is exactly what the estimator reads from ``progress``: each finished
observation's unit and the features the estimator conditions on (tokens and parallelism of LLM
units, parallelism and duration of tool units), the current unit and its attained service. A
new estimator for an app (the PDGraph was relearned) starts with an empty cache. Samples are
shared between callers, so they are treated as read-only (the policies only reduce them).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class CachingEstimator:
    """A :class:`~hermes.core.estimator.DemandEstimator` whose ``sample`` is memoized."""

    def __init__(self, inner: Any, max_entries: int = 4096) -> None:
        self.inner = inner
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple, Any] = OrderedDict()
        self.hits = 0
        self.misses = 0
        units = getattr(inner, "_units", None)
        idx = getattr(inner, "_idx", None)
        self._llm: dict[str, bool] = {}
        if units is not None and idx is not None:
            self._llm = {name: bool(getattr(units[i], "llm", True)) for name, i in idx.items()}

    def _key(self, progress: Any, n: int | None) -> tuple:
        if progress is None:
            return (None, n)
        obs = []
        for o in progress.finished:
            if self._llm.get(o.unit, False):
                obs.append((o.unit, o.input_tokens, o.output_tokens, o.parallelism))
            else:  # tool units (and units the graph does not know): duration counts too
                obs.append((o.unit, o.input_tokens, o.output_tokens, o.parallelism, o.duration_s))
        return (tuple(obs), progress.current, progress.current_attained_s, n)

    def sample(self, progress: Any = None, n: int | None = None) -> Any:
        key = self._key(progress, n)
        got = self._cache.get(key)
        if got is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return got
        self.misses += 1
        got = self.inner.sample(progress, n)
        self._cache[key] = got
        if len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return got

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CachingEstimatorPool:
    """An ``EstimatorPool`` look-alike whose estimators memoize their samples."""

    def __init__(self, pool: Any, max_entries: int = 4096) -> None:
        self.pool = pool
        self.max_entries = max_entries
        self._wrapped: dict[str, CachingEstimator] = {}

    def get(self, app: str) -> CachingEstimator | None:
        est = self.pool.get(app)
        if est is None:
            return None
        w = self._wrapped.get(app)
        if w is None or w.inner is not est:  # first use, or the graph was relearned
            w = self._wrapped[app] = CachingEstimator(est, self.max_entries)
        return w

    def stats(self) -> dict[str, int]:
        return {"sample_cache_hits": sum(w.hits for w in self._wrapped.values()),
                "sample_cache_misses": sum(w.misses for w in self._wrapped.values())}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)

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

Because they are read-only, what is derived from shared samples is the same for every run
that holds them, and is memoized too (:class:`SharedSamples`): the walks conditioned on the
unit that started (``given_next``) or on service attained since (``given_attained``), and the
rank of a policy whose rank is a function of the samples alone (``rank_memo``, read by
:meth:`~hermes.core.policies.estimated.EstimatedPolicy.rank`). A one-request run (an OpenAI
request without headers) then ranks from memos: arrival, unit start and its per-bucket rank
table, unit finish.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from hermes.core.estimator import DemandSamples

_FIELDS = DemandSamples.__slots__  # type: ignore[attr-defined]


class SharedSamples(DemandSamples):
    """Demand samples shared by the runs in one state: derived samples and ranks memoized.

    Derived samples live in the owning :class:`CachingEstimator`'s bounded LRU (keyed by this
    object's key and the condition), so memory stays bounded however many distinct
    conditions are asked; ``rank_memo`` holds floats only (policy name -> rank)."""

    # no __slots__: instances carry these attributes in a __dict__
    key: tuple
    owner: CachingEstimator
    rank_memo: dict[str, float]

    @classmethod
    def of(cls, samples: DemandSamples, key: tuple, owner: CachingEstimator) -> SharedSamples:
        out = cls(**{f: getattr(samples, f) for f in _FIELDS})
        out.key, out.owner, out.rank_memo = key, owner, {}
        return out

    def _derived(self, op: str, arg: Any, min_keep: int) -> SharedSamples | None:
        key = (self.key, op, arg, min_keep)
        memo = self.owner._derived
        try:
            got = memo[key]
        except KeyError:
            base = DemandSamples.given_next if op == "next" else DemandSamples.given_attained
            raw = base(self, arg, min_keep=min_keep)
            got = None if raw is None else SharedSamples.of(raw, key, self.owner)
            memo[key] = got
            if len(memo) > self.owner.max_entries:
                memo.popitem(last=False)
            return got
        memo.move_to_end(key)
        return got

    def given_attained(self, more_s: float, *, min_keep: int = 1) -> DemandSamples | None:
        if more_s <= 0 or self.current_s is None or self.head_s is None:
            return DemandSamples.given_attained(self, more_s, min_keep=min_keep)
        return self._derived("attained", float(more_s), min_keep)

    def given_next(self, unit: str, *, min_keep: int = 1) -> DemandSamples | None:
        if self.current_s is not None or self.head_unit is None:
            return None
        return self._derived("next", unit, min_keep)


class CachingEstimator:
    """A :class:`~hermes.core.estimator.DemandEstimator` whose ``sample`` is memoized."""

    def __init__(self, inner: Any, max_entries: int = 4096) -> None:
        self.inner = inner
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple, Any] = OrderedDict()
        #: samples derived from shared ones (SharedSamples._derived), same bound
        self._derived: OrderedDict[tuple, SharedSamples | None] = OrderedDict()
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
        if type(got) is DemandSamples:
            got = SharedSamples.of(got, key, self)
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

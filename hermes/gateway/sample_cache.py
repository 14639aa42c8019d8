"""Memoized demand samples for the live scheduler.

The estimator-driven policies draw Monte Carlo samples of a run's remaining demand at every
refresh point (``DemandEstimator.sample(progress, n)``), which costs milliseconds to hundreds
of milliseconds of CPU per call on the gateway's event loop. Many calls ask about the *same*
state: every new run of an app arrives in the empty state and starts its first unit with no
service attained, and a one-request run (no headers) of a known app repeats the same few
states. :class:`CachingEstimatorPool` wraps the :class:`~hermes.core.estimator.EstimatorPool`
the policy is given and returns, for a state it has already sampled with the same estimator,
the same samples: an identically distributed estimate, without the work.

The cache key is the estimator's own :meth:`~hermes.core.estimator.DemandEstimator.
condition_key`: what its draw reads of the state (each finished unit's visit count and the
quantile bucket of each feature a branch or edge table conditions on, the last finished unit,
the running unit and its attained service), so two runs in states the estimator cannot tell
apart share walks whatever their exact token counts (an estimator without it: each finished
observation's unit and features, exactly). After a day of traffic an app's runs then visit a
few dozen keys, drawn once per PDGraph version: ranking is a lookup. A new estimator for an
app (the PDGraph was relearned) starts with the states its predecessor saw most recently
drawn ahead (:meth:`CachingEstimatorPool.prepare`, in the learner's worker thread, off the
event loop), so the request path does not pay for the new version. Samples are shared
between callers, so they are treated as read-only (the policies only reduce them).

Memory: each estimator keeps at most ``max_entries`` samples and as many derived ones, and
all apps together at most ``max_bytes`` (the least recently used app's oldest entries go
first): the memo levels off however many apps, states and versions go by.

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

import numpy as np

from hermes.core.estimator import DemandSamples
from hermes.core.state import RunProgress

_FIELDS = DemandSamples.__slots__  # type: ignore[attr-defined]
#: states remembered per estimator to draw ahead for its successor (a relearned graph): an
#: app's runs keep to a few hot states, and each costs a draw in the worker per version
HOT_STATES = 16
#: all apps' memoized samples together, bytes (1000 walks: ~80 KB a state)
DEFAULT_MAX_BYTES = 128 << 20


def _nbytes(samples: Any) -> int:
    """Bytes held by a samples object's arrays, or by an array (0 for anything else)."""
    if isinstance(samples, np.ndarray):
        return int(samples.nbytes)
    if not isinstance(samples, DemandSamples):
        return 0
    return sum(a.nbytes for a in (getattr(samples, f) for f in _FIELDS) if a is not None)


class _Budget:
    """The byte budget the estimators of one pool share, and who was used last."""

    __slots__ = ("max_bytes", "used", "lru")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        #: the estimators holding bytes, least recently used first
        self.lru: OrderedDict[int, CachingEstimator] = OrderedDict()

    def touch(self, est: CachingEstimator) -> None:
        self.lru[id(est)] = est
        self.lru.move_to_end(id(est))

    def enforce(self) -> None:
        """Evict the least recently used estimators' oldest entries until within budget."""
        while self.used > self.max_bytes and self.lru:
            est = next(iter(self.lru.values()))
            if not est.evict_one():
                del self.lru[id(est)]


class SharedSamples(DemandSamples):
    """Demand samples shared by the runs in one state: derived samples and ranks memoized.

    Derived samples live in the owning :class:`CachingEstimator`'s bounded LRU (keyed by this
    object's key and the condition), so memory stays bounded however many distinct
    conditions are asked; ``rank_memo`` holds floats only: policy name -> rank, and (policy
    name, boundary offsets) -> the ranks of a unit's per-bucket table."""

    # no __slots__: instances carry these attributes in a __dict__
    key: tuple
    owner: CachingEstimator
    rank_memo: dict[Any, Any]

    @classmethod
    def of(cls, samples: DemandSamples, key: tuple, owner: CachingEstimator) -> SharedSamples:
        out = cls(**{f: getattr(samples, f) for f in _FIELDS})
        out.key, out.owner, out.rank_memo = key, owner, {}
        return out

    def _derived(self, op: str, arg: Any, min_keep: int) -> SharedSamples | None:
        # attained service is keyed to the nanosecond: a boundary offset by a run's earlier
        # service ((a + b) - a) is the same condition, not a new one
        key = (self.key, op, round(arg, 9) if op == "attained" else arg, min_keep)
        owner = self.owner
        memo = owner._derived
        try:
            got = memo[key]
        except KeyError:
            base = DemandSamples.given_next if op == "next" else DemandSamples.given_attained
            raw = base(self, arg, min_keep=min_keep)
            got = None if raw is None else SharedSamples.of(raw, key, owner)
            owner._put(memo, key, got)
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

    def sorted_current(self) -> np.ndarray | None:
        """``current_s`` sorted (the prewarm planner reads quantiles of it at every unit
        start), kept with the derived samples: the same LRU and byte budget."""
        if self.current_s is None:
            return None
        key = (self.key, "sorted", None, 0)
        memo = self.owner._derived
        try:
            got = memo[key]
        except KeyError:
            got = np.sort(self.current_s)
            self.owner._put(memo, key, got)
            return got
        memo.move_to_end(key)
        return got


class CachingEstimator:
    """A :class:`~hermes.core.estimator.DemandEstimator` whose ``sample`` is memoized."""

    def __init__(self, inner: Any, max_entries: int = 4096, budget: _Budget | None = None) -> None:
        self.inner = inner
        self.max_entries = max_entries
        self.budget = budget if budget is not None else _Budget(DEFAULT_MAX_BYTES)
        self._cache: OrderedDict[tuple, Any] = OrderedDict()
        #: samples derived from shared ones (SharedSamples._derived), same bound
        self._derived: OrderedDict[tuple, SharedSamples | np.ndarray | None] = OrderedDict()
        #: key -> a state that had it, most recently sampled last (:meth:`hot_states`)
        self._states: OrderedDict[tuple, Any] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._exact = not callable(getattr(inner, "condition_key", None))
        units = getattr(inner, "_units", None)
        idx = getattr(inner, "_idx", None)
        self._llm: dict[str, bool] = {}
        if units is not None and idx is not None:
            self._llm = {name: bool(getattr(units[i], "llm", True)) for name, i in idx.items()}

    def _key(self, progress: Any, n: int | None) -> tuple:
        if not self._exact:
            return self.inner.condition_key(progress, n)  # type: ignore[no-any-return]
        if progress is None:
            return (None, n)
        obs = []
        for o in progress.finished:
            if self._llm.get(o.unit, False):
                obs.append((o.unit, o.input_tokens, o.output_tokens, o.parallelism))
            else:  # tool units (and units the graph does not know): duration counts too
                obs.append((o.unit, o.input_tokens, o.output_tokens, o.parallelism, o.duration_s))
        return (tuple(obs), progress.current, progress.current_attained_s, n)

    def _put(self, table: OrderedDict, key: tuple, value: Any) -> None:
        """Insert into one of the memos, within the entry bound and the pool's byte budget."""
        old = table.pop(key, None)
        self.bytes -= _nbytes(old)
        self.budget.used -= _nbytes(old)
        table[key] = value
        size = _nbytes(value)
        self.bytes += size
        self.budget.used += size
        if len(table) > self.max_entries:
            self._pop_oldest(table)
        self.budget.touch(self)
        self.budget.enforce()

    def _pop_oldest(self, table: OrderedDict) -> None:
        key, value = table.popitem(last=False)
        size = _nbytes(value)
        self.bytes -= size
        self.budget.used -= size
        if table is self._cache:
            self._states.pop(key, None)

    def evict_one(self) -> bool:
        """Drop this estimator's oldest entry (derived first); False when it holds none."""
        for table in (self._derived, self._cache):
            if table:
                self._pop_oldest(table)
                return True
        return False

    def release(self) -> None:
        """Give back every byte (the estimator was replaced)."""
        while self.evict_one():
            pass
        self.budget.lru.pop(id(self), None)

    def sample(self, progress: Any = None, n: int | None = None) -> Any:
        key = self._key(progress, n)
        got = self._cache.get(key)
        if got is not None:
            self._cache.move_to_end(key)
            if key in self._states:
                self._states.move_to_end(key)
            self.hits += 1
            return got
        self.misses += 1
        return self._store(key, self.inner.sample(progress, n), progress, n)

    def _store(self, key: tuple, got: Any, progress: Any, n: int | None) -> Any:
        if type(got) is DemandSamples:
            got = SharedSamples.of(got, key, self)
        self._put(self._cache, key, got)
        if progress is not None:  # a copy: a live run's progress goes on changing
            progress = RunProgress(list(progress.finished), progress.current,
                                   progress.current_attained_s)
        self._states[key] = (progress, n)
        if len(self._states) > HOT_STATES:
            self._states.popitem(last=False)
        return got

    def hot_states(self) -> list[tuple[Any, int | None]]:
        """The states (progress, walk count) sampled most recently, newest last."""
        return list(self._states.values())

    def draw_ahead(self, states: list[tuple[Any, int | None]]) -> int:
        """Sample ``states`` now (e.g. a predecessor's :meth:`hot_states`), before this
        estimator serves: meant for a worker thread while nothing else uses it. Returns the
        number of draws."""
        drawn = 0
        for progress, n in states:
            key = self._key(progress, n)
            if key not in self._cache:
                self._store(key, self.inner.sample(progress, n), progress, n)
                drawn += 1
        return drawn

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CachingEstimatorPool:
    """An ``EstimatorPool`` look-alike whose estimators memoize their samples."""

    def __init__(self, pool: Any, max_entries: int = 4096,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.pool = pool
        self.max_entries = max_entries
        self.budget = _Budget(max_bytes)
        self._wrapped: dict[str, CachingEstimator] = {}
        #: hits and misses of the memos already replaced (the counters never go back)
        self._retired = [0, 0]

    def get(self, app: str) -> CachingEstimator | None:
        est = self.pool.get(app)
        if est is None:
            gone = self._wrapped.pop(app, None)  # forgotten by the pool: its bytes too
            if gone is not None:
                self._retire(gone)
            return None
        w = self._wrapped.get(app)
        if w is None or w.inner is not est:  # first use, or the graph was relearned
            if w is not None:
                self._retire(w)
            w = self._wrapped[app] = CachingEstimator(est, self.max_entries, self.budget)
        return w

    def prepare(self, estimators: dict[str, Any],
                states: dict[str, list[tuple[Any, int | None]]]) -> dict[str, CachingEstimator]:
        """New estimators' memos, the given states drawn ahead (in a worker thread: nothing
        here touches what the event loop reads; :meth:`adopt` installs the result)."""
        out = {}
        for app, est in estimators.items():
            w = CachingEstimator(est, self.max_entries, _Budget(self.budget.max_bytes))
            w.draw_ahead(states.get(app, []))
            out[app] = w
        return out

    def adopt(self, app: str, w: CachingEstimator) -> None:
        """Serve ``app`` from ``w`` (made by :meth:`prepare`; its estimator is the raw
        pool's now): its bytes join this pool's budget."""
        old = self._wrapped.get(app)
        if old is not None and old is not w:
            self._retire(old)
        w.budget = self.budget
        self.budget.used += w.bytes
        self._wrapped[app] = w
        self.budget.touch(w)
        self.budget.enforce()

    def _retire(self, w: CachingEstimator) -> None:
        self._retired[0] += w.hits
        self._retired[1] += w.misses
        w.release()

    def hot_states(self, app: str) -> list[tuple[Any, int | None]]:
        w = self._wrapped.get(app)
        return [] if w is None else w.hot_states()

    def stats(self) -> dict[str, int]:
        """Hits and misses since start (replaced memos included), bytes held now."""
        return {"sample_cache_hits": self._retired[0] + sum(w.hits for w in self._wrapped.values()),
                "sample_cache_misses": self._retired[1] + sum(w.misses
                                                             for w in self._wrapped.values()),
                "sample_cache_bytes": self.budget.used}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)

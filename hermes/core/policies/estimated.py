"""Shared machinery of the policies that rank runs from PDGraph demand estimates.

:class:`EstimatedPolicy` looks up the run's app in the :class:`~hermes.core.estimator.
EstimatorPool` given to the constructor, draws the remaining-demand samples (conditioned by
the estimator on the run's PDGraph state and on ``progress.current_attained_s``) and turns
them into a rank with :meth:`EstimatedPolicy.rank_from_samples`.

Refresh points (Hermes paper §4.2): the rank is recomputed when a unit starts, when a unit
finishes, and when the run's attained service crosses the next bucket boundary of the current
unit's service-time distribution (``buckets`` quantile boundaries from
``estimator.unit_service_boundaries``, offset by the service attained when the unit started;
both kept in ``run.policy_state``; drivers set ``progress.current`` before calling
``on_unit_start``). Between two boundaries the conditional distribution
changes little, so a driver can skip the work (``run.next_refresh_attained_s``). Walks are
drawn about once per unit and conditioned at the other refresh points
(:meth:`EstimatedPolicy.samples`).

Unknown apps (``pool.get(app) is None``: no PDGraph yet) fall back to least attained service
first: rank = ``run.attained_s``, refreshed every ``las_quantum_s`` seconds of service.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hermes.core.estimator import DemandSamples
from hermes.core.policies.base import SchedulingPolicy
from hermes.core.state import RunState, UnitObservation

if TYPE_CHECKING:
    from hermes.core.estimator import DemandEstimator, EstimatorPool

_OFFSET = "unit_start_attained_s"
_BOUNDS = "unit_bounds_s"
_ABS = "unit_bounds_abs"  # the boundaries in run.attained_s terms (a sorted list)
_TABLE = "rank_table"  # (finished units, bucket starts, ranks, first attained not covered),
# or a _PendingTable until first read (tables_on_demand)
_WALKS = "walks"  # (finished units, running unit or None, its attained when drawn, samples)


@dataclass(slots=True)
class _PendingTable:
    """What a unit's rank table is built from, kept until it is read
    (:attr:`EstimatedPolicy.tables_on_demand`)."""

    walks: DemandSamples
    rank: float
    now: float
    at: float
    done: int


class EstimatedPolicy(SchedulingPolicy):
    """Base of the estimator-driven policies (``hermes``, ``hermes-ddl``, ``srpt``, ...)."""

    uses_estimator: ClassVar[bool] = True
    refine: ClassVar[bool] = True
    #: the rank is a function of the samples alone (not of ``now`` or of state the policy
    #: keeps), so each bucket's rank can be computed ahead when the unit's walks are drawn
    tabulate: ClassVar[bool] = False
    #: build a unit's per-bucket rank table when it is first read, not when the unit starts
    #: (the same table: from the walks, rank and attained service of the unit's start). A
    #: driver sets it where most units end before their first bucket boundary is refreshed:
    #: the live gateway credits a request's service when its answer comes (only streamed
    #: tokens are credited on the way), so a one-request unit's table was built and never read
    tables_on_demand: bool = False
    #: leave the rank of a run as it is when its last running unit ends: its next unit's
    #: start ranks it afresh, from walks drawn for that state, and nothing of the run waits
    #: in a queue meanwhile (a request belongs to a running unit), so no key reads the rank
    #: skipped. A driver sets it where most runs are idle between units: the live gateway,
    #: where every header-less call is a unit of an inferred run, idle until the client's
    #: next call (or closed): the rank at each call's end was never read. The rank an idle
    #: run shows (``hermes top``, the rank gauge, a trace's rank events) is then its last
    #: unit's. The simulator keeps ranking at every boundary (its figures unchanged, draw
    #: for draw)
    defer_idle_ranks: bool = False

    def __init__(
        self,
        *,
        estimators: EstimatorPool | None = None,
        buckets: int = 10,
        n_walks: int | None = None,
        las_quantum_s: float = 1.0,
        min_keep: int = 32,
        seed: int = 0,
    ) -> None:
        if buckets < 1:
            raise ValueError(f"buckets must be >= 1, got {buckets}")
        self.estimators = estimators
        self.buckets = buckets
        self.n_walks = n_walks  # None: the estimator's own default
        self.las_quantum_s = las_quantum_s
        self.min_keep = min_keep
        self.seed = seed
        #: id of a unit's boundary array -> (the array, its values as floats): the offsets
        #: are added to a run's attained service at every unit start (the array is held, so
        #: that its id is not reused while the entry exists; at most 4096, then afresh)
        self._bounds_f: dict[int, tuple[Any, list[float]]] = {}
        #: offset -> round(offset, 9): a unit's boundary offsets recur from run to run (the
        #: same floats, at most 4096 kept), and a round to 9 digits is ~10 dict lookups' time
        self._round9: dict[float, float] = {}

    # -- what subclasses define -------------------------------------------------------------
    def rank_from_samples(self, run: RunState, samples: DemandSamples, now: float) -> float:
        """The rank of ``run`` given its remaining-demand samples."""
        raise NotImplementedError

    def fallback_rank(self, run: RunState, now: float) -> float:
        """Rank of a run whose app has no estimator: least attained service first."""
        return run.attained_s

    # -- shared logic -----------------------------------------------------------------------
    def estimator(self, run: RunState) -> DemandEstimator | None:
        return None if self.estimators is None else self.estimators.get(run.app)

    def samples(self, run: RunState, est: DemandEstimator) -> DemandSamples:
        """Remaining-demand samples of ``run`` now, drawn about once per unit.

        The walks drawn at the last refresh point are kept in ``run.policy_state`` with the
        state they were drawn in (finished units, running unit, service attained in it).
        When the next unit starts, the walks drawn when the previous one finished are
        conditioned on the unit that actually started (:meth:`DemandSamples.given_next`);
        at a bucket boundary, the running unit's walks are conditioned on the service it
        attained since (:meth:`DemandSamples.given_attained`). Both are rejection on walks
        already drawn, i.e. the estimator's own conditional distribution at the cost of a
        filter. Fresh walks are drawn when fewer than ``min_keep`` survive.
        """
        progress = run.progress
        done = len(progress.finished)
        walks: DemandSamples | None = None
        cached = run.policy_state.get(_WALKS)
        if cached is not None and cached[0] == done:
            _, unit, base_s, drawn = cached
            if unit is None and progress.current is not None:
                # drawn between units: keep the walks that chose the unit that started
                walks = drawn.given_next(progress.current, min_keep=self.min_keep)
                unit, base_s = progress.current, 0.0
                if walks is not None:
                    run.policy_state[_WALKS] = (done, unit, base_s, walks)
            elif unit is not None and unit == progress.current:
                walks = drawn
            if walks is not None:
                more_s = progress.current_attained_s - base_s
                walks = walks.given_attained(more_s, min_keep=self.min_keep) if more_s > 0 else walks
        if walks is None:
            walks = est.sample(progress, self.n_walks)
            if isinstance(walks, DemandSamples) and walks.head_unit is not None:
                base_s = progress.current_attained_s if progress.current is not None else 0.0
                run.policy_state[_WALKS] = (done, progress.current, base_s, walks)
        return walks

    def rank(self, run: RunState, now: float) -> float:
        if self.tabulate:
            hit = self._from_table(run)
            if hit is not None:
                return hit
        est = self.estimator(run)
        if est is None:
            run.next_refresh_attained_s = run.attained_s + self.las_quantum_s
            return self.fallback_rank(run, now)
        self._set_next_refresh(run)
        walks = self.samples(run, est)
        rank = self._samples_rank(run, walks, now)
        if self.tabulate and run.progress.current is not None and isinstance(walks, DemandSamples):
            if self.tables_on_demand:
                run.policy_state[_TABLE] = _PendingTable(walks, rank, now, run.attained_s,
                                                         len(run.progress.finished))
            else:
                self._build_table(run, walks, rank, now)
        return rank

    def _samples_rank(self, run: RunState, walks: DemandSamples, now: float) -> float:
        """:meth:`rank_from_samples`, memoized on samples that several runs share and that
        carry a ``rank_memo`` dict (the live gateway's sample cache), when the rank is a
        function of the samples alone (``tabulate``)."""
        memo = getattr(walks, "rank_memo", None) if self.tabulate else None
        if memo is None:
            return self.rank_from_samples(run, walks, now)
        rank: float | None = memo.get(self.name)
        if rank is None:
            rank = memo[self.name] = self.rank_from_samples(run, walks, now)
        return rank

    def on_unit_start(self, run: RunState, unit: str, now: float) -> None:
        run.policy_state[_OFFSET] = run.attained_s
        run.policy_state[_TABLE] = None
        est = self.estimator(run)
        bounds = None if est is None else est.unit_service_boundaries(unit, self.buckets)
        run.policy_state[_BOUNDS] = bounds
        run.policy_state[_ABS] = (
            None if bounds is None else [run.attained_s + b for b in self._floats(bounds)]
        )
        run.rank = self.rank(run, now)
        run.rank_refreshed_at = now

    def _floats(self, bounds: Any) -> list[float]:
        """``[float(b) for b in bounds]``, once per boundary array (see ``_bounds_f``)."""
        hit = self._bounds_f.get(id(bounds))
        if hit is not None and hit[0] is bounds:
            return hit[1]
        out = [float(b) for b in bounds]
        if len(self._bounds_f) >= 4096:
            self._bounds_f.clear()
        self._bounds_f[id(bounds)] = (bounds, out)
        return out

    def _offsets(self, ahead: list[float], at: float) -> tuple[float, ...]:
        """``tuple(round(b - at, 9) for b in ahead)``, the rounding looked up (``_round9``)."""
        memo = self._round9
        out = []
        for b in ahead:
            d = b - at
            r = memo.get(d)
            if r is None:
                if len(memo) >= 4096:
                    memo.clear()
                r = memo[d] = round(d, 9)
            out.append(r)
        return tuple(out)

    def on_unit_finish(self, run: RunState, obs: UnitObservation, now: float) -> None:
        run.policy_state[_BOUNDS] = run.policy_state[_ABS] = run.policy_state[_TABLE] = None
        if self.defer_idle_ranks and run.progress.current is None:
            return  # idle now: ranked at its next unit's start (defer_idle_ranks)
        super().on_unit_finish(run, obs, now)

    def on_closing_service(self, run: RunState, seconds: float, tokens: int, now: float) -> None:
        """The unit ends next and :meth:`on_unit_finish` re-ranks the run: the bucket
        refresh of :meth:`~hermes.core.policies.base.SchedulingPolicy.on_service` (a
        conditioning of the run's walks, past the table's last boundary: per request of a
        live gateway) would be overwritten unread, so it is skipped. A subclass with its own
        ``on_service`` has it called."""
        if type(self).on_service is not SchedulingPolicy.on_service:
            self.on_service(run, seconds, tokens, now)

    # -- per-bucket rank tables (Hermes §4.2: the index is constant within a bucket) -----------
    def _build_table(self, run: RunState, walks: DemandSamples, rank: float, now: float,
                     at: float | None = None, done: int | None = None
                     ) -> tuple[int, list[float], list[float], float]:
        """Ranks of the running unit at each bucket boundary still ahead, from the same walks.

        Built when the unit's walks are (re)drawn; a bucket-boundary refresh is then a lookup,
        which keeps re-ranking every active run cheap (``hermes bench overhead``). The table
        stops at the first boundary that fewer than ``min_keep`` walks reach (a refresh there
        draws afresh). Cost: one conditioning and one rank per boundary, linear in buckets.
        ``at`` / ``done``: the service attained and the units finished when the walks were
        drawn (default: the run's now; a table built on demand passes those of the unit's
        start). Returns the table, also kept in ``run.policy_state``.
        """
        bounds = run.policy_state.get(_ABS) or []
        if at is None:
            at = run.attained_s
        ahead = [b for b in bounds if b > at]
        # walks shared between runs (the live sample cache) memoize the table by the offsets
        # of the boundaries ahead (to the nanosecond, as the conditioned walks are keyed):
        # every run that starts this unit in this state then reads it instead of conditioning
        # the walks at each boundary again
        memo = getattr(walks, "rank_memo", None)
        key = (self.name, self._offsets(ahead, at)) if memo is not None else None
        got = memo.get(key) if memo is not None else None
        if got is not None:
            ranks = [rank, *got]
        else:
            ranks = [rank]
            for b in ahead:
                cond = walks.given_attained(b - at, min_keep=self.min_keep)
                if cond is None:
                    break
                ranks.append(self._samples_rank(run, cond, now))
            if memo is not None:
                memo[key] = tuple(ranks[1:])
        starts = [at, *ahead[: len(ranks) - 1]]
        limit = ahead[len(ranks) - 1] if len(ranks) <= len(ahead) else float("inf")
        table = (len(run.progress.finished) if done is None else done, starts, ranks, limit)
        run.policy_state[_TABLE] = table
        return table

    def _from_table(self, run: RunState) -> float | None:
        """The tabulated rank at the run's attained service (and its next refresh point), or
        ``None`` outside what the table covers. The hot path of a re-rank: two compares and
        one bisection."""
        table = run.policy_state.get(_TABLE)
        if table is None:
            return None
        if type(table) is _PendingTable:  # (tables_on_demand) built now, as at unit start
            p = table
            table = self._build_table(run, p.walks, p.rank, p.now, at=p.at, done=p.done)
        done: int
        starts: list[float]
        ranks: list[float]
        limit: float
        done, starts, ranks, limit = table
        a = run.attained_s
        if done != len(run.progress.finished) or a >= limit:
            return None
        i = bisect_right(starts, a)
        if i == 0:
            return None
        run.next_refresh_attained_s = starts[i] if i < len(starts) else limit
        return ranks[i - 1]

    def _set_next_refresh(self, run: RunState) -> None:
        """Next refresh: the first bucket boundary of the current unit above attained service."""
        absolute = run.policy_state.get(_ABS)
        if not absolute:
            run.next_refresh_attained_s = float("inf")
            return
        i = bisect_right(absolute, run.attained_s)
        run.next_refresh_attained_s = absolute[i] if i < len(absolute) else float("inf")

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
changes little, so a driver can skip the work (``run.next_refresh_attained_s``).

Unknown apps (``pool.get(app) is None``: no PDGraph yet) fall back to least attained service
first: rank = ``run.attained_s``, refreshed every ``las_quantum_s`` seconds of service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from hermes.core.policies.base import SchedulingPolicy
from hermes.core.state import RunState, UnitObservation

if TYPE_CHECKING:
    from hermes.core.estimator import DemandEstimator, DemandSamples, EstimatorPool

_OFFSET = "unit_start_attained_s"
_BOUNDS = "unit_bounds_s"


class EstimatedPolicy(SchedulingPolicy):
    """Base of the estimator-driven policies (``hermes``, ``hermes-ddl``, ``srpt``, ...)."""

    uses_estimator: ClassVar[bool] = True
    refine: ClassVar[bool] = True

    def __init__(
        self,
        *,
        estimators: EstimatorPool | None = None,
        buckets: int = 10,
        n_walks: int | None = None,
        las_quantum_s: float = 1.0,
        seed: int = 0,
    ) -> None:
        if buckets < 1:
            raise ValueError(f"buckets must be >= 1, got {buckets}")
        self.estimators = estimators
        self.buckets = buckets
        self.n_walks = n_walks  # None: the estimator's own default
        self.las_quantum_s = las_quantum_s
        self.seed = seed

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
        return est.sample(run.progress, self.n_walks)

    def rank(self, run: RunState, now: float) -> float:
        est = self.estimator(run)
        if est is None:
            run.next_refresh_attained_s = run.attained_s + self.las_quantum_s
            return self.fallback_rank(run, now)
        self._set_next_refresh(run)
        return self.rank_from_samples(run, self.samples(run, est), now)

    def on_unit_start(self, run: RunState, unit: str, now: float) -> None:
        run.policy_state[_OFFSET] = run.attained_s
        est = self.estimator(run)
        bounds = None if est is None else est.unit_service_boundaries(unit, self.buckets)
        run.policy_state[_BOUNDS] = bounds
        run.rank = self.rank(run, now)
        run.rank_refreshed_at = now

    def on_unit_finish(self, run: RunState, obs: UnitObservation, now: float) -> None:
        run.policy_state[_BOUNDS] = None
        super().on_unit_finish(run, obs, now)

    def _set_next_refresh(self, run: RunState) -> None:
        """Next refresh: the first bucket boundary of the current unit above attained service."""
        bounds = run.policy_state.get(_BOUNDS)
        if bounds is None or len(bounds) == 0:
            run.next_refresh_attained_s = float("inf")
            return
        absolute = run.policy_state.get(_OFFSET, 0.0) + np.asarray(bounds, dtype=np.float64)
        i = int(np.searchsorted(absolute, run.attained_s, side="right"))
        run.next_refresh_attained_s = float(absolute[i]) if i < absolute.size else float("inf")

"""Non-preemptive shortest job first on the estimated mean total demand (``sjf``).

The classic baseline between FCFS and SRPT: each run (the *job*) is sized once, when it
arrives, by the mean of the estimator's samples of its whole demand (isolated service seconds,
``DemandSamples.service_s`` of a run that has not started); the estimate is never refreshed as
the run progresses (that is what ``srpt`` adds). Non-preemptive at the level of runs: once a
run has received service, it keeps priority over every run that has not, so a shorter run
arriving later waits for the runs already started instead of overtaking them; among started
runs, and among waiting ones, the shorter estimate goes first (FCFS on ties). The engines
batch, so "in service" is a set of runs, not one.

The two tiers live in the rank (lower first): ``size`` for a run that has not been served yet,
``size - STARTED_OFFSET`` once it has, with ``STARTED_OFFSET = 1e9`` seconds (far above any
run's demand), so a driver re-keys a run's requests when it enters service. A run whose app
has no estimator (no PDGraph yet) is sized ``UNKNOWN_SIZE_S = 1e8`` seconds: after every sized
run of its tier, FCFS among such runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from hermes.core.policies.base import SchedulingPolicy, register
from hermes.core.state import RunProgress, RunState, UnitObservation

if TYPE_CHECKING:
    from hermes.core.estimator import EstimatorPool

#: rank offset of a run that has received service: ahead of every run that has not
STARTED_OFFSET = 1e9
#: the size of a run whose app has no estimator: after every sized run, below the offset
UNKNOWN_SIZE_S = 1e8
_SIZE = "sjf_size_s"


@register("sjf")
class ShortestJobFirstPolicy(SchedulingPolicy):
    """Rank = the run's estimated mean total demand, fixed at arrival; started runs first."""

    name: ClassVar[str] = "sjf"
    uses_estimator: ClassVar[bool] = True
    refine: ClassVar[bool] = True

    def __init__(self, *, estimators: EstimatorPool | None = None,
                 n_walks: int | None = None) -> None:
        self.estimators = estimators
        self.n_walks = n_walks  # None: the estimator's own default

    def size(self, run: RunState) -> float:
        """The run's estimated mean total demand (seconds), drawn once and kept."""
        size: float | None = run.policy_state.get(_SIZE)
        if size is None:
            est = None if self.estimators is None else self.estimators.get(run.app)
            service = None if est is None else est.sample(RunProgress(), self.n_walks).service_s
            size = UNKNOWN_SIZE_S if service is None or not len(service) else float(
                np.mean(service))
            run.policy_state[_SIZE] = size
        return size

    def rank(self, run: RunState, now: float) -> float:
        size = self.size(run)
        return size - STARTED_OFFSET if run.attained_s > 0 else size

    def on_unit_finish(self, run: RunState, obs: UnitObservation, now: float) -> None:
        self._refresh(run, now)

    def on_service(self, run: RunState, seconds: float, tokens: int, now: float) -> None:
        self._refresh(run, now)

    def _refresh(self, run: RunState, now: float) -> None:
        """Only the tier can change (at the run's first service); the size never does."""
        rank = self.rank(run, now)
        if rank != run.rank:
            run.rank = rank
            run.rank_refreshed_at = now

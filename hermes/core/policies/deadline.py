"""Deadline policies: ``hermes-ddl`` (least worst-case slack first) and ``edf``.

``hermes-ddl`` (Hermes paper §4.3): least slack first, with
``slack = deadline − now − worst-case remaining demand`` and the worst case a high quantile
(``quantile``, default 0.95) of the estimator's remaining service samples. ``now`` is common
to all runs at a decision, so the stored rank is the time-invariant ``deadline − worst case``
(the latest time the run can still start its remaining work alone): ranks refreshed at
different times stay comparable. Runs without a deadline come after every run with one and
are ordered among themselves by their Gittins rank; the tier is the first element of the
request key (``run.policy_state["tier"]``: 0 with a deadline, 1 without). A run whose deadline
is lost even in the optimistic case (``deadline − now`` below the ``1 − quantile`` quantile of
its remaining time, service plus client gaps) is checked at every refresh point and moved to
tier 1: serving lost causes first is what makes least-slack and EDF collapse under overload.
The check reads the clock, so these ranks are not tabulated per bucket.

``edf``: earliest deadline first (Liu & Layland, 1973); runs without a deadline rank ``+inf``
and, among themselves, first come first served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from hermes.core.policies.base import RequestKey, SchedulingPolicy, register
from hermes.core.policies.estimated import EstimatedPolicy
from hermes.core.policies.gittins import gittins_rank
from hermes.core.state import RequestView, RunState

if TYPE_CHECKING:
    from hermes.core.estimator import DemandSamples, EstimatorPool


@register("hermes-ddl")
class HermesDeadlinePolicy(EstimatedPolicy):
    """Least worst-case slack first; Gittins among runs without a deadline."""

    name: ClassVar[str] = "hermes-ddl"

    def __init__(
        self,
        *,
        estimators: EstimatorPool | None = None,
        quantile: float = 0.95,
        buckets: int = 10,
        n_walks: int | None = None,
        las_quantum_s: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__(
            estimators=estimators, buckets=buckets, n_walks=n_walks,
            las_quantum_s=las_quantum_s, seed=seed,
        )
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1], got {quantile}")
        self.quantile = quantile

    def worst_case_s(self, samples: DemandSamples) -> float:
        return float(np.quantile(samples.service_s, self.quantile))

    def slack(self, run: RunState, now: float) -> float:
        """Slack of a run with a deadline at ``now`` (from its last refreshed rank)."""
        if run.deadline is None:
            return float("inf")
        return run.rank - now

    def best_case_s(self, samples: DemandSamples) -> float:
        """Optimistic remaining time to completion (service plus client gaps)."""
        return float(np.quantile(samples.wall_s, 1.0 - self.quantile))

    def rank_from_samples(self, run: RunState, samples: DemandSamples, now: float) -> float:
        if run.deadline is None:
            run.policy_state["tier"] = 1
            return gittins_rank(samples.service_s)
        if run.deadline - now < self.best_case_s(samples):
            # even the optimistic case misses the deadline: least slack would keep serving a
            # lost cause first and drag feasible runs past theirs (EDF's domino effect under
            # overload), so the run joins the runs without a deadline, Gittins-ordered
            run.policy_state["tier"] = 1
            run.policy_state["deadline_lost"] = True
            return gittins_rank(samples.service_s)
        run.policy_state["tier"] = 0
        return run.deadline - self.worst_case_s(samples)

    def fallback_rank(self, run: RunState, now: float) -> float:
        # unknown app: no demand estimate, so slack degenerates to the deadline itself
        if run.deadline is None:
            run.policy_state["tier"] = 1
            return run.attained_s
        run.policy_state["tier"] = 0
        return run.deadline

    def request_key(self, run: RunState, req: RequestView, now: float) -> RequestKey:
        tier = run.policy_state.get("tier", 0 if run.deadline is not None else 1)
        return (tier, run.rank, run.submitted, req.arrival, req.seq)


@register("edf")
class EarliestDeadlineFirstPolicy(SchedulingPolicy):
    """Earliest deadline first; no deadline = ``+inf``, then FCFS by submission."""

    name: ClassVar[str] = "edf"

    def rank(self, run: RunState, now: float) -> float:
        return float("inf") if run.deadline is None else run.deadline

"""Shortest-remaining-processing-time baselines.

- ``srpt``: SRPT on the *mean* of the estimator's remaining service samples (Schrage, 1968 for
  SRPT; the "Hermes without Gittins" ablation of the Hermes paper, Fig. 12). Same estimator,
  refresh points and unknown-app fallback as ``hermes``; only the index differs.
- ``oracle``: SRPT on the true remaining service, which only the simulator knows
  (``RunState.true_remaining_s``): the lower bound the estimator-driven policies aim at. Its
  rank is re-read on every service report, since the truth changes as the run is served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hermes.core.policies.base import SchedulingPolicy, register
from hermes.core.policies.estimated import EstimatedPolicy
from hermes.core.state import RunState

if TYPE_CHECKING:
    from hermes.core.estimator import DemandSamples


@register("srpt")
class MeanSRPTPolicy(EstimatedPolicy):
    """SRPT on the estimated mean remaining service."""

    name: ClassVar[str] = "srpt"
    tabulate: ClassVar[bool] = True

    def rank_from_samples(self, run: RunState, samples: DemandSamples, now: float) -> float:
        return float(samples.service_s.mean())


@register("oracle")
class OracleSRPTPolicy(SchedulingPolicy):
    """SRPT on the true remaining service (simulator only)."""

    name: ClassVar[str] = "oracle"
    uses_truth: ClassVar[bool] = True

    def rank(self, run: RunState, now: float) -> float:
        if run.true_remaining_s is None:
            raise ValueError(f"oracle: run {run.run_id} has no true_remaining_s (simulator only)")
        return run.true_remaining_s

    def on_service(self, run: RunState, seconds: float, tokens: int, now: float) -> None:
        run.rank = self.rank(run, now)
        run.rank_refreshed_at = now

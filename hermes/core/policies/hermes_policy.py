"""Hermes: Gittins-rank scheduling on PDGraph demand estimates (Liu et al., 2025, §4).

Each run's rank is the Gittins index (:mod:`hermes.core.policies.gittins`) of its remaining
service, distributed as the estimator's Monte Carlo samples conditioned on where the run is in
its PDGraph (current unit and service attained in it, finished units and their observed
demand). Runs likely to finish soon go first, without starving long runs whose chance of
finishing grows as they attain service. Refresh points and the unknown-app fallback are
described in :mod:`hermes.core.policies.estimated`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hermes.core.policies.base import register
from hermes.core.policies.estimated import EstimatedPolicy
from hermes.core.policies.gittins import gittins_rank
from hermes.core.state import RunState

if TYPE_CHECKING:
    from hermes.core.estimator import DemandSamples


@register("hermes")
class HermesPolicy(EstimatedPolicy):
    """Gittins rank on the estimator's remaining service-time samples."""

    name: ClassVar[str] = "hermes"
    tabulate: ClassVar[bool] = True

    def rank_from_samples(self, run: RunState, samples: DemandSamples, now: float) -> float:
        return gittins_rank(samples.service_s)


@register("hermes-no-refine")
class HermesNoRefinePolicy(HermesPolicy):
    """Ablation (paper Fig. 12): Hermes without online refinement.

    Same ranking; the driver builds this policy's EstimatorPool with ``refine=False``, so the
    estimator conditions on the PDGraph position only, not on the demand observed upstream.
    """

    name: ClassVar[str] = "hermes-no-refine"
    refine: ClassVar[bool] = False

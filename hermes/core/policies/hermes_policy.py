"""Hermes: Gittins-rank scheduling on PDGraph demand estimates (Liu et al., 2025, §4).

Each run's rank is the Gittins index (:mod:`hermes.core.policies.gittins`) of its remaining
service, distributed as the estimator's Monte Carlo samples conditioned on where the run is in
its PDGraph (current unit and service attained in it, finished units and their observed
demand). Runs likely to finish soon go first, without starving long runs whose chance of
finishing grows as they attain service. Refresh points and the unknown-app fallback are
described in :mod:`hermes.core.policies.estimated`.

Bounded wait: Gittins alone can still starve a long run while short ones keep arriving (its
requests stay behind theirs in every queue, unit after unit). ``max_wait_s`` promotes the
requests of a run that has waited that long ahead of every other, oldest run first
(:class:`~hermes.core.policies.starvation.WaitGuard`, which says how a run's wait is measured);
below the bound the Gittins order is unchanged. Default :data:`DEFAULT_MAX_WAIT_S`, chosen from ``hermes bench sched`` (its cost in
mean ACT against its effect on the maximum and P99 wait); ``hermes-noguard`` is Hermes without
it, ``hermes-wait<N>`` with a bound of ``N`` seconds.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, ClassVar

from hermes.core.policies.base import RequestKey, register
from hermes.core.policies.estimated import EstimatedPolicy
from hermes.core.policies.gittins import gittins_rank
from hermes.core.policies.starvation import WaitGuard
from hermes.core.state import RequestView, RunState, UnitObservation

if TYPE_CHECKING:
    from hermes.core.estimator import DemandSamples, EstimatorPool

#: the bound of ``hermes``'s wait guard (seconds a run may wait before its requests are
#: promoted; ``None``: no guard), chosen from ``hermes bench sched`` (seeds 0-2, 300 paper
#: apps in 10 and 30 min; 50 agent apps in 10 min) against ``hermes-noguard``: 300 s cost
#: +17% mean ACT on the paper workload in 10 min (+49% on one seed: promoted runs delay
#: others into promotion, a cascade to FCFS) though it cut the agents' by 7% and their max wait
#: by half; 450 s still cost about 4%; 600 s cost nothing measurable (the paper workload's
#: runs never reach it) and cut the agents' mean ACT by 0.7% and their max wait by 14%
DEFAULT_MAX_WAIT_S: float | None = 600.0


@register("hermes")
class HermesPolicy(EstimatedPolicy):
    """Gittins rank on the estimator's remaining service-time samples."""

    name: ClassVar[str] = "hermes"
    tabulate: ClassVar[bool] = True

    def __init__(
        self,
        *,
        estimators: EstimatorPool | None = None,
        buckets: int = 10,
        n_walks: int | None = None,
        las_quantum_s: float = 1.0,
        min_keep: int = 32,
        seed: int = 0,
        max_wait_s: float | None = DEFAULT_MAX_WAIT_S,
    ) -> None:
        super().__init__(estimators=estimators, buckets=buckets, n_walks=n_walks,
                         las_quantum_s=las_quantum_s, min_keep=min_keep, seed=seed)
        self.guard = WaitGuard(max_wait_s)
        #: promotion reads the clock: queues are re-keyed before dispatch (base class)
        self.aging_keys = self.guard.enabled

    def rank_from_samples(self, run: RunState, samples: DemandSamples, now: float) -> float:
        return gittins_rank(samples.service_s)

    def on_unit_finish(self, run: RunState, obs: UnitObservation, now: float) -> None:
        self.guard.on_unit_finish(run, obs)
        super().on_unit_finish(run, obs, now)

    def request_key(self, run: RunState, req: RequestView, now: float) -> RequestKey:
        """The Gittins key (rank, then FCFS), behind the wait guard's promotion."""
        return self.guard.key(super().request_key(run, req, now), run, req, now)


@register("hermes-no-refine")
class HermesNoRefinePolicy(HermesPolicy):
    """Ablation (paper Fig. 12): Hermes without online refinement.

    Same ranking; the driver builds this policy's EstimatorPool with ``refine=False``, so the
    estimator conditions on the PDGraph position only, not on the demand observed upstream.
    """

    name: ClassVar[str] = "hermes-no-refine"
    refine: ClassVar[bool] = False


def _bounded(name: str, max_wait_s: float | None, doc: str) -> type[HermesPolicy]:
    """Register ``name``: Hermes whose wait guard defaults to ``max_wait_s``."""

    class Bounded(HermesPolicy):
        # HermesPolicy's constructor with another default bound: one signature to keep, and
        # make_policy still sees the named parameters (inspect follows partialmethod)
        __init__ = functools.partialmethod(HermesPolicy.__init__, max_wait_s=max_wait_s)

    Bounded.name = name
    Bounded.__name__ = Bounded.__qualname__ = f"Hermes_{name.replace('-', '_')}"
    Bounded.__doc__ = doc
    cls: type[HermesPolicy] = Bounded
    register(name)(cls)
    return cls


#: Hermes without the wait guard (the policy as in the paper), and with other bounds: the
#: variants ``hermes bench sched`` compares to choose :data:`DEFAULT_MAX_WAIT_S`
HermesNoGuardPolicy = _bounded("hermes-noguard", None, "Hermes without the wait guard.")
GUARD_VARIANTS: dict[str, float] = {f"hermes-wait{b}": float(b) for b in (120, 300, 600, 1200)}
for _name, _bound in GUARD_VARIANTS.items():
    _bounded(_name, _bound, f"Hermes with a {_bound:g} s wait guard.")

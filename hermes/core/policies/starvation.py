"""A bounded-wait guard for rank-ordered policies: age-based promotion of starving runs.

Gittins (and any size-based rank) can starve a long run: as long as shorter runs keep arriving,
the long run's requests stay behind theirs in every queue, unit after unit, and its total wait
has no bound. The guard bounds it. A run's *wait* is measured from data every driver already
gives the policy (no clock read):

- for each finished LLM unit, the time it took beyond its own isolated service,
  ``obs.finished - obs.started - obs.service_s`` (time queued, plus the slowdown of sharing
  batches, which a live system cannot tell apart; as Autellix's anti-starvation, see
  :mod:`hermes.core.policies.autellix`), summed in ``run.policy_state`` at each unit's end
  (:meth:`WaitGuard.on_unit_finish`);
- plus the age of the queued request being keyed, ``now - req.arrival``.

Once a run's wait reaches ``max_wait_s`` its queued requests are *promoted*: they go ahead of
every request that is not, and promoted requests are served oldest run first (by submission,
then request arrival and submission order). Below the bound the policy's own key is kept, so
the guard changes nothing for runs that are not starving. Per run, not per request: a long run
is starved by many moderate waits, one per unit, more than by one long one.

How a key looks: a promoted request's is ``(-inf, submitted, arrival, seq)``, any other keeps
the policy's key, whose first element (the run's rank) must be above ``-inf``. The rank stays
the key's first element, which is what a vLLM node's in-engine ``priority`` is made from
(:func:`hermes.protocol.key_to_priority`): promoted requests get its lowest value.

Promotion depends on the clock: a waiting request's key changes when its age crosses what is
left of the bound, with no event of its run. A policy that uses the guard sets ``aging_keys``
(:class:`~hermes.core.policies.base.SchedulingPolicy`), so the simulator re-keys an engine's
waiting queue before each dispatch; the live gateway re-keys every queued request on its
periodic sweep (``scheduler.rekey_interval_s``), which bounds the promotion's lateness. A run's
own events still change only its own keys (``key_scope = "run"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hermes.core.state import RequestView, RunState, UnitObservation

RequestKey = tuple[float, ...]

#: the first element (rank) of a promoted request's key: ahead of every finite rank
PROMOTED = -math.inf
#: ``run.policy_state`` entry: the run's wait over its finished LLM units (seconds)
_WAITED = "wait_guard_waited_s"


@dataclass(frozen=True, slots=True)
class WaitGuard:
    """Promote a run's queued requests once the run has waited ``max_wait_s`` (``None`` or
    ``inf``: never)."""

    max_wait_s: float | None = None

    def __post_init__(self) -> None:
        b = self.max_wait_s
        if b is not None and not (b > 0):  # also rejects NaN
            raise ValueError(f"max_wait_s must be > 0 or None, got {b}")

    @property
    def enabled(self) -> bool:
        return self.max_wait_s is not None and not math.isinf(self.max_wait_s)

    def on_unit_finish(self, run: RunState, obs: UnitObservation) -> None:
        """Add a finished LLM unit's time beyond its isolated service to the run's wait
        (tool units carry no tokens and are not counted)."""
        if obs.input_tokens + obs.output_tokens > 0:
            excess = max(0.0, obs.finished - obs.started - obs.service_s)
            run.policy_state[_WAITED] = run.policy_state.get(_WAITED, 0.0) + excess

    @staticmethod
    def waited(run: RunState, req: RequestView, now: float) -> float:
        """The run's wait while ``req`` is queued at ``now`` (seconds, never negative)."""
        return float(run.policy_state.get(_WAITED, 0.0)) + max(0.0, now - req.arrival)

    def promoted(self, run: RunState, req: RequestView, now: float) -> bool:
        """Whether ``req``'s run has waited at least the bound."""
        if self.max_wait_s is None or not self.enabled:
            return False
        return self.waited(run, req, now) >= self.max_wait_s

    def key(self, base: RequestKey, run: RunState, req: RequestView, now: float) -> RequestKey:
        """The guarded key of ``req``: promoted ones first (oldest run first), then ``base``
        order; ``base`` itself below the bound or with the guard off."""
        if self.promoted(run, req, now):
            return (PROMOTED, run.submitted, req.arrival, float(req.seq))
        return base

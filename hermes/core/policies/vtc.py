"""Virtual Token Counter: fair share of LLM service per tenant (Sheng et al., "Fairness in
Serving Large Language Models", OSDI'24, Algorithm 2).

Each tenant has a counter of the weighted tokens it has been served (``input_weight`` per
prompt token, ``output_weight`` per generated token; defaults 1 and 2, the paper's
``w_p``/``w_q`` choice). The queued request of the tenant with the smallest counter is served
first (FCFS within a tenant). When a tenant becomes active (its first unfinished run
arrives), its counter is lifted to the smallest counter among the active tenants, so an idle
period earns no credit to burst later.

Accounting: the driver reports service with ``on_service(run, seconds, tokens, now)`` where
``tokens`` does not say which are prompt and which generated ones. Those tokens are charged
provisionally at ``input_weight``; when the unit finishes, the charge is trued up to the
exact ``input_weight·input_tokens + output_weight·output_tokens`` of its observation. Tool
units carry no tokens and are not charged (VTC shares LLM service).

The request key reads the tenant's counter at the time of ordering, so it is always current;
``run.rank`` holds the counter at the last refresh, for display only.
"""

from __future__ import annotations

from collections import defaultdict
from typing import ClassVar

from hermes.core.policies.base import RequestKey, SchedulingPolicy, register
from hermes.core.state import RequestView, RunState, UnitObservation

_PROVISIONAL = "vtc_provisional"


@register("vtc")
class VirtualTokenCounterPolicy(SchedulingPolicy):
    """Smallest per-tenant virtual token counter first."""

    name: ClassVar[str] = "vtc"
    dynamic_keys: ClassVar[bool] = True
    key_scope: ClassVar[str] = "tenant"  # an event of a run moves only its tenant's counter

    def __init__(self, *, input_weight: float = 1.0, output_weight: float = 2.0) -> None:
        self.input_weight = input_weight
        self.output_weight = output_weight
        self.counters: dict[str, float] = defaultdict(float)
        self._active_runs: dict[str, int] = defaultdict(int)

    def counter(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0)

    def _active_tenants(self) -> list[str]:
        return [t for t, n in self._active_runs.items() if n > 0]

    def on_arrival(self, run: RunState, now: float) -> None:
        if self._active_runs[run.tenant] == 0:
            active = self._active_tenants()
            if active:
                floor = min(self.counters[t] for t in active)
                self.counters[run.tenant] = max(self.counters[run.tenant], floor)
        self._active_runs[run.tenant] += 1
        run.policy_state[_PROVISIONAL] = 0.0
        super().on_arrival(run, now)

    def on_service(self, run: RunState, seconds: float, tokens: int, now: float) -> None:
        charge = self.input_weight * tokens
        self.counters[run.tenant] += charge
        run.policy_state[_PROVISIONAL] = run.policy_state.get(_PROVISIONAL, 0.0) + charge
        run.rank = self.counters[run.tenant]
        run.rank_refreshed_at = now

    def on_unit_finish(self, run: RunState, obs: UnitObservation, now: float) -> None:
        exact = self.input_weight * obs.input_tokens + self.output_weight * obs.output_tokens
        self.counters[run.tenant] += exact - run.policy_state.get(_PROVISIONAL, 0.0)
        run.policy_state[_PROVISIONAL] = 0.0
        super().on_unit_finish(run, obs, now)

    def on_finish(self, run: RunState, now: float) -> None:
        self._active_runs[run.tenant] = max(0, self._active_runs[run.tenant] - 1)

    def rank(self, run: RunState, now: float) -> float:
        return self.counter(run.tenant)

    def request_key(self, run: RunState, req: RequestView, now: float) -> RequestKey:
        return (self.counter(run.tenant), req.arrival, req.seq)

"""Fair share across tenants: a wrapper that puts a tenant's weighted share ahead of any
policy's own order, so that one tenant's long generations cannot hold another's short
requests for more than a bounded time.

Why. A policy ranks runs, not tenants: Gittins, say, orders by expected remaining work. One
tenant with four 30,000-token streams fills an engine's KV; every running request that needs
a block preempts the lowest-priority running one, and a waiting request is admitted only as
the head of the queue once room is free. If that tenant's preempted streams rank ahead of
another tenant's 3-token chat, the chat waits for the streams (20 s and more, measured with
the built-in engine at 40,000 KV tokens).

The rule (:class:`FairShare`). Each tenant has a counter of the tokens it was served divided
by its weight (``weights``, default 1), as VTC's virtual token counter (Sheng et al., OSDI'24;
:mod:`hermes.core.policies.vtc`). A request's key is ``(band, *policy key)`` with ``band =
floor(counter / quantum_tokens)``: a tenant that has been served a quantum more than another
is a band behind it, whatever the policy says; within a band (one tenant alone, or tenants
served alike) the policy's order is kept unchanged. A tenant that becomes active (its first
unfinished run arrives) is lifted to one quantum below the smallest counter of the tenants
already active: an idle period earns no credit to burst later, and a newcomer's first
requests go one band ahead of a tenant that is being served. How long a short request waits
behind another tenant's long ones is then bounded by the time that tenant takes to be served
one quantum (plus one engine iteration, the next preemption or completion), not by the
length of its generations.

The run's rank becomes ``band + squash(policy rank)`` (``squash`` maps the policy's rank
monotonically into ``[0, 1)``), so that a driver that re-keys a run's requests when its rank
moves (the live gateway) sees the band change; ``key_scope = "tenant"``: a run's service
moves only its own tenant's counter. Decision logic only: no I/O, no clock; the simulator
and the live gateway wrap any policy the same way (:func:`fair_share`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import ClassVar

from hermes.core.policies.base import RequestKey, SchedulingPolicy
from hermes.core.state import RequestView, RunState, UnitObservation

#: ``run.policy_state`` entry: the wrapped policy's own rank of the run
_INNER_RANK = "fair_share_inner_rank"
_TOP = math.nextafter(1.0, 0.0)


def squash(rank: float) -> float:
    """A rank mapped monotonically into ``[0, 1)`` (``-inf`` -> 0; ``inf``, NaN -> just
    below 1)."""
    if rank != rank:
        return _TOP
    return min(_TOP, 0.5 + math.atan(rank) / math.pi)


class FairShare(SchedulingPolicy):
    """``inner`` within per-tenant bands of served tokens (module docstring)."""

    name: ClassVar[str] = "fair-share"
    dynamic_keys: ClassVar[bool] = True
    key_scope: ClassVar[str] = "tenant"

    def __init__(self, inner: SchedulingPolicy, *, quantum_tokens: float = 2048.0,
                 weights: Mapping[str, float] | None = None) -> None:
        if not quantum_tokens > 0:
            raise ValueError(f"quantum_tokens must be > 0, got {quantum_tokens}")
        for t, w in (weights or {}).items():
            if not (isinstance(w, int | float) and w > 0 and math.isfinite(w)):
                raise ValueError(f"weight of tenant {t!r} must be a positive number, got {w!r}")
        self.inner = inner
        self.quantum = float(quantum_tokens)
        self.weights = dict(weights or {})
        self.counters: dict[str, float] = defaultdict(float)
        self._active: dict[str, int] = defaultdict(int)
        self.name = f"{inner.name}+fair-share"  # type: ignore[misc]
        self.uses_estimator = inner.uses_estimator  # type: ignore[misc]
        self.uses_truth = inner.uses_truth  # type: ignore[misc]
        self.refine = inner.refine  # type: ignore[misc]
        self.aging_keys = inner.aging_keys

    # ------------------------------------------------------------------ bands
    def band(self, tenant: str) -> int:
        """The tenant's band: its served tokens over its weight, in quanta."""
        return int(self.counters.get(tenant, 0.0) // self.quantum)

    def _compose(self, run: RunState) -> None:
        """Keep the inner rank aside and make ``run.rank`` ``band + squash(inner rank)``."""
        run.policy_state[_INNER_RANK] = run.rank
        run.rank = self.band(run.tenant) + squash(run.rank)

    def _restore(self, run: RunState) -> None:
        """Give the inner policy its own rank back before it reads or updates it."""
        inner = run.policy_state.get(_INNER_RANK)
        if inner is not None:
            run.rank = inner

    # ------------------------------------------------------------------ events
    def on_arrival(self, run: RunState, now: float) -> None:
        t = run.tenant
        if self._active[t] == 0:
            others = [self.counters[o] for o, n in self._active.items() if n > 0 and o != t]
            if others:
                self.counters[t] = max(self.counters[t], min(others) - self.quantum)
        self._active[t] += 1
        self.inner.on_arrival(run, now)
        self._compose(run)

    def on_unit_start(self, run: RunState, unit: str, now: float) -> None:
        self._restore(run)
        self.inner.on_unit_start(run, unit, now)
        self._compose(run)

    def on_unit_finish(self, run: RunState, obs: UnitObservation, now: float) -> None:
        self._restore(run)
        self.inner.on_unit_finish(run, obs, now)
        self._compose(run)

    def on_service(self, run: RunState, seconds: float, tokens: int, now: float) -> None:
        self.counters[run.tenant] += tokens / self.weights.get(run.tenant, 1.0)
        self._restore(run)
        self.inner.on_service(run, seconds, tokens, now)
        self._compose(run)

    def on_finish(self, run: RunState, now: float) -> None:
        self._active[run.tenant] = max(0, self._active[run.tenant] - 1)
        self._restore(run)
        self.inner.on_finish(run, now)
        self._compose(run)

    # ------------------------------------------------------------------ ranks and keys
    def rank(self, run: RunState, now: float) -> float:
        return self.band(run.tenant) + squash(self.inner.rank(run, now))

    def request_key(self, run: RunState, req: RequestView, now: float) -> RequestKey:
        outer = run.rank
        self._restore(run)
        try:
            key = self.inner.request_key(run, req, now)
        finally:
            run.rank = outer
        return (float(self.band(run.tenant)), *key)


def policy_rank(run: RunState) -> float:
    """The run's rank as its policy gave it (what the admin and runs APIs show): without the
    fair-share band a :class:`FairShare` wrapper adds, else ``run.rank`` itself."""
    inner = run.policy_state.get(_INNER_RANK)
    return float(inner) if inner is not None else run.rank


def fair_share(policy: SchedulingPolicy, *, quantum_tokens: float = 2048.0,
               weights: Mapping[str, float] | None = None) -> SchedulingPolicy:
    """``policy`` within per-tenant fair-share bands (:class:`FairShare`)."""
    return FairShare(policy, quantum_tokens=quantum_tokens, weights=weights)

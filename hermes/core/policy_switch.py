"""Live policy switch and the K knob: pure decision helpers (no I/O, no clock).

:func:`adopt_runs` hands the active runs to a newly installed policy; :func:`resolve_k` says
which prewarming knob applies to a run. Both are called by the gateway's admin API and can be
called by the simulator for what-if studies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hermes.core.policies.base import SchedulingPolicy
from hermes.core.state import RunState

#: scopes of the K knob, most specific last (a later scope overrides an earlier one)
KNOB_SCOPES: tuple[str, ...] = ("default", "tenant", "app")


def adopt_runs(policy: SchedulingPolicy, runs: Iterable[RunState], now: float) -> int:
    """Rank ``runs`` afresh under ``policy`` (just installed); returns how many were ranked.

    The old policy's per-run scratch (``policy_state``, refresh points) is dropped and each run
    is treated as if it arrived now with the progress and attained service it already has:
    ``on_arrival``, then ``on_unit_start`` for the unit it is in. Counters a policy keeps
    across runs (VTC's tenant counters) start from zero.
    """
    n = 0
    for st in runs:
        st.policy_state = {}
        st.next_refresh_attained_s = float("inf")
        st.rank_refreshed_at = float("-inf")
        policy.on_arrival(st, now)
        if st.progress.current is not None:
            policy.on_unit_start(st, st.progress.current, now)
        n += 1
    return n


def resolve_k(
    knobs: Mapping[str, Mapping[str, float]],
    default: float,
    *,
    app: str | None = None,
    tenant: str | None = None,
    run_k: float | None = None,
) -> float:
    """The K that applies to a run: its own ``k``, else the tenant's, else the app's, else
    ``knobs["default"][""]`` when set, else ``default`` (the configured ``scheduler.k``).
    A tenant's K (how much backend waste it accepts for latency) is the more specific
    setting, so it wins over the app's (the prewarm planner's ``k_for`` uses this order).

    ``knobs`` is the scheduler's ``knobs`` dict: ``{"default": {"": k}, "tenant": {name: k},
    "app": {name: k}}`` (missing scopes allowed).
    """
    if run_k is not None:
        return float(run_k)
    if tenant is not None and tenant in knobs.get("tenant", {}):
        return float(knobs["tenant"][tenant])
    if app is not None and app in knobs.get("app", {}):
        return float(knobs["app"][app])
    return float(knobs.get("default", {}).get("", default))

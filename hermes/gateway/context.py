"""What every service of the live scheduler shares: the config, the scheduler clock, the
policy with its estimators, counters and the metrics hooks.

One :class:`SchedulerContext` per gateway, built by :class:`~hermes.gateway.scheduler.
LiveScheduler` and handed to the run registry, the node table, dispatch, the prewarm planner,
learning and durability. The policy and its estimator pool are read from it at each use,
never cached, because ``PUT /admin/policy`` replaces both while the gateway runs
(:meth:`~hermes.gateway.scheduler.LiveScheduler.switch_policy`).

Clock: every time handed to the core is the *scheduler clock* (:meth:`SchedulerClock.now`),
wall-clock epoch time when ``time_scale`` is 1 and otherwise running ``time_scale`` times
faster (the built-in engine runs at the same scale), so run records, ACT and PDGraph
durations are in model seconds either way.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from hermes.core.costmodel import CostModel
from hermes.core.estimator import EstimatorPool
from hermes.core.policies.base import SchedulingPolicy, make_policy, policy_class
from hermes.core.policies.fair_share import fair_share
from hermes.gateway.config import GatewayConfig
from hermes.gateway.sample_cache import CachingEstimatorPool


class SchedulerClock:
    """Model seconds: epoch time at ``time_scale`` 1, ``time_scale`` times faster otherwise."""

    def __init__(self, time_scale: float = 1.0) -> None:
        self.time_scale = time_scale
        self._t0_wall = time.time()
        self._t0_mono = time.monotonic()

    def now(self) -> float:
        """The scheduler clock (model seconds; epoch time when ``time_scale`` is 1)."""
        return self._t0_wall + (time.monotonic() - self._t0_mono) * self.time_scale

    @property
    def start(self) -> float:
        """The clock's reading when the gateway started (moved by :meth:`not_before`)."""
        return self._t0_wall

    def wall_s(self, model_s: float) -> float:
        """Wall seconds that ``model_s`` model seconds take at the configured time scale."""
        return model_s / self.time_scale

    def not_before(self, t: float) -> None:
        """Move the clock forward to just past ``t`` if it is behind: a restarted gateway
        keeps its clock monotonic across the restart (stored runs' times)."""
        if self.now() < t:
            self._t0_wall += t - self.now() + 1e-3


@dataclass(eq=False)
class SchedulerContext:
    """The state the gateway's services share (see the module docstring)."""

    config: GatewayConfig
    clock: SchedulerClock
    cost: CostModel
    #: the policy in use (replaced by a live switch: read it at each use)
    policy: SchedulingPolicy
    #: the policy's estimator pool, None for policies without estimates (replaced with it)
    pool: Any | None
    #: counters shown by ``/healthz`` and exported as metrics
    stats: dict[str, int] = field(default_factory=lambda: {
        "runs_finished": 0, "records_written": 0, "rekeys_sent": 0})
    #: the K knob per scope, set by the admin API: {"default": {"": k}, "app": {name: k},
    #: "tenant": {name: k}}; read with :func:`hermes.core.policy_switch.resolve_k`
    knobs: dict[str, dict[str, float]] = field(default_factory=lambda: {
        "default": {}, "app": {}, "tenant": {}})
    #: metrics hooks (a :class:`hermes.metrics.GatewayMetrics`, set by the app) or None
    metrics: Any = None
    #: sequence numbers of queued work (the last tie-break of queue keys), shared by
    #: requests and KV prewarms so that both order alike at a node
    seq: itertools.count[int] = field(default_factory=itertools.count)

    def now(self) -> float:
        return self.clock.now()


def build_pool(config: GatewayConfig, kb: Any | None, cost: CostModel,
               policy: str | None = None) -> Any | None:
    """The estimator pool of ``policy`` (the configured one by default), seeded with the
    knowledge base's PDGraphs; None for a policy that uses no estimates."""
    cls = policy_class(policy or config.scheduler.policy)
    if not getattr(cls, "uses_estimator", False):
        return None
    sc = config.scheduler
    graphs = {}
    if kb is not None:
        for app in kb.list_apps():
            g = kb.get(app)
            if g is not None:
                graphs[app] = g
    return EstimatorPool(
        graphs,
        cost,
        refine=bool(getattr(cls, "refine", True)) and sc.refine,
        n_walks=sc.n_walks,
        min_match=sc.min_match,
        seed=sc.seed,
    )


def startup_policy(config: GatewayConfig, pool: Any | None) -> SchedulingPolicy:
    """The configured policy; it samples through a memo of identical run states
    (:mod:`hermes.gateway.sample_cache`), and builds a unit's per-bucket rank table when it
    is first read (``tables_on_demand``: here a request's service is credited when its
    answer comes, and most units end before a bucket refresh would read the table), and
    does not re-rank a run whose last running unit ended (``defer_idle_ranks``: a
    header-less call is a unit of an inferred run, idle until the client's next call)."""
    sc = config.scheduler
    max_bytes = int(config.stores.sample_cache_mb * (1 << 20))
    policy_pool = CachingEstimatorPool(pool, max_bytes=max_bytes) if pool is not None else None
    policy = make_policy(sc.policy, estimators=policy_pool, seed=sc.seed)
    if hasattr(policy, "tables_on_demand"):
        policy.tables_on_demand = True
    if hasattr(policy, "defer_idle_ranks"):
        policy.defer_idle_ranks = True
    return with_fair_share(config, policy)


def with_fair_share(config: GatewayConfig, policy: SchedulingPolicy) -> SchedulingPolicy:
    """``policy`` within per-tenant fair-share bands when ``scheduler.fair_share`` is on
    (by default: when authentication is on)."""
    sc = config.scheduler
    if sc.fair_share == "off" or (sc.fair_share == "auto" and not (
            config.security.auth_file or config.security.auth_redis)):
        return policy  # auto: on with authentication on (tenants are then real, not claims)
    return fair_share(policy, quantum_tokens=sc.fair_share_quantum_tokens,
                      weights=sc.tenant_weights)

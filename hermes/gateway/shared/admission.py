"""Per-tenant admission shared by every gateway process: exact across edges, not N times.

:class:`SharedAdmission` has the surface of :class:`hermes.core.limits.Admission` (``admit``,
``release``, ``limits``, ``runs_allowed``, ``default``, ``per_tenant``), so the security
middleware uses either. Its state is in Redis, decided by one Lua script per request (check
everything, then spend everything, atomically; the time is the Redis server's, so the edges'
clocks need not agree). Keys per tenant ``T`` (hash-tagged ``{T}`` so that they share a slot
under Redis Cluster):

=============================  =====  =======================================================
``P q:{T}:bucket``             hash   token bucket (``rate``/``burst``): ``tokens``, ``stamp``
``P q:{T}:win``                zset   admissions of the last 60 s (``rpm``; exact window)
``P q:{T}:inflight``           zset   requests in flight (``max_concurrent``), scored by the
                                      end of their lease: a request of an edge killed before
                                      it released frees its slot after ``lease_s``
=============================  =====  =======================================================

Every key expires once it would be empty or full again, so idle tenants cost nothing.
``max_active_runs`` is the scheduler's (it holds the runs: one registry, exact already).

When the store does not answer (:class:`~hermes.gateway.shared.store.StoreUnavailable`):
``cluster.store_unavailable = "refuse"``: :meth:`SharedAdmission.admit` raises it (the
middleware answers 503 ``store_unavailable``); ``"admit-local"``: the process's own in-memory
:class:`~hermes.core.limits.Admission` decides (limits then per instance, counted as
``admitted-local`` and logged by the store).
"""

from __future__ import annotations

import itertools
import math
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from hermes.core.limits import Admission, TenantLimits
from hermes.gateway.shared.store import SharedStore, StoreUnavailable

_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local conc, rpm = tonumber(ARGV[3]), tonumber(ARGV[4])
local member, lease = ARGV[5], tonumber(ARGV[6])
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= conc then return {0, '1', 'concurrent'} end
end
local tokens = 0
if rate > 0 then
  local b = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
  tokens = tonumber(b[1])
  local stamp = tonumber(b[2])
  if tokens == nil or stamp == nil then tokens = burst; stamp = now end
  if now > stamp then tokens = math.min(burst, tokens + (now - stamp) * rate) end
  if tokens < 1 then return {0, tostring((1 - tokens) / rate), 'rate'} end
end
if rpm > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - 60)
  if redis.call('ZCARD', KEYS[2]) >= rpm then
    local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return {0, tostring(tonumber(oldest[2]) + 60 - now), 'rpm'}
  end
  redis.call('ZADD', KEYS[2], now, member)
  redis.call('EXPIRE', KEYS[2], 61)
end
if rate > 0 then
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens - 1), 'stamp', tostring(now))
  redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
end
if conc > 0 then
  redis.call('ZADD', KEYS[3], now + lease, member)
  redis.call('EXPIRE', KEYS[3], math.ceil(lease) + 1)
end
return {1, '0', ''}
"""


@dataclass(slots=True)
class SharedAdmission:
    """Per-tenant admission in the shared store (module docstring). ``lease_s``: how long an
    in-flight slot is held at most (a crashed edge's slots come back after it)."""

    store: SharedStore
    default: TenantLimits = field(default_factory=TenantLimits)
    per_tenant: dict[str, TenantLimits] = field(default_factory=dict)
    lease_s: float = 600.0
    #: the process's own limits, used with ``store_unavailable = "admit-local"``
    local: Admission = field(default_factory=Admission)
    concurrency_retry_s: float = 1.0
    #: tenant -> in-flight members this process admitted (None: admitted locally)
    _held: dict[str, list[str | None]] = field(default_factory=dict)
    _script: Any = None
    _ascript: Any = None
    _ids: Any = None
    _edge: str = ""

    def __post_init__(self) -> None:
        self._script = self.store.register_script(_ADMIT)
        self._ids = itertools.count()
        self._edge = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.local.default = self.default

    def limits(self, tenant: str) -> TenantLimits:
        return self.per_tenant.get(tenant, self.default)

    def admit(self, tenant: str, now: float) -> tuple[bool, float, str]:
        """``(ok, retry_after_s, reason)`` as :meth:`Admission.admit`, decided in the shared
        store (``now`` is used only by the local fallback); blocking."""
        lim, call = self._call(tenant)
        if call is None:
            return self._admitted(tenant, lim, "")
        try:
            got = self.store.call("admission", lambda: self._script(**call), counted=False)
        except StoreUnavailable:
            return self._unavailable(tenant, now)
        return self._decide(tenant, lim, call, got)

    async def admit_async(self, tenant: str, now: float) -> tuple[bool, float, str]:
        """:meth:`admit` on the asyncio client (the event loop serves other requests during
        the round trip): what the security middleware calls."""
        lim, call = self._call(tenant)
        if call is None:
            return self._admitted(tenant, lim, "")
        if self._ascript is None:
            self._ascript = self.store.register_async_script(_ADMIT)
        script = self._ascript
        try:
            got = await self.store.acall("admission", lambda: script(**call), counted=False)
        except StoreUnavailable:
            return self._unavailable(tenant, now)
        return self._decide(tenant, lim, call, got)

    def _call(self, tenant: str) -> tuple[TenantLimits, dict[str, Any] | None]:
        """The tenant's limits and the script's keys and arguments (None: nothing to count)."""
        lim = self.limits(tenant)
        if lim.rate is None and lim.rpm is None and lim.max_concurrent is None:
            return lim, None
        member = f"{self._edge}:{next(self._ids)}"
        rate = lim.rate or 0.0
        burst = lim.burst if lim.burst is not None else max(1.0, rate)
        tag = "{" + tenant + "}"
        keys = [self.store.key("q", tag, "bucket"), self.store.key("q", tag, "win"),
                self.store.key("q", tag, "inflight")]
        args = [repr(float(rate)), repr(float(burst)), lim.max_concurrent or 0, lim.rpm or 0,
                member, repr(float(self.lease_s))]
        return lim, {"keys": keys, "args": args}

    def _admitted(self, tenant: str, lim: TenantLimits, member: str) -> tuple[bool, float, str]:
        self._held.setdefault(tenant, []).append(member if lim.max_concurrent else "")
        return True, 0.0, ""

    def _unavailable(self, tenant: str, now: float) -> tuple[bool, float, str]:
        """The store did not answer: refuse (raise) or decide locally, per the policy."""
        if self.store.policy != "admit-local":
            self.store.count("admission", "refused")
            raise StoreUnavailable("admission", "the shared store did not answer")
        self.store.count("admission", "admitted-local")
        self.local.per_tenant = self.per_tenant
        self.local.default = self.default
        got = self.local.admit(tenant, now)
        if got[0]:
            self._held.setdefault(tenant, []).append(None)
        return got

    def _decide(self, tenant: str, lim: TenantLimits, call: dict[str, Any],
                got: Any) -> tuple[bool, float, str]:
        ok, wait, why = got
        if int(ok) == 1:
            return self._admitted(tenant, lim, str(call["args"][4]))
        why = why.decode() if isinstance(why, bytes) else str(why)
        wait_s = float(wait)
        if why == "concurrent":
            return False, self.concurrency_retry_s, (
                f"tenant {tenant!r} has {lim.max_concurrent} requests in flight (its quota)")
        if why == "rpm":
            return False, max(wait_s, 0.001), (
                f"tenant {tenant!r} is over its limit of {lim.rpm} requests a minute")
        return False, wait_s if math.isfinite(wait_s) else math.inf, (
            f"tenant {tenant!r} is over its rate limit of {lim.rate or 0.0:g}/s")

    def _pop(self, tenant: str) -> str | None:
        """The in-flight member an ending request gives back ("" none, None local)."""
        held = self._held.get(tenant)
        if not held:
            return ""
        member = held.pop()
        if not held:
            del self._held[tenant]
        if member is None:
            self.local.release(tenant)
        return member

    def release(self, tenant: str) -> None:
        """An admitted request ended: its in-flight slot is freed (in the store, or locally
        for one admitted by the local fallback). A store that does not answer now leaves the
        slot to its lease."""
        member = self._pop(tenant)
        if member:
            key = self.store.key("q", "{" + tenant + "}", "inflight")
            try:
                self.store.call("admission-release", lambda: self.store.client.zrem(key, member))
            except StoreUnavailable:
                pass

    async def release_async(self, tenant: str) -> None:
        """:meth:`release` on the asyncio client."""
        member = self._pop(tenant)
        if member:
            key = self.store.key("q", "{" + tenant + "}", "inflight")
            try:
                await self.store.acall("admission-release",
                                       lambda: self.store.aclient.zrem(key, member))
            except StoreUnavailable:
                pass

    def runs_allowed(self, tenant: str, active_runs: int) -> tuple[bool, str]:
        """Whether ``tenant`` may start another run (the scheduler counts them)."""
        lim = self.limits(tenant)
        if lim.max_active_runs is not None and active_runs >= lim.max_active_runs:
            return False, f"tenant {tenant!r} has {active_runs} active runs (quota {lim.max_active_runs})"
        return True, ""

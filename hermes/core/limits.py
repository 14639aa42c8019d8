"""Admission limits: per-tenant token buckets and concurrency quotas (no I/O, no clock).

Both are pure decision objects: every call takes ``now`` (seconds, any monotonic origin) and
answers whether a request may go ahead and, if not, how long to wait (the ``Retry-After`` a
gateway sends with 429). The live gateway drives them from its HTTP middleware; a simulator
could drive the same objects in virtual time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

#: the window of a per-minute limit (s)
MINUTE_S = 60.0


@dataclass(slots=True)
class TokenBucket:
    """A token bucket: ``rate`` tokens a second, at most ``burst`` saved up.

    :meth:`take` spends ``cost`` tokens if the bucket holds them and returns 0.0, else leaves
    the bucket as it is and returns the seconds until it would hold them.
    """

    rate: float
    burst: float
    tokens: float = -1.0  # -1: full at the first call
    stamp: float | None = None

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst <= 0:
            raise ValueError(f"token bucket needs rate > 0 and burst > 0, got {self.rate}, {self.burst}")
        if self.tokens < 0:
            self.tokens = self.burst

    def _refill(self, now: float) -> None:
        if self.stamp is not None and now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        if self.stamp is None or now > self.stamp:
            self.stamp = now

    def take(self, now: float, cost: float = 1.0) -> float:
        """Spend ``cost`` tokens now (0.0), or the wait in seconds until that is possible."""
        self._refill(now)
        if cost > self.burst:
            return math.inf
        if self.tokens >= cost:
            self.tokens -= cost
            return 0.0
        return (cost - self.tokens) / self.rate


@dataclass(slots=True)
class SlidingWindow:
    """At most ``limit`` events in any ``window_s`` seconds: the times of the last ``limit``
    admitted events are kept (memory O(limit)), so the count is exact, unlike a token bucket
    whose refill lets ``burst + rate * t`` through in ``t`` seconds."""

    limit: int
    window_s: float = MINUTE_S
    times: deque[float] = field(default_factory=deque)

    def take(self, now: float) -> float:
        """Record an event now (0.0), or the seconds until the oldest one leaves the window."""
        times = self.times
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) >= self.limit:
            return times[0] + self.window_s - now
        times.append(now)
        return 0.0


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """What one tenant may do: request rate (``rate`` per second, ``burst``), requests in
    flight at once (``max_concurrent``), runs active at once (``max_active_runs``) and
    requests in any 60 s (``rpm``: a sliding window, exact). ``None`` means unlimited."""

    rate: float | None = None
    burst: float | None = None
    max_concurrent: int | None = None
    max_active_runs: int | None = None
    rpm: int | None = None

    def counted(self) -> list[tuple[str, float]]:
        """The set limits that admission counts per request (``rate``, ``rpm``,
        ``max_concurrent``), as (name, value): what a process enforcing them from its own
        memory counts alone. ``max_active_runs`` is the scheduler's, ``burst`` shapes a rate."""
        return [(name, float(v)) for name, v in (("rate", self.rate), ("rpm", self.rpm),
                                                 ("max_concurrent", self.max_concurrent)) if v]


@dataclass(slots=True)
class Admission:
    """Per-tenant admission state: rate buckets and in-flight counts.

    ``admit(tenant, now)`` returns ``(ok, retry_after_s, reason)``; after an admitted request
    ends the caller calls :meth:`release`.
    """

    default: TenantLimits = field(default_factory=TenantLimits)
    per_tenant: dict[str, TenantLimits] = field(default_factory=dict)
    buckets: dict[str, TokenBucket] = field(default_factory=dict)
    inflight: dict[str, int] = field(default_factory=dict)
    windows: dict[str, SlidingWindow] = field(default_factory=dict)
    #: Retry-After for a concurrency refusal: requests end at an unknown time, so a short hint
    concurrency_retry_s: float = 1.0

    def limits(self, tenant: str) -> TenantLimits:
        return self.per_tenant.get(tenant, self.default)

    def admit(self, tenant: str, now: float) -> tuple[bool, float, str]:
        lim = self.limits(tenant)
        if lim.max_concurrent is not None and self.inflight.get(tenant, 0) >= lim.max_concurrent:
            return False, self.concurrency_retry_s, (
                f"tenant {tenant!r} has {lim.max_concurrent} requests in flight (its quota)")
        bucket = None
        if lim.rate is not None:
            bucket = self.buckets.get(tenant)
            if bucket is None:
                burst = lim.burst if lim.burst is not None else max(1.0, lim.rate)
                bucket = self.buckets[tenant] = TokenBucket(lim.rate, burst)
            bucket._refill(now)
            if bucket.tokens < 1.0:
                return False, bucket.take(now), (
                    f"tenant {tenant!r} is over its rate limit of {lim.rate:g}/s")
        if lim.rpm is not None:
            window = self.windows.get(tenant)
            if window is None or window.limit != lim.rpm:
                window = self.windows[tenant] = SlidingWindow(
                    lim.rpm, times=window.times if window is not None else deque())
            wait = window.take(now)
            if wait > 0:
                return False, wait, (
                    f"tenant {tenant!r} is over its limit of {lim.rpm} requests a minute")
        if bucket is not None:
            bucket.take(now)  # checked above: spends a token
        self.inflight[tenant] = self.inflight.get(tenant, 0) + 1
        return True, 0.0, ""

    def release(self, tenant: str) -> None:
        n = self.inflight.get(tenant, 0) - 1
        if n > 0:
            self.inflight[tenant] = n
        else:
            self.inflight.pop(tenant, None)

    def runs_allowed(self, tenant: str, active_runs: int) -> tuple[bool, str]:
        """Whether ``tenant`` may start another run with ``active_runs`` already active."""
        lim = self.limits(tenant)
        if lim.max_active_runs is not None and active_runs >= lim.max_active_runs:
            return False, f"tenant {tenant!r} has {active_runs} active runs (quota {lim.max_active_runs})"
        return True, ""

"""The shared store's connection, and what a gateway does when it does not answer.

:class:`SharedStore` holds one redis-py client (socket and connect timeouts of
``cluster.store_timeout_s``) and the key prefix. Every command of the shared-state services
goes through :meth:`SharedStore.call`, which turns any Redis error into
:class:`StoreUnavailable` and keeps the outage visible:

- the gauge ``hermes_shared_store_up`` (1/0) and the counter
  ``hermes_shared_store_unavailable_total{op, action}`` (``action``: ``refused`` or
  ``admitted-local``, what the caller then did; :meth:`SharedStore.count`);
- one WARNING log line when the store goes down (naming the operation, the error and the
  ``cluster.store_unavailable`` setting in force) and one when it answers again; a single
  slow reply (a timeout) is logged at most every 10 s;
- a circuit breaker: the store is down after a connection error (refused, reset) or
  ``max_timeouts`` timeouts in a row; calls then fail at once for ``retry_s`` instead of
  each waiting for the socket timeout (most calls are synchronous, on the event loop: a
  store that hangs must not stall every request). One slow reply under load fails only its
  own call.

Admission, on every request, uses the asyncio client (:meth:`SharedStore.acall`): the event
loop serves other requests during its round trip.

What a service does with :class:`StoreUnavailable` is its own: admission refuses (503) or
admits by the process's own limits (``admit-local``), never silently.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Literal, TypeVar

import redis
import redis.asyncio

log = logging.getLogger("hermes.gateway.shared")

T = TypeVar("T")
Policy = Literal["refuse", "admit-local"]


class StoreUnavailable(RuntimeError):
    """The shared store did not answer ``op`` (or is in its retry pause after a failure)."""

    def __init__(self, op: str, cause: str) -> None:
        super().__init__(f"shared store unavailable ({op}): {cause}")
        self.op = op


class SharedStore:
    """A Redis client for the shared-state services, with outage accounting (module doc)."""

    def __init__(self, url: str, *, prefix: str = "hermes:", policy: Policy = "refuse",
                 timeout_s: float = 1.0, retry_s: float = 1.0,
                 client: redis.Redis | None = None) -> None:
        self.url = url
        self.client: redis.Redis = client if client is not None else redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            decode_responses=False)
        self._timeout_s = timeout_s
        self._aclient: redis.asyncio.Redis | None = None
        self.prefix = prefix
        self.policy: Policy = policy
        self.retry_s = retry_s
        self.max_timeouts = 3
        self.up = True
        self._down_until = 0.0
        self._timeouts = 0  # in a row
        self._slow_logged = 0.0
        #: (op, action) -> count of calls the store did not answer
        self.unavailable: Counter[tuple[str, str]] = Counter()

    def key(self, *parts: str) -> str:
        """A key under the prefix: ``key("q", tenant)`` -> ``hermes:q:{tenant}``."""
        return self.prefix + ":".join(parts)

    def call(self, op: str, fn: Callable[[], T], *, counted: bool = True) -> T:
        """``fn()`` (Redis commands); :class:`StoreUnavailable` when the store fails or is in
        its retry pause, counted as ``refused`` (``counted=False``: the caller counts what it
        did instead, e.g. admitted by its own limits)."""
        with self._guarded(op, counted):
            out = fn()
        return out

    @contextlib.contextmanager
    def _guarded(self, op: str, counted: bool) -> Iterator[None]:
        """One store call of :meth:`call` or :meth:`acall`: refused (and counted, unless
        ``counted`` is off) while in the retry pause or when Redis fails; its answer
        noted."""
        try:
            self._check(op)
            yield
        except redis.RedisError as e:
            if counted:
                self.count(op, "refused")
            raise self._failed(op, e) from None
        except StoreUnavailable:
            if counted:
                self.count(op, "refused")
            raise
        self._answered(op)

    @property
    def aclient(self) -> redis.asyncio.Redis:
        """The asyncio client (made on first use, on the loop that uses it)."""
        if self._aclient is None:
            self._aclient = redis.asyncio.Redis.from_url(
                self.url, socket_timeout=self._timeout_s,
                socket_connect_timeout=self._timeout_s, decode_responses=False)
        return self._aclient

    async def acall(self, op: str, fn: Callable[[], Awaitable[T]], *,
                    counted: bool = True) -> T:
        """:meth:`call` for the asyncio client: ``await fn()``."""
        with self._guarded(op, counted):
            out = await fn()
        return out

    def _check(self, op: str) -> None:
        if not self.up and time.monotonic() < self._down_until:
            raise StoreUnavailable(op, "in the retry pause after a failure")

    def _failed(self, op: str, e: Exception) -> StoreUnavailable:
        now = time.monotonic()
        if isinstance(e, redis.TimeoutError):
            self._timeouts += 1
            if self._timeouts < self.max_timeouts:
                if now - self._slow_logged >= 10.0:
                    self._slow_logged = now
                    log.warning("shared store %s slow: %s timed out (%s); that call is "
                                "treated as unavailable", self._where(), op, e)
                return StoreUnavailable(op, str(e))
        self._down_until = now + self.retry_s
        if self.up:
            self.up = False
            log.warning("shared store %s unavailable during %s: %s; cluster."
                        "store_unavailable = %r: %s", self._where(), op, e, self.policy,
                        "refusing with 503" if self.policy == "refuse" else
                        "admitting by this process's own limits (per instance)")
        return StoreUnavailable(op, str(e))

    def _answered(self, op: str) -> None:
        self._timeouts = 0
        if not self.up:
            self.up = True
            log.warning("shared store %s answers again (%s)", self._where(), op)

    def count(self, op: str, action: Literal["refused", "admitted-local"]) -> None:
        """Count a call the store did not answer and what the caller did instead."""
        self.unavailable[(op, action)] += 1

    def register_script(self, lua: str) -> Callable[..., Any]:
        """redis-py's :class:`~redis.commands.core.Script` (EVALSHA, loaded on first use)."""
        return self.client.register_script(lua)

    def register_async_script(self, lua: str) -> Callable[..., Any]:
        """The same on the asyncio client (:class:`~redis.commands.core.AsyncScript`)."""
        return self.aclient.register_script(lua)

    def _where(self) -> str:
        kw = self.client.connection_pool.connection_kwargs
        return f"{kw.get('host', '?')}:{kw.get('port', '?')}" if "host" in kw else self.url

    def close(self) -> None:
        self.client.close()

    async def aclose(self) -> None:
        """Close both clients (the asyncio one on its loop)."""
        if self._aclient is not None:
            await self._aclient.aclose()
            self._aclient = None
        self.client.close()


class SharedStoreCollector:
    """Prometheus collector of a :class:`SharedStore`'s health (``/metrics``)."""

    def __init__(self, store: SharedStore) -> None:
        self.store = store

    def describe(self) -> list[object]:
        return []

    def collect(self) -> object:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        up = GaugeMetricFamily("hermes_shared_store_up",
                               "1 while the shared store (cluster.store) answers, else 0")
        up.add_metric([], 1.0 if self.store.up else 0.0)
        yield up
        c = CounterMetricFamily(
            "hermes_shared_store_unavailable",
            "calls the shared store did not answer, by operation and what the gateway did "
            "instead (refused: 503; admitted-local: by this process's own limits)",
            labels=["op", "action"])
        for (op, action), n in sorted(self.store.unavailable.items()):
            c.add_metric([op, action], float(n))
        yield c

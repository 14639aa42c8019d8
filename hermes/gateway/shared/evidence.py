"""The run resolver's evidence index in the shared store: the next turn of an agent joins its
run whichever edge receives it (and after a scheduler failover).

:class:`RedisKeyIndex` implements :class:`hermes.gateway.resolve.index.EvidenceIndex`
(conversation digests, response ids, session and affinity ids -> run key). Keys for tenant
``T`` (hash-tagged for Redis Cluster):

==========================  ======  =========================================================
``P ix:{T}:HEX``            string  the run key, expiring after ``identity.index_ttl_s``
``P ix:{T}``                zset    the tenant's entries by time written: past
                                    ``identity.index_max_per_tenant`` its oldest are deleted
``P run:{T}:RUN``           hash    ``app``, ``app_id`` of an inferred run, for the edge that
                                    adopts it (:meth:`RedisKeyIndex.run_info`)
==========================  ======  =========================================================

A lookup of a conversation's candidate prefixes is one ``MGET``; a write one Lua script.
Joining needs more than the key: the run must still be active where runs live (the
scheduler's registry); :class:`hermes.gateway.identity.RunIdentities` asks it before the
resolver adopts the run (:meth:`Resolver.__init__`'s ``adopt``). TTLs are the Redis server's
wall seconds. The dataflow passage index stays per process (weaker evidence, many writes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from redis.exceptions import NoScriptError

from hermes.gateway.shared.store import SharedStore, StoreUnavailable

_PUT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl / 1000)
local over = redis.call('ZCARD', KEYS[2]) - cap
if over > 0 then
  for _, k in ipairs(redis.call('ZRANGE', KEYS[2], 0, over - 1)) do
    redis.call('DEL', ARGV[5] .. k)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
end
redis.call('PEXPIRE', KEYS[2], ttl)
return over > 0 and over or 0
"""


class RedisKeyIndex:
    """``(tenant, key) -> run key`` in Redis, with a per-tenant cap and a TTL."""

    def __init__(self, store: SharedStore, *, max_per_tenant: int, ttl_s: float) -> None:
        self.store = store
        self.max_per_tenant = max_per_tenant
        self.ttl_s = ttl_s
        self.evicted = 0
        self.expired = 0  # by Redis itself; not counted here
        self.written = 0
        self._tenants: set[str] = set()
        self._put: Callable[..., Any] = store.register_script(_PUT)

    def _base(self, tenant: str) -> str:
        return self.store.key("ix", "{" + tenant + "}")

    def __len__(self) -> int:
        """Entries this process wrote (the store's own count would take a scan of every
        tenant: not for a metrics scrape)."""
        return self.written

    @property
    def tenants(self) -> int:
        """Tenants this process wrote entries for (at most 10,000 counted)."""
        return len(self._tenants)

    def get(self, tenant: str, key: bytes, now: float) -> str | None:
        hit = self.get_first(tenant, [key], now)
        return None if hit is None else hit[1]

    def _soft(self, op: str, fn: Callable[[], Any], default: Any) -> Any:
        """``fn()`` through the store; when it does not answer: ``default`` with
        ``store_unavailable = "admit-local"`` (the request resolves as if there were no
        evidence: a new run), else :class:`StoreUnavailable` (503)."""
        try:
            return self.store.call(op, fn, counted=False)
        except StoreUnavailable:
            if self.store.policy != "admit-local":
                self.store.count(op, "refused")
                raise
            self.store.count(op, "admitted-local")
            return default

    def get_first(self, tenant: str, keys: Sequence[bytes], now: float
                  ) -> tuple[bytes, str] | None:
        if not keys:
            return None
        base = self._base(tenant)
        values = self._soft("index-get", lambda: self.store.client.mget(
            [f"{base}:{k.hex()}" for k in keys]), [None] * len(keys))
        for key, value in zip(keys, values, strict=True):
            if value is not None:
                return key, value.decode() if isinstance(value, bytes) else str(value)
        return None

    def put(self, tenant: str, key: bytes, value: str, now: float) -> None:
        self.put_many(tenant, [(key, value)], now)

    def put_many(self, tenant: str, items: Sequence[tuple[bytes, str]], now: float) -> None:
        """:meth:`put` of each ``(key, value)`` in one round trip (a pipeline of the write
        script, in order): an answer leaves several entries (the conversation it completes,
        what it asked, its tool-call ids), and a blocking round trip each held the edge's
        event loop that many times."""
        if not items:
            return
        self.written += len(items)
        if len(self._tenants) < 10_000:
            self._tenants.add(tenant)
        base = self._base(tenant)
        ttl_ms = max(1, int(self.ttl_s * 1000))
        prefix = base + ":"
        calls: list[tuple[list[str], list[str | int]]] = []
        for k, v in items:
            hexkey = k.hex()
            calls.append(([prefix + hexkey, base], [hexkey, v, ttl_ms, self.max_per_tenant,
                                                    prefix]))

        def run() -> int:
            if len(calls) == 1:
                return int(self._put(keys=calls[0][0], args=calls[0][1]))
            # EVALSHA in a plain pipeline: a script object in a pipeline makes redis-py ask
            # SCRIPT EXISTS first, a second round trip per batch; a server that lost the
            # script (restarted) answers NOSCRIPT: loaded, the batch sent again
            for attempt in (0, 1):
                pipe = self.store.client.pipeline(transaction=False)
                for keys, args in calls:
                    pipe.evalsha(self._put.sha, len(keys), *keys, *args)  # type: ignore[attr-defined]
                try:
                    return sum(int(n) for n in pipe.execute())
                except NoScriptError:
                    if attempt:
                        raise
                    self._put.sha = self.store.client.script_load(_PUT)  # type: ignore[attr-defined]
            return 0  # (not reached)

        self.evicted += int(self._soft("index-put", run, 0))

    def sweep(self, now: float) -> None:
        """Nothing to do: Redis expires entries itself."""

    def dump(self) -> list[list[Any]]:
        """Nothing: the entries live in the store (a restart finds them there)."""
        return []

    def load(self, rows: Iterable[Sequence[Any]]) -> None:
        """Insert rows of another index's dump (e.g. a single process moving to a store)."""
        for tenant, key, value, t in rows:
            self.put(str(tenant), bytes.fromhex(key), str(value), float(t))

    # ------------------------------------------------------------------ runs
    def remember_run(self, tenant: str, run_key: str, app: str, app_id: str) -> None:
        """Keep an inferred run's app, for an edge that adopts it later."""
        k = self.store.key("run", "{" + tenant + "}", run_key)

        def run() -> Any:
            pipe = self.store.client.pipeline(transaction=True)
            pipe.hset(k, mapping={"app": app, "app_id": app_id})
            pipe.pexpire(k, max(1, int(self.ttl_s * 1000)))
            return pipe.execute()

        self._soft("index-run", run, None)

    def forget_run(self, tenant: str, run_key: str) -> None:
        """The inferred run ended: no edge adopts it any more (a continuation of it starts a
        new run, as after a close in one process)."""
        self.forget_runs([(tenant, run_key)])

    def forget_runs(self, runs: Sequence[tuple[str, str]]) -> None:
        """:meth:`forget_run` for several ``(tenant, run key)`` in one round trip: one ``DEL``
        of all the keys of a tenant (its hash tag puts them in one Redis Cluster slot), in a
        pipeline when several tenants' runs ended. The scheduler forgets the runs it ended
        in a slice of the edges' closes so: a round trip per run, on its event loop, was a
        third of its time at 2,000 one-turn calls/s; a ``DEL`` per run in one pipeline
        still cost ~9 us of the scheduler's CPU per one-turn call at 4,000 calls/s
        (redis-py's work per command: queueing it, its reply, its callback)."""
        if not runs:
            return
        by_tenant: dict[str, list[str]] = {}
        for tenant, run_key in runs:
            by_tenant.setdefault(tenant, []).append(
                self.store.key("run", "{" + tenant + "}", run_key))

        def run() -> Any:
            client = self.store.client
            if len(by_tenant) == 1:
                return client.delete(*next(iter(by_tenant.values())))
            pipe = client.pipeline(transaction=False)
            for keys in by_tenant.values():
                pipe.delete(*keys)
            return pipe.execute()

        self._soft("index-run", run, None)

    def run_info(self, tenant: str, run_key: str) -> tuple[str, str] | None:
        """``(app, app_id)`` of an inferred run :meth:`remember_run` kept, or None."""
        k = self.store.key("run", "{" + tenant + "}", run_key)
        d = self._soft("index-run", lambda: self.store.client.hgetall(k), {})
        if not d:
            return None
        get = {(a.decode() if isinstance(a, bytes) else a): (b.decode() if isinstance(b, bytes)
                                                            else b) for a, b in d.items()}
        return get.get("app", ""), get.get("app_id", "")

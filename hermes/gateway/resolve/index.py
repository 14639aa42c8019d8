"""A bounded, expiring, per-tenant map from evidence keys to run keys.

One structure holds every kind of evidence the resolver remembers: digests of answered
conversations, response ids, session ids, affinity values (their keys are namespaced by
:func:`hermes.gateway.resolve.canon.key_digest`). Bounds, whatever clients send (issue 17,
item 4):

- each tenant's entries are kept in insertion order (a re-inserted key moves to the end), so
  the oldest is first: entries older than ``ttl_s`` are dropped from the front, lazily on
  every insert for that tenant and for all tenants in :meth:`KeyIndex.sweep`;
- past ``max_per_tenant`` a tenant's oldest entry goes (a tenant flooding never-repeating
  conversations only evicts its own);
- past ``max_entries`` in all, the oldest entry of the least recently written tenant goes
  (idle tenants' conversations are the likeliest to be over).

A lookup never refreshes an entry: a continued conversation is indexed again, longer, when
it is answered. Everything is O(1) amortised per operation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, Protocol


class EvidenceIndex(Protocol):
    """What the resolver asks of its evidence index: :class:`KeyIndex` in one process, or
    a shared one (:class:`hermes.gateway.shared.evidence.RedisKeyIndex`) that every edge
    reads and writes, so that evidence left by one edge leads another to the run."""

    evicted: int
    expired: int

    def __len__(self) -> int: ...

    @property
    def tenants(self) -> int: ...

    def get(self, tenant: str, key: bytes, now: float) -> str | None: ...

    def get_first(self, tenant: str, keys: Sequence[bytes], now: float
                  ) -> tuple[bytes, str] | None: ...

    def put(self, tenant: str, key: bytes, value: str, now: float) -> None: ...

    def put_many(self, tenant: str, items: Sequence[tuple[bytes, str]], now: float) -> None:
        """:meth:`put` of each ``(key, value)``, in order (a shared index: one round trip)."""
        ...

    def sweep(self, now: float) -> None: ...

    def dump(self) -> list[list[Any]]: ...

    def load(self, rows: Iterable[Sequence[Any]]) -> None: ...


class KeyIndex:
    """``(tenant, key) -> run key`` with per-tenant and global caps and a TTL."""

    __slots__ = ("max_entries", "max_per_tenant", "ttl_s", "_tenants", "_n", "evicted",
                 "expired")

    def __init__(self, *, max_entries: int, max_per_tenant: int, ttl_s: float) -> None:
        self.max_entries = max_entries
        self.max_per_tenant = max_per_tenant
        self.ttl_s = ttl_s
        #: tenant -> its entries, oldest first; tenants least recently written first
        self._tenants: OrderedDict[str, OrderedDict[bytes, tuple[str, float]]] = OrderedDict()
        self._n = 0
        self.evicted = 0  # entries dropped by a cap
        self.expired = 0  # entries dropped by the TTL

    def __len__(self) -> int:
        return self._n

    @property
    def tenants(self) -> int:
        return len(self._tenants)

    def get(self, tenant: str, key: bytes, now: float) -> str | None:
        """The run key stored under ``key`` for ``tenant``, unless absent or expired."""
        entries = self._tenants.get(tenant)
        if entries is None:
            return None
        entry = entries.get(key)
        if entry is None:
            return None
        if now - entry[1] > self.ttl_s:
            del entries[key]
            self._n -= 1
            self.expired += 1
            return None
        return entry[0]

    def get_first(self, tenant: str, keys: Sequence[bytes], now: float
                  ) -> tuple[bytes, str] | None:
        """``(key, run key)`` of the first of ``keys`` that is present, else None (a shared
        index answers it in one round trip)."""
        for key in keys:
            value = self.get(tenant, key, now)
            if value is not None:
                return key, value
        return None

    def put_many(self, tenant: str, items: Sequence[tuple[bytes, str]], now: float) -> None:
        """:meth:`put` of each ``(key, value)``, in order."""
        for key, value in items:
            self.put(tenant, key, value, now)

    def put(self, tenant: str, key: bytes, value: str, now: float) -> None:
        """Store ``value`` under ``key`` (replacing and refreshing an existing entry)."""
        tenants = self._tenants
        entries = tenants.get(tenant)
        if entries is None:
            entries = tenants[tenant] = OrderedDict()
        else:
            tenants.move_to_end(tenant)
            if entries.pop(key, None) is not None:
                self._n -= 1
        entries[key] = (value, now)
        self._n += 1
        self._expire(entries, now)
        while len(entries) > self.max_per_tenant:
            entries.popitem(last=False)
            self._n -= 1
            self.evicted += 1
        while self._n > self.max_entries:
            oldest_tenant, oldest = next(iter(tenants.items()))
            oldest.popitem(last=False)
            self._n -= 1
            self.evicted += 1
            if not oldest:
                del tenants[oldest_tenant]

    def _expire(self, entries: OrderedDict[bytes, tuple[str, float]], now: float) -> None:
        cutoff = now - self.ttl_s
        while entries:
            first = next(iter(entries.values()))
            if first[1] >= cutoff:
                break
            entries.popitem(last=False)
            self._n -= 1
            self.expired += 1

    def dump(self) -> list[list[Any]]:
        """Every entry as ``[tenant, key hex, value, time]``, oldest tenant and entry first
        (:meth:`load` puts them back in that order)."""
        return [[tenant, key.hex(), value, t] for tenant, entries in self._tenants.items()
                for key, (value, t) in entries.items()]

    def load(self, rows: Iterable[Sequence[Any]]) -> None:
        """Insert :meth:`dump` rows (caps and TTL apply as to any insert; a row's own time is
        kept, so an entry expires when it would have)."""
        for tenant, key, value, t in rows:
            self.put(str(tenant), bytes.fromhex(key), str(value), float(t))

    def sweep(self, now: float) -> None:
        """Drop every expired entry (and tenants left empty): O(expired + tenants)."""
        for tenant in list(self._tenants):
            entries = self._tenants[tenant]
            self._expire(entries, now)
            if not entries:
                del self._tenants[tenant]

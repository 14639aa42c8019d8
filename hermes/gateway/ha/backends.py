"""The one place an election store is chosen: by the scheme of ``[ha] election`` (``--ha``).

- ``redis://``, ``rediss://``, ``unix://``: :class:`~hermes.gateway.ha.store.RedisLeaseStore`;
- ``etcd://``, ``etcds://`` (TLS): :class:`~hermes.gateway.ha.etcd_store.EtcdLeaseStore`
  (the ``ha-etcd`` extra).

A Kubernetes Lease is a documented option, not built (docs/ha.md).
"""

from __future__ import annotations

from hermes.gateway.config import ELECTION_SCHEMES
from hermes.gateway.ha.base import LeaseStore
from hermes.gateway.ha.etcd_store import EtcdLeaseStore
from hermes.gateway.ha.store import RedisLeaseStore

#: scheme -> the store serving it (every scheme of ELECTION_SCHEMES, none other)
BACKENDS: dict[str, type[RedisLeaseStore] | type[EtcdLeaseStore]] = {
    "redis": RedisLeaseStore, "rediss": RedisLeaseStore, "unix": RedisLeaseStore,
    "etcd": EtcdLeaseStore, "etcds": EtcdLeaseStore,
}


def open_lease_store(url: str, *, prefix: str | None = None,
                     timeout_s: float = 0.5) -> LeaseStore:
    """The election store at ``url`` (``prefix``: its keys' prefix; None: the store's own
    default); ValueError naming the accepted schemes for any other URL."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    store = BACKENDS.get(scheme)
    if store is None:
        raise ValueError(f"[ha] election: {url!r} is not an election store; accepted: "
                         f"{', '.join(s + '://' for s in ELECTION_SCHEMES)} (Redis or etcd)")
    if prefix is None:
        return store(url, timeout_s=timeout_s)
    return store(url, prefix=prefix, timeout_s=timeout_s)

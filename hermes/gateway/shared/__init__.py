"""State that must be exact across several gateway processes, in a shared store (Redis).

One process (``hermes serve`` without ``[cluster] store``) keeps all of it in memory, as
before. Several edges behind a load balancer share it through Redis, each concept behind a
small interface with an in-memory and a Redis implementation, picked by
:func:`open_shared_state` from the config:

- per-tenant admission (:mod:`.admission`): rate, per-minute window and in-flight limits,
  exact with N edges (not N times the limit);
- idempotency keys of ``POST /v1/runs`` (:mod:`.idempotency`): one run per key whichever
  edge receives the retry;
- stored Responses (:mod:`.responses`): per-tenant caps, durable with Redis persistence,
  ``previous_response_id`` continued from any edge;
- the run resolver's evidence index (:mod:`.evidence`): a conversation's next turn, a
  session id or a response id leads to its run from any edge (and after a scheduler
  failover);
- API keys and their revocation are the Redis key store's (``security.auth_redis``,
  :class:`hermes.gateway.keys.RedisKeyStore`, checked on every request).

When the store does not answer (:mod:`.store`): refuse (503) or admit by the process's own
limits (``cluster.store_unavailable``), counted in a metric and logged, never silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hermes.gateway.shared.admission import SharedAdmission
from hermes.gateway.shared.store import SharedStore, StoreUnavailable

__all__ = ["SharedAdmission", "SharedState", "SharedStore", "StoreUnavailable",
           "open_shared_state"]


@dataclass(slots=True)
class SharedState:
    """The shared-state services of one gateway process, on one :class:`SharedStore`."""

    store: SharedStore
    responses: Any  # hermes.gateway.shared.responses.RedisResponseStore
    idempotency: Any  # hermes.gateway.shared.idempotency.RedisIdempotency
    evidence: Any  # hermes.gateway.shared.evidence.RedisKeyIndex

    def close(self) -> None:
        self.store.close()

    async def aclose(self) -> None:
        await self.store.aclose()


def open_shared_state(config: Any) -> SharedState | None:
    """The shared-state services of ``config.cluster.store``, or None without one (one
    process: the in-memory implementations). Connects lazily: a store down at start is
    an outage like any other (refused or admitted locally, logged and counted)."""
    cl = config.cluster
    if not cl.store:
        return None
    from hermes.gateway.responses import DEFAULT_MAX_STORED, DEFAULT_RETENTION_S
    from hermes.gateway.shared.evidence import RedisKeyIndex
    from hermes.gateway.shared.idempotency import RedisIdempotency
    from hermes.gateway.shared.responses import RedisResponseStore

    store = SharedStore(cl.store, prefix=cl.store_prefix, policy=cl.store_unavailable,
                        timeout_s=cl.store_timeout_s)
    ident = config.identity
    return SharedState(
        store,
        RedisResponseStore(store, max_age_s=DEFAULT_RETENTION_S, max_items=DEFAULT_MAX_STORED),
        RedisIdempotency(store),
        RedisKeyIndex(store, max_per_tenant=ident.index_max_per_tenant, ttl_s=ident.index_ttl_s))

"""``Idempotency-Key`` claims in the shared store: one run per key whichever edge receives it.

A ``POST /v1/runs`` with a key first asks the run registry (the run is there when this
process, or the scheduler it talks to, created it); if not, it claims the key here before it
creates the run: ``SET NX`` of ``P idem:{T}:KEY`` = ``run id, body hash``, expiring after
``ttl_s``. Exactly one of several concurrent requests with the key wins the claim and creates
its run under the id it claimed; the others get that run id and body hash back (a replay of
the run, or 422 for another body, or 409 while the run is not visible yet). A claim whose run
could not be created is dropped (compare-and-delete, so only the claim's own creator does).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hermes.gateway.shared.store import SharedStore

#: how long a key stays claimed (s): retries come within minutes; Stripe keeps keys a day
DEFAULT_TTL_S = 86_400.0

_DROP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisIdempotency:
    """Claims of idempotency keys, per tenant (module docstring)."""

    def __init__(self, store: SharedStore, *, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._drop: Callable[..., Any] = store.register_script(_DROP)

    def _key(self, tenant: str, key: str) -> str:
        return self.store.key("idem", "{" + tenant + "}", key)

    @staticmethod
    def _value(run_id: str, body_hash: str) -> str:
        return json.dumps([run_id, body_hash], separators=(",", ":"))

    def claim(self, tenant: str, key: str, body_hash: str, run_id: str) -> tuple[str, str] | None:
        """None when this call claimed ``key`` for ``run_id``; else ``(run id, body hash)``
        of the request that holds it."""
        k = self._key(tenant, key)
        value = self._value(run_id, body_hash)

        def run() -> Any:
            pipe = self.store.client.pipeline(transaction=True)
            pipe.set(k, value, nx=True, px=int(self.ttl_s * 1000))
            pipe.get(k)
            return pipe.execute()

        won, held = self.store.call("idempotency", run)
        if won:
            return None
        rid, body = json.loads(held)
        return str(rid), str(body)

    def drop(self, tenant: str, key: str, body_hash: str, run_id: str) -> None:
        """Give up this call's claim (its run was not created)."""
        k = self._key(tenant, key)
        v = self._value(run_id, body_hash)
        self.store.call("idempotency-drop", lambda: self._drop(keys=[k], args=[v]))

"""Stored Responses in the shared store: any edge continues a ``previous_response_id``.

:class:`RedisResponseStore` implements :class:`hermes.gateway.responses.ResponseStorage`.
Keys for tenant ``T`` (``~`` when authentication is off; hash-tagged for Redis Cluster):

==========================  ======  =========================================================
``P resp:{T}:ID``           string  the stored response as JSON, expiring after the retention
``P resp:{T}``              zset    the tenant's response ids by time stored: past the cap
                                    (``max_items``, per tenant) its oldest are deleted
==========================  ======  =========================================================

A put is one Lua script (write, index, trim, all or nothing), with the Redis server's time.
An id is looked up under the caller's tenant only, so another tenant's id is "not found"
without a read of it. Durable as Redis is (its AOF or RDB persistence: the deployment's
Redis runs with ``appendonly yes``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hermes.gateway.responses import DEFAULT_MAX_STORED, DEFAULT_RETENTION_S, StoredResponse
from hermes.gateway.shared.store import SharedStore

_PUT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl_ms, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local doc = string.gsub(ARGV[2], '"stored_at":0.0', '"stored_at":' .. string.format('%.6f', now), 1)
redis.call('SET', KEYS[1], doc, 'PX', ttl_ms)
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl_ms / 1000)
local over = redis.call('ZCARD', KEYS[2]) - cap
if over > 0 then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, over - 1)) do
    redis.call('DEL', ARGV[5] .. id)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
end
redis.call('PEXPIRE', KEYS[2], ttl_ms)
return string.format('%.6f', now)
"""


def _tag(tenant: str | None) -> str:
    return "{" + (tenant if tenant is not None else "~") + "}"


class RedisResponseStore:
    """Stored responses in Redis, per tenant (module docstring). ``max_items``: per tenant."""

    def __init__(self, store: SharedStore, *, max_age_s: float = DEFAULT_RETENTION_S,
                 max_items: int = DEFAULT_MAX_STORED) -> None:
        self.store = store
        self.max_age_s = max_age_s
        self.max_items = max_items
        self._put: Callable[..., Any] = store.register_script(_PUT)

    def _key(self, tenant: str | None, response_id: str = "") -> str:
        base = self.store.key("resp", _tag(tenant))
        return f"{base}:{response_id}" if response_id else base

    def put(self, tenant: str | None, response: dict[str, Any], input_items: list[dict[str, Any]],
            conversation: list[dict[str, Any]], *, run_id: str | None = None) -> StoredResponse:
        """Store a finished response (replacing one with the same id)."""
        rid = str(response["id"])
        doc = json.dumps({"stored_at": 0.0, "tenant": tenant, "run_id": run_id,
                          "response": response, "input_items": input_items,
                          "conversation": conversation}, separators=(",", ":"))
        keys = [self._key(tenant, rid), self._key(tenant)]
        args = [rid, doc, int(self.max_age_s * 1000), self.max_items, self._key(tenant) + ":"]
        at = self.store.call("responses-put", lambda: self._put(keys=keys, args=args))
        return StoredResponse(tenant, response, input_items, conversation, float(at), run_id)

    def get(self, tenant: str | None, response_id: str) -> StoredResponse | None:
        """The stored response, or None when unknown, expired or another tenant's."""
        raw = self.store.call("responses-get",
                              lambda: self.store.client.get(self._key(tenant, response_id)))
        if raw is None:
            return None
        d = json.loads(raw)
        if d.get("tenant") != tenant:  # never: the key is the tenant's; kept as a guard
            return None
        return StoredResponse(tenant, d["response"], d["input_items"], d["conversation"],
                              float(d["stored_at"]), d.get("run_id"))

    def delete(self, tenant: str | None, response_id: str) -> bool:
        """Forget a response; False when :meth:`get` would not find it."""
        def run() -> int:
            pipe = self.store.client.pipeline(transaction=True)
            pipe.delete(self._key(tenant, response_id))
            pipe.zrem(self._key(tenant), response_id)
            return int(pipe.execute()[0])

        return self.store.call("responses-delete", run) > 0

    def count(self, tenant: str | None) -> int:
        """Responses stored for ``tenant`` (including ones expiring now)."""
        return int(self.store.call("responses-count",
                                   lambda: self.store.client.zcard(self._key(tenant))))

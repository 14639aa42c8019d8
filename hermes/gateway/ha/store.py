"""The scheduler lease in Redis: one key with a time to live, and an epoch counter
(a :class:`~hermes.gateway.ha.base.LeaseStore`; etcd's is :mod:`hermes.gateway.ha.etcd_store`).

Keys (``prefix`` ``hermes:ha:`` by default):

- ``{prefix}leader``: the **leader record**, JSON ``{"epoch", "holder", "nodes_address",
  "http_address", "since"}``, set with a time to live (``PX``) by the holder and renewed
  by it; it exists only while a holder keeps it alive. Nodes and operators may read it
  (``redis-cli GET hermes:ha:leader``);
- ``{prefix}epoch``: a counter, ``INCR``-ed at every acquisition: each term has a larger epoch
  than every one before it, even across Redis keys expiring;
- ``{prefix}nodes``: the names of the nodes the leader serves (a JSON list), so that a new
  leader knows whom to wait for before it resumes runs.

Acquire, renew and release are Lua scripts: each is one atomic step on the server, so that
two candidates can never both acquire, and a holder renews or releases only its own term.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from hermes.gateway.ha.base import Term

__all__ = ["RedisLeaseStore", "Term"]

_ACQUIRE = """
if redis.call('exists', KEYS[1]) == 1 then return {0, false} end
local e = redis.call('incr', KEYS[2])
local rec = '{"epoch": ' .. e .. ', ' .. string.sub(ARGV[1], 2)
redis.call('set', KEYS[1], rec, 'PX', ARGV[2])
return {e, rec}
"""

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class RedisLeaseStore:
    """The lease operations on one Redis server (see the module doc). Every call is one
    round trip, bounded by ``timeout_s`` (a hung server must not stall a renewal past the
    lease)."""

    def __init__(self, url: str, *, prefix: str = "hermes:ha:", timeout_s: float = 0.5) -> None:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"the election store must be a redis:// URL, got {url!r}")
        self.url = url
        self.prefix = prefix
        self.client: redis.Redis = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._acquire = self.client.register_script(_ACQUIRE)
        self._renew = self.client.register_script(_RENEW)
        self._release = self.client.register_script(_RELEASE)

    @property
    def leader_key(self) -> str:
        return self.prefix + "leader"

    def try_acquire(self, holder: str, ttl_s: float, **record: Any) -> Term | None:
        """Take the lease if nobody holds it: a new term (epoch and record), or None."""
        body = json.dumps({"holder": holder, **record, "since": time.time()})
        got = self._acquire(keys=[self.leader_key, self.prefix + "epoch"],
                            args=[body, max(1, int(ttl_s * 1000))])
        epoch, rec = got[0], got[1]
        if not epoch:
            return None
        return Term(int(epoch), rec.decode() if isinstance(rec, bytes) else str(rec))

    def renew(self, term: Term, ttl_s: float) -> bool:
        """Extend our term; False: the lease is someone else's (or expired and gone)."""
        return bool(self._renew(keys=[self.leader_key],
                                args=[term.record, max(1, int(ttl_s * 1000))]))

    def release(self, term: Term) -> bool:
        """Give the lease up (a clean stop), if it is still ours."""
        return bool(self._release(keys=[self.leader_key], args=[term.record]))

    def leader(self) -> dict[str, Any] | None:
        """The current leader record, or None when nobody holds the lease."""
        raw = self.client.get(self.leader_key)
        return None if raw is None else dict(json.loads(raw))

    def put_nodes(self, names: list[str]) -> None:
        self.client.set(self.prefix + "nodes", json.dumps(sorted(names)))

    def nodes(self) -> list[str]:
        raw = self.client.get(self.prefix + "nodes")
        return [] if raw is None else [str(n) for n in json.loads(raw)]

    def close(self) -> None:
        self.client.close()

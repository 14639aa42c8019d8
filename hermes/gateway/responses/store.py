"""Stored responses, per tenant, with the chat conversation each ended with, so that
``previous_response_id`` continues it (retention by age and count, per tenant).

:class:`ResponseStorage` is the interface the Responses API uses; :class:`ResponseStore` is
the in-memory one (one gateway process); the shared one, in Redis, is
:class:`hermes.gateway.shared.responses.RedisResponseStore` (several gateways, durable).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hermes.gateway.responses.request import DEFAULT_MAX_STORED, DEFAULT_RETENTION_S

#: stored responses of all tenants together in one process's memory (the largest tenant's
#: oldest go first past it, so that one tenant's flood never evicts another's)
DEFAULT_MAX_TOTAL = 100_000


# ---------------------------------------------------------------------------------- store
@dataclass(slots=True)
class StoredResponse:
    """A stored response: the object as returned, this request's input items (for
    ``input_items``), and the chat conversation it ended with (history, input, reply; no
    instructions, which OpenAI does not carry over a ``previous_response_id``)."""

    tenant: str | None
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]
    stored_at: float
    run_id: str | None = None  # the run that made it (for inferring runs from chains later)


class ResponseStorage(Protocol):
    """Where stored responses are kept: an id is visible only to the tenant that created it
    (another tenant's id is "not found", as an unknown one); each tenant's oldest go first
    past its cap, and every entry expires after the retention time."""

    def put(self, tenant: str | None, response: dict[str, Any],
            input_items: list[dict[str, Any]], conversation: list[dict[str, Any]], *,
            run_id: str | None = None) -> StoredResponse: ...

    def get(self, tenant: str | None, response_id: str) -> StoredResponse | None: ...

    def delete(self, tenant: str | None, response_id: str) -> bool: ...


class ResponseStore:
    """Stored responses in memory, per tenant: entries older than ``max_age_s`` expire; past
    ``max_items`` for one tenant that tenant's oldest is dropped, and past ``max_total`` in
    all the oldest of the tenant holding the most (``clock`` is injectable for tests)."""

    def __init__(self, *, max_age_s: float = DEFAULT_RETENTION_S,
                 max_items: int = DEFAULT_MAX_STORED, max_total: int = DEFAULT_MAX_TOTAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.max_items = max_items
        self.max_total = max_total
        self.clock = clock
        self._tenants: dict[str | None, OrderedDict[str, StoredResponse]] = {}
        self._n = 0

    def __len__(self) -> int:
        for tenant in list(self._tenants):
            self._expire(tenant)
        return self._n

    def _expire(self, tenant: str | None) -> None:
        items = self._tenants.get(tenant)
        if items is None:
            return
        cutoff = self.clock() - self.max_age_s
        while items:
            first = next(iter(items.values()))
            if first.stored_at > cutoff:
                break
            items.popitem(last=False)
            self._n -= 1
        if not items:
            del self._tenants[tenant]

    def put(self, tenant: str | None, response: dict[str, Any], input_items: list[dict[str, Any]],
            conversation: list[dict[str, Any]], *, run_id: str | None = None) -> StoredResponse:
        """Store a finished response (replacing one with the same id)."""
        entry = StoredResponse(tenant, response, input_items, conversation, self.clock(), run_id)
        items = self._tenants.setdefault(tenant, OrderedDict())
        if items.pop(response["id"], None) is not None:
            self._n -= 1
        items[response["id"]] = entry
        self._n += 1
        self._expire(tenant)
        while len(items) > self.max_items:
            items.popitem(last=False)
            self._n -= 1
        while self._n > self.max_total:
            largest = max(self._tenants.values(), key=len)
            largest.popitem(last=False)
            self._n -= 1
        return entry

    def get(self, tenant: str | None, response_id: str) -> StoredResponse | None:
        """The stored response, or None when unknown, expired or another tenant's."""
        self._expire(tenant)
        items = self._tenants.get(tenant)
        return None if items is None else items.get(response_id)

    def delete(self, tenant: str | None, response_id: str) -> bool:
        """Forget a response; False when :meth:`get` would not find it."""
        if self.get(tenant, response_id) is None:
            return False
        items = self._tenants[tenant]
        del items[response_id]
        self._n -= 1
        if not items:
            del self._tenants[tenant]
        return True

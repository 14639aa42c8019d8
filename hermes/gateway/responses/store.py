"""Stored responses, per tenant, with the chat conversation each ended with, so that
``previous_response_id`` continues it (retention by age and count).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hermes.gateway.responses.request import DEFAULT_MAX_STORED, DEFAULT_RETENTION_S


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


class ResponseStore:
    """Stored responses, per tenant: an id is visible only to the tenant that created it
    (another tenant's id is "not found", as an unknown one). Oldest first out: entries older
    than ``max_age_s`` expire, and past ``max_items`` the oldest is dropped. In memory, one
    per gateway (``clock`` is injectable for tests)."""

    def __init__(self, *, max_age_s: float = DEFAULT_RETENTION_S,
                 max_items: int = DEFAULT_MAX_STORED,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.max_items = max_items
        self.clock = clock
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._items)

    def _expire(self) -> None:
        cutoff = self.clock() - self.max_age_s
        while self._items:
            first = next(iter(self._items.values()))
            if first.stored_at > cutoff:
                break
            self._items.popitem(last=False)

    def put(self, tenant: str | None, response: dict[str, Any], input_items: list[dict[str, Any]],
            conversation: list[dict[str, Any]], *, run_id: str | None = None) -> StoredResponse:
        """Store a finished response (replacing one with the same id)."""
        entry = StoredResponse(tenant, response, input_items, conversation, self.clock(), run_id)
        self._items.pop(response["id"], None)
        self._items[response["id"]] = entry
        self._expire()
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)
        return entry

    def get(self, tenant: str | None, response_id: str) -> StoredResponse | None:
        """The stored response, or None when unknown, expired or another tenant's."""
        self._expire()
        entry = self._items.get(response_id)
        if entry is None or entry.tenant != tenant:
            return None
        return entry

    def delete(self, tenant: str | None, response_id: str) -> bool:
        """Forget a response; False when :meth:`get` would not find it."""
        if self.get(tenant, response_id) is None:
            return False
        del self._items[response_id]
        return True

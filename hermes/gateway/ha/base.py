"""What every election store offers: a :class:`Term` and the :class:`LeaseStore` protocol.

A **lease store** keeps one lease in a coordination service (Redis:
:mod:`hermes.gateway.ha.store`; etcd: :mod:`hermes.gateway.ha.etcd_store`; chosen by the URL's
scheme in :mod:`hermes.gateway.ha.backends`). Whatever the service, a store guarantees:

- **one holder**: :meth:`~LeaseStore.try_acquire` is one atomic step on the server, so two
  candidates can never both acquire;
- **epochs that grow**: every acquisition gets an epoch larger than every epoch granted before
  it in that store (the fencing token every scheduler message carries);
- **own terms only**: a renewal or a release succeeds only while the lease is still the one
  granted to that term; a store error raises and never extends a term (the caller,
  :mod:`hermes.gateway.ha.election`, counts it and believes the lease only until
  ``sent + ttl - margin``);
- **a readable leader record** (edges and operators follow it): a dict with at least
  ``epoch`` and ``holder``, plus what the holder put in it (``nodes_address``,
  ``http_address``, ``edge_address``) and ``since`` (wall time);
- the **node names** the leader serves, kept past its term (a successor waits for them).

Every call is a blocking round trip bounded by the store's timeout: the election calls them
from its own thread, an edge through :func:`asyncio.to_thread`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Term:
    """A lease granted: its epoch, the leader record as stored (what a renewal or a release
    matches) and the store's own handle on it (etcd: the lease ID; Redis: 0, unused)."""

    epoch: int
    record: str
    lease: int = 0


class LeaseStore(Protocol):
    """The lease operations (see the module doc); :class:`~hermes.gateway.ha.store.
    RedisLeaseStore` and :class:`~hermes.gateway.ha.etcd_store.EtcdLeaseStore` implement it."""

    #: where the lease lives, as configured (``[ha] election``), for log lines
    url: str

    def try_acquire(self, holder: str, ttl_s: float, **record: Any) -> Term | None:
        """Take the lease if nobody holds it: a new term, or None (someone else holds it)."""
        ...

    def renew(self, term: Term, ttl_s: float) -> bool:
        """Extend ``term``; False: the lease is someone else's, or expired and gone."""
        ...

    def release(self, term: Term) -> bool:
        """Give the lease up if it is still ``term``'s (a clean stop); True if it was."""
        ...

    def leader(self) -> dict[str, Any] | None:
        """The current leader record (with its ``epoch``), or None when nobody holds it."""
        ...

    def put_nodes(self, names: list[str]) -> None:
        """Record the names of the nodes the leader serves."""
        ...

    def nodes(self) -> list[str]:
        """The node names last recorded by a leader (empty: none)."""
        ...

    def close(self) -> None:
        """Drop the connection (the store is not used after)."""
        ...

"""The scheduler lease in etcd: a key attached to an etcd lease, taken in one transaction
(a :class:`~hermes.gateway.ha.base.LeaseStore`; ``[ha] election = "etcd://HOST:PORT"``).

Talks to etcd's v3 JSON gateway (the HTTP API every etcd >= 3.3 serves beside gRPC) through
`etcd3gw <https://opendev.org/openstack/etcd3gw>`_, installed with the ``ha-etcd`` extra and
imported only when an etcd store is made. etcd3gw finds the gateway's path from the server's
version (``/v3/`` on etcd >= 3.4, ``/v3beta/`` on 3.3).

Keys (``prefix`` ``hermes/ha/`` by default):

- ``{prefix}leader``: the **leader record**, JSON ``{"holder", "nodes_address",
  "http_address", "edge_address", "since"}``, attached to the holder's etcd lease: it exists
  only while the holder keeps that lease alive, and etcd deletes it when the lease expires or
  is revoked. :meth:`EtcdLeaseStore.leader` adds the ``epoch`` (below). Operators read it with
  ``etcdctl get hermes/ha/leader -w json``;
- ``{prefix}nodes``: the names of the nodes the leader serves (JSON list; no lease: a
  successor reads it).

Semantics, one round trip each where it matters:

- **acquire**: a read of the leader key (a standby's usual answer: someone holds it), then a
  lease grant and ONE transaction ``if create_revision(leader) == 0 then put(leader, record,
  lease)``: etcd runs transactions one at a time, so two candidates can never both create the
  key. A candidate that loses revokes the lease it granted (it would expire anyway);
- **epoch** = the leader key's ``create_revision``, i.e. the store revision of the transaction
  that created it (the transaction's response header). etcd's revision is one counter for the
  whole cluster that every write increments and that never goes back (compaction drops old
  versions, not the counter), so each term's epoch is larger than every earlier term's,
  after an expiry or a release alike, with no counter key to keep in step. Epochs are thus
  large and not consecutive; fencing only compares them. (A cluster rebuilt from scratch
  restarts at revision 1, as a Redis that lost its data restarts its counter: start its
  schedulers and nodes afresh too.) The record cannot hold its own revision, so
  :meth:`~EtcdLeaseStore.leader` reads it from the key's metadata;
- **renew**: a keepalive of the term's lease (etcd answers no TTL once it has expired), then a
  transaction comparing the leader key's value and lease with the term's: both must hold,
  else the term is over (another holder, or the key gone);
- **release**: a transaction deleting the leader key only if its value and lease are still the
  term's, then a revoke of the term's lease: a stale term changes nothing of its successor's;
- a store error (refused, timed out, an etcd error) raises :class:`EtcdStoreError` with
  etcd's own words: it never counts as a renewal.

etcd leases are whole seconds, and etcd raises a shorter one to its minimum (1.5 x its election
timeout, rounded up: 2 s with etcd's defaults): the lease is granted for
``ceil(lease_ttl_s)`` s, which is never less than what the holder believes it holds
(``lease_ttl_s - margin``, :mod:`hermes.core.lease`), so a holder stops acting before etcd
frees the key. A standby takes over once etcd expires the lease: after the granted TTL plus up
to 0.5 s (etcd looks for expired leases twice a second).

TLS: ``etcds://HOST:PORT`` speaks HTTPS, verifying the server against ``?ca=PATH`` (else
requests' own CA bundle, certifi's); ``&cert=PATH&key=PATH`` add a client certificate. The
environment is not consulted (no ``REQUESTS_CA_BUNDLE``, no ``HTTPS_PROXY``): the URL alone
says how etcd is reached. etcd's user/password
authentication is not supported (etcd3gw does not do it): use client certificates.
One endpoint: put etcd's members behind one name or address (a DNS name, a load balancer, or
the local member).
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from hermes.extras import require
from hermes.gateway.ha.base import Term

if TYPE_CHECKING:
    from etcd3gw import Etcd3Client

#: query parameters an ``etcds://`` URL takes: the CA bundle, the client certificate and key
TLS_PARAMS = ("ca", "cert", "key")


def parse_etcd_url(url: str) -> tuple[str, int, str, dict[str, str]]:
    """``etcd://HOST[:PORT]`` or ``etcds://HOST[:PORT][?ca=&cert=&key=]`` as (host, port,
    protocol, TLS files); ValueError naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in ("etcd", "etcds"):
        raise ValueError(f"an etcd election store is etcd://HOST:PORT or etcds://HOST:PORT, "
                         f"got {url!r}")
    try:
        port = parts.port or 2379
    except ValueError as exc:
        raise ValueError(f"bad port in the etcd URL {url!r}: {exc}") from exc
    if not parts.hostname:
        raise ValueError(f"no host in the etcd URL {url!r} (etcd://HOST:PORT)")
    if parts.path not in ("", "/") or parts.fragment or parts.username or parts.password:
        raise ValueError(f"an etcd URL is etcd[s]://HOST:PORT[?ca=&cert=&key=], got {url!r} "
                         "(etcd user/password authentication is not supported: use client "
                         "certificates)")
    query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted(set(query) - set(TLS_PARAMS))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} in the etcd URL {url!r}; accepted "
                         f"(etcds:// only): {', '.join(TLS_PARAMS)}")
    tls = {k: v[-1] for k, v in query.items()}
    if tls and parts.scheme != "etcds":
        raise ValueError(f"{', '.join(sorted(tls))} in {url!r} need TLS: etcds://")
    if ("cert" in tls) != ("key" in tls):
        raise ValueError(f"a client certificate needs both cert= and key=, got {url!r}")
    return parts.hostname, port, "https" if parts.scheme == "etcds" else "http", tls


class EtcdStoreError(ConnectionError):
    """etcd did not answer, or answered an error (etcd3gw's exception says why only in its
    ``detail_text``: it is in this one's message)."""


class EtcdLeaseStore:
    """The lease operations on one etcd endpoint (see the module doc). Every request is one
    HTTP round trip bounded by ``timeout_s`` (a hung server must not stall a renewal past the
    lease). Makes no request until first used."""

    def __init__(self, url: str, *, prefix: str = "hermes/ha/", timeout_s: float = 0.5) -> None:
        host, port, protocol, tls = parse_etcd_url(url)
        require("ha-etcd")  # one clear error naming the extra when etcd3gw is missing
        import requests
        from etcd3gw import Etcd3Client, Lease
        from etcd3gw.exceptions import Etcd3Exception

        self.url = url
        self._errors_of = Etcd3Exception
        self.prefix = prefix
        self._lease = Lease
        session = requests.Session()
        # the URL says how to reach etcd, not the environment: requests would let
        # REQUESTS_CA_BUNDLE override the CA given here, and send etcd's traffic through an
        # HTTP(S)_PROXY meant for the outside
        session.trust_env = False
        session.verify = tls.get("ca", True)
        if "cert" in tls:
            session.cert = (tls["cert"], tls["key"])
        self.client: Etcd3Client = Etcd3Client(host=host, port=port, protocol=protocol,
                                               timeout=timeout_s, session=session)

    @property
    def leader_key(self) -> str:
        return self.prefix + "leader"

    @contextmanager
    def _etcd(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._errors_of as exc:
            why = (exc.detail_text or "").strip() or "no answer"
            raise EtcdStoreError(f"etcd at {self.url}: {what}: {type(exc).__name__}: "
                                 f"{why[:300]}") from exc

    # ------------------------------------------------------------------ the lease
    def try_acquire(self, holder: str, ttl_s: float, **record: Any) -> Term | None:
        """Take the lease if nobody holds it: a new term (epoch: the key's create revision)."""
        with self._etcd("acquire"):
            return self._try_acquire(holder, ttl_s, record)

    def _try_acquire(self, holder: str, ttl_s: float, record: dict[str, Any]) -> Term | None:
        if self.client.get(self.leader_key):
            return None  # held: no lease granted for nothing
        body = json.dumps({"holder": holder, **record, "since": time.time()})
        lease = self.client.lease(max(1, math.ceil(ttl_s)))
        key = _b64(self.leader_key)
        got = self.client.transaction({
            "compare": [{"key": key, "result": "EQUAL", "target": "CREATE",
                         "create_revision": 0}],
            "success": [{"request_put": {"key": key, "value": _b64(body), "lease": lease.id}}],
            "failure": []})
        if not got.get("succeeded"):  # another candidate created it first
            lease.revoke()
            return None
        return Term(int(got["header"]["revision"]), body, lease.id)

    def renew(self, term: Term, ttl_s: float) -> bool:
        """Keep the term's lease alive (its TTL was fixed at the grant: ``ttl_s`` is not used)
        and check the leader key is still the term's."""
        with self._etcd("renew"):
            return self._renew(term)

    def _renew(self, term: Term) -> bool:
        if self._lease(term.lease, client=self.client).refresh() <= 0:
            return False  # expired: etcd has deleted the key
        return self._is_ours(term, ops=[])

    def release(self, term: Term) -> bool:
        """Delete the leader key if it is still the term's, then revoke the term's lease."""
        drop = {"request_delete_range": {"key": _b64(self.leader_key)}}
        with self._etcd("release"):
            ours = self._is_ours(term, ops=[drop])
            if ours:
                self._lease(term.lease, client=self.client).revoke()
            return ours

    def _is_ours(self, term: Term, *, ops: list[dict[str, Any]]) -> bool:
        key = _b64(self.leader_key)
        got = self.client.transaction({
            "compare": [
                {"key": key, "result": "EQUAL", "target": "VALUE", "value": _b64(term.record)},
                {"key": key, "result": "EQUAL", "target": "LEASE", "lease": term.lease}],
            "success": ops, "failure": []})
        return bool(got.get("succeeded"))

    # ------------------------------------------------------------------ records
    def leader(self) -> dict[str, Any] | None:
        """The current leader record with its epoch, or None when nobody holds the lease."""
        with self._etcd("read the leader record"):
            got = self.client.get(self.leader_key, metadata=True)
        if not got:
            return None
        value, meta = got[0]
        rec = dict(json.loads(value))
        rec["epoch"] = int(meta["create_revision"])
        return rec

    def put_nodes(self, names: list[str]) -> None:
        with self._etcd("put the node names"):
            self.client.put(self.prefix + "nodes", json.dumps(sorted(names)))

    def nodes(self) -> list[str]:
        with self._etcd("read the node names"):
            got = self.client.get(self.prefix + "nodes")
        return [str(n) for n in json.loads(got[0])] if got else []

    def close(self) -> None:
        self.client.session.close()


def _b64(text: str) -> str:
    """A key or value as the JSON gateway takes them in a transaction (base64 of UTF-8)."""
    return base64.b64encode(text.encode()).decode("ascii")

"""The scheduler lease in a real etcd server (``[ha] election = "etcd://..."``): one holder at a
time, epochs that grow across expiries and releases, renewals and releases of one's own term
only, and leader election over it failing over to a standby within the lease's time to live,
the paused ex-leader told it is deposed. Also the choice of store by URL scheme."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest
from gw_etcd import etcd_url, make_tls, need_etcd, start_etcd, stop_etcd  # noqa: F401

from hermes.core.lease import LeaseTerms
from hermes.extras import MissingExtraError
from hermes.gateway.config import ELECTION_SCHEMES, load_config
from hermes.gateway.ha.backends import BACKENDS, open_lease_store
from hermes.gateway.ha.base import LeaseStore, Term
from hermes.gateway.ha.election import LeaderElection
from hermes.gateway.ha.etcd_store import EtcdLeaseStore, EtcdStoreError, parse_etcd_url
from hermes.gateway.ha.store import RedisLeaseStore
from hermes.procs import free_port

#: the fixture's etcd grants 1 s leases at least (gw_etcd): a believed term of 1 - 0.1 s
TERMS = LeaseTerms(ttl_s=1.0, renew_s=0.15, retry_s=0.05, margin_s=0.1)


def store(url: str, prefix: str) -> EtcdLeaseStore:
    s = open_lease_store(url, prefix=prefix)
    assert isinstance(s, EtcdLeaseStore)
    return s


def wait_gone(s: EtcdLeaseStore, timeout: float = 4.0) -> float:
    """Seconds until etcd has expired the leader key."""
    t0 = time.monotonic()
    while s.leader() is not None:
        assert time.monotonic() - t0 < timeout, "the lease did not expire"
        time.sleep(0.02)
    return time.monotonic() - t0


# ---------------------------------------------------------------------------- the store
def test_one_holder_and_its_record(etcd_url: str) -> None:  # noqa: F811
    a, b = store(etcd_url, "s1/"), store(etcd_url, "s1/")
    assert a.leader() is None and a.nodes() == []
    ta = a.try_acquire("a", 1.0, nodes_address="tcp://a:1", edge_address=None)
    assert ta is not None and ta.lease != 0
    assert b.try_acquire("b", 1.0) is None  # held: refused, however often asked
    assert b.try_acquire("b", 1.0) is None
    rec = b.leader()
    assert rec is not None and rec["holder"] == "a" and rec["nodes_address"] == "tcp://a:1"
    assert rec["epoch"] == ta.epoch  # the epoch is the key's create revision
    assert "edge_address" in rec and rec["since"] > 0
    a.put_nodes(["n2", "n1"])
    assert b.nodes() == ["n1", "n2"]
    for _ in range(8):  # renewals keep it past its ttl
        assert a.renew(ta, 1.0)
        time.sleep(0.2)
    assert b.leader() is not None and b.try_acquire("b", 1.0) is None
    assert a.release(ta) and a.leader() is None
    assert b.nodes() == ["n1", "n2"]  # kept for a successor
    a.close()
    b.close()


def test_two_candidates_racing_get_one_term(etcd_url: str) -> None:  # noqa: F811
    stores = [store(etcd_url, "race/") for _ in range(6)]
    go = threading.Barrier(len(stores))
    got: list[Term | None] = [None] * len(stores)

    def run(i: int) -> None:
        go.wait()
        got[i] = stores[i].try_acquire(f"c{i}", 1.0)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    winners = [t for t in got if t is not None]
    assert len(winners) == 1, got
    rec = stores[0].leader()
    assert rec is not None and rec["epoch"] == winners[0].epoch


def test_epochs_grow_across_release_and_expiry(etcd_url: str) -> None:  # noqa: F811
    a, b = store(etcd_url, "s2/"), store(etcd_url, "s2/")
    t1 = a.try_acquire("a", 1.0)
    assert t1 is not None
    assert a.release(t1)
    t2 = b.try_acquire("b", 1.0)
    assert t2 is not None and t2.epoch > t1.epoch  # after a release
    assert not a.release(t1)  # a stale term's release changes nothing
    assert not a.renew(t1, 1.0)  # nor does its renewal succeed
    rec = a.leader()
    assert rec is not None and rec["holder"] == "b" and rec["epoch"] == t2.epoch
    took = wait_gone(a)  # b stops renewing (a pause, a kill): etcd expires its lease
    assert took <= 1.0 + 0.6, took
    t3 = a.try_acquire("a", 1.0)
    assert t3 is not None and t3.epoch > t2.epoch  # after an expiry
    assert not b.renew(t2, 1.0)  # b wakes up: its term is over
    assert not b.release(t2)
    rec = b.leader()
    assert rec is not None and rec["holder"] == "a" and rec["epoch"] == t3.epoch
    assert a.release(t3)


def test_a_renewal_fails_once_the_key_is_not_the_terms(etcd_url: str) -> None:  # noqa: F811
    """The lease alive but the key gone (deleted by an operator): the term is over."""
    a = store(etcd_url, "s3/")
    t = a.try_acquire("a", 1.0)
    assert t is not None and a.renew(t, 1.0)
    a.client.delete(a.leader_key)
    assert not a.renew(t, 1.0)
    # a forged term (another lease ID, same record) neither renews nor releases a holder's key
    t2 = a.try_acquire("a", 1.0)
    assert t2 is not None
    forged = Term(t2.epoch, t2.record, t.lease)
    assert not a.renew(forged, 1.0) and not a.release(forged)
    assert a.leader() is not None and a.release(t2)


def test_a_store_error_raises_saying_why() -> None:
    need_etcd()
    url = f"etcd://127.0.0.1:{free_port()}"  # nobody listens there
    s = EtcdLeaseStore(url, timeout_s=0.2)
    with pytest.raises(EtcdStoreError, match=f"etcd at {url}: acquire: .*refused"):
        s.try_acquire("a", 1.0)
    with pytest.raises(EtcdStoreError, match="renew: .*refused"):
        s.renew(Term(5, "{}", 7), 1.0)


# ---------------------------------------------------------------------------- election
class Member:
    def __init__(self, s: LeaseStore, name: str) -> None:
        self.elected: list[int] = []
        self.deposed: list[tuple[int, str]] = []
        self.event = threading.Event()
        self.told = threading.Event()
        self.e = LeaderElection(s, TERMS, name, on_elected=self._on_elected,
                                on_deposed=self._on_deposed,
                                record={"nodes_address": f"tcp://{name}"})

    def _on_elected(self, epoch: int) -> None:
        self.elected.append(epoch)
        self.event.set()

    def _on_deposed(self, epoch: int, why: str) -> None:
        self.deposed.append((epoch, why))
        self.told.set()


class Pausable:
    """The real etcd store behind a gate: while paused, calls block (as a SIGSTOPped
    process's would), then go to etcd."""

    def __init__(self, inner: EtcdLeaseStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.running = threading.Event()
        self.running.set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)

        def call(*args: Any, **kw: Any) -> Any:
            self.running.wait()
            return attr(*args, **kw)
        return call


def test_failover_to_a_standby_when_the_leader_stops_renewing(etcd_url: str) -> None:  # noqa: F811
    a, b = Member(store(etcd_url, "e1/"), "a"), Member(store(etcd_url, "e1/"), "b")
    a.e.start()
    assert a.event.wait(3.0)
    b.e.start()
    time.sleep(1.3)  # longer than the ttl: a renews, b never gets it
    assert a.e.held() and not b.e.held() and not b.elected
    rec = store(etcd_url, "e1/").leader()
    assert rec is not None and rec["holder"] == "a" and rec["epoch"] == a.elected[0]
    a.e._stop.set()  # a stops renewing without releasing (kill -9, or a stalled thread)
    t0 = time.monotonic()
    assert b.event.wait(4.0)
    took = time.monotonic() - t0
    assert b.elected[0] > a.elected[0]
    assert took <= TERMS.ttl_s + 0.5 + 0.4, took  # etcd expires leases every 0.5 s
    assert not a.e.held()  # what the sending path asks: a finds itself deposed
    assert a.deposed and a.deposed[0][0] == a.elected[0]
    assert b.e.held()
    b.e.stop()
    assert store(etcd_url, "e1/").leader() is None  # released at a clean stop


def test_a_paused_leader_wakes_up_deposed(etcd_url: str) -> None:  # noqa: F811
    pa = Pausable(store(etcd_url, "e2/"))
    a = Member(pa, "a")  # type: ignore[arg-type]
    b = Member(store(etcd_url, "e2/"), "b")
    a.e.start()
    assert a.event.wait(3.0)
    b.e.start()
    pa.running.clear()  # a's renewal hangs (paused)
    assert b.event.wait(4.0) and b.elected[0] > a.elected[0]
    pa.running.set()  # a wakes up: the renewal it was sending reaches etcd, and is refused
    assert a.told.wait(2.0)
    assert a.deposed[0][0] == a.elected[0] and not a.e.held()
    a.e.stop(release=True)  # releasing a term it no longer holds changes nothing
    rec = store(etcd_url, "e2/").leader()
    assert rec is not None and rec["holder"] == "b" and rec["epoch"] == b.elected[0]
    b.e.stop()


# ---------------------------------------------------------------------------- TLS
def test_etcds_verifies_the_server_and_presents_a_client_certificate(tmp_path: Any) -> None:
    """``etcds://`` against an etcd that requires client certificates: with the CA and a
    client certificate it works; without the certificate, with the system's CAs only (which
    do not know this CA) or in plain HTTP, every call fails: no unverified fallback."""
    import ssl

    need_etcd()
    tls = make_tls(tmp_path)
    ctx = ssl.create_default_context(cafile=str(tls["ca"]))
    ctx.load_cert_chain(str(tls["client"]), str(tls["client_key"]))
    proc, port = start_etcd(tmp_path, tls=ctx, extra=[
        "--cert-file", str(tls["server"]), "--key-file", str(tls["server_key"]),
        "--client-cert-auth", "--trusted-ca-file", str(tls["ca"])])
    try:
        base = f"etcds://127.0.0.1:{port}"
        s = open_lease_store(f"{base}?ca={tls['ca']}&cert={tls['client']}&key={tls['client_key']}")
        t = s.try_acquire("a", 1.0, edge_address="tcp://a:1")
        assert t is not None and s.renew(t, 1.0)
        rec = s.leader()
        assert rec is not None and rec["epoch"] == t.epoch
        for url, why in [(f"{base}?ca={tls['ca']}", "(?i)certificate|handshake|ssl|tls"),
                         (base, "(?i)certificate verify failed"),
                         (f"etcd://127.0.0.1:{port}", "(?i)connection|aborted|reset|bad")]:
            with pytest.raises(EtcdStoreError, match=why):
                open_lease_store(url).leader()
        assert s.release(t) and s.leader() is None
    finally:
        stop_etcd(proc)


# ---------------------------------------------------------------------------- choosing a store
def test_the_store_is_chosen_by_scheme_and_others_are_refused() -> None:
    assert set(BACKENDS) == set(ELECTION_SCHEMES)
    assert isinstance(open_lease_store("redis://127.0.0.1:1/0"), RedisLeaseStore)
    for bad in ("zk://h:2181", "http://h:2379", "127.0.0.1:2379"):
        with pytest.raises(ValueError, match=r"\[ha\] election.*redis://.*etcd://"):
            open_lease_store(bad)
        with pytest.raises(ValueError, match=r"\[ha\] election.*etcd://"):
            load_config(None, environ={}, **{"ha.election": bad})
    cfg = load_config(None, environ={}, **{"ha.role": "edge", "ha.election": "etcds://h:2379",
                                           "scheduler.bind": "tcp://127.0.0.1:7001"})
    assert cfg.ha.election == "etcds://h:2379"


def test_an_edge_follows_the_leader_in_etcd(etcd_url: str) -> None:  # noqa: F811
    """An edge (``--role edge --ha etcd://...``) reads the leader record from etcd and
    follows each new term."""
    import asyncio

    import zmq.asyncio

    from hermes.gateway.edge.front import SchedulerLink

    cfg = load_config(None, environ={}, **{
        "ha.role": "edge", "ha.election": etcd_url, "scheduler.bind": "tcp://127.0.0.1:7001"})
    s = store(etcd_url, "hermes/ha/")  # the stores' default prefix: what the edge reads
    t1 = s.try_acquire("s1", 1.0, edge_address="tcp://127.0.0.1:7101")
    assert t1 is not None

    async def follow() -> list[Any]:
        ctx = zmq.asyncio.Context()
        link = SchedulerLink(cfg, ctx, "edge-t", "tcp://127.0.0.1:7001")
        assert isinstance(link.store, EtcdLeaseStore)
        watch = asyncio.get_running_loop().create_task(link.watch())
        seen = []
        for _ in range(50):
            await asyncio.sleep(0.05)
            if link.leader is not None:
                break
        seen.append(dict(link.leader or {}))
        assert s.release(t1)
        t2 = await asyncio.to_thread(s.try_acquire, "s2", 1.0,
                                     edge_address="tcp://127.0.0.1:7102")
        assert t2 is not None
        for _ in range(50):
            await asyncio.sleep(0.05)
            if (link.leader or {}).get("holder") == "s2":
                break
        seen.append(dict(link.leader or {}))
        seen.append(link.gate.epoch)
        watch.cancel()
        if link._recv is not None:
            link._recv.cancel()
        if link.sock is not None:
            link.sock.close(linger=0)
        ctx.term()
        assert s.release(t2)
        return seen

    first, second, gate = asyncio.run(follow())
    assert first["holder"] == "s1" and first["epoch"] == t1.epoch
    assert second["holder"] == "s2" and second["epoch"] > t1.epoch
    assert second["edge_address"] == "tcp://127.0.0.1:7102"
    assert gate == second["epoch"]  # a message of an older epoch is now dropped


def test_etcd_urls() -> None:
    assert parse_etcd_url("etcd://10.0.0.5") == ("10.0.0.5", 2379, "http", {})
    assert parse_etcd_url("etcds://e.local:2380?ca=/c.pem&cert=/x.pem&key=/x.key") == (
        "e.local", 2380, "https", {"ca": "/c.pem", "cert": "/x.pem", "key": "/x.key"})
    for bad, why in [("etcd://h:2379?ca=/c.pem", "etcds://"), ("etcds://h?cert=/x", "key="),
                     ("etcd://h:2379?user=x", "unknown"), ("etcd://u:p@h:2379", "password"),
                     ("etcd://h:2379/prefix", "HOST:PORT"), ("etcd://:2379", "no host"),
                     ("etcd://h:99999", "port")]:
        with pytest.raises(ValueError, match=why):
            parse_etcd_url(bad)


def test_without_etcd3gw_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "etcd3gw", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"hermes-gateway\[ha-etcd\]"):
        open_lease_store("etcd://127.0.0.1:2379")

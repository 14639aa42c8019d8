"""Leader election on a real Redis: one holder at a time, epochs grow, a dead holder's lease
passes to a standby within its time to live, a paused holder finds itself deposed."""

from __future__ import annotations

import threading
import time

import pytest
from gw_redis import redis_url  # noqa: F401  (fixture)

from hermes.core.lease import LeaseTerms
from hermes.gateway.ha.election import LeaderElection
from hermes.gateway.ha.store import RedisLeaseStore

TERMS = LeaseTerms(ttl_s=0.6, renew_s=0.1, retry_s=0.05, margin_s=0.05)


class Member:
    def __init__(self, url: str, name: str, prefix: str,
                 clock: object = time.monotonic) -> None:
        self.elected: list[int] = []
        self.deposed: list[tuple[int, str]] = []
        self.event = threading.Event()
        self.e = LeaderElection(RedisLeaseStore(url, prefix=prefix), TERMS, name,
                                on_elected=self._on_elected,
                                on_deposed=lambda ep, why: self.deposed.append((ep, why)),
                                record={"nodes_address": f"tcp://{name}"},
                                clock=clock)  # type: ignore[arg-type]

    def _on_elected(self, epoch: int) -> None:
        self.elected.append(epoch)
        self.event.set()


def test_one_leader_then_failover_after_the_ttl(redis_url: str) -> None:  # noqa: F811
    prefix = "t1:"
    a, b = Member(redis_url, "a", prefix), Member(redis_url, "b", prefix)
    a.e.start()
    assert a.event.wait(2.0)
    b.e.start()
    time.sleep(0.8)  # longer than the ttl: a renews, b never gets it
    assert a.e.held() and not b.e.held() and not b.elected
    rec = RedisLeaseStore(redis_url, prefix=prefix).leader()
    assert rec is not None and rec["holder"] == "a" and rec["epoch"] == a.elected[0]
    assert rec["nodes_address"] == "tcp://a"
    # a dies without releasing (kill -9): its thread stops, the key expires
    a.e._stop.set()
    t0 = time.monotonic()
    assert b.event.wait(3.0)
    took = time.monotonic() - t0
    assert b.elected[0] == a.elected[0] + 1
    assert took <= TERMS.ttl_s + 0.3, took
    b.e.stop()
    assert RedisLeaseStore(redis_url, prefix=prefix).leader() is None  # released


def test_a_paused_holder_is_deposed_and_cannot_renew(redis_url: str) -> None:  # noqa: F811
    prefix = "t2:"
    offset = [0.0]
    a = Member(redis_url, "a", prefix, clock=lambda: time.monotonic() + offset[0])
    b = Member(redis_url, "b", prefix)
    a.e.start()
    assert a.event.wait(2.0)
    epoch = a.elected[0]
    offset[0] = 5.0  # as if SIGSTOPped for 5 s: its own clock says the term ran out
    assert not a.e.held()
    deadline = time.monotonic() + 2.0
    while not a.deposed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert a.deposed and a.deposed[0][0] == epoch
    assert b.e.state.epoch is None
    b.e.start()
    assert b.event.wait(3.0) and b.elected[0] > epoch
    a.e.stop(release=True)  # releasing a term it no longer holds changes nothing
    rec = RedisLeaseStore(redis_url, prefix=prefix).leader()
    assert rec is not None and rec["holder"] == "b"
    b.e.stop()


def test_a_bad_store_url_is_refused() -> None:
    with pytest.raises(ValueError, match="redis://"):
        RedisLeaseStore("etcd://127.0.0.1:2379")

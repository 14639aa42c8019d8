"""RedisStore specifics against a real redis-server: key layout, the version counter and
pub/sub events that let several gateways follow updates, prefixes, bad data in Redis. The
shared behaviour is in test_store_contract.py."""

from __future__ import annotations

import json
import time

import pytest
import redis

from hermes.core.pdgraph import PDGraph, PDGraphError
from hermes.core.records import RecordError
from hermes.kb import RedisStore

pytestmark = pytest.mark.redis


@pytest.fixture
def raw(redis_server):
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    yield client
    client.close()


def _next_event(pubsub, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = pubsub.get_message(timeout=0.1)
        if msg and msg["type"] == "message":
            return json.loads(msg["data"])
    raise AssertionError("no pub/sub event within timeout")


def test_key_layout(redis_factory, raw, mkgraph, mkrecords):
    store = redis_factory(max_records=3)
    p = store.prefix
    g = mkgraph("toy")
    store.put(g)
    assert PDGraph.from_json(raw.hget(f"{p}pdgraphs", "toy")) == g
    for rec in mkrecords("toy", n=7, seed=1):
        store.append_record(rec)
    assert raw.llen(f"{p}records:toy") == 3  # capped in Redis itself, not only on read
    assert [json.loads(x)["run_id"] for x in raw.lrange(f"{p}records:toy", 0, -1)] == [
        "toy-1-4", "toy-1-5", "toy-1-6"]


def test_version_counter_and_events(redis_factory, mkgraph):
    writer, watcher = redis_factory(), redis_factory()
    assert watcher.version() == 0
    sub = watcher.subscribe()
    try:
        writer.put(mkgraph("toy", n=10))
        ev = _next_event(sub)
        assert ev["op"] == "put" and ev["app"] == "toy" and ev["version"] == watcher.version()
        v1 = watcher.version()
        writer.put(mkgraph("toy", n=20))
        assert watcher.version() > v1
        assert _next_event(sub)["op"] == "put"
        assert writer.delete("toy") is True
        ev = _next_event(sub)
        assert ev == {"op": "delete", "app": "toy", "version": watcher.version()}
        assert writer.delete("toy") is False
        assert sub.get_message(timeout=0.2) is None  # nothing deleted, nothing announced
    finally:
        sub.close()


def test_bad_graph_does_not_bump_version_or_publish(redis_factory, mkgraph):
    store = redis_factory()
    store.put(mkgraph("toy"))
    v = store.version()
    bad = mkgraph("toy").model_copy(deep=True)
    bad.entry = {"ghost": 1.0}
    with pytest.raises(PDGraphError):
        store.put(bad)
    assert store.version() == v


def test_prefixes_isolate_stores(redis_factory, mkgraph):
    a = redis_factory()
    b = redis_factory(prefix=a.prefix + "other:")
    a.put(mkgraph("toy"))
    assert b.get("toy") is None and b.list_apps() == []
    assert a.list_apps() == ["toy"]


def test_garbage_in_redis_is_reported_with_its_key(redis_factory, raw, mkgraph):
    store = redis_factory()
    raw.hset(f"{store.prefix}pdgraphs", "toy", '{"version": 1, "app": "toy"')
    with pytest.raises(PDGraphError, match=rf"{store.prefix}pdgraphs\[toy\]"):
        store.get("toy")
    raw.rpush(f"{store.prefix}records:toy", '{"app": "toy"}')
    with pytest.raises(RecordError, match=rf"{store.prefix}records:toy\[0\]: field run_id"):
        list(store.records("toy"))


def test_client_and_url_are_exclusive(redis_server):
    with pytest.raises(ValueError):
        RedisStore()
    client = redis.Redis.from_url(redis_server)
    with pytest.raises(ValueError):
        RedisStore(redis_server, client=client)
    store = RedisStore(client=client, prefix="test-client:")
    try:
        assert store.list_apps() == []
        store.close()  # not ours: the caller's client stays usable
        assert client.ping()
    finally:
        client.close()

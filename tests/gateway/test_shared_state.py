"""State exact across gateway processes, in a real Redis (hermes.gateway.shared): admission,
stored Responses, idempotency claims, the resolver's evidence index, and what an edge does
when the store does not answer."""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest
from gw_redis import redis_url  # noqa: F401  (fixture)

from hermes.core.limits import Admission, TenantLimits
from hermes.gateway.config import IdentityConfig
from hermes.gateway.resolve import Resolver
from hermes.gateway.responses import ResponseStore
from hermes.gateway.shared import SharedAdmission, SharedStore, StoreUnavailable
from hermes.gateway.shared.evidence import RedisKeyIndex
from hermes.gateway.shared.idempotency import RedisIdempotency
from hermes.gateway.shared.responses import RedisResponseStore
from hermes.procs import free_port

MODEL = "llama-2-7b"


@pytest.fixture
def store(redis_url: str):  # noqa: F811
    s = SharedStore(redis_url, prefix=f"t{uuid.uuid4().hex[:8]}:")
    yield s
    s.close()


def _dead_store(policy: str = "refuse") -> SharedStore:
    return SharedStore(f"redis://127.0.0.1:{free_port()}/0", policy=policy,  # type: ignore[arg-type]
                       timeout_s=0.2)


# ---------------------------------------------------------------------------------- admission
def test_limits_are_exact_over_two_edges_not_twice(store: SharedStore) -> None:
    lim = TenantLimits(rpm=10)
    edges = [SharedAdmission(store, default=lim), SharedAdmission(store, default=lim)]
    got = [edges[i % 2].admit("acme", 0.0) for i in range(30)]
    assert sum(ok for ok, _, _ in got) == 10
    refused = [g for g in got if not g[0]]
    assert all(0 < wait <= 60 and "10 requests a minute" in why for _, wait, why in refused)
    # the in-memory admission of each process would have let 2 x 10 through
    local = [Admission(default=lim), Admission(default=lim)]
    assert sum(local[i % 2].admit("acme", 0.0)[0] for i in range(30)) == 20
    # another tenant has its own window
    assert edges[1].admit("other", 0.0)[0]


def test_token_bucket_and_in_flight_limits_are_shared(store: SharedStore) -> None:
    bucket = TenantLimits(rate=0.001, burst=4)
    a, b = SharedAdmission(store, default=bucket), SharedAdmission(store, default=bucket)
    assert sum((a if i % 2 else b).admit("t1", 0.0)[0] for i in range(12)) == 4
    conc = TenantLimits(max_concurrent=3)
    a.default = b.default = conc
    assert [a.admit("t2", 0.0)[0], b.admit("t2", 0.0)[0], a.admit("t2", 0.0)[0]] == [True] * 3
    ok, wait, why = b.admit("t2", 0.0)
    assert not ok and "3 requests in flight" in why
    a.release("t2")  # one ends on edge a: edge b may admit one more
    assert b.admit("t2", 0.0)[0] and not a.admit("t2", 0.0)[0]


def test_an_unreachable_store_refuses_or_admits_locally_and_says_so() -> None:
    lim = TenantLimits(rpm=2)
    refuse = SharedAdmission(_dead_store("refuse"), default=lim)
    with pytest.raises(StoreUnavailable):
        refuse.admit("acme", 0.0)
    assert refuse.store.unavailable[("admission", "refused")] == 1 and not refuse.store.up
    local = SharedAdmission(_dead_store("admit-local"), default=lim)
    got = [local.admit("acme", float(i))[0] for i in range(4)]
    assert got == [True, True, False, False]  # the process's own window: per instance
    assert local.store.unavailable[("admission", "admitted-local")] == 4


def test_one_slow_reply_fails_alone_three_in_a_row_mean_down() -> None:
    """A store that accepts connections and never answers: each call times out; the store
    counts as down (and the next calls fail at once) only after 3 in a row."""
    import socket
    import time

    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(16)
    store = SharedStore(f"redis://127.0.0.1:{hang.getsockname()[1]}/0", timeout_s=0.1)
    try:
        for i in range(3):
            with pytest.raises(StoreUnavailable):
                store.call("ping", store.client.ping)
            assert store.up == (i < 2)
        t = time.monotonic()
        with pytest.raises(StoreUnavailable, match="retry pause"):
            store.call("ping", store.client.ping)
        assert time.monotonic() - t < 0.05  # no wait for the timeout while down
    finally:
        store.close()
        hang.close()


# ---------------------------------------------------------------------------------- responses
def test_one_tenants_flood_never_evicts_anothers_response_in_memory() -> None:
    store = ResponseStore(max_items=100)
    store.put("A", {"id": "resp_a"}, [], [{"role": "user", "content": "a"}])
    for i in range(150):
        store.put("B", {"id": f"resp_b{i}"}, [], [])
    assert store.get("A", "resp_a") is not None
    assert store.get("B", "resp_b0") is None and store.get("B", "resp_b149") is not None


def test_redis_responses_are_shared_per_tenant_capped_and_outlive_the_client(
        store: SharedStore, redis_url: str) -> None:  # noqa: F811
    edge1 = RedisResponseStore(store, max_items=20)
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    edge1.put("A", {"id": "resp_a"}, [{"id": "in1"}], conv, run_id="run-1")
    for i in range(30):
        edge1.put("B", {"id": f"resp_b{i}"}, [], [])
    # another process, another client: finds A's, not B's oldest; B never sees A's
    other = SharedStore(redis_url, prefix=store.prefix)
    edge2 = RedisResponseStore(other, max_items=20)
    got = edge2.get("A", "resp_a")
    assert got is not None and got.conversation == conv and got.run_id == "run-1"
    assert edge2.get("B", "resp_a") is None and edge2.get(None, "resp_a") is None
    assert edge2.get("B", "resp_b9") is None and edge2.get("B", "resp_b10") is not None
    assert edge2.count("B") == 20
    assert not edge2.delete("B", "resp_a") and edge2.delete("A", "resp_a")
    assert edge1.get("A", "resp_a") is None
    other.close()


# ---------------------------------------------------------------------------------- idempotency
def test_one_claim_wins_among_concurrent_edges(store: SharedStore) -> None:
    idem = RedisIdempotency(store)
    results: list[tuple[str, str] | None] = []
    lock = threading.Lock()

    def claim(i: int) -> None:
        got = idem.claim("acme", "key-1", "h", f"run-{i}")
        with lock:
            results.append(got)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r is None]
    assert len(winners) == 1
    held = {r for r in results if r is not None}
    assert len(held) == 1 and next(iter(held))[1] == "h"
    assert idem.claim("other", "key-1", "h", "run-x") is None  # per tenant
    rid = next(iter(held))[0]
    idem.drop("acme", "key-1", "h", "run-not-mine")  # not the holder: kept
    assert idem.claim("acme", "key-1", "h", "run-y") == (rid, "h")
    idem.drop("acme", "key-1", "h", rid)
    assert idem.claim("acme", "key-1", "h", "run-y") is None


# ---------------------------------------------------------------------------------- resolver
def test_next_turn_joins_its_run_on_another_edge(store: SharedStore) -> None:
    """Two resolvers (two edges) share the evidence index; the run lives in one registry
    (the scheduler's): the second turn, received by edge 2, joins the run edge 1 opened."""
    cfg = IdentityConfig()
    registry: dict[str, tuple[str, str, str]] = {}
    index = RedisKeyIndex(store, max_per_tenant=1000, ttl_s=600)

    def adopt(run_key: str) -> tuple[str, str, str] | None:
        return registry.get(run_key)

    edges = [Resolver(cfg, index=index, adopt=adopt, new_run_id=lambda: f"run-{uuid.uuid4()}")
             for _ in range(2)]
    msgs = [{"role": "system", "content": "You are a careful travel agent."},
            {"role": "user", "content": "Book me a flight to Lisbon next Tuesday."}]
    first = edges[0].resolve("acme", {"model": MODEL, "messages": msgs}, {}, 0.0)
    assert first.new_run
    index.remember_run("acme", first.run, first.app, first.app_id)
    registry[first.run] = ("acme", first.app, first.app_id)
    reply = {"role": "assistant", "content": "Which airport do you leave from?"}
    edges[0].answered(first, reply, 1.0)
    nxt = [*msgs, reply, {"role": "user", "content": "From Berlin."}]
    second = edges[1].resolve("acme", {"model": MODEL, "messages": nxt}, {}, 2.0)
    assert (second.run, second.evidence, second.new_run) == (first.run, "continuation", False)
    assert second.app_id == first.app_id
    # another tenant's identical conversation does not join it
    third = edges[1].resolve("evil", {"model": MODEL, "messages": nxt}, {}, 2.0)
    assert third.run != first.run
    # a run the registry no longer has active: a new run that follows it
    registry.clear()
    fresh = Resolver(cfg, index=index, adopt=adopt)
    late = fresh.resolve("acme", {"model": MODEL, "messages": nxt}, {}, 3.0)
    assert late.new_run and late.follows == first.run


def test_an_answer_writes_its_evidence_in_one_round_trip(store: SharedStore) -> None:
    """An answer with tool calls leaves several entries (the conversation it completes, what
    it asked, each call id): written together, one round trip, each found by the next turn's
    lookups; the per-tenant cap still drops the oldest first."""
    cfg = IdentityConfig()
    index = RedisKeyIndex(store, max_per_tenant=1000, ttl_s=600)
    trips: list[int] = []
    real = index.put_many

    def counted(tenant: str, items: list[tuple[bytes, str]], now: float) -> None:
        trips.append(len(items))
        real(tenant, items, now)

    index.put_many = counted  # type: ignore[method-assign]
    edge = Resolver(cfg, index=index, new_run_id=lambda: f"run-{uuid.uuid4()}")
    msgs = [{"role": "system", "content": "You are a careful travel agent."},
            {"role": "user", "content": "Book me a flight to Lisbon next Tuesday."}]
    first = edge.resolve("acme", {"model": MODEL, "messages": msgs}, {}, 0.0)
    calls = [{"id": f"call_{i}", "type": "function",
              "function": {"name": "search", "arguments": "{}"}} for i in range(3)]
    reply = {"role": "assistant", "content": None, "tool_calls": calls}
    edge.answered(first, reply, 1.0)
    assert trips == [5]  # answered + asked + 3 call ids: one round trip
    assert index.written == 5
    # the next turn, quoting the calls' results, at another edge (a fresh resolver)
    results = [{"role": "tool", "tool_call_id": f"call_{i}", "content": "ok"} for i in range(3)]
    other = Resolver(cfg, index=index, adopt=lambda k: ("acme", first.app, first.app_id))
    second = other.resolve("acme", {"model": MODEL, "messages": [*msgs, reply, *results]},
                           {}, 2.0)
    assert second.run == first.run and not second.new_run
    # the cap: past it the oldest entries of the batch go first
    small = RedisKeyIndex(store, max_per_tenant=2, ttl_s=600)
    small.put_many("capped", [(bytes([i]), f"run-{i}") for i in range(4)], 0.0)
    assert small.evicted == 2
    assert [small.get("capped", bytes([i]), 0.0) for i in range(4)] == [
        None, None, "run-2", "run-3"]
    # a server that lost its scripts (restarted, flushed): loaded again, the batch written
    store.client.script_flush()
    small.put_many("flushed", [(b"a", "run-a"), (b"b", "run-b")], 0.0)
    assert small.get("flushed", b"a", 0.0) == "run-a" and small.get("flushed", b"b", 0.0) == "run-b"


# ---------------------------------------------------------------------------------- live
def test_two_gateways_share_quota_and_stored_responses(make_gateway, redis_url: str) -> None:  # noqa: ANN001, F811
    prefix = f"g{uuid.uuid4().hex[:8]}:"
    gws = [make_gateway(store=redis_url, store_prefix=prefix, tenant_rpm=6) for _ in range(2)]
    codes = []
    for i in range(14):
        r = httpx.post(f"{gws[i % 2].url}/v1/chat/completions", timeout=30,
                       headers={"X-Hermes-Tenant": "acme", "X-Hermes-Run": "none"},
                       json={"model": MODEL, "max_tokens": 2,
                             "messages": [{"role": "user", "content": f"q{i}"}]})
        codes.append(r.status_code)
    assert codes.count(200) == 6 and codes.count(429) == 8, codes
    # previous_response_id continued on the other gateway (tenant "other": its own window)
    h = {"X-Hermes-Tenant": "other"}
    r1 = httpx.post(f"{gws[0].url}/v1/responses", headers=h, timeout=30,
                    json={"model": MODEL, "input": "Remember the word tangerine.",
                          "max_output_tokens": 4})
    assert r1.status_code == 200, r1.text
    r2 = httpx.post(f"{gws[1].url}/v1/responses", headers=h, timeout=30,
                    json={"model": MODEL, "input": "Which word?", "max_output_tokens": 4,
                          "previous_response_id": r1.json()["id"]})
    assert r2.status_code == 200, r2.text
    assert httpx.get(f"{gws[1].url}/v1/responses/{r1.json()['id']}", headers=h).status_code == 200
    items = httpx.get(f"{gws[0].url}/v1/responses/{r2.json()['id']}/input_items", headers=h)
    assert items.json()["data"][0]["content"][0]["text"] == "Which word?"


def test_gateway_refuses_when_the_store_is_down_and_counts_it(make_gateway) -> None:  # noqa: ANN001
    dead = f"redis://127.0.0.1:{free_port()}/0"
    gw = make_gateway(store=dead, tenant_rpm=100, store_timeout_s=0.2)
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    r = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
    assert r.headers["retry-after"] == "1"
    m = httpx.get(f"{gw.url}/metrics").text
    assert "hermes_shared_store_up 0.0" in m
    assert 'hermes_shared_store_unavailable_total{action="refused",op="admission"}' in m
    nolimit = make_gateway(store=dead, store_timeout_s=0.2)  # admission needs no store here
    r = httpx.get(f"{nolimit.url}/v1/responses/resp_x", timeout=30)
    assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
    assert 'action="refused",op="responses-get"' in httpx.get(f"{nolimit.url}/metrics").text
    local = make_gateway(store=dead, tenant_rpm=100, store_timeout_s=0.2,
                         store_unavailable="admit-local")
    r = httpx.post(f"{local.url}/v1/chat/completions", json=body, timeout=30,
                   headers={"X-Hermes-Run": "none"})
    assert r.status_code == 200, r.text
    m = httpx.get(f"{local.url}/metrics").text
    assert 'hermes_shared_store_unavailable_total{action="admitted-local",op="admission"}' in m


def test_idempotency_key_gives_one_run_over_two_gateways(make_gateway, redis_url: str) -> None:  # noqa: ANN001, F811
    prefix = f"i{uuid.uuid4().hex[:8]}:"
    gws = [make_gateway(store=redis_url, store_prefix=prefix) for _ in range(2)]
    h = {"Idempotency-Key": "order-42"}
    body = {"app": "myapp"}
    first = httpx.post(f"{gws[0].url}/v1/runs", json=body, headers=h, timeout=30)
    assert first.status_code == 201
    rid = first.json()["run_id"]
    # the other process cannot see that run (it lives in the first one's registry): it never
    # makes a second run for the key
    other = httpx.post(f"{gws[1].url}/v1/runs", json=body, headers=h, timeout=30)
    assert other.status_code == 409 and rid in other.text
    assert other.json()["error"]["code"] == "idempotency_key_in_progress"
    again = httpx.post(f"{gws[0].url}/v1/runs", json=body, headers=h, timeout=30)
    assert again.json()["run_id"] == rid and again.headers["idempotent-replayed"] == "true"
    reused = httpx.post(f"{gws[1].url}/v1/runs", json={"app": "other"}, headers=h, timeout=30)
    assert reused.status_code == 422
    assert reused.json()["error"]["code"] == "idempotency_key_reused"


def test_revoking_a_key_refuses_it_on_every_gateway_at_once(make_gateway, redis_url: str) -> None:  # noqa: ANN001, F811
    from hermes.gateway.keys import RedisKeyStore

    keys = RedisKeyStore(redis_url)
    key = keys.create(f"rev{uuid.uuid4().hex[:6]}")
    gws = [make_gateway(auth_redis=redis_url, store=redis_url) for _ in range(2)]
    auth = {"Authorization": f"Bearer {key}"}
    assert [httpx.get(f"{g.url}/v1/models", headers=auth).status_code for g in gws] == [200, 200]
    assert keys.revoke(key[3:].split(".")[0])
    assert [httpx.get(f"{g.url}/v1/models", headers=auth).status_code for g in gws] == [401, 401]


def test_key_store_down_is_503_not_500(make_gateway, tmp_path) -> None:  # noqa: ANN001
    """The Redis key store and shared store go away while the gateway serves: a key check is
    refused with 503 (it was a 500), counted; with admit-local a key verified lately passes."""
    from hermes.bench.quota import start_redis
    from hermes.gateway.keys import RedisKeyStore
    from hermes.procs import stop_group

    proc, url = start_redis(tmp_path)
    try:
        key = RedisKeyStore(url).create("acme")
        gw = make_gateway(auth_redis=url, store=url, store_timeout_s=0.2, metrics_token="mtok")
        local = make_gateway(auth_redis=url, store=url, store_timeout_s=0.2,
                             store_unavailable="admit-local")
        auth = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{gw.url}/v1/models", headers=auth).status_code == 200
        assert httpx.get(f"{local.url}/v1/models", headers=auth).status_code == 200
    finally:
        stop_group(proc, 5.0)
    r = httpx.get(f"{gw.url}/v1/models", headers=auth)
    assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
    assert 'op="api-keys"' in httpx.get(f"{gw.url}/metrics",
                                        headers={"Authorization": "Bearer mtok"}).text
    assert httpx.get(f"{local.url}/v1/models", headers=auth).status_code == 200
    other = {"Authorization": "Bearer hk-1a2b3c4d.never-verified"}
    assert httpx.get(f"{local.url}/v1/models", headers=other).status_code == 503


@pytest.mark.slow
def test_next_turn_joins_its_run_after_the_gateway_was_killed(tmp_path, redis_url: str) -> None:  # noqa: ANN001, F811
    """kill -9 of the process that opened an inferred run (no clean stop, so no snapshot of
    the resolver): the restarted one recovers the run from durable state and, finding the
    conversation in the shared evidence index, the next turn joins that run."""
    import os
    import signal
    import subprocess
    import sys

    from hermes.procs import wait_http

    env = {**os.environ, "HERMES_LOG_LEVEL": "warning", "HERMES_TIME_SCALE": "50",
           "HERMES_CLUSTER__STORE": redis_url,
           "HERMES_CLUSTER__STORE_PREFIX": f"k{uuid.uuid4().hex[:8]}:",
           "HERMES_DURABILITY__RECOVERY_GRACE_S": "0.5"}

    def start() -> tuple[subprocess.Popen, str]:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "hermes.cli", "serve", "--host", "127.0.0.1", "--port",
             str(port), "--bind", "", "--state-dir", str(tmp_path), "--kb",
             str(tmp_path / "kb")],
            stdout=(tmp_path / "gw.log").open("ab"), stderr=subprocess.STDOUT, env=env,
            start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/healthz", proc, timeout=60)
        return proc, url

    msgs = [{"role": "system", "content": "You plan trips step by step."},
            {"role": "user", "content": "Plan two days in Porto for me."}]
    proc, url = start()
    try:
        r1 = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                        json={"model": MODEL, "max_tokens": 5, "messages": msgs})
        assert r1.status_code == 200
        run = r1.headers["x-hermes-run"]
        reply = r1.json()["choices"][0]["message"]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    proc, url = start()
    try:
        turn2 = [*msgs, {"role": "assistant", "content": reply["content"]},
                 {"role": "user", "content": "Add a wine tasting."}]
        r2 = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                        json={"model": MODEL, "max_tokens": 5, "messages": turn2})
        assert r2.status_code == 200
        assert r2.headers["x-hermes-run"] == run
        assert httpx.get(f"{url}/v1/runs/{run}").json()["state"] in ("queued", "running")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

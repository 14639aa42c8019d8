"""Two gateways elected by a lease in a real Redis, with a real HermesLet following both: the
leader serves and answers /readyz 200; the standby answers 503 (``not_leader``) but for the
health paths; when the leader stops, the standby takes over, the node follows it and the
accepted run finishes there. Config refusals name what is missing."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gw_redis import redis_url  # noqa: F401  (fixture)

from hermes.gateway.config import ConfigError, load_config
from hermes.gateway.server import BackgroundServer, gateway_state, start_background
from hermes.procs import free_port

pytestmark = pytest.mark.timeout(120)


def _gateway(tmp: Path, redis: str, i: int, zmq_port: int) -> BackgroundServer:
    cfg = load_config(None, environ={"HERMES_EMBEDDED_NODE": "false"}, port=0,
                      bind=f"tcp://127.0.0.1:{zmq_port}", kb=str(tmp / f"kb{i}"),
                      state_dir=str(tmp / f"st{i}"), time_scale=50.0, log_level="warning",
                      state_redis=redis, election=redis, member=f"gw{i}",
                      lease_ttl_s=1.0, lease_renew_s=0.2, recovery_grace_s=2.0)
    return start_background(cfg)


@pytest.fixture
def node_proc(tmp_path: Path) -> Iterator[list]:
    made: list = []
    yield made
    for p in made:
        p.terminate()
        p.wait(10)


def _start_node(made: list, addresses: list[str], log: Path) -> subprocess.Popen:
    """``hermeslet run`` following both schedulers (a real node process)."""
    argv = [sys.executable, "-m", "hermeslet.cli", "run", "--node", "n0", "--time-scale",
            "50", "--heartbeat-s", "0.2", "--max-inflight", "8"]
    for a in addresses:
        argv += ["--scheduler", a]
    p = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    made.append(p)
    return p


def _wait(pred, timeout: float = 15.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_leader_serves_standby_refuses_then_takes_over(tmp_path: Path, redis_url: str,  # noqa: F811
                                                       node_proc: list) -> None:
    ports = [free_port(), free_port()]
    a = _gateway(tmp_path, redis_url, 0, ports[0])
    _wait(lambda: httpx.get(a.url + "/readyz").status_code == 200)
    b = _gateway(tmp_path, redis_url, 1, ports[1])
    log = tmp_path / "node.log"
    _start_node(node_proc, [f"tcp://127.0.0.1:{p}" for p in ports], log)
    try:
        _wait(lambda: httpx.get(a.url + "/healthz").json()["nodes"])
        r = httpx.get(b.url + "/readyz")
        assert r.status_code == 503 and r.json()["role"] == "standby"
        refused = httpx.post(b.url + "/v1/chat/completions", json={
            "model": "llama-2-7b", "messages": [{"role": "user", "content": "hi"}]})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_leader"
        assert refused.headers["retry-after"] == "1"
        assert httpx.get(b.url + "/healthz").status_code == 200
        ok = httpx.post(a.url + "/v1/chat/completions", json={
            "model": "llama-2-7b", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4})
        assert ok.status_code == 200
        run = httpx.post(a.url + "/v1/runs", json={"app": "llm_reasoning", "input": {"seed": 1}},
                         headers={"Idempotency-Key": "k1"}).json()
        epoch_a = httpx.get(a.url + "/readyz").json()["epoch"]
        a.stop()  # a clean stop gives the lease up: the standby takes over at once
        _wait(lambda: httpx.get(b.url + "/readyz").status_code == 200, timeout=10)
        info = httpx.get(b.url + "/readyz").json()
        assert info["epoch"] > epoch_a and info["role"] == "leader"
        _wait(lambda: f"address #1, epoch {info['epoch']}" in log.read_text())
        _wait(lambda: httpx.get(f"{b.url}/v1/runs/{run['run_id']}").json()["state"]
              == "finished", timeout=30)
        again = httpx.post(b.url + "/v1/runs", json={"app": "llm_reasoning",
                                                     "input": {"seed": 1}},
                           headers={"Idempotency-Key": "k1"})
        assert again.json()["run_id"] == run["run_id"]  # the key outlived the failover
        assert gateway_state(b).scheduler.node_table.epoch == info["epoch"]
    finally:
        # both, whatever failed: an elected gateway left running in this process exits it
        # (status 75) when it later loses its lease
        a.stop()
        b.stop()


def test_election_needs_remote_nodes_and_shared_runs() -> None:
    with pytest.raises(ConfigError, match="embedded_node"):
        load_config(None, environ={}, election="redis://127.0.0.1:1/0")
    with pytest.raises(ConfigError, match="--redis"):
        load_config(None, environ={"HERMES_EMBEDDED_NODE": "false"},
                    election="redis://127.0.0.1:1/0")
    with pytest.raises(ConfigError, match="renew_s"):
        load_config(None, environ={"HERMES_EMBEDDED_NODE": "false"},
                    election="redis://127.0.0.1:1/0", state_redis="redis://127.0.0.1:1/0",
                    lease_ttl_s=1.0, lease_renew_s=2.0)


def test_redis_run_store_indexes_the_active_runs(redis_url: str) -> None:  # noqa: F811
    """A new leader reads the runs not ended first (``active_runs``): the index follows every
    write, and a store written before the index existed is indexed when opened."""
    import redis

    from hermes.gateway.run_store import RedisRunStore

    prefix = f"t{time.time()}:"
    store = RedisRunStore(redis_url, prefix=prefix)
    for i, status in enumerate(["running", "finished", "queued"]):
        store.put_run(f"r{i}", status, {"run_id": f"r{i}", "status": status,
                                         "submitted": float(10 - i), "n_units": 0})
    assert [d["run_id"] for d in store.active_runs()] == ["r2", "r0"]  # acceptance order
    store.put_run("r0", "failed", {"run_id": "r0", "status": "failed", "submitted": 10.0,
                                   "n_units": 0})
    assert [d["run_id"] for d in store.active_runs()] == ["r2"]
    store.close()
    r = redis.Redis.from_url(redis_url)
    r.delete(prefix + "active", prefix + "active_index")  # as an older version left it
    again = RedisRunStore(redis_url, prefix=prefix)
    assert [d["run_id"] for d in again.active_runs()] == ["r2"]
    assert len(again.runs()) == 3
    again.close()


def test_role_cpu_meter_counts_the_schedulers_share(make_gateway, monkeypatch) -> None:  # noqa: ANN001
    """``HERMES_ROLE_CPU=1``: the scheduler's own CPU time (submissions, node messages, the
    sweep) is counted apart from the edge's, for the capacity figures of ``--scale``."""
    monkeypatch.setenv("HERMES_ROLE_CPU", "1")
    gw = make_gateway()
    before = httpx.get(gw.url + "/healthz").json()["scheduler_cpu_ns"]
    for _ in range(5):
        r = httpx.post(gw.url + "/v1/chat/completions", json={
            "model": "llama-2-7b", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4})
        assert r.status_code == 200
    assert httpx.get(gw.url + "/healthz").json()["scheduler_cpu_ns"] > before
    monkeypatch.delenv("HERMES_ROLE_CPU")
    assert "scheduler_cpu_ns" not in httpx.get(make_gateway().url + "/healthz").json()


def test_a_lookup_that_misses_while_ended_runs_are_restored_says_retry(tmp_path: Path) -> None:
    """A new leader restores the ended runs after it is ready: a run id or Idempotency-Key
    it does not know yet is "retry" (503), not "not found" (404) or a second run."""
    from hermes.gateway.errors import NoCapacity, RunNotFound
    from hermes.gateway.scheduler import LiveScheduler

    sched = LiveScheduler(load_config(None, environ={}, kb=str(tmp_path / "kb"),
                                      state_dir=str(tmp_path / "st")))
    try:
        sched.recovery.restoring_ended = True
        with pytest.raises(NoCapacity, match="retry"):
            sched.get_run("run-unknown")
        with pytest.raises(NoCapacity):
            sched.idempotent_run("default", "k")
        sched.recovery.restoring_ended = False
        with pytest.raises(RunNotFound):
            sched.get_run("run-unknown")
        assert sched.idempotent_run("default", "k") is None
    finally:
        sched.durable.close()

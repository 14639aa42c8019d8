"""Two gateways elected by a lease in a real Redis, with a real HermesLet following both: the
leader serves and answers /readyz 200; the standby answers 503 (``not_leader``) but for the
health paths; when the leader stops, the standby takes over, the node follows it and the
accepted run finishes there. Config refusals name what is missing."""

from __future__ import annotations

import os
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


def test_an_elected_gateway_that_cannot_lead_gives_the_lease_up(tmp_path: Path,
                                                                redis_url: str) -> None:  # noqa: F811
    """Elected, a gateway whose node socket's port is taken (another process bound it after
    the port was chosen) logs why, gives the lease up and exits (75: restart it as a
    standby), so that the standby leads. Before, it went on renewing a lease it could not
    serve under, and no gateway became ready (``hermes bench ha``: "no leader after 60 s")."""
    import json
    import socket

    from hermes.bench.ha import EXIT_DEPOSED
    from hermes.procs import stop_group

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    base = redis_url.rsplit("/", 1)[0]  # a lease and run state of this test's own
    election, state = f"{base}/7", f"{base}/8"

    def serve(i: int, zmq_port: int) -> tuple[subprocess.Popen, Path, int]:
        log = tmp_path / f"gw{i}.log"
        env = {**os.environ, "HERMES_EMBEDDED_NODE": "false", "HERMES_LOG_LEVEL": "warning",
               "HERMES_HA__MEMBER": f"gw{i}", "HERMES_HA__LEASE_TTL_S": "30",
               "HERMES_HA__LEASE_RENEW_S": "0.5"}
        port = free_port()
        argv = [sys.executable, "-m", "hermes.cli", "serve", "--host", "127.0.0.1",
                "--port", str(port), "--bind", f"tcp://127.0.0.1:{zmq_port}",
                "--redis", state, "--ha", election, "--state-dir", str(tmp_path / f"st{i}"),
                "--kb", str(tmp_path / f"kb{i}")]
        return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                env=env, start_new_session=True), log, port

    first, log0, _ = serve(0, taken.getsockname()[1])
    second = None
    try:
        _wait(lambda: "scheduler lease acquired" in log0.read_text() or first.poll() is not None,
              timeout=60)
        second, _, port1 = serve(1, free_port())
        # it gave up well before its lease (30 s) would have run out
        assert first.wait(30) == EXIT_DEPOSED, log0.read_text()[-2000:]
        text = log0.read_text()
        assert "could not start leading" in text and "Address already in use" in text, text
        event = json.loads(next(line for line in text.splitlines() if "ha_start_failed" in line))
        assert event["epoch"] >= 1 and event["member"] == "gw0"
        _wait(lambda: _ready(f"http://127.0.0.1:{port1}"), timeout=60)
    finally:
        taken.close()
        for p in (first, second):
            if p is not None:
                stop_group(p)


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False

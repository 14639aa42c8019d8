"""Split roles with ZeroMQ CURVE on every link: edge -> scheduler (``[ha] edge_bind``), node ->
scheduler and node -> edge (the answers). In process, real sockets, a real Redis for the
lease: an active ``--role scheduler``, a HermesLet with the built-in engine (its own event loop
in a thread) and ``--role edge`` processes' apps (uvicorn in threads).

- an edge with an authorized key serves chats (plain and streamed) answered by the node;
- an edge whose key the scheduler does not list gets nothing: its ``/readyz`` stays 503
  (and says the scheduler refused its key), its chats 503; the scheduler logs and counts it;
- an edge that does not list the node's key (its copy of ``authorized/`` lacks it) refuses
  the node's answers: the node finds out at the handshake and fails the call, so the client
  gets a clear 502 within seconds, not a wait for the request timeout (600 s).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gw_redis import redis_url  # noqa: F401  (fixture)
from threaded_node import ThreadedNode

from hermes.gateway.config import load_config
from hermes.gateway.server import BackgroundServer, gateway_state, start_background
from hermes.procs import free_port

pytestmark = pytest.mark.timeout(120)

MODEL = "curve-edge-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


class _Node(ThreadedNode):
    """A HermesLet with CURVE keys and one built-in engine, in a thread."""

    def __init__(self, address: str, keys: Path, name: str) -> None:
        self.keys, self.name = keys, name
        super().__init__(address)

    def make(self, address: str) -> Any:
        from hermeslet.agent import HermesLet
        from hermeslet.engines.sim_engine import SimEngine

        return HermesLet(self.name, address, [SimEngine(name="sim", model=MODEL,
                                                        time_scale=50.0)],
                         heartbeat_s=0.2,
                         curve_keys=(str(self.keys / "nodes" / f"{self.name}.key_secret"),
                                     str(self.keys / "server.key")))


def _wait(pred, why: str, timeout: float = 15.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


def _ready(srv: BackgroundServer) -> dict[str, Any]:
    r = httpx.get(srv.url + "/readyz", timeout=5)
    return {**r.json(), "http": r.status_code}


@pytest.fixture(scope="module")
def cluster(redis_url: str, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
            ) -> Iterator[dict[str, Any]]:
    from hermes.security.curve import create_curve_keys

    tmp = tmp_path_factory.mktemp("curve")
    keys = tmp / "keys"
    create_curve_keys(keys, ["n0"], ["e-good", "e-revoked"])
    (keys / "authorized-edges" / "e-revoked.key").unlink()  # made, then revoked
    # a host whose copy of the directory does not list the node: it refuses the node's answers
    strict = tmp / "strict-keys"
    shutil.copytree(keys, strict)
    (strict / "authorized" / "n0.key").unlink()

    refusals: list[str] = []  # the CURVE refusals logged (from the start: once per key)

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            refusals.append(record.getMessage())

    handler = _Keep(logging.WARNING)
    logging.getLogger("hermes.security.curve").addHandler(handler)
    nodes_addr = f"tcp://127.0.0.1:{free_port()}"
    servers: list[BackgroundServer] = []

    def start(**kw: Any) -> BackgroundServer:
        base: dict[str, Any] = dict(port=0, time_scale=50.0, log_level="warning",
                                    election=redis_url, lease_ttl_s=1.0, lease_renew_s=0.2)
        srv = start_background(load_config(None, environ={}, **{**base, **kw}))
        servers.append(srv)
        return srv

    sched = start(**{"ha.role": "scheduler", "ha.edge_bind": f"tcp://127.0.0.1:{free_port()}",
                     "embedded_node": False, "bind": nodes_addr, "state_redis": redis_url,
                     "kb": str(tmp / "kb"), "state_dir": str(tmp / "st"), "member": "s0",
                     "curve_dir": str(keys)})
    node = _Node(nodes_addr, keys, "n0")
    try:
        live = gateway_state(sched).scheduler
        _wait(lambda: "n0" in live.nodes, "the node never joined the scheduler (CURVE)")

        def edge(name: str, directory: Path, key: str) -> BackgroundServer:
            return start(**{"ha.role": "edge", "bind": f"tcp://127.0.0.1:{free_port()}",
                            "member": name, "curve_dir": str(directory),
                            "curve_key": str(directory / "edges" / f"{key}.key_secret")})

        yield {"sched": sched, "keys": keys, "node": node, "refusals": refusals,
               "good": edge("edge-good", keys, "e-good"),
               "revoked": edge("edge-revoked", keys, "e-revoked"),
               "strict": edge("edge-strict", strict, "e-good")}
    finally:
        logging.getLogger("hermes.security.curve").removeHandler(handler)
        node.stop()
        for srv in reversed(servers):
            srv.stop()


def test_a_chat_through_a_curve_edge_is_answered_by_a_curve_node(cluster: dict) -> None:
    good = cluster["good"]
    _wait(lambda: _ready(good)["http"] == 200, "the authorized edge never became ready")
    info = _ready(good)
    assert info["curve"] == "up" and info["curve_refused"] == 0
    r = httpx.post(good.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4
    with httpx.stream("POST", good.url + "/v1/chat/completions", timeout=30,
                      json={**CHAT, "stream": True}) as s:
        assert s.status_code == 200
        events = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                   for e in events[:-1] if json.loads(e)["choices"])
    assert text


def test_an_edge_the_scheduler_does_not_list_gets_nothing(cluster: dict) -> None:
    revoked, sched = cluster["revoked"], cluster["sched"]
    _wait(lambda: _ready(revoked).get("curve") == "refused",
          "the edge never heard that the scheduler refused its key")
    time.sleep(1.2)  # longer than an edge's readiness window (READY_S): still no pong
    info = _ready(revoked)
    assert info["http"] == 503 and info["status"] == "not_ready"
    assert "not authorized" in info["curve_reason"]
    r = httpx.post(revoked.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
    metrics = httpx.get(sched.url + "/metrics", timeout=5).text
    line = next(ln for ln in metrics.splitlines()
                if ln.startswith('hermes_curve_refused_total{socket="edges"}'))
    assert float(line.split()[-1]) >= 1
    assert 'hermes_curve_refused_total{socket="nodes"} 0.0' in metrics
    revoked_key = (cluster["keys"] / "edges" / "e-revoked.key").read_text()
    assert any("refused an edge" in m and "authorized-edges" in m and m.split()[6] in revoked_key
               for m in cluster["refusals"]), cluster["refusals"]
    # the authorized edge is not disturbed
    assert _ready(cluster["good"])["http"] == 200


def test_a_node_the_edge_does_not_list_cannot_answer_and_the_call_fails_fast(
        cluster: dict) -> None:
    strict = cluster["strict"]
    _wait(lambda: _ready(strict)["http"] == 200, "the edge never became ready")
    t0 = time.monotonic()
    r = httpx.post(strict.url + "/v1/chat/completions", json=CHAT, timeout=20)
    took = time.monotonic() - t0
    assert r.status_code == 502, r.text
    assert "CURVE key" in r.json()["error"]["message"], r.text
    assert took < 10, took  # the node said so: not the request timeout (600 s)
    print(f"a call the edge cannot get answers for failed in {took:.2f} s")
    info = _ready(strict)
    assert info["curve_refused"] >= 1  # the edge counted the node it refused
    # the fast path (a call opted out of run inference) ends the same way
    r = httpx.post(strict.url + "/v1/chat/completions", json=CHAT, timeout=20,
                   headers={"X-Hermes-Run": "none"})
    assert r.status_code == 502 and "CURVE key" in r.json()["error"]["message"], r.text
    # a streamed call ends too, with an error event
    with httpx.stream("POST", strict.url + "/v1/chat/completions", timeout=60,
                      json={**CHAT, "stream": True}) as s:
        body = "".join(s.iter_lines())
    assert "CURVE key" in body and "[DONE]" not in body
    # the node still answers the edge that lists it
    r = httpx.post(cluster["good"].url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200, r.text

"""Slow tier: split roles on real processes. A real Redis, a real haproxy in front of two
``hermes serve --role edge``, an active and a standby ``--role scheduler``, one HermesLet with
the built-in engine, all started here and stopped by their PIDs (``hermes.bench.ha.Cluster``):

- header-less chats, plain and streamed, answered through either edge and through haproxy
  (the node streams to the edge; the scheduler takes the fast path); calls of a run the
  client drives (``X-Hermes-Run``) join it through either edge, an unknown run is a 404;
- a rename of an app inferred at an edge (``hermes apps rename``, through haproxy) reaches
  both edges; after ``kill -9`` of the active scheduler the new one (same knowledge base)
  keeps it, and a merge made through it reaches both edges;
- a hosted run (``POST /v1/runs`` with ``Idempotency-Key``) survives ``kill -9`` of the active
  scheduler, then one started through an edge survives ``kill -9`` of that edge: each
  finishes once, and its key names the same run afterwards; a long stream in flight through
  an edge survives the scheduler's kill whole;
- after ``kill -9`` of the active scheduler the new leader lists an app an edge inferred
  before that app's next run (the edge tells it), and a rename through it reaches the edge;
- an edge rejects a message of a lower epoch than the scheduler it follows (the test plays a
  scheduler that took the lease with a higher epoch, then sends as a deposed one);
- a header-less agent whose turns go alternately through the two edges (``[cluster] store``:
  the run resolver's evidence index in Redis) is one inferred run, named in every answer,
  which the scheduler ends once an edge's resolver closes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from gw_procs import AGENT_SYSTEM, AGENT_TOOLS, agent_app, need_tools

from hermes.bench.ha import MODEL, Cluster
from hermes.procs import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello edge"}],
        "max_tokens": 8}


def _chat_ok(base: str) -> None:
    r = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] > 0
    with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=30,
                      json={**CHAT, "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c["choices"])
    assert text and chunks[-1]["usage"]["completion_tokens"] > 0


def _post_run(base: str, key: str) -> str:
    for _ in range(300):
        try:
            r = httpx.post(f"{base}/v1/runs", json={"app": "llm_reasoning",
                                                    "input": {"seed": 1, "key": key}},
                           headers={"Idempotency-Key": key}, timeout=10)
        except httpx.HTTPError:
            time.sleep(0.1)
            continue
        if r.status_code in (200, 201):
            return str(r.json()["run_id"])
        time.sleep(0.1)
    raise AssertionError(f"run {key} never accepted")


def _finished(base: str, rid: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{base}/v1/runs/{rid}", timeout=10)
        except httpx.HTTPError:
            time.sleep(0.2)
            continue
        if r.status_code == 200 and r.json()["state"] in ("finished", "failed", "cancelled"):
            return dict(r.json())
        assert r.status_code in (200, 502, 503, 504), r.text  # never 404: nothing lost
        time.sleep(0.2)
    raise AssertionError(f"run {rid} did not end in {timeout} s")


def _app_of(base: str, text: str, system: str = "You greet the visitors.") -> str:
    """The app a new header-less conversation through ``base`` is counted in."""
    r = httpx.post(f"{base}/v1/chat/completions", timeout=30,
                   json={**CHAT, "messages": [{"role": "system", "content": system},
                                              {"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r.headers["x-hermes-app"]


def _admin(via: str, edges: list[str], path: str, body: dict[str, str]) -> float:
    """``POST /admin/apps/PATH`` through ``via``; seconds until every edge follows the new
    app names (its ``/readyz`` ``app_names`` digest changed)."""
    before = [httpx.get(f"{e}/readyz").json()["app_names"] for e in edges]
    r = httpx.post(f"{via}/admin/apps/{path}", json=body, timeout=10)
    assert r.status_code == 200, r.text
    t0 = time.monotonic()
    for e, b in zip(edges, before, strict=True):
        while httpx.get(f"{e}/readyz").json()["app_names"] == b:
            assert time.monotonic() - t0 < 10, f"{e} did not follow {path}"
            time.sleep(0.02)
    return time.monotonic() - t0


def test_edges_serve_and_hosted_runs_survive_scheduler_and_edge_kills(tmp_path: Path) -> None:
    need_tools("redis-server", "haproxy")
    # the schedulers share one knowledge base (the app names survive the failover)
    cl = Cluster(tmp_path, time_scale=5.0, n_gateways=2, n_nodes=1, ttl_s=1.0, n_edges=2,
                 shared_kb=True)
    try:
        cl.start()
        edges = [f"http://127.0.0.1:{port}" for port in cl.edge_ports]
        for port in cl.edge_ports:
            _chat_ok(f"http://127.0.0.1:{port}")
        _chat_ok(cl.url)
        for port in cl.edge_ports:
            d = httpx.get(f"http://127.0.0.1:{port}/readyz").json()
            assert d["role"] == "edge" and d["epoch"] is not None
        # the operator renames an app inferred at an edge (through haproxy): every edge
        # follows within the ping period and a round trip
        greeter = _app_of(edges[0], "Visitor 0")
        took = _admin(cl.url, edges, f"{greeter}/rename", {"to": "greeter"})
        assert took < 2.0, took
        assert [_app_of(e, f"Visitor {i + 1}") for i, e in enumerate(edges)] == ["greeter"] * 2
        # a run the client drives: its calls take the full path (the run registry) and the
        # answers name the run, whichever edge they went through
        run = httpx.post(f"{cl.url}/v1/runs", json={"app": "factool_kbqa"}, timeout=10)
        assert run.status_code == 201, run.text
        run_id = run.json()["run_id"]
        for port in cl.edge_ports:
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT,
                           headers={"X-Hermes-Run": run_id, "X-Hermes-Unit": "verify"},
                           timeout=30)
            assert r.status_code == 200 and r.headers["x-hermes-run"] == run_id, r.text
        units = httpx.get(f"{cl.url}/v1/runs/{run_id}", timeout=10).json()["units"]
        assert sum(len(u.get("requests") or []) for u in units) == 2, units
        r = httpx.post(f"{cl.url}/v1/chat/completions", json=CHAT, timeout=30,
                       headers={"X-Hermes-Run": "run-that-does-not-exist"})
        assert r.status_code == 404, r.text  # the scheduler's refusal, told by the edge

        # kill -9 of the active scheduler with a hosted run and a long stream in flight: the
        # stream's node answers its edge, and the new scheduler leaves it running (an edge's
        # call is not an orphan to cancel once recovery's grace is over)
        rid = _post_run(cl.url, "k-sched")
        got: dict = {}
        started = threading.Event()

        def long_stream() -> None:
            events = []
            with httpx.stream("POST", f"http://127.0.0.1:{cl.edge_ports[1]}/v1/chat/completions",
                              timeout=60, json={**CHAT, "max_tokens": 4000, "ignore_eos": True,
                                                "stream": True,
                                                "stream_options": {"include_usage": True}}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        started.set()
            got["events"] = events

        t = threading.Thread(target=long_stream)
        t0 = time.monotonic()
        t.start()
        assert started.wait(30)
        old = cl.wait_leader(30.0)
        cl.gateways[old].signal(signal.SIGKILL)
        new = cl.wait_leader(30.0, other_than=old)
        assert new != old
        assert _finished(cl.url, rid)["state"] == "finished"
        assert _post_run(cl.url, "k-sched") == rid  # the same run, not a second one
        t.join(60)
        events = got["events"]
        assert time.monotonic() - t0 > 6.0  # it outlived the failover and recovery's grace
        assert events[-1] == "[DONE]" and not any('"error"' in e for e in events), events[-3:]
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 4000
        cl.wait_edge(0)
        cl.wait_edge(1)
        _chat_ok(cl.url)  # edges followed the new scheduler
        # its app names are the old leader's (read again from the knowledge base when it was
        # elected), and a merge made through it reaches both edges
        assert [_app_of(e, f"Guest {i}") for i, e in enumerate(edges)] == ["greeter"] * 2
        porter = _app_of(edges[1], "Guest 2", system="You carry the visitors' bags.")
        assert porter != "greeter"
        assert _admin(cl.url, edges, f"{porter}/merge", {"into": "greeter"}) < 2.0
        assert _app_of(edges[0], "Guest 3", system="You carry the visitors' bags.") == \
            "greeter"
        epochs = {httpx.get(f"http://127.0.0.1:{p}/readyz").json()["epoch"]
                  for p in cl.edge_ports}
        assert len(epochs) == 1 and epochs != {None}

        # kill -9 of the edge a hosted run was started through
        rid2 = _post_run(f"http://127.0.0.1:{cl.edge_ports[0]}", "k-edge")
        cl.edges[0].signal(signal.SIGKILL)
        assert _post_run(cl.url, "k-edge") == rid2  # a retry through haproxy: the same run
        assert _finished(cl.url, rid2)["state"] == "finished"
        _chat_ok(cl.url)  # haproxy sends everything to the other edge
        _chat_ok(f"http://127.0.0.1:{cl.edge_ports[1]}")
    finally:
        cl.stop()


def _turn(port: int, messages: list[dict], *, stream: bool = False) -> tuple[dict, dict]:
    """One turn of a header-less agent through the edge at ``port``: (its run headers, the
    assistant message)."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 12}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    if not stream:
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 200, r.text
        return dict(r.headers), r.json()["choices"][0]["message"]
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        headers = dict(r.headers)
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    text = "".join(c["choices"][0]["delta"].get("content") or ""
                   for c in map(json.loads, events[:-1]) if c["choices"])
    return headers, {"role": "assistant", "content": text}


def test_a_header_less_agent_through_both_edges_is_one_inferred_run(tmp_path: Path) -> None:
    need_tools("redis-server", "haproxy")
    # model seconds at time scale 5: an app with too few gaps closes its runs 10 s (2 s
    # real) after their last answer
    cl = Cluster(tmp_path, time_scale=5.0, n_gateways=2, n_nodes=1, ttl_s=1.0, n_edges=2,
                 shared_store=True,
                 gateway_env={"HERMES_IDENTITY__CLOSE_PRIOR_S": "10",
                              "HERMES_IDENTITY__CLOSE_MIN_S": "5"})
    try:
        cl.start()
        a, b = cl.edge_ports
        msgs: list[dict] = [{"role": "system", "content": "You are a careful research agent."},
                            {"role": "user", "content": "Find the capital of France."}]
        runs, units = [], []
        for i, (port, stream) in enumerate([(a, False), (b, True), (a, False)]):
            h, reply = _turn(port, msgs, stream=stream)
            runs.append(h.get("x-hermes-run"))
            units.append(h.get("x-hermes-unit"))
            assert h.get("x-hermes-app"), h
            msgs = msgs + [reply, {"role": "user", "content": f"Now check step {i + 1}."}]
        assert runs[0] and runs[0].startswith("run-") and len(set(runs)) == 1, runs
        assert all(units), units
        run_id = runs[0]
        d = httpx.get(f"{cl.url}/v1/runs/{run_id}", timeout=10).json()
        assert d["inferred"] is True and d["state"] in ("queued", "running"), d
        assert len(d["units"]) == 3, d["units"]
        assert [u["unit"] for u in d["units"]] == units
        import redis

        info = redis.Redis.from_url(cl.redis_url)  # the edges' shared index: the run's app
        assert info.exists(f"hermes:run:{{default}}:{run_id}") == 1
        # another conversation is another run
        h, _ = _turn(b, [{"role": "user", "content": "An unrelated question."}])
        assert h["x-hermes-run"] != run_id
        # the resolver closes the run when idle; the scheduler then ends it
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            d = httpx.get(f"{cl.url}/v1/runs/{run_id}", timeout=10).json()
            if d["state"] == "finished":
                break
            time.sleep(0.3)
        assert d["state"] == "finished", d
        for _ in range(30):  # both edges tracked it (B adopted it): each closes it
            ready = [httpx.get(f"http://127.0.0.1:{p}/readyz").json() for p in (a, b)]
            if sum(r["inferred_closed"] for r in ready) >= 2:
                break
            time.sleep(0.2)
        assert sum(r["inferred_closed"] for r in ready) >= 2, ready
        assert all(r["inferred_closed_untold"] == 0 for r in ready), ready
        assert len(d["units"]) == 3 and all(u.get("finished") for u in d["units"]), d["units"]
        # no edge adopts it any more: its run info is gone from the shared index
        assert info.exists(f"hermes:run:{{default}}:{run_id}") == 0
    finally:
        cl.stop()


def test_a_new_leader_lists_the_apps_edges_inferred_before_their_next_run(
        tmp_path: Path) -> None:
    """A header-less agent through an edge makes an inferred app; after ``kill -9`` of the
    active scheduler the new leader lists it (``GET /admin/apps``) before any new
    conversation (the edge told it the apps its resolver knows at its first pong), and a
    rename through it reaches the edge."""
    need_tools("redis-server", "haproxy")
    cl = Cluster(tmp_path, time_scale=5.0, n_gateways=2, n_nodes=1, ttl_s=1.0, n_edges=1,
                 shared_kb=True)
    try:
        cl.start()
        edge = f"http://127.0.0.1:{cl.edge_ports[0]}"
        app = agent_app(edge, MODEL)  # an agent: its second turn continues the first's run
        old = cl.wait_leader(30.0)
        listed = httpx.get(f"http://127.0.0.1:{cl.http_ports[old]}/admin/apps",
                           timeout=10).json()["apps"]
        assert app in {a["name"] for a in listed if a["inferred"]}, listed
        cl.gateways[old].signal(signal.SIGKILL)
        new = cl.wait_leader(30.0, other_than=old)
        leader = f"http://127.0.0.1:{cl.http_ports[new]}"
        cl.wait_edge(0)
        t0 = time.monotonic()
        row: dict = {}
        while not row:  # no conversation is sent meanwhile
            r = httpx.get(f"{leader}/admin/apps", timeout=10)
            if r.status_code == 200:
                row = next((a for a in r.json()["apps"] if a["name"] == app), {})
            assert time.monotonic() - t0 < 5.0, r.text
            time.sleep(0.05)
        assert row["inferred"] and row["app_id"] and row["inferred_runs"] == 1, row
        assert row["tools"] == ["book"] and row["instructions"].startswith("You plan"), row
        assert _admin(leader, [edge], f"{app}/rename", {"to": "planner"}) < 2.0
        r = httpx.post(f"{edge}/v1/chat/completions", timeout=30,
                       json={"model": MODEL, "tools": AGENT_TOOLS, "max_tokens": 8,
                             "messages": [AGENT_SYSTEM, {"role": "user", "content": "Paris?"}]})
        assert r.status_code == 200 and r.headers["x-hermes-app"] == "planner", r.headers
    finally:
        cl.stop()


def test_an_edge_rejects_a_deposed_schedulers_messages(tmp_path: Path) -> None:
    """The test is the scheduler: it writes a lease record with its own address for edges
    (epoch 10), answers the edge's pings, then sends as epoch 9."""
    need_tools("redis-server")
    import redis
    import zmq

    from hermes.bench.quota import start_redis
    from hermes.gateway.edge import wire

    rproc, url = start_redis(tmp_path)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    zport, hport = free_port(), free_port()
    router.bind(f"tcp://127.0.0.1:{zport}")
    r = redis.Redis.from_url(url)
    r.set("hermes:ha:leader", json.dumps({"epoch": 10, "holder": "test",
                                          "edge_address": f"tcp://127.0.0.1:{zport}",
                                          "http_address": "127.0.0.1:1"}), px=60_000)
    edge = subprocess.Popen(
        [sys.executable, "-m", "hermes.cli", "serve", "--role", "edge", "--ha", url,
         "--host", "127.0.0.1", "--port", str(hport), "--bind",
         f"tcp://127.0.0.1:{free_port()}", "--state-dir", str(tmp_path / "edge")],
        stdout=(tmp_path / "edge.log").open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    base = f"http://127.0.0.1:{hport}"
    try:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        ident: bytes | None = None

        def serve(epoch: int, until: float) -> list:
            """Answer pings with ``epoch`` until ``until``; the calls received."""
            nonlocal ident
            calls = []
            while time.monotonic() < until:
                if not poller.poll(50):
                    continue
                ident, frame = router.recv_multipart()
                msg = wire.decode_edge(frame)
                if isinstance(msg, wire.Ping):
                    router.send_multipart([ident, wire.encode(wire.Pong(epoch=epoch))])
                elif isinstance(msg, wire.Call):
                    calls.append(msg)
            return calls

        deadline = time.monotonic() + 60
        ready = False
        while time.monotonic() < deadline and not ready:
            serve(10, time.monotonic() + 0.3)
            try:
                ready = httpx.get(f"{base}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                pass
        assert ready, (tmp_path / "edge.log").read_text()
        with httpx.Client(base_url=base, timeout=30) as http:
            got: dict = {}
            t = threading.Thread(target=lambda: got.setdefault(
                "r", http.post("/v1/chat/completions", json=CHAT,
                               headers={"X-Hermes-Run": "none"})))  # the fast path
            t.start()
            calls = []
            while not calls:
                calls = serve(10, time.monotonic() + 0.2)
            rid = calls[0].rid
            assert calls[0].direct and calls[0].reply_to.startswith("tcp://127.0.0.1:")
            # a deposed scheduler (epoch 9) says the call failed: the edge must not believe it
            assert ident is not None
            router.send_multipart([ident, wire.encode(wire.CallFailed(
                rid=rid, epoch=9, status=500, code="stale", message="from the past"))])
            serve(10, time.monotonic() + 0.5)
            assert "r" not in got  # the client still waits for its answer
            d = httpx.get(f"{base}/readyz").json()
            assert d["stale_rejected"] == 1 and d["epoch"] == 10
            # the leader of epoch 10 says it failed: believed
            router.send_multipart([ident, wire.encode(wire.CallFailed(
                rid=rid, epoch=10, status=404, code="model_not_found", message="no model"))])
            t.join(10)
            assert got["r"].status_code == 404 and got["r"].json()["error"]["code"] == \
                "model_not_found"
        assert "stale epoch 9" in (tmp_path / "edge.log").read_text()
    finally:
        os.killpg(edge.pid, signal.SIGTERM)
        edge.wait(10)
        router.close()
        ctx.term()
        r.close()
        rproc.terminate()
        rproc.wait(5)

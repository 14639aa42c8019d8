"""ZeroMQ CURVE between the scheduler and HermesLets: nodes with an authorized key serve;
a node without a key, or with a key the scheduler does not list, is refused."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from hermes.gateway.server import gateway_state
from hermes.procs import free_port

MODEL = "curve-model"


def _node(address: str, name: str, *curve: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hermeslet.cli", "run", "--scheduler", address, "--node", name,
         "--engine", "sim", "--model", MODEL, "--time-scale", "50", *curve],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_node_without_the_curve_key_is_refused(make_gateway, tmp_path: Path) -> None:  # noqa: ANN001
    keys = tmp_path / "curve"
    out = subprocess.run([sys.executable, "-m", "hermes.cli", "keys", "curve", "--dir", str(keys),
                          "--node", "good", "--node", "revoked"], capture_output=True, text=True,
                         check=True)
    assert "good" in out.stdout
    (keys / "authorized" / "revoked.key").unlink()  # made, but not authorized
    address = f"tcp://127.0.0.1:{free_port()}"
    srv = make_gateway(bind=address, embedded_node=False, curve_dir=str(keys))
    sched = gateway_state(srv).scheduler
    server_pub = str(keys / "server.key")
    procs = {
        "plain": _node(address, "plain"),  # no CURVE at all
        "revoked": _node(address, "revoked", "--curve-key",
                         str(keys / "nodes" / "revoked.key_secret"), "--curve-server-key", server_pub),
        # its own key pair, made elsewhere: the scheduler does not know it
        "good": _node(address, "good", "--curve-key", str(keys / "nodes" / "good.key_secret"),
                      "--curve-server-key", server_pub),
    }
    try:
        deadline = time.monotonic() + 30
        while "good" not in sched.nodes:
            assert time.monotonic() < deadline, procs["good"].stderr.read() if procs["good"].poll() else ""
            time.sleep(0.05)
        time.sleep(3.0)  # the others have had time to say hello (they retry) and heartbeat
        assert set(sched.nodes) == {"good"}
        r = httpx.post(srv.url + "/v1/completions", timeout=30,
                       json={"model": MODEL, "prompt": "hello", "max_tokens": 3, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert all(p.poll() is None for p in procs.values())  # refused, not crashed
        # the node with a key not listed was refused at the handshake: counted (a node
        # without CURVE never gets as far as the key check)
        metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        line = next(ln for ln in metrics.splitlines()
                    if ln.startswith('hermes_curve_refused_total{socket="nodes"}'))
        assert float(line.split()[-1]) >= 1
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(10)


def test_embedded_node_works_with_curve_on(make_gateway, tmp_path: Path) -> None:  # noqa: ANN001
    from hermes.security.curve import create_curve_keys

    create_curve_keys(tmp_path / "k", [])
    srv = make_gateway(bind=f"tcp://127.0.0.1:{free_port()}", curve_dir=str(tmp_path / "k"))
    r = httpx.post(srv.url + "/v1/completions", timeout=30,
                   json={"model": "llama-2-7b", "prompt": "hello", "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_keys_for_edges_and_the_reply_address(tmp_path: Path) -> None:
    import zmq.auth

    from hermes.security.curve import public_key, reply_address, split_reply_address

    keys = tmp_path / "k"
    out = subprocess.run([sys.executable, "-m", "hermes.cli", "keys", "curve", "--dir",
                          str(keys), "--node", "n0", "--edge", "e0"], capture_output=True,
                         text=True, check=True)
    assert "edge e0" in out.stdout
    assert (keys / "authorized-edges" / "e0.key").read_text() == \
        (keys / "edges" / "e0.key").read_text()
    assert not (keys / "authorized" / "e0.key").exists()  # an edge is not a node
    assert (keys / "edges" / "e0.key_secret").stat().st_mode & 0o077 == 0
    key = public_key(keys / "edges" / "e0.key_secret")
    assert key.encode() == zmq.auth.load_certificate(keys / "edges" / "e0.key")[0]
    addr = reply_address("tcp://10.0.0.5:7001", key)
    assert split_reply_address(addr) == ("tcp://10.0.0.5:7001", key.encode())
    assert split_reply_address("tcp://10.0.0.5:7001") == ("tcp://10.0.0.5:7001", None)
    for bad in ("tcp://h:1#curve=short", "tcp://h:1#other=" + key):
        with pytest.raises(ValueError, match="bad reply address"):
            split_reply_address(bad)


def test_authorized_keys_are_reread_and_refusals_counted(tmp_path: Path) -> None:
    import asyncio
    import shutil

    import zmq.asyncio

    from hermes.security.curve import NODES, CurveGate, _Authorized, create_curve_keys

    keys = tmp_path / "k"
    create_curve_keys(keys, ["late"])
    (keys / "authorized" / "late.key").unlink()
    key = (keys / "nodes" / "late.key").read_text().split('public-key = "')[1][:40].encode()

    async def go() -> None:
        ctx = zmq.asyncio.Context()
        gate = CurveGate.of(ctx)
        try:
            allowed = _Authorized(gate, NODES, keys / "authorized")
            assert not allowed.callback(NODES, key)
            assert not allowed.callback(NODES, key)
            assert gate.refused == {NODES: 2}
            time.sleep(0.01)  # a later modification time, on a coarse clock too
            shutil.copy(keys / "nodes" / "late.key", keys / "authorized" / "late.key")
            assert allowed.callback(NODES, key)  # added while running: in
            assert gate.refused == {NODES: 2}
        finally:
            gate.auth.stop()
            ctx.term()

    asyncio.run(go())


def test_a_node_never_sends_answers_across_a_curve_mismatch(tmp_path: Path) -> None:
    """A node without CURVE cannot answer a CURVE edge; a node with CURVE does not send
    answers in plain text to an edge without it: either way the request fails at once with
    the reason (no silent fallback)."""
    import asyncio

    import zmq.asyncio

    from hermes.security.curve import create_curve_keys, public_key, reply_address

    keys = tmp_path / "k"
    create_curve_keys(keys, ["n0"], ["e0"])
    plain_edge = f"tcp://127.0.0.1:{free_port()}"
    curve_edge = reply_address(plain_edge, public_key(keys / "edges" / "e0.key_secret"))

    async def go() -> None:
        from hermeslet.edges import EdgeSockets

        ctx = zmq.asyncio.Context()
        plain = EdgeSockets(ctx, "n-plain")
        secure = EdgeSockets(ctx, "n0", curve_key=str(keys / "nodes" / "n0.key_secret"))
        try:
            assert "this node has no CURVE key" in (await plain.check(curve_edge) or "")
            assert "without CURVE" in (await secure.check(plain_edge) or "")
            assert await plain.check(plain_edge) is None  # plain to plain: as before
            from hermes import protocol as P

            plain.send(curve_edge, P.Failed(request_id="r", error="x"))
            assert plain.dropped == 1  # never sent
        finally:
            plain.close()
            secure.close()
            ctx.term()

    asyncio.run(go())

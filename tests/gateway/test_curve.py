"""ZeroMQ CURVE between the scheduler and HermesLets: nodes with an authorized key serve;
a node without a key, or with a key the scheduler does not list, is refused."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

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

"""The haproxy configuration the HA cluster runs (``hermes.bench.ha.haproxy_config``, shown in
docs/ha.md), on a real haproxy: a POST that one server refuses with 503 before running it (an
elected standby's ``not_leader`` while haproxy's checks still count it up) is answered by the
other server, never surfaced to the client. Found by CI: without ``option http-buffer-request``
haproxy did not retry such a POST and an agent's first turn got the standby's 503."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from hermes.bench.ha import haproxy_config
from hermes.procs import free_port, wait_http


def _server(post_status: int) -> ThreadingHTTPServer:
    """A server that is 'ready' (``GET /readyz`` 200) and answers every POST ``post_status``
    with the body a standby gateway sends (a stand-in for a standby whose lease loss haproxy
    has not seen yet: its checks pass, its answer is 503)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, status: int) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = json.dumps({"error": {"code": "not_leader"}} if status == 503
                              else {"served_by": self.server.server_port}).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._answer(200)

        def do_POST(self) -> None:  # noqa: N802
            self._answer(post_status)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    srv.handle_error = lambda *a: None  # haproxy's checks close connections mid-read
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def lb(tmp_path: Path) -> Iterator[tuple[str, int]]:
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy not on PATH (apt-get install haproxy)")
    standby, leader = _server(503), _server(200)
    port = free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(haproxy_config(port, [("standby", f"127.0.0.1:{standby.server_port}"),
                                         ("leader", f"127.0.0.1:{leader.server_port}")]))
    with open(tmp_path / "haproxy.log", "wb") as log:
        proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=log, stderr=log)
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", proc, timeout=20.0)
        yield f"http://127.0.0.1:{port}", leader.server_port
    finally:
        proc.terminate()
        proc.wait(10)
        standby.shutdown()
        leader.shutdown()


def test_a_post_a_server_refuses_with_503_is_answered_by_the_other(lb: tuple[str, int]) -> None:
    url, leader_port = lb
    seen: Counter[int] = Counter()
    with httpx.Client(timeout=10) as c:
        for i in range(20):  # round robin: about half go to the standby first
            r = c.post(f"{url}/v1/chat/completions",
                       json={"model": "m", "messages": [{"role": "user", "content": "x" * 200}],
                             "i": i})
            seen[r.status_code] += 1
            if r.status_code == 200:
                assert r.json()["served_by"] == leader_port
    assert seen == Counter({200: 20}), seen

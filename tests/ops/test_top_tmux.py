"""``hermes top`` in a real terminal (tmux): it renders the runs and the engines of a live
gateway and refreshes as runs progress."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux not installed (apt-get install -y tmux)")


def _pane(sock: str) -> str:
    return subprocess.run(["tmux", "-L", sock, "capture-pane", "-p", "-t", "top"],
                          capture_output=True, text=True, timeout=10).stdout


def test_hermes_top_renders_runs_and_engines(make_ops_gateway) -> None:  # noqa: ANN001
    srv = make_ops_gateway(time_scale=10.0)  # slow enough that runs stay active for seconds
    http = httpx.Client(base_url=srv.url, timeout=30)
    ids = [http.post("/v1/runs", json={"app": "got_docmerge", "input": {"seed": i},
                                       "tenant": "acme"}).json()["run_id"] for i in range(3)]
    sock = f"hermes-test-{uuid.uuid4().hex[:8]}"
    hermes = str(Path(sys.executable).parent / "hermes")
    cmd = f"{hermes} top --url {srv.url} --interval 0.3"
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    subprocess.run(["tmux", "-L", sock, "new-session", "-d", "-s", "top", "-x", "160", "-y", "50",
                    cmd], check=True, env=env, timeout=10)
    try:
        deadline = time.monotonic() + 20
        pane = ""
        while time.monotonic() < deadline:
            pane = _pane(sock)
            if "Engines" in pane and any(i[-12:] in pane for i in ids) and "sim0" in pane:
                break
            time.sleep(0.3)
        assert "hermes top" in pane and "policy=hermes" in pane, pane
        assert "Runs (by rank" in pane and "Engines" in pane, pane
        assert all(i[-12:] in pane for i in ids), pane
        assert "got_docmerge" in pane and "acme" in pane and "running" in pane, pane
        assert "sim0" in pane and "llama-2-7b" in pane and "embedded" in pane, pane
        # it refreshes: cancel the runs and they leave the view
        for i in ids:
            assert http.post(f"/admin/runs/{i}/cancel").status_code == 200
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(i[-12:] in _pane(sock) for i in ids):
            time.sleep(0.3)
        pane = _pane(sock)
        assert not any(i[-12:] in pane for i in ids), pane
        assert "active=0" in pane, pane
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=10)

"""Real gateway and HermesLet processes for fault tests (started and killed by PID)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hermes.procs import wait_http


def start_gateway(port: int, zmq_port: int, state_dir: Path, log: Path, **env: str) -> subprocess.Popen:
    """``hermes serve`` with no embedded node; HermesLets connect over TCP."""
    environ = {**os.environ, "HERMES_EMBEDDED_NODE": "false", "HERMES_LOG_LEVEL": "warning",
               **env}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--bind", f"tcp://127.0.0.1:{zmq_port}", "--state-dir", str(state_dir),
         "--kb", str(state_dir / "kb")],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, env=environ, start_new_session=True)
    return proc


def start_node(zmq_port: int, name: str, log: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hermeslet.cli", "run", "--scheduler", f"tcp://127.0.0.1:{zmq_port}",
         "--node", name, "--engine", "sim", "--model", "llama-2-7b", *extra],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_healthy(url: str, proc: subprocess.Popen, nodes: int = 1, timeout: float = 60.0) -> None:
    """The gateway at ``url`` answers ``/healthz`` with at least ``nodes`` HermesLets."""
    wait_http(url + "/healthz", proc, timeout=timeout,
              ready=lambda r: len(r.json()["nodes"]) >= nodes)


def kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def need_tools(*tools: str) -> None:
    """Skip (or, with ``HERMES_REQUIRE_REDIS=1``, fail) a test whose servers are not on PATH."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        if os.environ.get("HERMES_REQUIRE_REDIS") == "1":
            pytest.fail(f"{missing} not on PATH")
        pytest.skip(f"{missing} not on PATH (apt-get install redis-server haproxy)")


#: the system prompt and tools of :func:`agent_app`'s agent (a request with both is its app's)
AGENT_SYSTEM = {"role": "system", "content": "You plan trips for the visitors."}
AGENT_TOOLS = [{"type": "function", "function": {
    "name": "book", "parameters": {"type": "object", "properties": {}}}}]


def agent_app(base: str, model: str) -> str:
    """Two header-less turns of a tool-using agent through ``base`` (the second continues the
    first's run); the name of the app the gateway inferred for it (the same for both)."""
    system, tools = AGENT_SYSTEM, AGENT_TOOLS
    messages = [system, {"role": "user", "content": "Plan a day in Lyon."}]
    app = ""
    for turn in range(2):
        r = httpx.post(f"{base}/v1/chat/completions", timeout=30,
                       json={"model": model, "messages": messages, "tools": tools,
                             "max_tokens": 8})
        assert r.status_code == 200, r.text
        app = app or r.headers["x-hermes-app"]
        assert r.headers["x-hermes-app"] == app
        messages += [r.json()["choices"][0]["message"],
                     {"role": "user", "content": f"And then {turn}?"}]
    return app

"""Real gateway and HermesLet processes for fault tests (started and killed by PID)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

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

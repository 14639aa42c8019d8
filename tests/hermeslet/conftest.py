"""Fixtures: real sim-engine server processes (uvicorn on free loopback ports)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from hermes.procs import free_port, stop_group


def _start_sim(*extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "hermeslet.cli", "sim-engine", "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sim-engine exited: {proc.stderr.read().decode()}")
        try:
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("sim-engine did not become healthy")


@contextlib.contextmanager
def running_sim(*extra: str) -> Iterator[str]:
    """A sim-engine process (``hermeslet sim-engine`` flags ``extra``) for the block: its URL."""
    proc, url = _start_sim(*extra)
    try:
        yield url
    finally:
        stop_group(proc, grace_s=5)


@pytest.fixture
def url() -> Iterator[str]:
    """A fresh sim-engine for one test (no LoRA adapters loaded), base model ``sim-7b``, at
    the modelled A100's speed (a module may override it with its own ``url``)."""
    with running_sim("--time-scale", "1", "--model", "sim-7b") as u:
        yield u


@pytest.fixture(scope="session")
def sim_url() -> Iterator[str]:
    """A sim-engine process, 50x faster than the modelled A100."""
    proc, url = _start_sim("--time-scale", "50", "--model", "sim-7b")
    yield url
    stop_group(proc, grace_s=5)


@pytest.fixture(scope="session")
def serial_sim_url() -> Iterator[str]:
    """A sim-engine process that runs one request at a time (to observe queue order)."""
    proc, url = _start_sim("--time-scale", "1", "--model", "sim-7b", "--max-num-seqs", "1")
    yield url
    stop_group(proc, grace_s=5)

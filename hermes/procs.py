"""Helper processes on this host (the gateway benchmark's servers, the vLLM launcher, test
fixtures): a free loopback port to bind, and a child's process group stopped gracefully."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """Stop ``proc`` and its children (started with ``start_new_session=True``): SIGTERM to the
    process group, SIGKILL if it is still running after ``grace_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

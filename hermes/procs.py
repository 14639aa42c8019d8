"""Helper processes on this host (the gateway benchmark's servers, the soak test's gateway, the
vLLM launcher, test fixtures): a free loopback port to bind, waiting until a child's HTTP
endpoint answers, and a child's process group stopped gracefully."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
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


def wait_http(url: str, proc: subprocess.Popen[Any] | None = None, *, timeout: float = 60.0,
              ready: Callable[[Any], bool] = lambda r: True) -> None:
    """Poll ``url`` until it answers 200 and ``ready(response)`` holds (e.g. a gateway's
    ``/healthz`` listing nodes). Raises ``OSError`` naming the URL after ``timeout`` seconds,
    or at once if ``proc`` (the server's process) has exited."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            args = proc.args  # the command's first words (a command given as one string: all)
            shown = args[:4] if isinstance(args, list | tuple) else args
            raise OSError(f"{shown!r} exited with {proc.returncode} before {url} answered")
        try:
            r = httpx.get(url, timeout=1.0)
            if r.status_code == 200 and ready(r):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.1)
    raise OSError(f"{url} not ready after {timeout:.0f} s")

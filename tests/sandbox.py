"""Tests whose gateway runs tool calls on its embedded node need a tool sandbox: without a
usable bubblewrap the node refuses tool calls (never runs them unsandboxed), so such a test
skips with the reason instead of failing with "tool calls are refused"."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def tool_sandbox_missing() -> str:
    """Why the embedded node would refuse tool calls here ("" when bubblewrap works)."""
    from hermeslet.tools import SubprocessSandbox

    box = SubprocessSandbox()
    return "" if box.sandboxed else box.why_not


def require_tool_sandbox() -> None:
    """Skip the calling test, with the reason, when tool calls would be refused here."""
    why = tool_sandbox_missing()
    if why:
        pytest.skip(f"needs a tool sandbox: {why} (apt-get install bubblewrap)")


def processes_running(*argv: str) -> list[int]:
    """PIDs of the processes whose command line is exactly ``argv`` (a sandboxed tool's
    process is in its own namespaces but in the host's ``/proc`` too)."""
    from pathlib import Path

    want = "\0".join(argv).encode() + b"\0"
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "cmdline").read_bytes() == want:
                    out.append(int(d.name))
            except OSError:  # gone meanwhile
                pass
    return out


def post_then_leave(url: str, body: dict, running: tuple[str, ...], *,
                    headers: dict[str, str] | None = None, timeout_s: float = 30.0) -> None:
    """POST ``body`` (JSON) to ``url`` on a socket of its own and close the socket, unanswered,
    once a process with the command line ``running`` exists: a client that goes away while
    its tool call runs."""
    import json
    import socket
    import time
    from urllib.parse import urlsplit

    u = urlsplit(url)
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    req = (f"POST {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(data)}\r\n{head}\r\n").encode() + data
    with socket.create_connection((u.hostname, u.port), timeout=timeout_s) as sock:
        sock.sendall(req)
        sock.setblocking(False)
        deadline = time.monotonic() + timeout_s
        while not processes_running(*running):
            try:
                answer = sock.recv(4096)
            except BlockingIOError:
                answer = None
            assert answer is None, f"answered before {running} ran: {answer!r}"
            assert time.monotonic() < deadline, f"{running} never ran"
            time.sleep(0.05)

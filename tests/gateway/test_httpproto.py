"""Coalesced response writes (hermes.gateway.api.httpproto): one write per small response."""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlparse

import pytest

from hermes.gateway.api.httpproto import CoalescingTransport


class _Recorder(asyncio.Transport):
    """A transport that records what reaches it (the proxy's output)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data) -> None:  # noqa: ANN001
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0


async def test_writes_of_one_iteration_leave_together_and_close_flushes() -> None:
    rec = _Recorder()
    t = CoalescingTransport(rec, asyncio.get_running_loop())
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t.write(memoryview(b"body"))
    t.write(b"")
    assert rec.writes == [] and t.get_write_buffer_size() == 23
    await asyncio.sleep(0)
    assert rec.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"] and t.get_write_buffer_size() == 0
    t.writelines([b"a", b"b"])
    t.close()  # buffered data goes out before the close
    assert rec.writes[-1] == b"ab" and rec.closed
    await asyncio.sleep(0)
    assert len(rec.writes) == 2  # the scheduled flush finds nothing left
    assert t.is_closing()  # everything else is the real transport's


@pytest.mark.timeout(60)
def test_gateway_connections_coalesce_and_keep_alive(gateway) -> None:  # noqa: ANN001
    """The gateway's connections write through the proxy; keep-alive answers stay whole."""
    u = urlparse(gateway.url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        for _ in range(3):
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data:
                data += s.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int([h.split(b":")[1] for h in head.split(b"\r\n")
                          if h.lower().startswith(b"content-length")][0])
            while len(body) < length:
                body += s.recv(65536)
            assert head.startswith(b"HTTP/1.1 200") and len(body) == length > 0
        conns = list(gateway.server.server_state.connections)
        assert conns and all(isinstance(c.transport, CoalescingTransport) for c in conns)

"""uvicorn's httptools protocol with the writes of one loop iteration coalesced.

uvicorn writes a response's status line and headers (``http.response.start``) and its body
(``http.response.body``) with two ``transport.write`` calls. With ``TCP_NODELAY`` (which the
gateway sets so that small responses do not wait on delayed ACKs) that is two segments and,
for a client waiting on the answer, two wake-ups; on a small VM each costs a noticeable part
of the gateway's per-request CPU (``hermes bench gateway``, concurrency 1). Both writes happen
in the same step of the handler's task, so :class:`CoalescingTransport` holds what is written
until the end of the current loop iteration and hands it over as one write. Nothing waits
longer than that iteration; ``close``/``write_eof``/``set_protocol`` flush first, and flow
control, peer addresses and everything else go to the real transport.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """A transport proxy whose writes within one loop iteration leave as one ``write``."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._buf: list[bytes] = []
        self._pending = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._buf:
            self._loop.call_soon(self._flush)
        self._buf.append(bytes(data))
        self._pending += len(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        if not self._buf:
            return
        data = self._buf[0] if len(self._buf) == 1 else b"".join(self._buf)
        self._buf.clear()
        self._pending = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._pending

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._flush()
        self._transport.set_protocol(protocol)

    def __getattr__(self, name: str) -> Any:  # is_closing, abort, pause/resume_reading, ...
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """``uvicorn.Config(http=...)``: httptools parsing, coalesced response writes."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

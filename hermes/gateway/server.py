"""``hermes serve``: the gateway on uvicorn, plus a background handle for tests and tools.

``serve(load_config(None))`` is a working gateway on a laptop: the scheduler, one in-process
HermesLet and the built-in simulated engine, policy ``hermes``, knowledge base ``pdgraphs/``.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import uvicorn

from hermes import evloop
from hermes.gateway.app import create_app
from hermes.gateway.config import GatewayConfig


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: without it, small responses wait on delayed ACKs (40 ms)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _http_protocol() -> Any:
    """httptools with coalesced response writes (:mod:`hermes.gateway.httpproto`), or
    uvicorn's own choice where httptools is not installed."""
    try:
        from hermes.gateway.httpproto import CoalescingHttpToolsProtocol
    except ImportError:
        return "auto"
    return CoalescingHttpToolsProtocol


def _uvicorn_config(config: GatewayConfig) -> uvicorn.Config:
    return uvicorn.Config(
        create_app(config),
        http=_http_protocol(),
        log_level=config.server.log_level,
        access_log=config.server.log_level == "debug",
        lifespan="on",
        timeout_keep_alive=30,
    )


def serve(config: GatewayConfig) -> None:
    """Run the gateway in the foreground until interrupted (port 0: any free port)."""
    from hermes.gateway.auth import check_exposure

    check_exposure(config)  # before binding: never listen off loopback without auth
    sock = _bind(config.server.host, config.server.port)
    host, port = sock.getsockname()[:2]
    print(f"hermes gateway on http://{host}:{port} (policy {config.scheduler.policy}, "
          f"time scale {config.scheduler.time_scale:g}, {evloop.loop_name()})", flush=True)
    server = uvicorn.Server(_uvicorn_config(config))
    evloop.run(server.serve(sockets=[sock]))


@dataclass
class BackgroundServer:
    """A gateway running in a thread of this process (tests, ``hermes load`` self-hosting)."""

    server: uvicorn.Server
    thread: threading.Thread
    url: str

    def stop(self, timeout: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def gateway_state(srv: BackgroundServer) -> Any:
    """The app state of a background gateway: ``scheduler``, ``node`` (embedded HermesLet),
    ``hosted``, ``config`` (tests and diagnostics)."""
    return srv.server.config.app.state  # type: ignore[union-attr]


def start_background(config: GatewayConfig, timeout: float = 30.0) -> BackgroundServer:
    """Start the gateway on its own event loop in a daemon thread; returns once it serves."""
    from hermes.gateway.auth import check_exposure

    check_exposure(config)
    sock = _bind(config.server.host, config.server.port)
    host, port = sock.getsockname()[:2]
    server = uvicorn.Server(_uvicorn_config(config))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  (not main thread)
    thread = threading.Thread(target=lambda: evloop.run(server.serve(sockets=[sock])),
                              name="hermes-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the gateway did not start")
        time.sleep(0.01)
    return BackgroundServer(server, thread, f"http://{host}:{port}")

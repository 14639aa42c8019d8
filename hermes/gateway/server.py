"""``hermes serve``: the gateway on uvicorn, plus a background handle for tests and tools.

``serve(load_config(None))`` is a working gateway on a laptop: the scheduler, one in-process
HermesLet and the built-in simulated engine, policy ``hermes``, the shipped PDGraphs, no TCP
socket but the HTTP one. A gateway that cannot start (HTTP port taken, node socket taken, an
unknown policy, an unreachable store) raises :class:`GatewayStartupError` with one line.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.lifespan.on import LifespanOn

from hermes import evloop
from hermes.gateway.app import create_app
from hermes.gateway.config import GatewayConfig
from hermes.gateway.disconnect import CancelOnDisconnectProtocol


def _bind(host: str, port: int) -> socket.socket:
    """The HTTP listening socket; a port that is taken (or an address this host does not
    have) is a :class:`GatewayStartupError` naming the address."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: without it, small responses wait on delayed ACKs (40 ms)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        hint = (" (another gateway? stop it, or give --port N; 0 picks a free one)"
                if e.errno == errno.EADDRINUSE else "")
        raise GatewayStartupError(f"cannot listen on {host}:{port}: "
                                  f"{e.strerror or e}{hint}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class GatewayStartupError(RuntimeError):
    """The gateway could not start; the message says why, in one line."""


class _DropStartupFailed(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "Application startup failed. Exiting."


class _Lifespan(LifespanOn):
    """uvicorn's lifespan, except that a failed startup is kept (``error``) instead of logged
    as a traceback: :func:`serve` and :func:`start_background` report it in one line."""

    error: BaseException | None = None
    banner: str = ""  # printed once the gateway has started (serve)
    #: freeze the startup heap and tune the collector once started (serve: the process is
    #: the gateway's; not in a test process that starts gateways in threads)
    tune_gc: bool = False

    async def startup(self) -> None:
        drop = _DropStartupFailed()
        self.logger.addFilter(drop)
        try:
            await super().startup()
        finally:
            self.logger.removeFilter(drop)
        if not self.should_exit:
            from hermes.gateway import looplag

            if self.tune_gc:
                looplag.tune_gc()  # what startup built is frozen: full GCs skip it (issue 16)
            looplag.start(self.config.app)  # GET /admin/loop: event-loop stalls (issue 16)
        if self.banner and not self.should_exit:
            print(self.banner, flush=True)

    async def send(self, message: Any) -> None:
        if message["type"] == "lifespan.startup.failed":
            # sent by Starlette from the except block around the app's lifespan
            lines = str(message.get("message", "")).strip().splitlines()
            self.error = sys.exc_info()[1] or RuntimeError(lines[-1] if lines else "failed")
            message = {"type": message["type"]}
        await super().send(message)


def _startup_error(server: uvicorn.Server) -> GatewayStartupError:
    err = getattr(getattr(server, "lifespan", None), "error", None)
    text = "unknown error" if err is None else str(err) or type(err).__name__
    return GatewayStartupError(f"the gateway did not start: {text}")


def _http_protocol() -> Any:
    """httptools with coalesced response writes (:mod:`hermes.gateway.api.httpproto`), or
    uvicorn's own choice where httptools is not installed."""
    try:
        from hermes.gateway.api.httpproto import CoalescingHttpToolsProtocol
    except ImportError:
        return "auto"
    return CoalescingHttpToolsProtocol


class _HeaderTimeout:
    """Mixin for uvicorn's httptools protocol: a connection whose request line and headers
    are not complete ``header_timeout_s`` after it opened (or after the first byte of its
    next request) is closed. uvicorn has no such timeout (0.54: ``timeout_keep_alive`` runs
    only between requests), so a client that connects and sends nothing, or sends headers a
    byte at a time, would hold its connection for ever (slowloris)."""

    header_timeout_s: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None
    #: a request's first bytes came and its headers are not complete yet
    _in_headers: bool = False

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()  # type: ignore[misc]
        self._in_headers = True

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._cancel_header_timer()
        super().on_headers_complete()  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        """The timer of a request's headers is armed only when they did not all come in the
        bytes that began it: almost every request's do, and arming and cancelling a timer
        for each cost the event loop two timer operations per request."""
        super().data_received(data)  # type: ignore[misc]
        if self._in_headers and self._header_timer is None:
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(  # type: ignore[attr-defined]
            self.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        transport = self.transport  # type: ignore[attr-defined]
        if transport is not None and not transport.is_closing():
            transport.close()


class _BodyTimeout:
    """Mixin for uvicorn's httptools protocol: a request whose body is not complete
    ``body_timeout_s`` after its headers gets ``408`` and its connection is closed. uvicorn
    waits for a body for ever, so a client trickling a byte every few seconds held its
    connection (and a file descriptor) as long as it liked; with many such connections one
    client starved every other of descriptors."""

    body_timeout_s: float = 30.0
    _body_timer: asyncio.TimerHandle | None = None
    #: a request's headers are complete and its body is not
    _in_body: bool = False

    def on_headers_complete(self) -> None:
        super().on_headers_complete()  # type: ignore[misc]
        self._in_body = True

    def on_message_complete(self) -> None:
        self._in_body = False
        self._cancel_body_timer()
        super().on_message_complete()  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        """The body's timer is armed only when the bytes that completed the headers did not
        complete the body too (a request without a body is complete with its headers)."""
        super().data_received(data)  # type: ignore[misc]
        if self._in_body and self._body_timer is None:
            parser = getattr(self, "parser", None)
            if parser is not None and not parser.should_upgrade():  # (not a protocol switch)
                self._body_timer = self.loop.call_later(  # type: ignore[attr-defined]
                    self.body_timeout_s, self._body_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_body_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timeout(self) -> None:
        self._body_timer = None
        transport = self.transport  # type: ignore[attr-defined]
        if transport is None or transport.is_closing():
            return
        cycle = getattr(self, "cycle", None)
        if cycle is not None and not cycle.response_started:
            body = (b'{"error": {"message": "the request body did not arrive within '
                    + f"{self.body_timeout_s:g}".encode() + b' s", "type": '
                    b'"invalid_request_error", "param": null, "code": "body_timeout"}}')
            transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json"
                            b"\r\nconnection: close\r\ncontent-length: "
                            + str(len(body)).encode() + b"\r\n\r\n" + body)
        transport.close()


def _with_header_timeout(protocol: Any, seconds: float, body_seconds: float = 30.0) -> Any:
    """``protocol`` (an httptools protocol class) with :class:`_HeaderTimeout` and
    :class:`_BodyTimeout`; uvicorn's own choice (``"auto"``, where httptools is missing:
    h11) is left as it is."""
    if isinstance(protocol, str):
        return protocol
    return type(f"HeaderTimeout{protocol.__name__}",
                (_HeaderTimeout, _BodyTimeout, CancelOnDisconnectProtocol, protocol),
                {"header_timeout_s": seconds, "body_timeout_s": body_seconds})


def max_connections(configured: int) -> int:
    """``server.max_connections``, or (0) three quarters of the file-descriptor limit."""
    if configured:
        return configured
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, soft * 3 // 4) if soft != resource.RLIM_INFINITY else 65_536


def _uvicorn_config(config: GatewayConfig) -> uvicorn.Config:
    from hermes.gateway import looplag

    if config.ha.role == "edge":  # HTTP only, in front of the elected scheduler
        from hermes.gateway.edge.front import edge_app

        app: Any = edge_app(config)
    else:
        app = create_app(config)
        looplag.install(app)  # GET /admin/loop (started with the app: _Lifespan.startup)
    srv = config.server
    cfg = uvicorn.Config(
        app,
        http=_with_header_timeout(_http_protocol(), srv.header_timeout_s, srv.body_timeout_s),
        log_level=srv.log_level,
        access_log=srv.log_level == "debug",
        lifespan="on",
        timeout_keep_alive=30,
        limit_concurrency=max_connections(srv.max_connections),
        # X-Forwarded-For names the client only when a configured proxy sent it (uvicorn's
        # default trusts 127.0.0.1: a loopback client could pick its own address)
        proxy_headers=bool(srv.trusted_proxies),
        forwarded_allow_ips=list(srv.trusted_proxies) or None,
    )
    cfg.load()
    cfg.lifespan_class = _Lifespan  # a failed startup: one line, not a traceback
    return cfg


def state_location(config: GatewayConfig) -> str:
    """Where the gateway keeps its runs, run records and learned PDGraphs."""
    from hermes.gateway.config import resolve_state_dir

    where = str(resolve_state_dir(config.stores.state_dir))
    if config.durability.state_redis:
        return f"{config.durability.state_redis} (runs), {where} (records, learned PDGraphs)"
    return where


def ready_banner(config: GatewayConfig, host: str, port: int) -> str:
    """What ``hermes serve`` prints once it serves: where, which models, how to call it, where
    its state is, how to stop it."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    base = f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"
    models = ([e.model for e in config.engines if e.task == "generate"]
              if config.scheduler.embedded_node else [])
    model = models[0] if models else "MODEL"
    authed = bool(config.security.auth_file or config.security.auth_redis)
    key = "$HERMES_API_KEY" if authed else "none"
    auth = ' -H "Authorization: Bearer $HERMES_API_KEY"' if authed else ""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    served = ", ".join(models) or "those of the HermesLets that connect"
    role = {"all": "gateway", "edge": "edge", "scheduler": "scheduler"}[config.ha.role]
    return "\n".join([
        f"hermes {role} ready on {base} (policy {config.scheduler.policy}, time scale "
        f"{config.scheduler.time_scale:g}, {evloop.loop_name()})",
        f"  OpenAI base URL: {base}/v1   model: {served}   API key: {key}",
        f"  curl {base}/v1/chat/completions{auth} -H 'content-type: application/json' "
        f"-d '{body}'",
        f'  python: OpenAI(base_url="{base}/v1", api_key="{key}").chat.completions.create('
        f'model="{model}", messages=[...])',
        f"  an app run: hermes run factool_kbqa --url {base}   (the apps: hermes apps list)",
        f"  state: {state_location(config)} (--state-dir DIR for another)",
        "  stop: Ctrl-C",
    ])


def serve(config: GatewayConfig) -> None:
    """Run the gateway in the foreground until interrupted (port 0: any free port)."""
    from hermes.gateway.auth import check_exposure

    check_exposure(config)  # before binding: never listen off loopback without auth
    sock = _bind(config.server.host, config.server.port)
    host, port = sock.getsockname()[:2]
    try:
        cfg = _uvicorn_config(config)
    except BaseException:  # a configuration refused while building the app
        sock.close()
        raise
    banner = ready_banner(config, str(host), int(port))
    cfg.lifespan_class = type("_ServeLifespan", (_Lifespan,), {"banner": banner, "tune_gc": True})
    server = uvicorn.Server(cfg)
    try:
        evloop.run(server.serve(sockets=[sock]))
    except SystemExit:  # uvicorn exits when the app's startup (lifespan) failed
        if server.started:
            raise
        raise _startup_error(server) from None


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
    try:
        server = uvicorn.Server(_uvicorn_config(config))
    except BaseException:  # a configuration refused while building the app
        sock.close()
        raise
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  (not main thread)
    thread = threading.Thread(target=lambda: evloop.run(server.serve(sockets=[sock])),
                              name="hermes-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise _startup_error(server)
        time.sleep(0.01)
    return BackgroundServer(server, thread, f"http://{host}:{port}")

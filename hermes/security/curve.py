"""ZeroMQ CURVE on every link between Hermes processes: authenticated and encrypted.

Layout made by ``hermes keys curve --dir DIR --node NAME ... --edge NAME ...``::

    DIR/server.key, DIR/server.key_secret      the scheduler's certificate (its node socket
                                               and its socket for edges, [ha] edge_bind)
    DIR/authorized/NAME.key                    public keys of the nodes allowed in (by the
                                               scheduler, and by edges for the answers)
    DIR/nodes/NAME.key, DIR/nodes/NAME.key_secret
                                               each node's certificate (copy the
                                               ``.key_secret`` and ``server.key`` to the node)
    DIR/authorized-edges/NAME.key              public keys of the edges the scheduler admits
    DIR/edges/NAME.key, DIR/edges/NAME.key_secret
                                               each edge's certificate (``--role edge``)

Every server socket is a CURVE server behind pyzmq's ZAP handler
(:class:`zmq.auth.asyncio.AsyncioAuthenticator`), one per ZeroMQ context
(:class:`CurveGate`), with one ZAP domain per kind of socket: a client whose public key is not
listed in that socket's directory never completes the handshake, so none of its messages
arrive; each refusal is logged (``hermes.security.curve``, the key and the directory it is
missing from) and counted (:attr:`CurveGate.refused`; ``hermes_curve_refused_total`` on the
scheduler's ``/metrics``, ``curve_refused`` in an edge's ``/readyz``). The directories are
re-read when they change, so a key can be added (or removed) while the process runs.

The links:

- node -> scheduler (``scheduler.bind``): the node's certificate, trusting ``server.key``;
  the scheduler admits ``authorized/``. The embedded node is linked in process
  (:mod:`hermes.inproc`), which has no socket and no handshake;
- edge -> scheduler (``[ha] edge_bind``): the edge's certificate (``security.curve_key``),
  trusting ``server.key``; the scheduler admits ``authorized-edges/``;
- node -> edge (the edge's ``--bind``, where nodes stream answers): the edge is the CURVE
  server with its own certificate and admits ``authorized/`` (the nodes the schedulers
  admit). A node learns the edge's public key from the address it is given for the answers
  (:func:`reply_address`: ``tcp://HOST:PORT#curve=KEY``), which comes from the scheduler it
  authenticated, which had it from an edge it authenticated; so no edge key is copied to the
  nodes, and each edge can have a certificate of its own (and lose it alone).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq
import zmq.auth

if TYPE_CHECKING:
    from zmq.auth.asyncio import AsyncioAuthenticator

log = logging.getLogger("hermes.security.curve")

#: the ZAP domains: which socket a handshake is for (one authenticator serves a context)
NODES, EDGES, ANSWERS = "hermes-nodes", "hermes-edges", "hermes-answers"
#: what each domain admits, for log lines and metric labels
ADMITS = {NODES: "a node", EDGES: "an edge", ANSWERS: "a node's answers"}
#: each domain's socket, as metrics name it
LABELS = {NODES: "nodes", EDGES: "edges", ANSWERS: "answers"}
#: a z85 CURVE public key is 40 characters
KEY_CHARS = 40
_REPLY_MARK = "#curve="


def _cert(directory: Path, name: str) -> tuple[Path, Path]:
    public, secret = zmq.auth.create_certificates(directory, name)
    return Path(public), Path(secret)


def _check_name(name: str, what: str) -> None:
    if not name or not all(c.isalnum() or c in "_.-" for c in name):
        raise ValueError(f"bad {what} name {name!r}: use [A-Za-z0-9_.-]")


def create_curve_keys(directory: str | Path, nodes: list[str],
                      edges: list[str] | None = None) -> dict[str, str]:
    """Create the server certificate (if missing), one certificate per node and per edge
    (their public keys copied to ``authorized/`` and ``authorized-edges/``); returns the
    secret key files made, by role."""
    d = Path(directory)
    for sub in ("authorized", "nodes", "authorized-edges", "edges"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    made: dict[str, str] = {}
    if not (d / "server.key_secret").exists():
        _, secret = _cert(d, "server")
        secret.chmod(0o600)
        made["server"] = str(secret)
    for kind, names, allowed in (("node", nodes, "authorized"),
                                 ("edge", edges or [], "authorized-edges")):
        for name in names:
            _check_name(name, kind)
            public, secret = _cert(d / f"{kind}s", name)
            secret.chmod(0o600)
            shutil.copy(public, d / allowed / f"{name}.key")
            made[name if kind == "node" else f"edge {name}"] = str(secret)
    return made


class _Authorized:
    """The ZAP callback of one domain: is a client's public key in ``directory``? The
    directory is re-read when it changes (its modification time); a refusal is logged (once
    a minute per key) and counted in the gate."""

    LOG_EVERY_S = 60.0

    def __init__(self, gate: CurveGate, domain: str, directory: Path) -> None:
        self.gate = gate
        self.domain = domain
        self.directory = directory
        self._stamp: int | None = None
        self._keys: dict[bytes, Any] = {}
        self._logged: dict[bytes, float] = {}

    def keys(self) -> dict[bytes, Any]:
        try:
            stamp = os.stat(self.directory).st_mtime_ns
        except OSError:
            return {}  # gone: nobody is admitted
        if stamp != self._stamp:
            self._keys = zmq.auth.load_certificates(self.directory)
            self._stamp = stamp
        return self._keys

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.keys():
            return True
        n = self.gate.refused[self.domain] = self.gate.refused.get(self.domain, 0) + 1
        now = time.monotonic()
        if now - self._logged.get(key, -self.LOG_EVERY_S) >= self.LOG_EVERY_S:
            if len(self._logged) > 1000:
                self._logged.clear()
            self._logged[key] = now
            log.warning("CURVE: refused %s: public key %s is not in %s (%d refused "
                        "so far on this socket; it gets nothing)", ADMITS.get(self.domain,
                        self.domain), key.decode("ascii", "replace"), self.directory, n)
        return False


#: the gate of each ZeroMQ context (a context has one ZAP handler)
_GATES: weakref.WeakKeyDictionary[zmq.Context[Any], CurveGate] = weakref.WeakKeyDictionary()


class CurveGate:
    """The ZAP handler of one ZeroMQ context (pyzmq's :class:`AsyncioAuthenticator`, started
    on the running event loop), shared by its CURVE server sockets, one domain each; counts
    the handshakes it refused, by domain (:attr:`refused`)."""

    def __init__(self, ctx: zmq.Context[Any]) -> None:
        from zmq.auth.asyncio import AsyncioAuthenticator

        self.ctx = ctx
        self.auth: AsyncioAuthenticator = AsyncioAuthenticator(ctx)
        self.auth.start()
        #: refused handshakes by ZAP domain (:data:`NODES`, :data:`EDGES`, :data:`ANSWERS`)
        self.refused: dict[str, int] = {}
        self._users = 0

    def counts(self) -> dict[str, int]:
        """Refused handshakes by socket: ``nodes``, ``edges``, ``answers`` (an edge's)."""
        return {label: self.refused.get(domain, 0) for domain, label in LABELS.items()}

    @classmethod
    def of(cls, ctx: zmq.Context[Any]) -> CurveGate:
        """The context's gate (started on first use)."""
        gate = _GATES.get(ctx)
        if gate is None:
            gate = _GATES[ctx] = cls(ctx)
        return gate

    def admit(self, sock: zmq.Socket[Any], domain: str, directory: Path) -> None:
        """``sock`` (a CURVE server) admits the public keys in ``directory``."""
        sock.zap_domain = domain.encode()
        self.auth.configure_curve_callback(domain, _Authorized(self, domain, directory))
        self._users += 1

    def stop(self) -> None:
        """One socket fewer; the last one stops the ZAP handler."""
        self._users -= 1
        if self._users <= 0:
            self.auth.stop()
            if _GATES.get(self.ctx) is self:
                del _GATES[self.ctx]


def gate_of(ctx: zmq.Context[Any] | None) -> CurveGate | None:
    """The context's gate, if a CURVE server socket was made on it."""
    return _GATES.get(ctx) if ctx is not None else None


def _load_secret(path: Path, what: str) -> tuple[bytes, bytes]:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no {what} certificate; make it with "
                                f"`hermes keys curve --dir DIR ...`")
    public, secret = zmq.auth.load_certificate(path)
    if secret is None:
        raise ValueError(f"{path}: not a secret key file (.key_secret)")
    return public, secret


def secure_server(sock: zmq.Socket[Any], ctx: zmq.Context[Any], directory: str | Path, *,
                  domain: str = NODES, admit: str = "authorized",
                  secret_file: str | Path | None = None) -> CurveGate:
    """Make ``sock`` a CURVE server with the certificate ``secret_file`` (default the
    scheduler's, ``DIR/server.key_secret``) admitting only the keys in ``DIR/admit``; returns
    the context's gate (call ``.stop()`` when the socket closes). Call before ``bind``."""
    d = Path(directory)
    public, secret = _load_secret(Path(secret_file) if secret_file else d / "server.key_secret",
                                  "server")
    allowed = d / admit
    if not allowed.is_dir():
        raise FileNotFoundError(f"{allowed}: no directory of authorized keys; make it with "
                                f"`hermes keys curve --dir {d} ...`")
    gate = CurveGate.of(ctx)
    gate.admit(sock, domain, allowed)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    return gate


def secure_client(sock: zmq.Socket[Any], client_secret_file: str | Path,
                  server_public: str | Path | bytes) -> None:
    """Make ``sock`` a CURVE client with the certificate ``client_secret_file``, trusting the
    server's public key (a ``.key`` file, or the z85 key itself as bytes). Call before
    ``connect``."""
    public, secret = _load_secret(Path(client_secret_file), "client")
    if isinstance(server_public, bytes):
        server_key = server_public
    else:
        server_key, _ = zmq.auth.load_certificate(server_public)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = server_key


def public_key(secret_file: str | Path) -> str:
    """The z85 public key of a certificate file."""
    public, _ = zmq.auth.load_certificate(secret_file)
    return public.decode("ascii")


def reply_address(address: str, server_public: str) -> str:
    """The address a node is given for answers to a CURVE edge: the ZeroMQ address and the
    edge's public key (``tcp://HOST:PORT#curve=KEY``)."""
    return f"{address}{_REPLY_MARK}{server_public}"


def split_reply_address(reply_to: str) -> tuple[str, bytes | None]:
    """``(ZeroMQ address, the edge's z85 public key or None)`` of a reply address
    (:func:`reply_address`; a plain address has no key). A ``#`` never occurs in a ZeroMQ
    TCP address, so the first one starts the key."""
    address, mark, rest = reply_to.partition("#")
    if not mark:
        return reply_to, None
    if not rest.startswith("curve=") or len(rest) != len("curve=") + KEY_CHARS:
        raise ValueError(f"bad reply address {reply_to!r}: expected ADDRESS#curve=KEY "
                         f"(a {KEY_CHARS}-character z85 public key)")
    return address, rest[len("curve="):].encode("ascii")


def edge_key_problems(directory: str | Path, own_secret: str | Path) -> list[str]:
    """What an edge with CURVE is missing (files, by name; empty: nothing)."""
    d = Path(directory)
    out: list[str] = []
    if not d.is_dir():
        return [f"{d} (the CURVE directory, --curve-dir) does not exist"]
    if not (d / "server.key").is_file():
        out.append(f"{d / 'server.key'} (the scheduler's public key) is missing")
    if not (d / "authorized").is_dir():
        out.append(f"{d / 'authorized'} (the nodes allowed to send answers) is missing")
    if not own_secret:
        out.append("[security] curve_key (--curve-key DIR/edges/NAME.key_secret, this edge's "
                   "certificate: `hermes keys curve --dir DIR --edge NAME`) is not set")
    else:
        p = Path(own_secret)
        if not p.is_file():
            out.append(f"{p} (this edge's certificate, [security] curve_key) is missing")
        else:
            try:
                _, secret = zmq.auth.load_certificate(p)
            except (OSError, ValueError) as e:
                secret = None
                out.append(f"{p} ([security] curve_key) is not a certificate: {e}")
            else:
                if secret is None:
                    out.append(f"{p} ([security] curve_key) holds no secret key (give the "
                               f".key_secret file)")
    return out


def scheduler_key_problems(directory: str | Path, *, edges: bool) -> list[str]:
    """What a scheduler with CURVE is missing (``edges``: it serves edges too)."""
    d = Path(directory)
    if not d.is_dir():
        return [f"{d} (the CURVE directory, --curve-dir) does not exist"]
    out: list[str] = []
    if not (d / "server.key_secret").is_file():
        out.append(f"{d / 'server.key_secret'} (the scheduler's certificate) is missing")
    if not (d / "authorized").is_dir():
        out.append(f"{d / 'authorized'} (the nodes allowed in) is missing")
    if edges and not (d / "authorized-edges").is_dir():
        out.append(f"{d / 'authorized-edges'} (the edges allowed in: `hermes keys curve "
                   f"--dir {d} --edge NAME`) is missing")
    return out


class Handshakes:
    """The CURVE handshakes of one client socket, followed with a ZeroMQ socket monitor: the
    last outcome (:attr:`state`: ``pending``, ``up`` or ``refused``, with :attr:`reason`), so
    that a refused client says so (a log line, a status) instead of waiting in silence.
    :meth:`run` reads the monitor until cancelled; :meth:`close` before the socket closes."""

    EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
              | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)

    def __init__(self, sock: zmq.Socket[Any], label: str) -> None:
        import asyncio

        self.sock = sock
        self.label = label
        self.mon: Any = sock.get_monitor_socket(self.EVENTS)
        self.state = "pending"
        self.reason = ""
        #: set at each outcome (a waiter clears it)
        self.changed = asyncio.Event()
        self._said = ""

    async def run(self) -> None:
        from zmq.utils.monitor import parse_monitor_message

        while True:
            frames = await self.mon.recv_multipart()
            ev = parse_monitor_message(frames)
            event = ev["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.state, self.reason = "up", ""
                if self._said:
                    log.warning("%s: CURVE handshake succeeded", self.label)
                self._said = ""
            else:
                self.state = "refused"
                self.reason = (f"the server refused this process's CURVE key (status "
                               f"{ev['value']}): its public key is not authorized there"
                               if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH else
                               "CURVE handshake failed (a wrong server key, or a server "
                               "without CURVE)")
                if self._said != self.reason:  # once per outcome, not per retry
                    log.warning("%s: %s", self.label, self.reason)
                    self._said = self.reason
            self.changed.set()

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.mon.close(linger=0)

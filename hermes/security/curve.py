"""ZeroMQ CURVE between the scheduler and its HermesLets: authenticated and encrypted.

Layout made by ``hermes keys curve --dir DIR --node NAME ...``::

    DIR/server.key, DIR/server.key_secret      the scheduler's certificate
    DIR/authorized/NAME.key                    public keys of the nodes allowed in
    DIR/nodes/NAME.key, DIR/nodes/NAME.key_secret
                                               each node's certificate (copy the
                                               ``.key_secret`` and ``server.key`` to the node)

The scheduler (``security.curve_dir = DIR``) makes its ROUTER a CURVE server and runs a ZAP
handler (:class:`zmq.auth.asyncio.AsyncioAuthenticator`) that admits only clients whose public
key is in ``DIR/authorized``: a node without a key, or with a key not listed there, never
completes the handshake, so none of its messages reach the scheduler. A node is started with
``hermeslet run --curve-key DIR/nodes/NAME.key_secret --curve-server-key DIR/server.key``.
The embedded node is linked in process (:mod:`hermes.inproc`), which has no socket and no
handshake. Keys are re-read from ``authorized/`` when a new connection arrives, so a node can
be added while the scheduler runs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq
import zmq.auth

if TYPE_CHECKING:
    from zmq.auth.asyncio import AsyncioAuthenticator


def _cert(directory: Path, name: str) -> tuple[Path, Path]:
    public, secret = zmq.auth.create_certificates(directory, name)
    return Path(public), Path(secret)


def create_curve_keys(directory: str | Path, nodes: list[str]) -> dict[str, str]:
    """Create the server certificate (if missing) and one certificate per node; returns the
    files made, by role."""
    d = Path(directory)
    for sub in ("authorized", "nodes"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    made: dict[str, str] = {}
    if not (d / "server.key_secret").exists():
        _, secret = _cert(d, "server")
        secret.chmod(0o600)
        made["server"] = str(secret)
    for node in nodes:
        if not node or not all(c.isalnum() or c in "_.-" for c in node):
            raise ValueError(f"bad node name {node!r}: use [A-Za-z0-9_.-]")
        public, secret = _cert(d / "nodes", node)
        secret.chmod(0o600)
        shutil.copy(public, d / "authorized" / f"{node}.key")
        made[node] = str(secret)
    return made


def secure_server(sock: zmq.Socket[Any], ctx: zmq.Context[Any],
                  directory: str | Path) -> AsyncioAuthenticator:
    """Make ``sock`` a CURVE server admitting only ``DIR/authorized`` keys; returns the
    started authenticator (call ``.stop()`` when the socket closes). Call before ``bind``."""
    from zmq.auth.asyncio import AsyncioAuthenticator

    d = Path(directory)
    secret_file = d / "server.key_secret"
    if not secret_file.exists():
        raise FileNotFoundError(f"{secret_file}: no server certificate; run "
                                f"`hermes keys curve --dir {d}`")
    public, secret = zmq.auth.load_certificate(secret_file)
    auth = AsyncioAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(d / "authorized"))
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    return auth


def secure_client(sock: zmq.Socket[Any], client_secret_file: str | Path,
                  server_public_file: str | Path) -> None:
    """Make ``sock`` a CURVE client with the node's certificate, trusting the server's key.
    Call before ``connect``."""
    public, secret = zmq.auth.load_certificate(client_secret_file)
    if secret is None:
        raise ValueError(f"{client_secret_file}: not a secret key file (.key_secret)")
    server_public, _ = zmq.auth.load_certificate(server_public_file)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = server_public

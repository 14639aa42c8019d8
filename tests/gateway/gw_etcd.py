"""A real etcd server (Debian's ``etcd-server``, ``/usr/bin/etcd``) on free loopback ports with
a temporary data directory: :func:`start_etcd` and the module-scoped fixture ``etcd_url``.

The member runs with short raft timings (heartbeat 20 ms, election 200 ms): a one-member
cluster elects itself within the election timeout, and etcd's shortest lease is
``ceil(1.5 x election timeout)`` = 1 s (2 s with etcd's defaults), so lease tests are quick.
"""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes.procs import free_port

ETCD = "/usr/bin/etcd"


def etcd_binary() -> str | None:
    return ETCD if os.access(ETCD, os.X_OK) else shutil.which("etcd")


def start_etcd(workdir: Path, *, extra: list[str] | None = None,
               tls: ssl.SSLContext | None = None) -> tuple[subprocess.Popen[Any], int]:
    """One etcd member on 127.0.0.1 (client and peer ports free), data in ``workdir``; the
    process and its client port, once it answers. ``extra``: more etcd flags; ``tls``: the
    clients' side of the TLS the flags set up (its URLs are then https)."""
    binary = etcd_binary()
    if binary is None:
        raise OSError("etcd not found (apt-get install etcd-server)")
    client, peer = free_port(), free_port()
    curl = f"{'https' if tls else 'http'}://127.0.0.1:{client}"
    purl = f"http://127.0.0.1:{peer}"
    log = open(workdir / "etcd.log", "wb")  # noqa: SIM115  (the child writes it)
    proc = subprocess.Popen(
        [binary, "--name", "t", "--data-dir", str(workdir / "data"),
         "--listen-client-urls", curl, "--advertise-client-urls", curl,
         "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
         "--initial-cluster", f"t={purl}", "--heartbeat-interval", "20",
         "--election-timeout", "200", *(extra or [])],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    deadline = time.monotonic() + 15
    while True:
        if proc.poll() is not None:
            raise OSError(f"etcd exited ({proc.returncode}): "
                          f"{(workdir / 'etcd.log').read_text()[-2000:]}")
        try:  # a member that has elected itself answers /health with "true"
            if b'"true"' in urllib.request.urlopen(f"{curl}/health", timeout=1,
                                                   context=tls).read():
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            stop_etcd(proc)
            raise OSError("etcd did not become healthy within 15 s")
        time.sleep(0.05)
    return proc, client


def stop_etcd(proc: subprocess.Popen[Any]) -> None:
    """Kill the member by its PID (and wait for it)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(5)


def need_etcd() -> None:
    """Skip (or fail, with ``HERMES_REQUIRE_ETCD=1`` as CI sets) when etcd or etcd3gw is
    missing."""
    missing = []
    if etcd_binary() is None:
        missing.append("the etcd server (apt-get install etcd-server)")
    try:
        import etcd3gw  # noqa: F401
    except ImportError:
        missing.append("etcd3gw (pip install 'hermes-gateway[ha-etcd]')")
    if missing:
        if os.environ.get("HERMES_REQUIRE_ETCD") == "1":
            pytest.fail(f"missing {' and '.join(missing)} (HERMES_REQUIRE_ETCD=1)")
        pytest.skip(f"missing {' and '.join(missing)}")


def make_tls(workdir: Path) -> dict[str, Path]:
    """A throw-away CA, a server certificate for 127.0.0.1 and a client certificate, made
    with the ``openssl`` command (paths: ca, server, server_key, client, client_key)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make test certificates")
    d = workdir
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)

    run("req", "-x509", *ec, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
        "-days", "1", "-subj", "/CN=hermes-test-ca")
    # the server's certificate is a client one too: etcd 3.4's JSON gateway dials the
    # member's gRPC port with it, which --client-cert-auth then checks
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\n"
                                 "extendedKeyUsage=serverAuth,clientAuth"),
                      ("client", "extendedKeyUsage=clientAuth")):
        (d / f"{name}.ext").write_text(ext + "\n")
        run("req", *ec, "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"),
            "-subj", f"/CN=hermes-test-{name}")
        run("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
            "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-out", str(d / f"{name}.pem"),
            "-days", "1", "-extfile", str(d / f"{name}.ext"))
    return {"ca": d / "ca.pem", "server": d / "server.pem", "server_key": d / "server.key",
            "client": d / "client.pem", "client_key": d / "client.key"}


@pytest.fixture(scope="module")
def etcd_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    need_etcd()
    proc, port = start_etcd(tmp_path_factory.mktemp("etcd"))
    yield f"etcd://127.0.0.1:{port}"
    stop_etcd(proc)

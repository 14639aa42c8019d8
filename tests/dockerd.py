"""A private Docker engine for tests, and a tiny image built locally (never pulled).

``dockerd`` runs with its own socket, data root and exec root, and ALWAYS with
``--bridge=none --iptables=false --ip6tables=false`` (no bridge network is created, no traffic
can leave the host). The image is a ``docker import`` of a busybox-static root filesystem.
Tests skip with the reason when dockerd cannot start, unless ``HERMES_REQUIRE_DOCKER=1``.

Use from a test module::

    from dockerd import docker_engine, busybox_image  # noqa: F401  (pytest fixtures)
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hermes.procs import stop_group

REQUIRE_ENV = "HERMES_REQUIRE_DOCKER"
IMAGE = "hermes-test-busybox:latest"


def _unavailable(msg: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{msg} ({REQUIRE_ENV}=1)")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[str]:
    """Start a private dockerd; yields its ``unix://`` URL; stopped by PID at the end."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        _unavailable("dockerd not installed (apt-get install docker.io)")
    if os.geteuid() != 0:
        _unavailable("dockerd needs root here (no rootless setup)")
    root = Path(tempfile.mkdtemp(prefix="hd-", dir="/tmp"))  # short: socket paths are limited
    sock = root / "d.sock"
    log = root / "dockerd.log"
    cmd = [dockerd, "--host", f"unix://{sock}", "--data-root", str(root / "data"),
           "--exec-root", str(root / "exec"), "--pidfile", str(root / "d.pid"),
           "--bridge=none", "--iptables=false", "--ip6tables=false"]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    import docker

    url = f"unix://{sock}"
    deadline = time.monotonic() + 40
    ok = False
    while time.monotonic() < deadline and proc.poll() is None:
        if sock.exists():
            try:
                docker.DockerClient(base_url=url).ping()
                ok = True
                break
            except Exception:
                pass
        time.sleep(0.2)
    if not ok:
        tail = log.read_text()[-1500:] if log.exists() else ""
        stop_group(proc, grace_s=20)
        shutil.rmtree(root, ignore_errors=True)
        _unavailable(f"dockerd did not start: {tail}")
    try:
        yield url
    finally:
        stop_group(proc, grace_s=20)
        subprocess.run(["umount", "-R", str(root / "exec")], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def busybox_rootfs_tar() -> bytes:
    """A root filesystem: busybox-static and its applet links, /tmp, /etc/passwd."""
    busybox = shutil.which("busybox")
    if busybox is None:
        _unavailable("busybox not installed (apt-get install busybox-static)")
    out = subprocess.run([busybox, "--list"], capture_output=True, text=True)
    if out.returncode != 0:
        _unavailable("busybox has no applet list (install busybox-static)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add_dir(name: str, mode: int = 0o755) -> None:
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode = tarfile.DIRTYPE, mode
            tar.addfile(ti)

        for d in ("bin", "etc", "tmp", "proc", "sys", "dev"):
            add_dir(d, 0o1777 if d == "tmp" else 0o755)
        tar.add(busybox, arcname="bin/busybox")
        for applet in out.stdout.split():
            if applet != "busybox":
                ti = tarfile.TarInfo(f"bin/{applet}")
                ti.type, ti.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(ti)
        passwd = b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
        ti = tarfile.TarInfo("etc/passwd")
        ti.size = len(passwd)
        tar.addfile(ti, io.BytesIO(passwd))
    return buf.getvalue()


@pytest.fixture(scope="session")
def busybox_image(docker_engine: str) -> str:
    """``hermes-test-busybox:latest``, imported into the private engine from a local rootfs."""
    import docker

    client = docker.DockerClient(base_url=docker_engine)
    client.api.import_image_from_data(busybox_rootfs_tar(), repository="hermes-test-busybox",
                                      tag="latest", changes=["ENV PATH=/bin"])
    client.images.get(IMAGE)
    return IMAGE


async def cancel_once_running(box: object, running: Callable[[], bool],
                              gone: Callable[[], bool], *, within_s: float = 20.0) -> float:
    """Start a ``sleep 120`` call on the Docker sandbox ``box``, cancel its task once
    ``running()`` says it runs, and return the seconds until ``gone()`` says its container
    is gone (failing past ``within_s``: its own timeout is 120 s)."""
    call = asyncio.create_task(box.run(command=["sleep", "120"], timeout_s=120))  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while not running():
        assert time.monotonic() < deadline and not call.done()
        await asyncio.sleep(0.1)
    t0 = time.monotonic()
    call.cancel()
    try:
        await call
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("the cancelled call returned")
    while not gone():
        assert time.monotonic() - t0 < within_s, "the cancelled call's container still exists"
        await asyncio.sleep(0.1)
    return time.monotonic() - t0


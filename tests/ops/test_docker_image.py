"""Build the image with ``docker build`` against a local Docker engine and run it (slow tier).

Nothing is pulled: the base image is a Debian bookworm root filesystem made with
``debootstrap`` (minbase + python3, python3-venv, pip; cached in ``$HERMES_TEST_ROOTFS``,
default ``/tmp/hermes-test-rootfs-bookworm``) and ``docker import``-ed; the build stage installs
the package from a wheelhouse (``pip wheel .``) served on 127.0.0.1 through the Dockerfile's
optional ``PIP_INDEX_URL`` build argument. dockerd runs with ``--bridge=none --iptables=false
--ip6tables=false`` and its own socket, data root and exec root; containers use the host
network and bind 127.0.0.1. Then a gateway container and a HermesLet container (the same image)
serve a hosted run, as user 10001, and the image's health check turns healthy.
Needs root, dockerd and debootstrap (apt-get install -y docker.io debootstrap).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hermes.procs import free_port
from tests.ops.conftest import REPO

# the image is built once, in a fixture (minutes; a first debootstrap adds more)
pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.timeout(2400)]

ROOTFS = Path(os.environ.get("HERMES_TEST_ROOTFS", "/tmp/hermes-test-rootfs-bookworm"))
BASE = "hermes-test-base:bookworm"
IMAGE = "hermes:ci-test"


def _need(*tools: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (dockerd, debootstrap)")
    for t in tools:
        if shutil.which(t) is None:
            pytest.skip(f"{t} not installed")


def _rootfs() -> Path:
    if not (ROOTFS / "usr" / "bin" / "python3").exists():
        tmp = ROOTFS.with_name(ROOTFS.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["debootstrap", "--variant=minbase",
                        "--include=python3,python3-venv,python3-pip", "bookworm", str(tmp),
                        "http://deb.debian.org/debian"], check=True, capture_output=True,
                       timeout=1800)
        tmp.rename(ROOTFS)
    py = ROOTFS / "usr" / "bin" / "python"
    if not py.exists():
        py.symlink_to("python3")  # the Dockerfile calls `python`, as the python images have it
    return ROOTFS


@pytest.fixture(scope="module")
def docker_env() -> Iterator[dict[str, str]]:
    """A private dockerd (no bridge, no iptables); its environment for the docker client."""
    _need("dockerd", "docker", "debootstrap")
    root = Path(tempfile.mkdtemp(prefix="hd-", dir="/tmp"))  # short: socket path limits
    sock = root / "docker.sock"
    log = (root / "dockerd.log").open("wb")
    proc = subprocess.Popen(
        ["dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false",
         f"--host=unix://{sock}", f"--data-root={root / 'data'}", f"--exec-root={root / 'x'}",
         f"--pidfile={root / 'docker.pid'}"], stdout=log, stderr=subprocess.STDOUT)
    env = {**os.environ, "DOCKER_HOST": f"unix://{sock}", "DOCKER_BUILDKIT": "0"}
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], env=env, capture_output=True).returncode:
            assert proc.poll() is None, (root / "dockerd.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "dockerd did not start"
            time.sleep(0.5)
        yield env
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        # dockerd leaves its default network namespace mounted under the exec root
        subprocess.run(["umount", str(root / "x" / "netns" / "default")], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _wheel_index(tmp: Path) -> Iterator[str]:
    """The project's wheels (and build backend) as a PEP 503 index on 127.0.0.1."""
    wh = tmp / "wheels"
    # async-timeout: redis needs it on Python < 3.11.3 (Debian's 3.11.2), not on this one
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", str(REPO), "setuptools", "wheel",
                    "async-timeout", "-w", str(wh)], check=True, capture_output=True, timeout=1200)
    simple = tmp / "index" / "simple"
    for f in wh.iterdir():
        d = simple / re.sub(r"[-_.]+", "-", f.name.split("-")[0]).lower()
        d.mkdir(parents=True, exist_ok=True)
        (d / f.name).symlink_to(f)
    port = free_port()
    srv = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                            "--directory", str(tmp / "index")], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/simple/"
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        yield url
    finally:
        srv.terminate()
        srv.wait(10)


def _docker(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    r = subprocess.run(["docker", *args], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"docker {' '.join(args)}: {r.stdout[-3000:]}{r.stderr[-3000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def image(docker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The image, built once for the module (minutes)."""
    env = docker_env
    rootfs = _rootfs()
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(["docker", "import", "-", BASE], stdin=tar.stdout, env=env, check=True,
                   capture_output=True, timeout=600)
    tar.wait()
    with _wheel_index(tmp_path_factory.mktemp("wheels")) as index:
        _docker(env, "build", "--network", "host", "--build-arg", f"PYTHON_IMAGE={BASE}",
                "--build-arg", f"PIP_INDEX_URL={index}", "--build-arg",
                "PIP_TRUSTED_HOST=127.0.0.1", "-t", IMAGE, str(REPO), timeout=1800)
    return IMAGE


DOCUMENTED = "docker run --rm -p 8000:8000 hermes:latest"


def _logs(env: dict[str, str], name: str) -> str:
    """A container's stdout and stderr so far."""
    r = subprocess.run(["docker", "logs", name], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, f"docker logs {name}: {r.stderr[-2000:]}"
    return r.stdout + r.stderr


def test_the_documented_command_serves_a_first_run(docker_env, image: str) -> None:  # noqa: ANN001
    """The Dockerfile's and the docs' command, as written but for the network: ``-p
    8000:8000`` becomes ``--network none`` (no bridge may be made here), a network namespace of
    the container's own, so its gateway listens on 0.0.0.0 as documented. It exited 2
    ("refusing to serve on 0.0.0.0 without authentication"); now its first start prints an
    API key, and a first run with it (``docker exec``: from inside that namespace) finishes."""
    env = docker_env
    assert DOCUMENTED in (REPO / "Dockerfile").read_text()
    assert DOCUMENTED in (REPO / "docs" / "deployment.md").read_text()
    argv = DOCUMENTED.split()[1:]
    argv[argv.index("-p"):argv.index("-p") + 2] = ["--network", "none"]
    argv[-1] = image
    name = "hermes-ci-documented"
    argv[argv.index("--rm") + 1:argv.index("--rm") + 1] = ["-d", "--name", name]
    try:
        _docker(env, *argv)
        deadline = time.monotonic() + 180
        while "hermes gateway ready" not in (logs := _logs(env, name)):
            assert time.monotonic() < deadline, logs[-3000:]
            time.sleep(0.5)
        lines = logs.splitlines()
        said = next(i for i, ln in enumerate(lines) if "no API key yet" in ln)
        key = lines[said + 1].strip()
        assert "0.0.0.0" not in key and len(key) > 20, logs[-3000:]
        refused = subprocess.run(["docker", "exec", name, "hermes", "run", "factool_kbqa"],
                                 env=env, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "HTTP 401" in refused.stderr, refused.stderr
        run = _docker(env, "exec", name, "hermes", "run", "factool_kbqa", "--token", key,
                      "--input", '{"seed": 1}', "--json", timeout=180)
        assert '"state": "finished"' in run, run
    finally:
        subprocess.run(["docker", "rm", "-f", name], env=env, capture_output=True, timeout=60)


def test_image_builds_from_a_local_base_and_serves(docker_env, image: str) -> None:  # noqa: ANN001
    env = docker_env
    assert _docker(env, "image", "inspect", "-f", "{{.Config.User}}", IMAGE).strip() == \
        "10001:10001"
    gp, zp, mp = free_port(), free_port(), free_port()
    names = ["hermes-ci-gw", "hermes-ci-let"]
    try:
        # on the host's network, so on loopback, and without authentication there (an empty
        # auth file setting: the image's first-key default is the other test's)
        _docker(env, "run", "-d", "--name", names[0], "--network", "host",
                "-e", "HERMES_SECURITY__AUTH_FILE=",
                "-e", "HERMES_HOST=127.0.0.1", "-e", f"HERMES_PORT={gp}",
                "-e", f"HERMES_BIND=tcp://127.0.0.1:{zp}", "-e", "HERMES_EMBEDDED_NODE=false",
                "-e", "HERMES_TIME_SCALE=100", IMAGE)
        _docker(env, "run", "-d", "--name", names[1], "--network", "host",
                "--entrypoint", "hermeslet", IMAGE, "run", "--scheduler",
                f"tcp://127.0.0.1:{zp}", "--node", "c1", "--engine", "sim", "--model",
                "llama-2-7b", "--time-scale", "100", "--metrics-port", str(mp))
        url = f"http://127.0.0.1:{gp}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).json()["nodes"]:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert time.monotonic() < deadline, _docker(env, "logs", names[0])
            time.sleep(0.5)
        rid = httpx.post(url + "/v1/runs", json={"app": "factool_kbqa",
                                                  "input": {"seed": 1}}).json()["run_id"]
        deadline = time.monotonic() + 60
        while (run := httpx.get(f"{url}/v1/runs/{rid}").json())["state"] in ("queued",
                                                                              "running"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert run["state"] == "finished" and run["units"], run
        assert "hermeslet_engine_max_inflight_requests" in httpx.get(
            f"http://127.0.0.1:{mp}/metrics").text
        assert 'hermes_runs_ended_total{app="factool_kbqa"' in httpx.get(url + "/metrics").text
        assert _docker(env, "exec", names[0], "id", "-u").strip() == "10001"
        deadline = time.monotonic() + 60  # HEALTHCHECK: every 10 s
        while (h := _docker(env, "inspect", "-f", "{{.State.Health.Status}}",
                            names[0]).strip()) != "healthy":
            assert h != "unhealthy" and time.monotonic() < deadline, h
            time.sleep(1)
    finally:
        subprocess.run(["docker", "rm", "-f", *names], env=env, capture_output=True, timeout=60)

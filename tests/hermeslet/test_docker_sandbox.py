"""The Docker tool sandbox against a real (private) Docker engine and a locally built image:
no network, memory limit enforced, timeout kills, read-only root, non-root user."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from dockerd import busybox_image, cancel_once_running, docker_engine  # noqa: F401  (fixtures)

from hermeslet.tools import DockerCall, DockerSandbox, ToolLimits, ToolRunner

pytestmark = pytest.mark.docker


@pytest.fixture
def box(docker_engine: str, busybox_image: str) -> DockerSandbox:  # noqa: F811
    return DockerSandbox(base_url=docker_engine, default_image=busybox_image,
                         limits=ToolLimits(memory_bytes=64 << 20, pids=32, cpus=0.5))


async def test_no_network_from_the_container(box: DockerSandbox) -> None:
    # a server on the host's loopback: reachable from the host, not from the sandbox
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    accepted: list[object] = []
    threading.Thread(target=lambda: accepted.append(srv.accept()), daemon=True).start()
    try:
        r = await box.run(command=["sh", "-c", "cat /proc/net/dev | tail -n +3 | cut -d: -f1; "
                                   f"nc -w 2 127.0.0.1 {port} </dev/null && echo CONNECTED; "
                                   "wget -T 2 -q -O- http://1.1.1.1/ && echo FETCHED; true"],
                          timeout_s=30)
        ifaces = r.stdout.split()
        assert ifaces[0] == "lo" and "eth0" not in ifaces, r.stdout
        assert "CONNECTED" not in r.stdout and "FETCHED" not in r.stdout
        time.sleep(0.2)
        assert not accepted
    finally:
        srv.close()


async def test_memory_limit_is_enforced(box: DockerSandbox) -> None:
    small = await box.run(command=["sh", "-c", "head -c 8000000 /dev/zero | tr '\\0' a | wc -c"])
    assert small.exit_code == 0 and small.stdout.strip() == "8000000"
    # hold 200 MB in a shell variable: over the 64 MiB limit (no swap allowed) -> OOM-killed
    r = await box.run(command=["sh", "-c", "x=$(head -c 200000000 /dev/zero | tr '\\0' a); "
                               "echo survived ${#x}"], timeout_s=60)
    assert "survived" not in r.stdout
    assert r.exit_code == 137, (r.exit_code, r.stderr)


async def test_timeout_kills_the_container(box: DockerSandbox) -> None:
    t0 = time.monotonic()
    r = await box.run(command=["sleep", "60"], timeout_s=1.5)
    assert r.timed_out and r.exit_code != 0
    assert time.monotonic() - t0 < 15
    import docker

    left = docker.DockerClient(base_url=box._base_url).containers.list(all=True)
    assert left == []  # killed and removed


async def test_read_only_root_non_root_user_no_capabilities(box: DockerSandbox) -> None:
    r = await box.run(command=["sh", "-c", "id -u; id -g; touch /bin/x 2>&1 || echo RO; "
                               "echo ok > /tmp/t && cat /tmp/t; "
                               "grep CapEff /proc/self/status"])
    lines = r.stdout.splitlines()
    assert lines[:2] == ["65534", "65534"], r.stdout
    assert "RO" in lines and "ok" in lines
    assert lines[-1].split()[-1] == "0000000000000000"
    # pids limit (32): a fork bomb stops at the limit
    r = await box.run(command=["sh", "-c", "for i in $(seq 100); do sleep 3 & done; wait"],
                      timeout_s=20)
    assert r.exit_code != 0 and "can't fork" in r.stderr, (r.exit_code, r.stderr)


async def test_runner_routes_docker_tools_to_the_engine(docker_engine: str, busybox_image: str) -> None:  # noqa: F811
    runner = ToolRunner(docker=DockerSandbox(base_url=docker_engine))
    r = await runner.run(f"docker:{busybox_image}", command=["sh", "-c", "echo $((6*7))"])
    assert (r.exit_code, r.stdout, r.cold) == (0, "42\n", True)


async def test_a_cancelled_call_kills_its_container_at_once(box: DockerSandbox) -> None:
    """A call whose task is cancelled (its run cancelled, its client gone, the node stopping)
    stops its container then, not at the call's timeout: the worker thread that waits on the
    Docker API is not interrupted by the cancel, so the container is killed under it."""
    import docker

    client = docker.DockerClient(base_url=box._base_url)
    await cancel_once_running(box, lambda: bool(client.containers.list()),  # running ones
                              lambda: not client.containers.list(all=True))

class _Container:
    """Stands in for the SDK's container object: records its kills."""

    def __init__(self) -> None:
        self.kills = 0

    def kill(self) -> None:
        self.kills += 1


def test_a_call_cancelled_before_its_container_exists_kills_it_when_attached() -> None:
    early = DockerCall()
    early.cancel()  # nothing to kill yet
    c = _Container()
    assert early.attach(c) is False and c.kills == 1  # start nothing in it
    late = DockerCall()
    c2 = _Container()
    assert late.attach(c2) is True and c2.kills == 0
    late.cancel()
    assert c2.kills == 1

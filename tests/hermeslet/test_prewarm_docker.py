"""The container pool against a real Docker engine (dockerd started here, image built locally).

dockerd runs with ``--bridge=none --iptables=false --ip6tables=false`` and its own socket,
data root and exec root under a temporary directory (PLATFORM.md); the image is a
busybox-static root filesystem imported with ``docker import`` (never pulled). Without dockerd
the tests are skipped, unless ``HERMES_REQUIRE_DOCKER=1`` (CI) makes that a failure.
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
from pathlib import Path

import numpy as np
import pytest
from dockerd import cancel_once_running

from hermes.core.prewarm import HermesPrewarm, WarmSet
from hermes.core.state import RunState
from hermeslet.prewarmers import ContainerPool, NodePrewarmer, PooledDockerSandbox
from hermeslet.tools import ToolRunner

IMAGE = "hermes-busybox:test"


def _unavailable(reason: str) -> None:
    if os.environ.get("HERMES_REQUIRE_DOCKER") == "1":
        pytest.fail(f"HERMES_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


def _busybox_rootfs_tar() -> bytes:
    busybox = shutil.which("busybox") or "/bin/busybox"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(busybox, arcname="bin/busybox")
        for name in ("sh", "sleep", "echo", "cat", "true", "wget"):
            link = tarfile.TarInfo(f"bin/{name}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            t.addfile(link)
        for d in ("tmp", "proc", "sys", "dev", "etc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            t.addfile(info)
    return buf.getvalue()


@pytest.fixture(scope="session")
def docker_client():
    """A private dockerd (no bridge, no iptables) and a client with the busybox image."""
    docker = pytest.importorskip("docker")
    if shutil.which("dockerd") is None:
        _unavailable("dockerd is not installed (apt-get install docker.io)")
    if not (shutil.which("busybox") or Path("/bin/busybox").exists()):
        _unavailable("busybox is not installed (apt-get install busybox-static)")
    root = Path(tempfile.mkdtemp(prefix="hdk"))  # short: unix socket paths are limited
    sock = root / "d.sock"
    log = open(root / "dockerd.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        ["dockerd", "--host", f"unix://{sock}", "--data-root", str(root / "data"),
         "--exec-root", str(root / "exec"), "--pidfile", str(root / "dockerd.pid"),
         "--bridge=none", "--iptables=false", "--ip6tables=false"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    client = None
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and proc.poll() is None:
        if sock.exists():
            try:
                client = docker.DockerClient(base_url=f"unix://{sock}")
                client.ping()
                break
            except Exception:
                client = None
        time.sleep(0.3)
    if client is None:
        proc.terminate()
        tail = (root / "dockerd.log").read_bytes()[-600:].decode(errors="replace")
        _unavailable(f"dockerd did not start (not root? no overlay?): {tail}")
    client.api.import_image_from_data(_busybox_rootfs_tar(), repository=IMAGE.split(":")[0],
                                      tag=IMAGE.split(":")[1])
    yield client
    for c in client.containers.list(all=True):
        c.remove(force=True)
    client.close()
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    shutil.rmtree(root, ignore_errors=True)


def test_pool_sandbox_limits_and_timeout_kill(docker_client):
    pool = ContainerPool(client=docker_client)
    pool.prewarm(IMAGE)
    (w,) = pool.idle[IMAGE]
    hc = docker_client.api.inspect_container(w.container.id)["HostConfig"]
    assert hc["NetworkMode"] == "none" and hc["ReadonlyRootfs"] is True
    assert hc["PidsLimit"] == pool.limits.pids and hc["Memory"] == pool.limits.memory_bytes
    r = pool.run_blocking(["sh", "-c", "echo hi; touch /x"], IMAGE, 10)
    assert r.cold is False and r.stdout == "hi\n" and r.exit_code != 0
    assert "Read-only" in r.stderr
    r = pool.run_blocking(["sh", "-c", "sleep 30"], IMAGE, 1.0)
    assert r.timed_out and r.cold and r.duration_s < 10
    # a prewarm nobody used is reaped after the idle timeout, and counted as waste
    pool.idle_timeout_s = 0.0
    pool.prewarm(IMAGE)
    assert pool.reap() == 1
    st = pool.stats()
    assert st["wasted"] == 1 and st["wasted_backend_s"] > 0 and st["idle"] == 0


def test_a_cancelled_pooled_call_kills_its_warm_container(docker_client):
    """A pooled call (an exec in a warm container) whose task is cancelled ends then: its
    container is killed and removed, not left running the command until its timeout."""
    import docker

    pool = ContainerPool(client=docker_client)
    pool.prewarm(IMAGE)
    (w,) = pool.idle[IMAGE]
    cid = w.container.id
    box = PooledDockerSandbox(pool, default_image=IMAGE)

    def gone() -> bool:
        try:
            docker_client.api.inspect_container(cid)
        except docker.errors.NotFound:
            return True
        return False

    scenario = cancel_once_running(
        box, lambda: bool(docker_client.api.inspect_container(cid).get("ExecIDs")), gone)
    assert asyncio.run(scenario) < 20
    assert pool.stats()["warm_hits"] == 1


def test_cg_execute_code_finds_a_warm_container(docker_client):
    """CG: while ``generate_code`` runs, the planner (shipped CG PDGraph, p(execute_code)=1)
    schedules a prewarm of the container; the execute-code call then starts warm, and its
    latency drops by about the measured cold start."""
    from hermes.bench.sched import load_graphs

    graphs = load_graphs()
    g = graphs["code_generation"]

    class Remaining:  # generate_code has ~3 s left (the estimator's own tests cover it)
        def sample(self, progress, n=None):  # noqa: ANN001, ANN201
            from hermes.core.estimator import DemandSamples

            z = np.zeros(100)
            return DemandSamples(z, z, z, z, current_s=np.linspace(2.0, 4.0, 100))

    planner = HermesPrewarm(
        k=0.5, graphs=graphs.get, estimators=lambda app: Remaining(),
        resources=lambda run, app, unit, backend: ["docker:" + IMAGE] if backend.startswith("docker:") else [],
    )
    run = RunState(run_id="cg1", app="code_generation", submitted=0.0)
    run.begin_unit("generate_code")
    assert planner.on_unit_start(run, "generate_code", g.units["generate_code"].backend, 0.0,
                                 WarmSet()) == []
    (pw,) = planner.outstanding("cg1")
    assert pw.unit == "execute_code" and 0.0 < pw.start_at < 4.0
    pool = ContainerPool(client=docker_client)
    node = NodePrewarmer(containers=pool)
    runner = ToolRunner(docker=PooledDockerSandbox(pool, default_image=IMAGE))
    cmd = ["sh", "-c", "echo ran"]

    async def scenario() -> tuple:
        cold = await runner.run(f"docker:{IMAGE}", command=cmd, timeout_s=20)
        (start,) = planner.due(pw.start_at)
        ok, detail = await node.handle(start.resource, start.action)
        assert ok, detail
        t_p = float(detail.split("=")[1])
        planner.observe_warmup(start.resource, t_p)
        run.end_unit(_obs("generate_code"))
        run.begin_unit("execute_code")
        (used,) = planner.on_unit_start(run, "execute_code", "docker:" + IMAGE, pw.start_at + 5,
                                        WarmSet())
        assert used.used and used.action == "release"  # the unit has it: nothing to stop
        warm = await runner.run(f"docker:{IMAGE}", command=cmd, timeout_s=20)
        return cold, warm, t_p

    cold, warm, t_p = asyncio.run(scenario())
    assert cold.cold and not warm.cold
    assert cold.stdout == warm.stdout == "ran\n"
    saved = cold.duration_s - warm.duration_s
    print(f"cold {cold.duration_s:.3f}s warm {warm.duration_s:.3f}s saved {saved:.3f}s "
          f"measured cold start {t_p:.3f}s")
    assert saved > 0.5 * t_p  # the drop is the cold start, up to the noise of a shared host
    assert saved < 2.0 * t_p + 0.3
    st = planner.stats()
    assert st["used"] == 1 and st["wasted"] == 0
    assert pool.stats()["warm_hits"] == 1
    assert planner.learner.estimate(start_resource := "docker:" + IMAGE) == pytest.approx(t_p)
    assert start_resource


def _obs(unit: str):  # noqa: ANN202
    from hermes.core.state import UnitObservation

    return UnitObservation(unit=unit, input_tokens=600, output_tokens=500, parallelism=1,
                           duration_s=3.0, service_s=3.0)


def test_wrong_branch_container_is_released_and_counted(docker_client):
    pool = ContainerPool(client=docker_client)
    node = NodePrewarmer(containers=pool)

    async def go() -> None:
        ok, _ = await node.handle(f"docker:{IMAGE}", "start")
        assert ok and pool.stats()["idle"] == 1
        ok, _ = await node.handle(f"docker:{IMAGE}", "release")
        assert ok

    asyncio.run(go())
    st = node.stats()
    assert st["docker_wasted"] == 1 and st["docker_idle"] == 0 and st["docker_wasted_backend_s"] > 0
    # the waste is counted in the node's metrics (one scrape of a HermesLet with this prewarmer)
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from hermeslet.agent import HermesLet
    from hermeslet.engines import make_engine
    from hermeslet.metrics import node_registry

    agent = HermesLet("node-d", "inproc://unused", [make_engine("sim", name="e", model="m")],
                      prewarmer=node)
    page = generate_latest(node_registry(agent)).decode()
    got = {s.name: s.value for f in text_string_to_metric_families(page) for s in f.samples
           if s.labels.get("backend_type") == "docker" and s.labels["node"] == "node-d"}
    assert got["hermeslet_prewarm_started_total"] == 1
    assert got["hermeslet_prewarm_wasted_total"] == 1 and got["hermeslet_prewarm_used_total"] == 0
    assert got["hermeslet_prewarm_wasted_backend_seconds_total"] == pytest.approx(
        pool.counters.wasted_backend_s) and pool.counters.wasted_backend_s > 0
    assert got["hermeslet_prewarm_last_warmup_seconds"] == pytest.approx(
        pool.counters.warmup_s_last) and pool.counters.warmup_s_last > 0
    assert "hermeslet_prewarm_idle_containers" not in got  # its label is the image
    assert f'hermeslet_prewarm_idle_containers{{image="{IMAGE}",node="node-d"}} 0.0' in page

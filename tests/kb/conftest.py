"""Fixtures for the knowledge-base tests: a real redis-server, hand-made graphs, and a
``store_factory`` parametrised over both store kinds so one behavioural suite covers both."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from hermes.core.pdgraph import PDGraph
from hermes.core.profiler import learn
from hermes.core.records import RequestRecord, RunRecord, UnitRecord
from hermes.kb import FileStore, KnowledgeBase, RedisStore
from hermes.procs import free_port

REQUIRE_ENV = "HERMES_REQUIRE_REDIS"


def _unavailable(msg: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{msg} ({REQUIRE_ENV}=1: a missing Redis is a failure, not a skip)")
    pytest.skip(msg)


def _start(binary: str, port: int, workdir: Path) -> tuple[subprocess.Popen, Path]:
    log = workdir / f"redis-{port}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=fh, stderr=subprocess.STDOUT,
        )
    return proc, log


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``redis-server`` on a free loopback port; yields its URL, killed at teardown."""
    binary = shutil.which("redis-server")
    if binary is None:
        _unavailable("redis-server not found on PATH (install it: apt-get install redis-server)")
    workdir = tmp_path_factory.mktemp("redis")
    for _attempt in range(3):  # the free port may be taken between probe and bind: retry
        port = free_port()
        proc, log = _start(binary, port, workdir)
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
        deadline = time.monotonic() + 10
        up = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                up = bool(client.ping())
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        client.close()
        if up:
            break
        _stop(proc)
    else:
        pytest.fail(f"redis-server did not start; last log:\n{log.read_text()[-2000:]}")
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(proc)


# ------------------------------------------------------------------------- hand-made graphs
def make_records(app: str = "toy", n: int = 30, seed: int = 0) -> list[RunRecord]:
    """``n`` runs of a small ReAct-like app: plan (LLM, 1-3 parallel requests), a search tool
    loop, then answer (LLM) whose input grows with the plan's output."""
    rng = random.Random(seed)
    runs = []
    for r in range(n):
        t = float(r)
        units = []
        plan_out = rng.randint(20, 200)
        reqs = [RequestRecord(input_tokens=rng.randint(50, 100), output_tokens=plan_out)
                for _ in range(rng.randint(1, 3))]
        units.append(UnitRecord(unit="plan", backend="llm:llama-2-7b", started=t,
                                finished=t + 1.0, requests=reqs))
        t += 1.0
        for _ in range(rng.randint(1, 3)):
            d = rng.uniform(0.1, 0.5)
            units.append(UnitRecord(unit="search", backend="api:search", started=t,
                                    finished=t + d, duration_s=d, upstream="plan"))
            t += d
        units.append(UnitRecord(
            unit="answer", backend="llm:llama-2-7b", started=t, finished=t + 1.0,
            requests=[RequestRecord(input_tokens=100 + plan_out, output_tokens=rng.randint(5, 50))],
            upstream="plan"))
        runs.append(RunRecord(app=app, run_id=f"{app}-{seed}-{r}", submitted=float(r),
                              finished=t + 1.0, units=units))
    return runs


def make_graph(app: str = "toy", n: int = 30, seed: int = 0) -> PDGraph:
    return learn(make_records(app, n, seed))


# ------------------------------------------------------------------------- stores
StoreFactory = Callable[..., KnowledgeBase]


@pytest.fixture
def file_factory(tmp_path: Path) -> Iterator[StoreFactory]:
    """Makes FileStores on one shared directory (``tmp_path/pdgraphs``)."""
    made: list[KnowledgeBase] = []

    def make(**kw: object) -> KnowledgeBase:
        store = FileStore(tmp_path / "pdgraphs", **kw)  # type: ignore[arg-type]
        made.append(store)
        return store

    yield make
    for s in made:
        s.close()


@pytest.fixture
def redis_factory(redis_server: str) -> Iterator[StoreFactory]:
    """Makes RedisStores on the test server, all under one fresh prefix (test isolation)."""
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    made: list[KnowledgeBase] = []

    def make(**kw: object) -> KnowledgeBase:
        kw.setdefault("prefix", prefix)
        store = RedisStore(redis_server, **kw)  # type: ignore[arg-type]
        made.append(store)
        return store

    yield make
    cleanup = redis.Redis.from_url(redis_server)
    keys = list(cleanup.scan_iter(match=f"{prefix}*"))
    if keys:
        cleanup.delete(*keys)
    cleanup.close()
    for s in made:
        s.close()


@pytest.fixture(params=["file", pytest.param("redis", marks=pytest.mark.redis)])
def store_factory(request: pytest.FixtureRequest) -> StoreFactory:
    """Parametrised over both store kinds: each call makes another instance on the SAME
    backing storage (directory or Redis prefix)."""
    return request.getfixturevalue(f"{request.param}_factory")


@pytest.fixture
def mkgraph() -> Callable[..., PDGraph]:
    """``mkgraph(app="toy", n=30, seed=0)``: a valid PDGraph learned from hand-made runs."""
    return make_graph


@pytest.fixture
def mkrecords() -> Callable[..., list[RunRecord]]:
    """``mkrecords(app="toy", n=30, seed=0)``: hand-made run records."""
    return make_records

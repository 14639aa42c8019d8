"""``hermes bench ha``: faults under load on a real highly available deployment, loopback only.

What runs (each its own process, started here, on 127.0.0.1 ports chosen free):

- a real **Redis** (``redis-server``): the scheduler lease and the durable run state;
- two **schedulers** ``hermes serve --role scheduler --ha REDIS --redis REDIS`` with remote
  nodes: one is elected (the active scheduler), the other is a warm standby;
- ``--edges N`` (default 2) **edges** ``hermes serve --role edge``: HTTP in front of the
  active scheduler (found in the lease record), answered straight by the nodes. With
  ``--edges 0`` the two gateways are all-in-one processes (HTTP and scheduler) instead, the
  load balancer sends all traffic to the leader, and "edge-kill" kills the standby's front
  end;
- two **HermesLets** (``hermeslet run --scheduler A --scheduler B``, built-in engine);
- a real **haproxy** in front of the edges (or the all-in-one gateways), checking
  ``GET /readyz`` every 100 ms (an edge answers 200 while the active scheduler answers it;
  an all-in-one gateway while it leads), retrying a refused request elsewhere.

A mixed load goes through haproxy: hosted runs (``POST /v1/runs`` with an
``Idempotency-Key``, retried with the same key until accepted, then followed to their end),
header-less agent loops (plain chat turns growing a conversation, each turn retried until
answered) and streamed chats, with at least ``--min-inflight`` hosted runs in flight when the
fault strikes. Scenarios, each repeated ``--repeats`` times:

- ``scheduler-kill``: ``kill -9`` of the active scheduler; its standby takes over;
- ``edge-kill``: ``kill -9`` of an edge (clients keep going through haproxy and the other);
- ``node-kill``: ``kill -9`` of a HermesLet (its work moves to the other);
- ``leader-pause``: ``SIGSTOP`` of the leader past its lease, then ``SIGCONT``: the standby
  takes over; the woken ex-leader must dispatch nothing (it stops itself, exit 75, counting
  what it refused to send; nodes count the stale epochs they rejected).

A killed process is started again (as a standby, or a node) before the next repeat.

Per row: hosted runs accepted, lost (accepted but not finished: failed, or unknown after the
fault), duplicated (one idempotency key, several runs in the shared store), failover time
(fault to the first dispatch by the new leader; None where no failover happens), requests
refused (connection errors, 502/503/504) while the fault lasted, streams cut and what their
clients got, agent loops finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes.procs import free_port, wait_http

SCENARIOS = ("scheduler-kill", "edge-kill", "node-kill", "leader-pause")
MODEL = "llama-2-7b"
#: exit status of a deposed scheduler (hermes.gateway.ha.role.EXIT_DEPOSED)
EXIT_DEPOSED = 75


# ---------------------------------------------------------------------------------- processes
@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str]
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.popen = subprocess.Popen(self.argv, stdout=self.log.open("ab"),
                                      stderr=subprocess.STDOUT, env=self.env,
                                      start_new_session=True)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def stop(self) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGCONT)
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process so far (Linux /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")



def haproxy_config(port: int, servers: list[tuple[str, str]]) -> str:
    """The haproxy configuration the cluster runs (and docs/ha.md shows): ``servers`` (name,
    ``host:port``) checked on ``GET /readyz`` every 100 ms, in front of ``127.0.0.1:port``.

    A request a server refused before running it (connection refused, or a 503 such as a
    standby's ``not_leader`` in the ~300 ms before its checks fail) is sent again, to another
    server on the last try. haproxy retries a request only while it holds all of it, so
    ``option http-buffer-request`` is needed: without it a POST whose body came in a second
    packet got the standby's 503 (18 of 20 chats at a cluster's start, tests/bench/test_ha_lb.py).
    """
    lines = "\n".join(f"  server {name} {addr} check" for name, addr in servers)
    return f"""global
  maxconn 4096
defaults
  mode http
  timeout connect 1s
  timeout client 120s
  timeout server 120s
  timeout queue 5s
  timeout check 2s
  retries 3
  option redispatch
  option http-buffer-request
  retry-on conn-failure 503
frontend fe
  bind 127.0.0.1:{port}
  default_backend gateways
backend gateways
  option httpchk GET /readyz
  http-check expect status 200
  default-server inter 100ms fastinter 100ms downinter 100ms fall 3 rise 1
{lines}
"""


@dataclass
class Cluster:
    """Redis, gateways, nodes and haproxy on loopback (see the module doc)."""

    workdir: Path
    time_scale: float = 5.0
    n_gateways: int = 2
    n_nodes: int = 2
    ha: bool = True
    ttl_s: float = 1.5
    redis: Proc | None = None
    gateways: list[Proc] = field(default_factory=list)
    nodes: list[Proc] = field(default_factory=list)
    haproxy: Proc | None = None
    http_ports: list[int] = field(default_factory=list)
    zmq_ports: list[int] = field(default_factory=list)
    url: str = ""
    redis_url: str = ""
    #: more environment for the gateways (``--scale``: ``HERMES_ROLE_CPU=1``)
    gateway_env: dict[str, str] = field(default_factory=dict)
    #: split roles: this many ``--role edge`` processes behind haproxy, the gateways then
    #: ``--role scheduler`` (0: all-in-one gateways behind haproxy, as before)
    n_edges: int = 0
    #: the gateways are ``--role scheduler`` (a socket for edges) even without edge processes
    edge_socket: bool = False
    edges: list[Proc] = field(default_factory=list)
    edge_ports: list[int] = field(default_factory=list)
    #: every process shares its state in the Redis (``[cluster] store``): quotas, the
    #: Responses store, the run resolver's evidence index
    shared_store: bool = False
    #: the election store (``--ha``) when it is not the Redis, e.g. ``etcd://HOST:PORT``
    #: (the run state stays in the Redis: ``--redis``)
    election: str = ""
    #: the gateways share one knowledge base in the Redis (db 4: the learned PDGraphs and
    #: the operator's app names survive a failover); else each its own directory
    shared_kb: bool = False

    def start(self) -> None:
        for tool in ("redis-server", "haproxy"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} not found on PATH (apt-get install {tool})")
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HERMES_LOG_LEVEL": "warning"}
        rport = free_port()
        self.redis = Proc("redis", ["redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                                    "--save", "", "--appendonly", "no",
                                    "--dir", str(self.workdir)],
                          self.workdir / "redis.log", env)
        self.redis.start()
        self.redis_url = f"redis://127.0.0.1:{rport}/0"
        _wait_redis(self.redis_url)
        self.http_ports = [free_port() for _ in range(self.n_gateways)]
        self.zmq_ports = [free_port() for _ in range(self.n_gateways)]
        genv = {**env, "HERMES_EMBEDDED_NODE": "false", "HERMES_HA__LEASE_TTL_S": str(self.ttl_s),
                "HERMES_HA__LEASE_RENEW_S": str(round(min(0.3, self.ttl_s / 5), 3)),
                "HERMES_RECOVERY_GRACE_S": "3", **self.gateway_env}
        if self.shared_store:
            genv["HERMES_CLUSTER__STORE"] = self.redis_url
        for i in range(self.n_gateways):
            argv = [sys.executable, "-m", "hermes.cli", "serve", "--host", "127.0.0.1",
                    "--port", str(self.http_ports[i]),
                    "--bind", f"tcp://127.0.0.1:{self.zmq_ports[i]}",
                    "--redis", self.redis_url, "--time-scale", str(self.time_scale),
                    "--state-dir", str(self.workdir / f"gw{i}"),
                    "--kb", (f"redis://127.0.0.1:{rport}/4" if self.shared_kb
                             else str(self.workdir / f"gw{i}" / "kb"))]
            if self.ha:
                argv += ["--ha", self.election or self.redis_url]
            if self.n_edges or self.edge_socket:
                argv += ["--role", "scheduler", "--edge-bind", f"tcp://127.0.0.1:{free_port()}"]
            self.gateways.append(Proc(f"gw{i}", argv, self.workdir / f"gw{i}.log",
                                      {**genv, "HERMES_HA__MEMBER": f"gw{i}"}))
        for j in range(self.n_nodes):
            argv = [sys.executable, "-m", "hermeslet.cli", "run", "--node", f"n{j}",
                    "--time-scale", str(self.time_scale), "--max-inflight", "64",
                    "--heartbeat-s", "0.5"]
            for p in self.zmq_ports:
                argv += ["--scheduler", f"tcp://127.0.0.1:{p}"]
            self.nodes.append(Proc(f"n{j}", argv, self.workdir / f"n{j}.log", env))
        self.edge_ports = [free_port() for _ in range(self.n_edges)]
        for k in range(self.n_edges):
            argv = [sys.executable, "-m", "hermes.cli", "serve", "--role", "edge",
                    "--ha", self.election or self.redis_url, "--host", "127.0.0.1",
                    "--port", str(self.edge_ports[k]),
                    "--bind", f"tcp://127.0.0.1:{free_port()}",
                    "--time-scale", str(self.time_scale),
                    "--state-dir", str(self.workdir / f"edge{k}")]
            self.edges.append(Proc(f"edge{k}", argv, self.workdir / f"edge{k}.log",
                                   {**genv, "HERMES_HA__MEMBER": f"edge{k}"}))
        for g in self.gateways:
            g.start()
            time.sleep(0.3)  # the first one started is the first leader
        for n in self.nodes:
            n.start()
        for e in self.edges:
            e.start()
        self.wait_leader(60.0)
        self.wait_gateways(60.0)
        self.wait_nodes(60.0)
        for k in range(self.n_edges):
            self.wait_edge(k)
        self._start_haproxy(env)

    def _start_haproxy(self, env: dict[str, str]) -> None:
        port = free_port()
        front = [("edge", p) for p in self.edge_ports] if self.n_edges else \
            [("gw", p) for p in self.http_ports]
        cfg = self.workdir / "haproxy.cfg"
        cfg.write_text(haproxy_config(port, [(f"{kind}{i}", f"127.0.0.1:{p}")
                                             for i, (kind, p) in enumerate(front)]))
        self.haproxy = Proc("haproxy", ["haproxy", "-db", "-f", str(cfg)],
                            self.workdir / "haproxy.log", env)
        self.haproxy.start()
        self.url = f"http://127.0.0.1:{port}"
        wait_http(self.url + "/readyz", self.haproxy.popen, timeout=30.0)

    # ------------------------------------------------------------------ queries
    def readyz(self, i: int) -> dict[str, Any] | None:
        import httpx

        try:
            r = httpx.get(f"http://127.0.0.1:{self.http_ports[i]}/readyz", timeout=3.0)
        except httpx.HTTPError:
            return None
        return dict(r.json()) if r.status_code in (200, 503) else None

    def leader(self) -> int | None:
        for i in range(len(self.gateways)):
            if not self.gateways[i].alive():
                continue
            d = self.readyz(i)
            if d is not None and d.get("ready"):
                return i
        return None

    def wait_leader(self, timeout: float, *, other_than: int | None = None) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            i = self.leader()
            if i is not None and i != other_than:
                return i
            time.sleep(0.05)
        raise RuntimeError(f"no leader after {timeout:.0f} s (logs in {self.workdir})")

    def wait_gateways(self, timeout: float) -> None:
        """Until every gateway answers (the leader or a standby). One that exited is started
        again, as its supervisor would: elected but unable to lead (its node or edge port
        was taken between :func:`free_port` choosing it and the process binding it, e.g. by
        another process's outgoing connection), it gave the lease up and exited."""
        deadline = time.monotonic() + timeout
        for i, g in enumerate(self.gateways):
            while self.readyz(i) is None:
                if not g.alive():
                    assert g.popen is not None
                    print(f"hermes bench ha: gateway {i} exited ({g.popen.returncode}) at "
                          f"start; starting it again (log: {g.log})", file=sys.stderr)
                    g.start()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gateway {i} did not come up within {timeout:.0f} s "
                                       f"(logs in {self.workdir})")
                time.sleep(0.1)

    def wait_nodes(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            i = self.leader()
            if i is not None:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    h = httpx.get(f"http://127.0.0.1:{self.http_ports[i]}/healthz",
                                  timeout=2.0).json()
                    if len(h.get("nodes", {})) >= len(self.nodes):
                        return
            time.sleep(0.1)
        raise RuntimeError(f"nodes did not connect within {timeout:.0f} s")

    def wait_standby(self, i: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.readyz(i) is not None:
                return
            time.sleep(0.1)
        raise RuntimeError(f"gateway {i} did not come back within {timeout:.0f} s")

    def wait_edge(self, k: int, timeout: float = 60.0) -> None:
        """Until edge ``k`` answers ``/readyz`` 200 (it follows the active scheduler)."""
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.edge_ports[k]}/readyz",
                             timeout=2.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"edge {k} not ready within {timeout:.0f} s (logs in {self.workdir})")

    def stop(self) -> None:
        for p in [self.haproxy, *self.edges, *self.nodes, *self.gateways, self.redis]:
            if p is not None:
                p.stop()


def _wait_redis(url: str, timeout: float = 10.0) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.ping()
            client.close()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis at {url} did not start") from None
            time.sleep(0.05)


# ---------------------------------------------------------------------------------- load
@dataclass
class LoadStats:
    accepted: int = 0
    finished: int = 0
    lost: int = 0
    lost_why: Counter[str] = field(default_factory=Counter)
    client_dup: int = 0  # one key answered with two run ids
    refused: int = 0
    refused_during_fault: int = 0
    streams: int = 0
    streams_cut: int = 0
    cut_what: Counter[str] = field(default_factory=Counter)
    agent_loops: int = 0
    agent_loops_done: int = 0
    in_flight: int = 0
    fault_window: tuple[float, float] | None = None

    def refuse(self) -> None:
        self.refused += 1
        w = self.fault_window
        now = time.monotonic()
        if w is not None and w[0] <= now <= w[1]:
            self.refused_during_fault += 1


TERMINAL = {"finished", "failed", "cancelled"}
RETRY = (502, 503, 504)


class Load:
    """The mixed load of one repeat (see the module doc)."""

    def __init__(self, url: str, tag: str, *, runs: int, app: str, agents: int, turns: int,
                 streams: int) -> None:
        self.url, self.tag, self.runs, self.app = url, tag, runs, app
        self.agents, self.turns, self.n_streams = agents, turns, streams
        self.stats = LoadStats()
        self.stop = asyncio.Event()
        self.run_ids: dict[str, str] = {}

    async def run(self) -> None:
        import httpx

        limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
        async with httpx.AsyncClient(base_url=self.url, timeout=60.0, limits=limits) as http:
            sem = asyncio.Semaphore(64)
            hosted = [asyncio.create_task(self._hosted(http, i, sem)) for i in range(self.runs)]
            agents = [asyncio.create_task(self._agent(http, i)) for i in range(self.agents)]
            streams = [asyncio.create_task(self._streams(http, i))
                       for i in range(self.n_streams)]
            await asyncio.gather(*hosted, *agents)
            self.stop.set()
            await asyncio.gather(*streams)

    async def _hosted(self, http: Any, i: int, sem: asyncio.Semaphore) -> None:
        import httpx

        st = self.stats
        key = f"{self.tag}-{i}"
        rid: str | None = None
        async with sem:
            for _ in range(400):
                try:
                    r = await http.post("/v1/runs", json={"app": self.app,
                                                          "input": {"seed": i, "key": key}},
                                        headers={"Idempotency-Key": key})
                except httpx.HTTPError:
                    st.refuse()
                    await asyncio.sleep(0.1)
                    continue
                if r.status_code in (200, 201):
                    rid = r.json()["run_id"]
                    break
                st.refuse()
                await asyncio.sleep(0.1)
        if rid is None:
            return
        st.accepted += 1
        st.in_flight += 1
        self.run_ids[key] = rid
        state = "queued"
        try:
            for _ in range(2400):
                await asyncio.sleep(0.25)
                try:
                    r = await http.get(f"/v1/runs/{rid}")
                except httpx.HTTPError:
                    st.refuse()
                    continue
                if r.status_code in RETRY:
                    st.refuse()
                    continue
                if r.status_code == 404:
                    state = "unknown after the fault (404)"
                    break
                d = r.json()
                state = d.get("state", "?")
                if state in TERMINAL:
                    if state != "finished":
                        state = f"{state}: {str(d.get('error'))[:80]}"
                    break
        finally:
            st.in_flight -= 1
        if state == "finished":
            st.finished += 1
        else:
            st.lost += 1
            st.lost_why[state] += 1
        # the same key once more: the same run (idempotency across the failover)
        with contextlib.suppress(httpx.HTTPError):
            r = await http.post("/v1/runs", json={"app": self.app,
                                                  "input": {"seed": i, "key": key}},
                                headers={"Idempotency-Key": key})
            if r.status_code in (200, 201) and r.json()["run_id"] != rid:
                st.client_dup += 1

    async def _agent(self, http: Any, i: int) -> None:
        """A header-less agent loop: each turn resends the conversation so far."""
        import httpx

        st = self.stats
        st.agent_loops += 1
        messages: list[dict[str, str]] = [
            {"role": "system", "content": f"You are agent {self.tag}-{i}. Solve step by step."},
            {"role": "user", "content": f"Task {i}: plan the next step."}]
        for turn in range(self.turns):
            answer = None
            for _ in range(400):
                try:
                    r = await http.post("/v1/chat/completions", json={
                        "model": MODEL, "messages": messages, "max_tokens": 24})
                except httpx.HTTPError:
                    st.refuse()
                    await asyncio.sleep(0.1)
                    continue
                if r.status_code == 200:
                    answer = r.json()["choices"][0]["message"]["content"]
                    break
                st.refuse()
                await asyncio.sleep(0.1)
            if answer is None:
                return
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": f"Observation {turn}: continue."}]
        st.agent_loops_done += 1

    async def _streams(self, http: Any, i: int) -> None:
        """Streamed chats, one after another, until the hosted runs are done."""
        import httpx

        st = self.stats
        n = 0
        while not self.stop.is_set():
            n += 1
            chunks, done, status = 0, False, None
            try:
                async with http.stream("POST", "/v1/chat/completions", json={
                        "model": MODEL, "stream": True, "max_tokens": 64,
                        "messages": [{"role": "user", "content": f"stream {i}.{n}"}]}) as r:
                    status = r.status_code
                    if status == 200:
                        st.streams += 1
                        async for line in r.aiter_lines():
                            if line == "data: [DONE]":
                                done = True
                            elif line.startswith("data: "):
                                chunks += 1
                                if '"error"' in line:
                                    st.streams_cut += 1
                                    st.cut_what[f"an error event after {_bucket(chunks)} "
                                                "chunks"] += 1
                                    done = True  # counted
                                    break
            except httpx.HTTPError as e:
                if status == 200:
                    st.streams_cut += 1
                    st.cut_what[f"{type(e).__name__} after {_bucket(chunks)} chunks"] += 1
                    continue
                st.refuse()
                await asyncio.sleep(0.1)
                continue
            if status != 200:
                st.refuse()
                await asyncio.sleep(0.1)
            elif not done:
                st.streams_cut += 1
                st.cut_what[f"the stream ended without [DONE] after {_bucket(chunks)} "
                            "chunks"] += 1
            await asyncio.sleep(0.25)  # a user reading the answer before the next one


def _bucket(n: int) -> str:
    return "0" if n == 0 else "some"


# ---------------------------------------------------------------------------------- scenarios
def _count_in(path: Path, pattern: str) -> int:
    try:
        return len(re.findall(pattern, path.read_text(errors="replace"), flags=re.M))
    except OSError:
        return 0


def _lease_losses(cl: Cluster) -> int:
    return sum(_count_in(g.log, r'^\{"event": "ha_deposed"') for g in cl.gateways)


def _store_duplicates(redis_url: str, tag: str) -> int:
    """Keys of this repeat with more than one run in the shared run store."""
    from hermes.gateway.run_store import RedisRunStore

    store = RedisRunStore(redis_url)
    try:
        per_key: Counter[str] = Counter()
        for d in store.runs():
            inp = d.get("input")
            if isinstance(inp, dict) and str(inp.get("key", "")).startswith(tag + "-"):
                per_key[inp["key"]] += 1
        return sum(1 for n in per_key.values() if n > 1)
    finally:
        store.close()


async def run_repeat(cl: Cluster, scenario: str, repeat: int, *, runs: int, app: str,
                     agents: int, turns: int, streams: int, min_inflight: int,
                     log: Any = None) -> dict[str, Any]:
    """One repeat of one scenario: load, fault when enough runs are in flight, recover."""
    tag = f"{scenario}-{repeat}-{int(time.time() * 1000) % 10**8}"
    load = Load(cl.url, tag, runs=runs, app=app, agents=agents, turns=turns, streams=streams)
    task = asyncio.create_task(load.run())
    st = load.stats
    deadline = time.monotonic() + 120
    while st.in_flight < min(min_inflight, runs) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        if task.done():
            break
    inflight_at_fault = st.in_flight
    old = await asyncio.to_thread(cl.wait_leader, 60.0)
    lost_before = _lease_losses(cl)
    stale_before = sum(_count_in(n.log, r"rejected a '[a-z_]+' message of stale epoch")
                       for n in cl.nodes)
    row: dict[str, Any] = {"scenario": scenario, "repeat": repeat, "failover_s": None,
                           "in_flight_at_fault": inflight_at_fault}
    t_fault = time.time()
    st.fault_window = (time.monotonic(), time.monotonic() + 3600)
    failover = scenario in ("scheduler-kill", "leader-pause")
    if scenario == "scheduler-kill":
        cl.gateways[old].signal(signal.SIGKILL)
    elif scenario == "edge-kill" and cl.n_edges:  # an edge process (split roles)
        victim = repeat % cl.n_edges
        cl.edges[victim].signal(signal.SIGKILL)
    elif scenario == "edge-kill":  # all-in-one: the standby's front end
        victim = next(i for i in range(len(cl.gateways)) if i != old)
        cl.gateways[victim].signal(signal.SIGKILL)
    elif scenario == "node-kill":
        cl.nodes[repeat % len(cl.nodes)].signal(signal.SIGKILL)
    elif scenario == "leader-pause":
        cl.gateways[old].signal(signal.SIGSTOP)
    if failover:
        new = await asyncio.to_thread(cl.wait_leader, 30.0, other_than=old)
        first = None
        for _ in range(400):
            d = cl.readyz(new) or {}
            first = d.get("first_dispatch_at")
            if first:
                break
            await asyncio.sleep(0.025)
        row["failover_s"] = round(first - t_fault, 3) if first else None
        d = cl.readyz(new) or {}
        row["new_epoch"] = d.get("epoch")
        for k, name in (("elected_at", "elected_s"), ("activated_at", "ready_s")):
            row[name] = round(d[k] - t_fault, 3) if d.get(k) else None  # failover's steps
    else:
        await asyncio.sleep(2.0)
    if scenario == "leader-pause":
        await asyncio.sleep(max(0.0, cl.ttl_s + 1.0 - (time.time() - t_fault)))
        paused = cl.gateways[old]
        paused.signal(signal.SIGCONT)
        try:
            assert paused.popen is not None
            code = await asyncio.to_thread(paused.popen.wait, 10)
        except subprocess.TimeoutExpired:
            code = None
        row["ex_leader_exit"] = code
        text = paused.log.read_text(errors="replace")
        events = [json.loads(m) for m in re.findall(r'^(\{"event": "ha_deposed".*\})$', text,
                                                    flags=re.M)]
        row["fenced_sends"] = events[-1]["fenced_sends"] if events else None
    st.fault_window = (st.fault_window[0], time.monotonic())
    # bring the killed process back (a standby, or the node) for the next repeat
    if scenario in ("scheduler-kill", "leader-pause"):
        cl.gateways[old].start()
        await asyncio.to_thread(cl.wait_standby, old)
    elif scenario == "edge-kill" and cl.n_edges:
        cl.edges[victim].start()
        await asyncio.to_thread(cl.wait_edge, victim)
    elif scenario == "edge-kill":
        cl.gateways[victim].start()
        await asyncio.to_thread(cl.wait_standby, victim)
    elif scenario == "node-kill":
        cl.nodes[repeat % len(cl.nodes)].start()
    await task
    await asyncio.to_thread(cl.wait_nodes, 60.0)
    stale = sum(_count_in(n.log, r"rejected a '[a-z_]+' message of stale epoch")
                for n in cl.nodes) - stale_before
    # leaders that lost their lease without being told to (a starved renewal thread on a
    # loaded machine): each is one more failover, restarted as a standby here
    unplanned = _lease_losses(cl) - lost_before - (1 if scenario == "leader-pause" else 0)
    row["unplanned_failovers"] = unplanned
    for i, g in enumerate(cl.gateways):
        if not g.alive():
            g.start()
            await asyncio.to_thread(cl.wait_standby, i)
    if scenario == "leader-pause":
        row["stale_rejected_by_nodes"] = stale
    if cl.n_edges:  # what the edges saw: calls sent again to a new leader, stale epochs
        import httpx

        seen = []
        for p in cl.edge_ports:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                seen.append(httpx.get(f"http://127.0.0.1:{p}/readyz", timeout=3.0).json())
        row["edge_calls_resent"] = sum(int(d.get("resent") or 0) for d in seen)
        row["edge_stale_rejected"] = sum(int(d.get("stale_rejected") or 0) for d in seen)
    row.update({
        "runs_accepted": st.accepted, "runs_lost": st.lost,
        "runs_duplicated": st.client_dup + _store_duplicates(cl.redis_url, tag),
        "lost_why": dict(st.lost_why),
        "requests_refused": st.refused_during_fault, "streams": st.streams,
        "streams_cut": st.streams_cut, "streams_cut_got": dict(st.cut_what),
        "agent_loops": st.agent_loops, "agent_loops_done": st.agent_loops_done,
    })
    if log is not None:
        print(json.dumps(row), file=log, flush=True)
    return row


async def run_ha(cl: Cluster, scenarios: list[str], repeats: int, **kw: Any) -> list[dict]:
    rows = []
    for scenario in scenarios:
        for rep in range(1, repeats + 1):
            rows.append(await run_repeat(cl, scenario, rep, **kw))
    return rows


# ---------------------------------------------------------------------------------- scale
async def _closed_loop(url: str, clients: int, seconds: float) -> int:
    import httpx

    done = 0
    stop_at = time.monotonic() + seconds
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as http:
        async def one() -> None:
            nonlocal done
            while time.monotonic() < stop_at:
                with contextlib.suppress(httpx.HTTPError):
                    r = await http.post("/v1/chat/completions", json=body)
                    if r.status_code == 200:
                        done += 1
        await asyncio.gather(*(one() for _ in range(clients)))
    return done


def _sched_cpu_s(cl: Cluster, i: int) -> float:
    import httpx

    h = httpx.get(f"http://127.0.0.1:{cl.http_ports[i]}/healthz", timeout=10.0).json()
    return float(h.get("scheduler_cpu_ns", 0)) / 1e9


def _cpu(procs: list[Proc]) -> list[float]:
    return [p.cpu_s() for p in procs]


def _measure(cl: Cluster, clients: int, seconds: float) -> dict[str, Any]:
    """A warm-up, then ``seconds`` of closed-loop chats through haproxy: requests done, wall
    time, and the CPU seconds each process spent meanwhile (/proc)."""
    asyncio.run(_closed_loop(cl.url, clients, 2.0))  # warm-up
    lead = cl.leader()
    assert lead is not None
    groups = {"gateways": cl.gateways, "edges": cl.edges, "nodes": cl.nodes}
    before = {k: _cpu(v) for k, v in groups.items()}
    s0 = _sched_cpu_s(cl, lead) if not cl.n_edges else 0.0
    t0 = time.monotonic()
    done = asyncio.run(_closed_loop(cl.url, clients, seconds))
    wall = time.monotonic() - t0
    cpu = {k: [a - b for a, b in zip(_cpu(v), before[k], strict=True)]
           for k, v in groups.items()}
    metered = _sched_cpu_s(cl, lead) - s0 if not cl.n_edges else 0.0
    return {"lead": lead, "done": done, "wall": wall, "cpu": cpu, "metered": metered}


def run_scale(workdir: Path, *, edges: list[int], clients: int, seconds: float,
              time_scale: float) -> list[dict[str, Any]]:
    """Closed-loop one-request chats (no Hermes headers) through haproxy: requests/s and CPU
    per request of each role, from each process's CPU time (/proc), in one invocation:

    - ``edges`` = 0: the baseline, all-in-one gateways (a leader doing the edge's and the
      scheduler's work, a standby); its scheduler share is the thread CPU of the scheduler's
      own work in the leader (``HERMES_ROLE_CPU=1``), the edge share the rest of the leader;
    - ``edges`` = N > 0: split roles, N ``--role edge`` processes behind haproxy, an active and
      a standby ``--role scheduler``: each role's figure is its processes' whole CPU time.
    """
    rows = []
    for n in [0, *edges]:
        cl = Cluster(workdir / f"scale-e{n}", time_scale=time_scale, n_gateways=2,
                     ha=True, n_edges=n,
                     gateway_env={"HERMES_ROLE_CPU": "1"} if n == 0 else {})
        try:
            cl.start()
            m = _measure(cl, clients, seconds)
            lead, per = m["lead"], max(m["done"], 1)
            gw = m["cpu"]["gateways"]
            standby = sum(c for i, c in enumerate(gw) if i != lead)
            sched = m["metered"] if n == 0 else gw[lead]
            edge = gw[lead] - m["metered"] if n == 0 else sum(m["cpu"]["edges"])
            rows.append({
                "edges": n, "roles": "all-in-one" if n == 0 else "split",
                "requests": m["done"], "req_per_s": round(m["done"] / m["wall"], 1),
                "scheduler_cpu_ms_per_req": round(1000 * sched / per, 3),
                "edge_cpu_ms_per_req": round(1000 * edge / per, 3),
                "per_edge_cpu_ms_per_req": ([round(1000 * c / per, 3) for c in m["cpu"]["edges"]]
                                            if n else None),
                "leader_cpu_ms_per_req": round(1000 * gw[lead] / per, 3),
                "standby_cpu_ms_per_req": round(1000 * standby / per, 3),
                "node_cpu_ms_per_req": round(1000 * sum(m["cpu"]["nodes"]) / per, 3),
            })
        finally:
            cl.stop()
    return rows


#: synthetic inferred runs interleaved: a run's next call comes this many calls after its last
#: (an agent's turns are sequential: its previous call has been answered)
SYN_RUNS_APART = 200


def _syn_turn(n: int, turns: int) -> tuple[int, int]:
    """(run, turn) of the ``n``-th synthetic call (from 1) in inferred runs of ``turns``."""
    block, i = divmod(n - 1, SYN_RUNS_APART * turns)
    turn, k = divmod(i, SYN_RUNS_APART)
    return block * SYN_RUNS_APART + k, turn


def _agent_body(kb: float) -> dict[str, Any]:
    """A chat body of about ``kb`` KB as an agent's late turn sends it: a system prompt, then
    user / assistant turns (``kb`` 0: one short message)."""
    if kb <= 0:
        return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent. " * 8}]
    i = 0
    while len(json.dumps(msgs)) < kb * 1024:
        msgs.append({"role": "user" if i % 2 == 0 else "assistant",
                     "content": f"Step {i}: " + "the tool returned these lines of output. " * 12})
        i += 1
    return {"messages": msgs, "max_tokens": 64}


def run_scheduler_rate(workdir: Path, *, rates: list[int], seconds: float,
                       inferred_turns: int = 0, body_kb: float = 0.0,
                       body_wire: str = "json", shared_store: bool = False) -> list[dict]:
    """The active scheduler alone, driven at fixed rates of header-less calls by a synthetic
    edge and a synthetic node in this process (both plain ZeroMQ sockets speaking the real
    wire: the edge sends calls, each carrying the ones answered since its last message; the
    node takes the submits). What the scheduler process spends per call at rates the
    loopback HTTP path cannot reach on a small machine: how its fixed costs (lease, sweeps,
    heartbeats) amortize, and where it saturates.

    ``inferred_turns`` > 0: the calls are those of inferred runs of that many calls each, as
    an edge's run resolver sends them (``inferred``; the scheduler creates the run on its
    first call), the node sends the scheduler each call's counts (``done``), and the edge
    closes every completed run in one ``closed`` message every 0.5 s; otherwise the fast
    path (one-request calls, settled by the edge).

    ``body_kb``: each call carries an agent-like body of about that many KB; ``body_wire``
    ``json``: as edges send it (``body_json``: encoded once at the edge, forwarded by the
    scheduler as it came), ``object``: as a msgpack object (the wire before that: decoded
    and re-encoded by the scheduler). ``shared_store``: the scheduler runs with ``[cluster]
    store`` (Redis), as a deployment of several edges does for its inferred runs (the edges'
    shared evidence index, which the scheduler updates as it ends runs)."""
    import zmq

    from hermes import protocol as P
    from hermes.gateway.edge import wire

    cl = Cluster(workdir / "rate", n_gateways=1, n_nodes=0, ha=True, edge_socket=True,
                 shared_store=shared_store)
    rows: list[dict] = []
    ctx = zmq.Context()
    try:
        edge_port = free_port()
        cl.start()
        import redis

        rec = json.loads(redis.Redis.from_url(cl.redis_url).get("hermes:ha:leader") or "{}")
        node = ctx.socket(zmq.DEALER)
        node.setsockopt(zmq.IDENTITY, b"synthetic-node")
        node.connect(rec["nodes_address"])
        node.send(P.encode(P.Hello(node="synthetic-node", engines=[P.EngineInfo(
            name="e0", model=MODEL, kind="sim", max_inflight=100_000)])))
        edge = ctx.socket(zmq.DEALER)
        edge.connect(rec["edge_address"])
        reply_to = f"tcp://127.0.0.1:{edge_port}"
        body = _agent_body(body_kb)
        e = wire.encode_body(body)
        enc: dict[str, Any] = ({"body": body} if body_wire == "object" else
                               {"body": {}, "body_json": e.json, "prefix": e.prefix,
                                "max_tokens": e.max_tokens})
        time.sleep(1.0)
        lead = cl.gateways[0]
        n = 0
        turns = inferred_turns
        for rate in rates:
            taken: list[str] = []
            completed: list[wire.ClosedRun] = []
            last_close = time.monotonic()
            dispatched = 0
            tick = 0.002
            per_tick = rate * tick
            owed = 0.0
            sent = 0
            last_hb = 0.0
            c0 = lead.cpu_s()
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                owed += per_tick
                while owed >= 1:
                    owed -= 1
                    settled = [wire.Settled(r, "synthetic-node", "e0", 0.0, 0.001)
                               for r in taken]
                    taken = []
                    n += 1
                    if turns:
                        k, turn = _syn_turn(n, turns)
                        call = wire.Call(rid=f"r{n}", reply_to=reply_to, model=MODEL,
                                         endpoint="chat", **enc, prompt_tokens=1,
                                         run=f"run-syn{k}", app="default.syn",
                                         unit=f"step{turn % 2}", inferred=True, new=turn == 0)
                    else:
                        call = wire.Call(rid=f"r{n}", reply_to=reply_to, model=MODEL,
                                         endpoint="chat", **enc, prompt_tokens=1,
                                         settled=settled)
                    edge.send(wire.encode(call))
                    sent += 1
                while node.poll(0):
                    msg = P.decode(node.recv())
                    if isinstance(msg, P.Submit):
                        dispatched += 1
                        if not turns:
                            taken.append(msg.request_id)
                            continue
                        node.send(P.encode(P.Done(
                            request_id=msg.request_id, input_tokens=1, output_tokens=4,
                            text="", engine="e0", queue_s=0.0, service_s=0.001)))
                        k, turn = _syn_turn(int(msg.request_id[1:]), turns)
                        if turn == turns - 1:
                            completed.append(wire.ClosedRun(msg.run_id, 0.0))
                now = time.monotonic()
                if completed and now - last_close > 0.5:
                    last_close = now
                    edge.send(wire.encode(wire.Closed(runs=completed)))
                    completed = []
                if now - last_hb > 0.5:
                    last_hb = now
                    node.send(P.encode(P.Heartbeat(node="synthetic-node", engines={
                        "e0": P.EngineLoad(queued=0, inflight=0)}, time=time.time())))
                time.sleep(max(0.0, t0 + (sent / rate) - time.monotonic()) if sent else tick)
            wall = time.monotonic() - t0
            cpu = lead.cpu_s() - c0
            rows.append({"edges": "synthetic", "roles": "scheduler alone",
                         "calls": f"inferred runs of {turns}" if turns else "fast path",
                         "body_kb": round(len(json.dumps(body)) / 1024, 1),
                         "body_wire": body_wire, "shared_store": shared_store,
                         "offered_req_per_s": rate, "req_per_s": round(sent / wall, 1),
                         "dispatched_per_s": round(dispatched / wall, 1),
                         "scheduler_cpu_ms_per_req": round(1000 * cpu / max(sent, 1), 3),
                         "scheduler_cpu_share": round(cpu / wall, 3)})
        node.close(0)
        edge.close(0)
    finally:
        cl.stop()
        ctx.term()
    return rows


# ---------------------------------------------------------------------------------- CLI
def _table(rows: list[dict[str, Any]]) -> str:
    cols = ["scenario", "repeat", "in_flight_at_fault", "runs_accepted", "runs_lost",
            "runs_duplicated", "failover_s", "requests_refused", "streams", "streams_cut",
            "agent_loops_done"]
    out = ["  ".join(f"{c:>14}" if i else f"{c:<15}" for i, c in enumerate(cols))]
    for r in rows:
        out.append("  ".join(f"{str(r.get(c)):>14}" if i else f"{str(r.get(c)):<15}"
                             for i, c in enumerate(cols)))
    return "\n".join(out)


def summary(rows: list[dict[str, Any]]) -> str:
    import statistics

    lines = []
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        rs = [r for r in rows if r["scenario"] == sc]
        fo = [r["failover_s"] for r in rs if r["failover_s"] is not None]
        cut: Counter[str] = Counter()
        for r in rs:
            cut.update(r.get("streams_cut_got", {}))
        line = (f"{sc}: accepted {sum(r['runs_accepted'] for r in rs)}, lost "
                f"{sum(r['runs_lost'] for r in rs)}, duplicated "
                f"{sum(r['runs_duplicated'] for r in rs)}, refused during the fault "
                f"{sum(r['requests_refused'] for r in rs)}, streams cut "
                f"{sum(r['streams_cut'] for r in rs)} ({dict(cut) or 'none'})")
        if fo:
            line += f"; failover p50 {statistics.median(fo):.2f} s, max {max(fo):.2f} s"
        if sc == "leader-pause":
            line += (f"; ex-leader exits {[r.get('ex_leader_exit') for r in rs]}, fenced sends "
                     f"{[r.get('fenced_sends') for r in rs]}, stale epochs rejected by nodes "
                     f"{[r.get('stale_rejected_by_nodes') for r in rs]}")
        lines.append(line)
    return "\n".join(lines)


def cmd_ha(args: Any) -> int:
    import tempfile

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hermes-bench-ha-"))
    if args.scale:
        rows = run_scale(workdir, edges=[1, 2], clients=args.clients, seconds=args.seconds,
                         time_scale=args.time_scale)
        wires = ["json", "object"] if args.body_kb > 0 else ["json"]
        for w in wires:
            rows += run_scheduler_rate(workdir / f"fast-{w}", rates=args.rates,
                                       seconds=min(args.seconds, 5.0), body_kb=args.body_kb,
                                       body_wire=w)
        if args.inferred_turns:
            for w in wires:
                rows += run_scheduler_rate(workdir / f"inferred-{w}", rates=args.rates,
                                           seconds=min(args.seconds, 5.0),
                                           inferred_turns=args.inferred_turns,
                                           body_kb=args.body_kb, body_wire=w,
                                           shared_store=True)
        for r in rows:
            print(json.dumps(r))
        print("(edges 0: the all-in-one baseline, its scheduler share metered inside the "
              "leader; edges 1, 2: --role edge processes and an active --role scheduler, "
              "each role's whole process CPU; synthetic: the scheduler alone at fixed rates, "
              "driven by a synthetic edge and node speaking the real wire)")
    else:
        scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
        bad = [s for s in scenarios if s not in SCENARIOS]
        if bad:
            print(f"hermes bench ha: unknown scenario(s) {bad}; known: {', '.join(SCENARIOS)}",
                  file=sys.stderr)
            return 2
        # the schedulers share one knowledge base, as deployed (deploy/, docs/ha.md): the
        # new leader serves the apps' learned graphs and the operator's names
        cl = Cluster(workdir, time_scale=args.time_scale, ttl_s=args.lease_ttl,
                     n_edges=args.edges, shared_kb=True)
        try:
            cl.start()
            rows = asyncio.run(run_ha(cl, scenarios, args.repeats, runs=args.runs,
                                      app=args.app, agents=args.agents, turns=args.turns,
                                      streams=args.streams, min_inflight=args.min_inflight,
                                      log=sys.stderr if args.verbose else None))
        finally:
            cl.stop()
        print(_table(rows))
        print(summary(rows))
    print(f"(logs in {workdir}; loopback, machine shared with other work)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def add_ha_parser(bsub: Any) -> None:
    from hermes.argtypes import positive_float, positive_int

    s = bsub.add_parser("ha", help="faults under load on a highly available deployment "
                        "(haproxy, 2 gateways elected by a lease in Redis, 2 HermesLets)")
    s.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help=f"comma-separated, of {', '.join(SCENARIOS)} (default: all)")
    s.add_argument("--repeats", type=positive_int, default=3)
    s.add_argument("--runs", type=positive_int, default=260,
                   help="hosted runs per repeat (default 260)")
    s.add_argument("--min-inflight", dest="min_inflight", type=positive_int, default=200,
                   help="hosted runs in flight when the fault strikes (default 200)")
    s.add_argument("--app", default="llm_reasoning", help="hosted app (default llm_reasoning)")
    s.add_argument("--agents", type=positive_int, default=8, help="header-less agent loops")
    s.add_argument("--turns", type=positive_int, default=6, help="turns per agent loop")
    s.add_argument("--streams", type=positive_int, default=6,
                   help="concurrent streamed chats, one after another")
    s.add_argument("--time-scale", dest="time_scale", type=positive_float, default=3.0)
    s.add_argument("--lease-ttl", dest="lease_ttl", type=positive_float, default=1.0,
                   help="the scheduler lease's time to live, s (default 1.0)")
    s.add_argument("--edges", type=int, default=2, choices=range(0, 9), metavar="N",
                   help="split roles: N `--role edge` processes behind haproxy in front of "
                   "an active and a standby `--role scheduler` (default 2); 0: all-in-one "
                   "gateways (edge-kill then kills the standby's front end)")
    s.add_argument("--scale", action="store_true",
                   help="instead: requests/s and CPU per request of each role: the all-in-one "
                   "baseline, 1 and 2 edges, the scheduler alone at fixed rates")
    s.add_argument("--clients", type=positive_int, default=32, help="--scale: clients")
    s.add_argument("--seconds", type=positive_float, default=10.0, help="--scale: duration")
    s.add_argument("--rates", type=lambda v: [positive_int(x) for x in v.split(",")],
                   default=[1000, 2500, 5000], metavar="R,R,...",
                   help="--scale: rates (calls/s) the scheduler alone is driven at by a "
                   "synthetic edge and node (default 1000,2500,5000)")
    s.add_argument("--inferred-turns", dest="inferred_turns", type=int, default=4,
                   metavar="T", help="--scale: the scheduler alone is also driven with the "
                   "calls of inferred runs of T calls each, as edges' run resolvers send "
                   "them (0: not)")
    s.add_argument("--body-kb", dest="body_kb", type=float, default=0.0, metavar="KB",
                   help="--scale: the scheduler alone gets calls with an agent-like body of "
                   "about KB kilobytes, each rate run twice: the body as edges send it "
                   "(JSON text the scheduler forwards) and as a msgpack object (decoded and "
                   "re-encoded there, the wire before); 0 (default): a one-line body")
    s.add_argument("--workdir", default=None, help="logs and state (default: a temp dir)")
    s.add_argument("--json", default=None, help="write the rows as a JSON list to FILE")
    s.add_argument("--verbose", action="store_true", help="print each row as it ends")
    s.set_defaults(func=cmd_ha)

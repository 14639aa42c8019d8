"""Split roles in one test process: a real Redis (the lease record, the durable run state),
one ``--role scheduler`` gateway and ``--role edge`` gateways (uvicorn on loopback ports, as
``hermes serve`` runs them, each on its own event loop in a thread), and a HermesLet with
the built-in engine on its own loop: every hop is a real socket (HTTP, ZeroMQ TCP, Redis).

:func:`start_split` returns a :class:`Split`; :meth:`Split.edge` starts (another) edge;
:meth:`Split.stop` stops everything it started."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from threaded_node import ThreadedNode

from hermes.gateway.config import load_config
from hermes.gateway.server import BackgroundServer, gateway_state, start_background
from hermes.procs import free_port

MODEL = "llama-2-7b"
EMBED_MODEL = "sim-embed"
SCALE = 50.0


class _Node(ThreadedNode):
    def make(self, address: str) -> Any:
        from hermeslet.agent import HermesLet
        from hermeslet.engines.sim_engine import SimEngine

        # the all-in-one gateway's embedded default: the model, and an embedding model
        return HermesLet("n0", address, [
            SimEngine(name="sim", model=MODEL, time_scale=SCALE),
            SimEngine(name="embed0", model=EMBED_MODEL, time_scale=SCALE, task="embed")],
            heartbeat_s=0.1)


def wait_for(pred: Any, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@dataclass
class Split:
    tmp: Path
    redis: str
    common: dict[str, Any]
    scheduler: BackgroundServer
    node: _Node
    edges: list[BackgroundServer] = field(default_factory=list)

    def edge(self, name: str = "edge0", **overrides: Any) -> BackgroundServer:
        """Start an edge (its own state directory ``TMP/NAME``) and wait until it is ready."""
        opts = {**self.common, "role": "edge", "bind": f"tcp://127.0.0.1:{free_port()}",
                "state_dir": str(self.tmp / name), "kb": str(self.tmp / name / "kb"),
                "member": name, **overrides}
        srv = start_background(load_config(None, environ={}, **opts))
        self.edges.append(srv)
        wait_for(lambda: httpx.get(srv.url + "/readyz").status_code == 200, what="edge ready")
        return srv

    @property
    def scheduler_state(self) -> Any:
        """The scheduler gateway's app state (``scheduler``, ``edge_link``)."""
        return gateway_state(self.scheduler)

    @property
    def sched(self) -> Any:
        """The scheduler's :class:`~hermes.gateway.scheduler.LiveScheduler`."""
        return self.scheduler_state.scheduler

    def stop(self) -> None:
        for e in self.edges:
            e.stop()
        self.node.stop()
        self.scheduler.stop()


def start_split(tmp: Path, redis: str, **overrides: Any) -> Split:
    """A scheduler with a node, ready for edges (``overrides``: config for every process)."""
    common: dict[str, Any] = {"port": 0, "time_scale": SCALE, "log_level": "warning",
                              "election": redis, "rekey_interval_s": 0.1,
                              "lease_ttl_s": 1.0, "lease_renew_s": 0.2, **overrides}
    zport = free_port()
    cfg = load_config(None, environ={"HERMES_EMBEDDED_NODE": "false"},
                      **{**common, "role": "scheduler", "state_redis": redis,
                         "port": free_port(),  # advertised in the lease record (proxying)
                         "bind": f"tcp://127.0.0.1:{zport}",
                         "edge_bind": f"tcp://127.0.0.1:{free_port()}",
                         "state_dir": str(tmp / "sched"), "kb": str(tmp / "sched" / "kb"),
                         "member": "sched0", "recovery_grace_s": 1.0})
    sched = start_background(cfg)
    node = _Node(f"tcp://127.0.0.1:{zport}")
    split = Split(tmp, redis, common, sched, node)
    wait_for(lambda: httpx.get(sched.url + "/healthz").json().get("nodes"), what="node")
    return split


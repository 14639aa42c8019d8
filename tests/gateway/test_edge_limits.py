"""Tenant limits at edges are exact or refused, never silently per edge.

An edge (``hermes serve --role edge``) without ``[cluster] store`` would enforce tenant
admission limits from its own memory: N edges behind a load balancer admit N times each
limit. It refuses to start so, naming the settings and the fix, unless ``[cluster]
per_edge_limits = true`` says the operator accepts it (then a WARNING at start and
``hermes_edge_per_instance_limits 1`` on the edge's own ``/metrics``). With the shared store
the limits hold over the edges together. The all-in-one process and the scheduler role are
one process: they start with limits and no store, as before. API keys from a file: a key
revoked in the file an edge reads is refused there at the next request; an edge reading its
own copy admits it until that copy changes (the start warning says so).

Real parts in one test process (``edge_inproc``): Redis (the lease, the durable runs, the
shared store), a ``--role scheduler`` gateway, a HermesLet with the built-in engine, edges
on loopback ports; and ``hermes serve --role edge`` as a command for the refusal's text."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from edge_inproc import MODEL, Split
from gw_redis import redis_url  # noqa: F401  (fixture)
from prometheus_client.parser import text_string_to_metric_families

from hermes.gateway.config import ConfigError
from hermes.gateway.keys import FileKeyStore
from hermes.gateway.server import BackgroundServer
from hermes.procs import free_port

pytestmark = pytest.mark.timeout(120)

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
#: the fast path (no run inferred): one call, one admission
FAST = {"X-Hermes-Run": "none", "X-Hermes-Tenant": "acme"}


def _admitted(edges: list[BackgroundServer], n: int,
              headers: dict[str, str] = FAST) -> list[int]:
    """Statuses of ``n`` chat completions sent round robin over ``edges``."""
    return [httpx.post(f"{edges[i % len(edges)].url}/v1/chat/completions", json=CHAT,
                       headers=headers, timeout=30).status_code for i in range(n)]


def _gauge(edge: BackgroundServer, name: str, headers: dict[str, str] | None = None) -> float:
    text = httpx.get(edge.url + "/metrics", headers=headers or {}, timeout=10).text
    return next(s.value for fam in text_string_to_metric_families(text)
                for s in fam.samples if s.name == name)


def test_an_edge_refuses_per_instance_limits_naming_the_setting_and_the_fix(
        split: Callable[..., Split], make_gateway: Callable[..., BackgroundServer],
        tmp_path: Path) -> None:
    # the scheduler role starts with limits and no shared store (one process: exact)
    sp = split(tenant_rpm=5)
    with pytest.raises(ConfigError) as e:
        sp.edge("edge0")
    msg = str(e.value)
    assert "security.tenant_rpm = 5" in msg and "N times" in msg
    assert "[cluster] store" in msg and "HERMES_CLUSTER__STORE" in msg
    assert "per_edge_limits = true" in msg and "HERMES_CLUSTER__PER_EDGE_LIMITS" in msg
    # a tenant's limits in the key store count too (the auth file's "tenants")
    auth = tmp_path / "auth.json"
    keys = FileKeyStore(auth)
    key = keys.create("acme")
    keys.set_limits("acme", {"max_concurrent": 4, "max_active_runs": 2})
    with pytest.raises(ConfigError, match=rf"tenant 'acme' \(max_concurrent\) in the auth file "
                                          rf"{auth}"):
        sp.edge("edge0", tenant_rpm=0, auth_file=str(auth))
    # max_active_runs alone is the scheduler's (it counts the runs): nothing per edge
    keys.set_limits("acme", {"max_active_runs": 2})
    edge = sp.edge("edge0", tenant_rpm=0, auth_file=str(auth))
    assert _admitted([edge], 1, {"Authorization": f"Bearer {key}", **FAST}) == [200]
    # an edge without limits and without a shared store starts, and says it enforces none
    assert _gauge(sp.edge("edge1", tenant_rpm=0), "hermes_edge_per_instance_limits") == 0
    # the all-in-one process with limits and no store starts and enforces them, as before
    aio = make_gateway(tenant_rpm=2)
    assert _admitted([aio], 3) == [200, 200, 429]


def test_the_command_refuses_such_an_edge_in_one_line() -> None:
    env = {**os.environ, "HERMES_SECURITY__TENANT_RATE": "10"}
    env.pop("HERMES_CLUSTER__STORE", None)
    r = subprocess.run(
        [sys.executable, "-m", "hermes.cli", "serve", "--role", "edge", "--port", "0",
         "--ha", f"redis://127.0.0.1:{free_port()}/0", "--bind",
         f"tcp://127.0.0.1:{free_port()}"], env=env, capture_output=True, text=True,
        timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("hermes: error: an edge (--role edge) without a shared store")
    assert "security.tenant_rate = 10" in r.stderr and "per_edge_limits" in r.stderr
    assert "Traceback" not in r.stderr


def test_per_edge_limits_opt_in_starts_warns_and_says_so_in_a_metric(
        split: Callable[..., Split], caplog: pytest.LogCaptureFixture) -> None:
    sp = split(tenant_rpm=3)
    with caplog.at_level(logging.WARNING, logger="hermes.gateway.edge"):
        edges = [sp.edge(f"edge{i}", per_edge_limits=True) for i in range(2)]
    warned = [r.getMessage() for r in caplog.records if "PER EDGE" in r.getMessage()]
    assert len(warned) == 2 and "security.tenant_rpm = 3" in warned[0], warned
    assert "N times" in warned[0]
    assert all(_gauge(e, "hermes_edge_per_instance_limits") == 1 for e in edges)
    # what the operator accepted: each edge counts alone, 2 edges admit 2 x 3
    codes = _admitted(edges, 10)
    assert codes.count(200) == 6 and codes.count(429) == 4, codes


def test_with_the_shared_store_limits_hold_over_the_edges_together(
        split: Callable[..., Split], redis_url: str) -> None:  # noqa: F811
    sp = split(tenant_rpm=3, cluster={"store": redis_url})
    edges = [sp.edge(f"edge{i}") for i in range(2)]
    codes = _admitted(edges, 10)
    assert codes.count(200) == 3 and codes.count(429) == 7, codes
    # the edge's own /metrics: its limits are not its own; the store's health is there too
    assert _gauge(edges[0], "hermes_edge_per_instance_limits") == 0
    assert _gauge(edges[1], "hermes_shared_store_up") == 1


def _acme_key(tmp_path: Path) -> tuple[Path, FileKeyStore, dict[str, str]]:
    """An auth file with one key of tenant ``acme``: the file, its store, and the headers of
    a one-request call with that key."""
    auth = tmp_path / "auth.json"
    keys = FileKeyStore(auth)
    key = keys.create("acme")
    return auth, keys, {"Authorization": f"Bearer {key}", "X-Hermes-Run": "none"}


def test_limits_that_appear_in_the_key_store_while_an_edge_serves_are_an_error(
        split: Callable[..., Split], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    auth, keys, who = _acme_key(tmp_path)
    sp = split(auth_file=str(auth), metrics_token="mtok")
    edge = sp.edge("edge0")
    scrape = {"Authorization": "Bearer mtok"}
    assert httpx.get(edge.url + "/metrics", timeout=10).status_code == 401  # its token
    assert _gauge(edge, "hermes_edge_per_instance_limits", scrape) == 0
    keys.set_limits("acme", {"rpm": 50})
    with caplog.at_level(logging.ERROR, logger="hermes.gateway.auth"):
        assert _admitted([edge], 1, who) == [200]  # the limits are re-read at a request
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("tenant 'acme' (rpm)" in m and "[cluster] store" in m for m in errors), errors
    assert _gauge(edge, "hermes_edge_per_instance_limits", scrape) == 1


def test_a_key_revoked_in_the_file_an_edge_reads_is_refused_at_once_a_copy_is_not(
        split: Callable[..., Split], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    auth, keys, who = _acme_key(tmp_path)
    key = who["Authorization"].removeprefix("Bearer ")
    copy = tmp_path / "copy.json"
    shutil.copy(auth, copy)
    sp = split(auth_file=str(auth))
    with caplog.at_level(logging.WARNING, logger="hermes.gateway.edge"):
        same = sp.edge("edge0")
        own = sp.edge("edge1", auth_file=str(copy))
    assert any("only by the edges that read that same file" in r.getMessage()
               for r in caplog.records)
    assert _admitted([same, own], 2, who) == [200, 200]
    assert keys.revoke(key[3:].split(".")[0])
    assert _admitted([same], 1, who) == [401]  # the next request (the file is re-read)
    assert _admitted([own], 1, who) == [200]  # its copy still holds the key

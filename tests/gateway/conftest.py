"""Gateway fixtures: a real gateway (uvicorn on a free loopback port, embedded HermesLet with
the built-in simulated engine), time-scaled so that tests are quick."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_client
from edge_inproc import Split, start_split

from hermes.gateway.config import load_config
from hermes.gateway.server import BackgroundServer, start_background


@pytest.fixture
def make_gateway(tmp_path: Path) -> Iterator[Callable[..., BackgroundServer]]:
    """Start gateways with overrides; each gets its own knowledge base and state directory."""
    started: list[BackgroundServer] = []

    def start(**overrides: Any) -> BackgroundServer:
        n = len(started)
        opts: dict[str, Any] = {
            "port": 0,
            "bind": "",  # no TCP ROUTER: the embedded node connects over inproc
            "kb": str(tmp_path / f"kb{n}"),
            "state_dir": str(tmp_path / f"state{n}"),
            "time_scale": 50.0,
            "log_level": "warning",
            "rekey_interval_s": 0.1,
        }
        opts.update(overrides)
        srv = start_background(load_config(None, environ={}, **opts))
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture
def gateway(make_gateway: Callable[..., BackgroundServer]) -> BackgroundServer:
    return make_gateway()


@pytest.fixture
def split(tmp_path: Path, redis_url: str) -> Iterator[Callable[..., Split]]:
    """Start split clusters (:func:`start_split`) on a flushed Redis; all stopped after the
    test. The module needs the ``redis_url`` fixture (``gw_redis``)."""
    made: list[Split] = []

    def start(**overrides: Any) -> Split:
        redis_client.Redis.from_url(redis_url).flushdb()  # nothing of another test's cluster
        s = start_split(tmp_path, redis_url, **overrides)
        made.append(s)
        return s

    yield start
    for s in made:
        s.stop()

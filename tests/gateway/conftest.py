"""Gateway fixtures: a real gateway (uvicorn on a free loopback port, embedded HermesLet with
the built-in simulated engine), time-scaled so that tests are quick."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

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

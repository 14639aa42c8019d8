"""Fixtures of the compatibility matrix: real client libraries against a real gateway, on both
paths a request can take to an engine.

- ``embedded``: ``hermes serve``'s default, the built-in engine in the gateway's process
  (chunks and answers made by :mod:`hermeslet.engines.sim_output`);
- ``http``: the gateway's embedded HermesLet driving ``openai``-kind engines, which are
  separate ``hermeslet sim-engine`` processes over HTTP, so that what the client receives is
  what an upstream server streamed, passed through by the adapter, the node and the gateway.

Both serve the chat model ``llama-2-7b`` and the embedding model ``sim-embed``. The gateways
live for the session (one each); every test gets its run from its own requests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from hermes.gateway.config import load_config
from hermes.gateway.server import BackgroundServer, start_background
from hermes.procs import free_port, stop_group
from tests.compat.venvs import NO_TELEMETRY

CHAT_MODEL = "llama-2-7b"
EMBED_MODEL = "sim-embed"
TIME_SCALE = 50.0
PATHS = ("embedded", "http")


def start_sim_engine(*extra: str) -> tuple[subprocess.Popen, str]:
    """A ``hermeslet sim-engine`` process on a free loopback port, once healthy: (proc, URL)."""
    port = free_port()
    cmd = [sys.executable, "-m", "hermeslet.cli", "sim-engine", "--port", str(port),
           "--time-scale", str(TIME_SCALE), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sim-engine exited: {proc.stderr.read().decode()}")
        try:
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    stop_group(proc, grace_s=2)
    raise RuntimeError("sim-engine did not become healthy")


@dataclass
class Upstreams:
    chat: str
    embed: str


@pytest.fixture(scope="session")
def upstreams() -> Iterator[Upstreams]:
    """The two engine servers of the ``http`` path (chat and embeddings)."""
    chat, chat_url = start_sim_engine("--model", CHAT_MODEL)
    try:
        embed, embed_url = start_sim_engine("--model", EMBED_MODEL, "--task", "embed")
    except Exception:
        stop_group(chat, grace_s=2)
        raise
    yield Upstreams(chat_url, embed_url)
    stop_group(chat, grace_s=5)
    stop_group(embed, grace_s=5)


def _gateway(tmp: str, **overrides: object) -> BackgroundServer:
    return start_background(load_config(
        None, environ={}, port=0, bind="", kb=f"{tmp}/kb", state_dir=f"{tmp}/state",
        time_scale=TIME_SCALE, log_level="warning", **overrides))


@pytest.fixture(scope="session")
def embedded_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    """``hermes serve`` on its embedded defaults (the built-in chat and embedding engines)."""
    srv = _gateway(str(tmp_path_factory.mktemp("gw-embedded")))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def http_gateway(tmp_path_factory: pytest.TempPathFactory,
                 upstreams: Upstreams) -> Iterator[BackgroundServer]:
    """A gateway whose embedded HermesLet drives ``openai``-kind engines over HTTP."""
    engines = [
        {"name": "up-chat", "kind": "openai", "url": upstreams.chat, "model": CHAT_MODEL},
        {"name": "up-embed", "kind": "openai", "url": upstreams.embed, "model": EMBED_MODEL,
         "task": "embed"},
    ]
    srv = _gateway(str(tmp_path_factory.mktemp("gw-http")), engines=engines)
    yield srv
    srv.stop()


@pytest.fixture(params=PATHS)
def base_url(request: pytest.FixtureRequest) -> str:
    """The gateway's OpenAI base URL (``.../v1``), once per path."""
    srv = request.getfixturevalue(f"{request.param}_gateway")
    return srv.url + "/v1"


@pytest.fixture(scope="module", autouse=True)
def no_telemetry() -> Iterator[None]:
    """Telemetry off for the frameworks imported in this process (LangSmith, smolagents' and
    others' OpenTelemetry, Hugging Face): nothing may leave loopback. Module scope: the
    variables are put back after each compat module (a session-wide OTEL_SDK_DISABLED turned
    the gateway's own tracing off in every later test of the session)."""
    saved = {k: os.environ.get(k) for k in NO_TELEMETRY}
    os.environ.update(NO_TELEMETRY)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v

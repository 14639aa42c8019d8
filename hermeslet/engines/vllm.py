"""vLLM engine: launch and supervise ``python -m vllm.entrypoints.openai.api_server``, or attach.

Launched servers bind 127.0.0.1 and run with ``--enable-prefix-caching`` and
``--scheduling-policy priority`` (so the HermesLet passes ``priority``), plus ``--enable-lora
--max-loras N`` when asked, and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` so adapters can be
loaded at run time. The supervisor waits for ``/health`` and restarts a crashed server with
exponential backoff. ``python`` defaults to ``$HERMES_VLLM_PYTHON`` (vLLM usually lives in its
own venv, see PLATFORM.md) or the current interpreter. The ``vllm`` console script is not used:
it fails on a metadata lookup in the CPU packaging.

With ``kv_events`` (issue 19) the server publishes vLLM's KV-cache events
(``--kv-events-config``: ZeroMQ PUB on a local ``ipc://`` socket, or the endpoint given) and
runs with ``--block-size kv_block_size``, so that the node can follow its prefix cache
(:mod:`hermeslet.kv_events`) and the gateway hash prompts' blocks as it does; the block hashes'
seed is ``PYTHONHASHSEED`` of the server's environment when set, else vLLM's fixed default.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import AsyncGenerator
from typing import Any
from urllib.parse import urlparse

from hermes.core.kv_blocks import DEFAULT_BLOCK_SIZE, DEFAULT_NONE_HASH_SEED
from hermes.procs import free_port
from hermeslet.engines.base import EngineError, GenChunk, GenResult, KVEventsSource
from hermeslet.engines.openai_http import HTTP_ERRORS, OpenAIHTTPEngine


def vllm_argv(
    python: str,
    model: str,
    port: int,
    *,
    served_model_name: str | None = None,
    enable_lora: bool = False,
    max_loras: int = 4,
    max_lora_rank: int | None = None,
    extra_args: list[str] | None = None,
    kv_events_endpoint: str | None = None,
    kv_block_size: int = DEFAULT_BLOCK_SIZE,
) -> list[str]:
    """The command line of a supervised vLLM OpenAI server (``kv_events_endpoint``: publish
    KV events there, vLLM binding it: an ``ipc://`` path or a ``tcp://*:PORT`` wildcard)."""
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--enable-prefix-caching",
        "--scheduling-policy", "priority",
    ]  # fmt: skip
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    if enable_lora:
        argv += ["--enable-lora", "--max-loras", str(max_loras)]
        if max_lora_rank:
            argv += ["--max-lora-rank", str(max_lora_rank)]
    if kv_events_endpoint is not None:
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
               "endpoint": kv_events_endpoint}
        argv += ["--kv-events-config", json.dumps(cfg, separators=(",", ":")),
                 "--block-size", str(kv_block_size)]
    return argv + list(extra_args or [])


class VLLMEngine(OpenAIHTTPEngine):
    """A vLLM server: supervised (``url`` None) or attached (``url`` given)."""

    kind = "vllm"

    def __init__(
        self,
        url: str | None = None,
        *,
        name: str = "vllm",
        model: str | None = None,
        max_inflight: int = 8,
        use_priority: bool = True,
        python: str | None = None,
        port: int | None = None,
        served_model_name: str | None = None,
        enable_lora: bool = False,
        max_loras: int = 4,
        max_lora_rank: int | None = None,
        extra_args: list[str] | None = None,
        startup_timeout_s: float = 300.0,
        max_backoff_s: float = 30.0,
        env: dict[str, str] | None = None,
        log_path: str | None = None,
        kv_events: bool | str = False,
        kv_block_size: int = DEFAULT_BLOCK_SIZE,
        **kw: Any,
    ) -> None:
        self.supervised = url is None
        if self.supervised and not model:
            raise ValueError("vllm engine without a URL needs --model to launch")
        self.port = port or (free_port() if self.supervised else None)
        super().__init__(url or f"http://127.0.0.1:{self.port}", name=name,
                         model=served_model_name or model, max_inflight=max_inflight,
                         use_priority=use_priority, **kw)
        self.launch_model = model
        self.python = python or os.environ.get("HERMES_VLLM_PYTHON") or sys.executable
        self.env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **(env or {})}
        # kv_events: True (a supervised server on a fresh local ipc socket) or the endpoint
        # of the server's publisher (attached: where to subscribe)
        endpoint: str | None = None
        if kv_events is True:
            if not self.supervised:
                raise ValueError("kv_events=True launches the publisher: an attached vLLM "
                                 "needs its publisher's endpoint (kv_events='tcp://...')")
            endpoint = (f"ipc://{tempfile.gettempdir()}/hermes-kv-{os.getpid()}-"
                        f"{self.port}.sock")
        elif isinstance(kv_events, str) and kv_events:
            endpoint = kv_events
        if endpoint is not None:
            self.kv_events = KVEventsSource(
                # a wildcard is where vLLM binds: subscribe at its server's host
                endpoint=endpoint.replace("tcp://*:",
                                          f"tcp://{urlparse(self.url).hostname or '127.0.0.1'}:"),
                block_size=kv_block_size,
                seed=self.env.get("PYTHONHASHSEED", DEFAULT_NONE_HASH_SEED))
        self.argv = vllm_argv(
            self.python, model or "", self.port or 0, served_model_name=served_model_name,
            enable_lora=enable_lora, max_loras=max_loras, max_lora_rank=max_lora_rank,
            extra_args=extra_args,
            kv_events_endpoint=endpoint if self.supervised else None,
            kv_block_size=kv_block_size,
        ) if self.supervised else []
        self.startup_timeout_s = startup_timeout_s
        self.max_backoff_s = max_backoff_s
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False
        self._ready = asyncio.Event()

    async def _launch(self) -> None:
        out = open(self.log_path, "ab") if self.log_path else asyncio.subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, stdout=out, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]

    async def wait_healthy(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if self.proc is not None and self.proc.returncode is not None:
                raise EngineError(f"vLLM exited with {self.proc.returncode} during startup",
                                  retryable=True)
            if await self.health():
                return
            await asyncio.sleep(0.5)
        raise EngineError(f"vLLM not healthy after {timeout_s:.0f}s", retryable=True)

    async def start(self) -> None:
        if self.supervised:
            await self._launch()
            await self.wait_healthy(self.startup_timeout_s)
            self._supervisor = asyncio.create_task(self._supervise(), name=f"vllm-{self.name}")
        else:
            await self.wait_healthy(self.startup_timeout_s)
        self._ready.set()
        await self.refresh_models()
        await self.learn_kv_capacity()

    async def _supervise(self) -> None:
        """Restart the server when it dies, backing off 1, 2, 4, ... up to max_backoff_s."""
        backoff = 1.0
        while not self._closing:
            assert self.proc is not None
            await self.proc.wait()
            if self._closing:
                return
            self._ready.clear()
            self.restarts += 1
            print(f"hermeslet: vLLM {self.name} exited ({self.proc.returncode}); "
                  f"restart #{self.restarts} in {backoff:.0f}s", file=sys.stderr)
            await asyncio.sleep(backoff)
            try:
                await self._launch()
                await self.wait_healthy(self.startup_timeout_s)
                self._ready.set()
                backoff = 1.0
            except (EngineError, OSError) as e:
                print(f"hermeslet: vLLM {self.name} restart failed: {e}", file=sys.stderr)
                backoff = min(backoff * 2, self.max_backoff_s)

    async def generate(self, endpoint: str, body: dict[str, Any], stream: bool, *, request_id: str,
                       priority: int | None = None) -> AsyncGenerator[GenChunk | GenResult, None]:
        if self.supervised and not self._ready.is_set():
            raise EngineError("vLLM is restarting", retryable=True)
        async for item in super().generate(endpoint, body, stream, request_id=request_id,
                                           priority=priority):
            yield item

    async def close(self) -> None:
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 15)
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, 9)
                await self.proc.wait()
        with contextlib.suppress(*HTTP_ERRORS):
            await super().close()

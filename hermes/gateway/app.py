"""The FastAPI application of the gateway: the composition root.

:func:`create_app` wires the HTTP edge (:mod:`hermes.gateway.api`: the OpenAI, runs, apps,
responses and admin routers, the fast path, the error handlers), the security middleware
(:mod:`hermes.gateway.auth`) and the metrics to one
:class:`~hermes.gateway.scheduler.LiveScheduler` whose lifetime is the app's (FastAPI
lifespan): the scheduler binds its ZeroMQ ROUTER, and, unless ``scheduler.embedded_node`` is
off, one in-process HermesLet (engines from ``[[engines]]``, the built-in simulated engine by
default) is linked to it directly (:mod:`hermes.inproc`: the protocol's messages as objects,
without ZeroMQ or JSON); then the runs stored before a restart are recovered. OpenAPI docs
are at ``/docs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import zmq.asyncio
from fastapi import FastAPI

from hermes.gateway.api import (
    admin_api,
    anthropic_api,
    apps_api,
    openai_api,
    responses_api,
    runs_api,
)
from hermes.gateway.api.errors import install_error_handlers
from hermes.gateway.api.fastpath import OpenAIFastPath
from hermes.gateway.auth import install_security
from hermes.gateway.config import EngineConfig, GatewayConfig
from hermes.gateway.disconnect import CancelOnDisconnect
from hermes.gateway.hosted import HostedRegistry
from hermes.gateway.scheduler import LiveScheduler
from hermes.gateway.shared import open_shared_state
from hermes.gateway.tracing import install_tracing
from hermes.metrics import GatewayMetrics

log = logging.getLogger("hermes.gateway")


def _embedded_builder(config: GatewayConfig) -> Any:
    """With ``placement.auto``: how the embedded node makes a plan's engines (built-in
    engines with the planner's costs, at the gateway's time scale, with the KV gate at their
    capacity when a configured generation engine has one); else None (no plans)."""
    if not config.placement.auto:
        return None
    from hermeslet.placement import build_engines

    window = config.engines[0].max_inflight if config.engines else 32
    gate = any(e.kv_gate for e in config.engines if e.task == "generate")

    def build(launches: Any) -> list[Any]:
        engines = build_engines(launches, "sim", time_scale=config.scheduler.time_scale,
                                max_inflight=window)
        for eng in engines if gate else ():
            eng.set_kv_gate()
        return engines

    return build


def make_engine_adapter(e: EngineConfig, time_scale: float) -> Any:
    """The HermesLet engine adapter for one ``[[engines]]`` entry."""
    from hermeslet.engines import make_engine

    if e.kind == "sim":
        kv = ({"kv_cache_gb": e.kv_cache_gb, "cpu_cache_gb": e.cpu_cache_gb}
              if e.kv_cache_gb > 0 else {})
        task = {"task": e.task} if e.task != "generate" else {}
        eng = make_engine("sim", name=e.name, model=e.model, max_inflight=e.max_inflight,
                          time_scale=time_scale, setup=e.cost_model, **kv, **task)
    elif e.kind == "openai":
        eng = make_engine(f"openai:{e.url}", name=e.name, model=e.model or None,
                          max_inflight=e.max_inflight, task=e.task, messages_api=e.messages_api)
    else:
        eng = make_engine(f"vllm:{e.url}" if e.url else "vllm", name=e.name,
                          model=e.model or None, max_inflight=e.max_inflight, task=e.task,
                          messages_api=e.messages_api)
    for lora in e.loras:
        if lora not in eng.loras:
            eng.loras.append(lora)
    if e.kv_gate:
        eng.set_kv_gate(e.kv_gate_tokens or None)
    return eng


def _otel_configured() -> bool:
    """Whether OpenTelemetry is set up for this process: an exporter or FastAPI's automatic
    configuration in the environment, or a global tracer provider already installed (e.g. by
    ``opentelemetry-instrument``)."""
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if env.get("FASTAPI_OTEL_AUTO_CONFIGURE", "").lower() == "true" or any(
            k.startswith("OTEL_EXPORTER_OTLP") or k in _OTEL_EXPORTERS for k in env):
        return True
    try:
        from opentelemetry import trace
    except ImportError:
        return False
    return type(trace.get_tracer_provider()).__name__ not in ("ProxyTracerProvider",
                                                              "NoOpTracerProvider")


_OTEL_EXPORTERS = ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER")


def _telemetry_option() -> dict[str, Any]:
    """``FastAPI(telemetry=...)``: FastAPI's native OpenTelemetry (spans, metrics and logs per
    request) where OpenTelemetry is set up (:func:`_otel_configured`), off otherwise. Left on
    without a provider it still asks the global providers on every request, a few percent
    of the gateway's CPU per request (``hermes bench gateway``). Empty for FastAPI versions
    without native telemetry."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    if _otel_configured():
        return {}  # FastAPI's defaults: global providers, every signal
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def create_app(config: GatewayConfig | None = None) -> FastAPI:
    """The gateway as an ASGI app; the scheduler starts and stops with it."""
    config = config or GatewayConfig()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = zmq.asyncio.Context()
        sched = LiveScheduler(config, context=ctx,
                              evidence_index=shared.evidence if shared is not None else None)
        app.state.metrics.attach(sched)
        if app.state.tracing is not None:  # traces of runs (hermes.gateway.tracing)
            app.state.tracing.attach(sched)
        app.state.scheduler = sched
        node_task: asyncio.Task[None] | None = None
        placer_task: asyncio.Task[None] | None = None
        agent = None

        async def activate() -> None:
            """Start scheduling: the node socket, the embedded node, the stored runs."""
            nonlocal node_task, placer_task, agent
            await sched.start()
            if config.scheduler.embedded_node:
                from hermeslet.agent import HermesLet
                from hermeslet.prewarmers import build_node_prewarmer

                engines = [make_engine_adapter(e, config.scheduler.time_scale)
                           for e in config.engines]
                # KV prefix prewarms reach the embedded engines (built-in or HTTP) through
                # their adapters; no container pool or runtime LoRA loading here (a
                # HermesLet's flags)
                _, prewarmer = build_node_prewarmer(engines)
                from hermeslet.tools import SubprocessSandbox, ToolLimits, ToolRunner

                # tool code runs in bubblewrap, or is refused: never a silent fallback; each
                # call in a cgroup of its own where the host allows (docs/security.md)
                tc = config.tools
                tools = ToolRunner(SubprocessSandbox(
                    unsafe_unsandboxed=tc.unsafe_unsandboxed, cgroup=tc.cgroup_root,
                    limits=ToolLimits(memory_bytes=tc.memory_bytes, pids=tc.max_processes)))
                agent = HermesLet("embedded", sched.inproc_address, engines, ctx=ctx,
                                  link=sched.inproc_link("embedded"), prewarmer=prewarmer,
                                  tools=tools, placement_builder=_embedded_builder(config),
                                  drain_timeout_s=config.placement.drain_timeout_s)
                from hermeslet.metrics import NodeCollector

                app.state.metrics.add_collector(NodeCollector(agent))
                node_task = asyncio.create_task(agent.run(), name="hermeslet-embedded")
                app.state.node = agent
                await sched.wait_for_nodes(30.0)
            if config.ha.role == "scheduler":  # split roles: the socket edges call
                from hermes.gateway.edge.link import EdgeLink

                app.state.edge_link = EdgeLink(sched, config.ha.edge_bind, ctx)
                app.state.edge_link.start()
            sched.recover(app.state.hosted)  # resume or fail stored runs (issue 7)
            if config.placement.auto:  # issue 22: re-place the models by itself
                from hermes.gateway.placer import Placer

                app.state.placer = Placer(sched, config.placement)
                placer_task = asyncio.create_task(app.state.placer.run(), name="hermes-placer")

        if config.ha.election:  # a standby until elected (hermes.gateway.ha)
            from hermes.gateway.ha.role import SchedulerRole

            app.state.ha = SchedulerRole(config, sched, activate)
            app.state.ha.start()
        else:
            await activate()
        try:
            yield
        finally:
            if app.state.ha is not None:
                await app.state.ha.stop()  # the lease goes to a standby at once
            if placer_task is not None:
                placer_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await placer_task
            if agent is not None and node_task is not None:
                agent.stop()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(node_task, 10.0)
            if app.state.edge_link is not None:
                app.state.edge_link.close()
            await sched.stop()
            if app.state.tracing is not None:
                app.state.tracing.shutdown()  # flushes what is queued
            ctx.term()
            if shared is not None:
                await shared.aclose()

    app = FastAPI(
        **_telemetry_option(),
        title="Hermes gateway",
        version="0.1.0",
        description="Serving gateway for LLM applications: app-run API and an "
        "OpenAI-compatible endpoint, scheduled by PDGraph demand estimates.",
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.node = None  # the embedded HermesLet, once started
    app.state.edge_link = None  # --role scheduler: the socket edges call (hermes.gateway.edge)
    app.state.placer = None  # the re-placement loop, with placement.auto
    app.state.ha = None  # this process's part in the scheduler election, with [ha] election
    app.state.hosted = HostedRegistry.from_config(config)
    # state exact across gateway processes, in the shared store ([cluster] store; else None:
    # in memory) -- admission, idempotency keys, stored Responses, the resolver's index
    shared = app.state.shared = open_shared_state(config)
    if shared is not None:
        app.state.responses = shared.responses
        app.state.idempotency = shared.idempotency
    app.add_middleware(OpenAIFastPath)  # completions past FastAPI's router (inside security)
    app.add_middleware(CancelOnDisconnect)  # a client gone stops its LLM call's or tool call's handler
    install_security(app, config,  # body limits, API keys, tenant admission (issue 7)
                     shared.store if shared is not None else None)
    app.include_router(runs_api.router)
    app.include_router(apps_api.router)
    app.include_router(openai_api.router)
    app.include_router(responses_api.router)  # POST /v1/responses, translated to chat
    app.include_router(anthropic_api.router)  # POST /v1/messages (Anthropic's Messages API)
    app.state.metrics = GatewayMetrics()  # its own registry: several apps per process
    if shared is not None:
        from hermes.gateway.shared.store import SharedStoreCollector

        app.state.metrics.add_collector(SharedStoreCollector(shared.store))
    admin_api.install(app)  # /admin/... (HERMES_ADMIN_TOKEN) and GET /metrics
    install_tracing(app, config)  # traces of runs, where [tracing] or OTEL_* turns them on
    install_error_handlers(app)  # every error in OpenAI's shape (Anthropic's on /v1/messages)
    if config.ha.election:  # a standby answers 503 but for health (hermes.gateway.ha.role)
        from hermes.gateway.ha.role import StandbyGate

        app.add_middleware(StandbyGate, state=app.state)
    return app

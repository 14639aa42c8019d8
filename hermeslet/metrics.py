"""Prometheus metrics of a HermesLet: its engine windows and its engines' own state.

:class:`NodeCollector` reads the agent when Prometheus scrapes: per engine the queue in front
of it, the in-flight window (used and size), and what the engine itself reports (vLLM's
``/metrics``, fetched by the adapter at every heartbeat: ``vllm:kv_cache_usage_perc``,
``vllm:num_requests_running``/``waiting``, ``vllm:prefix_cache_queries_total``/
``hits_total``; the built-in engine reports the same), plus the tool queue, plus the node's
prewarmers (:class:`~hermeslet.prewarmers.NodePrewarmer`, read from their own objects, never
from the flat ``stats()`` keys, since model names may contain ``_``):

- counters ``hermeslet_prewarm_{started,used,wasted,wasted_backend_seconds}`` (the gateway's
  ``hermes_prewarm_*`` per node) and ``hermeslet_prewarm_{cold_starts,warm_hits}``, labels
  ``node``, ``backend_type`` (``docker``, ``lora``, ``kv``, ``dnn``) and ``target`` (the
  base model of ``lora``, the model of ``kv`` and ``dnn``; empty for ``docker``, whose pool
  counts over all images). Every node exports ``docker``, ``lora`` and ``kv`` rows from the
  start (target empty, at zero where it has no such prewarmer), as the gateway does; a DNN
  hook counts its loads as ``started`` (it tracks no use or waste); cold starts and warm hits
  count calls: tool calls of the container pool (``docker``) and requests released with their
  LoRA adapter not loaded / loaded (``lora``); a KV prefix's use is not visible on the node
  (the gateway's planner counts it);
- gauge ``hermeslet_prewarm_last_warmup_seconds`` (the last measured warm-up, once there was
  one), gauge ``hermeslet_prewarm_idle_containers{node,image}`` (warm containers waiting);
- gauges ``hermeslet_lora_adapters_loaded`` and ``hermeslet_lora_adapters_max{node,model}``
  (adapters a LoRA prewarmer keeps loaded, and its ``max_loras``), counters
  ``hermeslet_lora_lookahead_{loads,failed,no_path}{node,model}`` when the queue lookahead is
  on (:mod:`hermeslet.lora_lookahead`);
- gauge ``hermeslet_dnn_model_loaded{node,model}`` (0 or 1);
- gauge ``hermeslet_tool_sandbox_kernel_limits{node,mode}`` (1 for how tool calls are
  bounded: ``cgroup2``/``cgroup1`` per call by the kernel, ``rlimit`` per process only, the
  fallback to alert on) and counter ``hermeslet_tool_rlimit_fallback_calls{node}``.

Nothing is updated per request: every value is read when Prometheus scrapes.

A standalone HermesLet serves them with :class:`MetricsServer` (``hermeslet run
--metrics-port P``) on its own event loop, so a scrape reads the agent's state between two
event-loop steps; an embedded HermesLet's collector is registered on the gateway's registry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from hermes.metrics import PREWARM_TYPES  # backend types exported from the start, as there

#: where engine adapters put vLLM's counters (the built-in engine's names first)
PREFIX_QUERIES = ("prefix_cache_queries", "vllm:prefix_cache_queries_total",
                  "vllm:gpu_prefix_cache_queries_total", "vllm:prefix_cache_queries")
PREFIX_HITS = ("prefix_cache_hits", "vllm:prefix_cache_hits_total",
               "vllm:gpu_prefix_cache_hits_total", "vllm:prefix_cache_hits")


def _first(extra: dict[str, float], names: tuple[str, ...]) -> float | None:
    for n in names:
        v = extra.get(n)
        if v is not None:
            return float(v)
    return None


class NodeCollector:
    """State metrics of one :class:`~hermeslet.agent.HermesLet` (label ``node``)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        a = self.agent
        node = a.node
        info = InfoMetricFamily("hermeslet", "HermesLet node.", labels=["node"])
        from hermeslet.agent import VERSION

        info.add_metric([node], {"version": VERSION})
        yield info
        labels = ["node", "engine", "model", "kind"]

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        queued = gauge("hermeslet_engine_queued_requests", "Requests waiting in the node's "
                       "priority queue for the engine.")
        inflight = gauge("hermeslet_engine_inflight_requests", "Requests released to the engine "
                         "(in the in-flight window).")
        window = gauge("hermeslet_engine_max_inflight_requests", "Size of the in-flight window.")
        kv = gauge("hermeslet_engine_kv_cache_usage_ratio", "The engine's KV-cache usage "
                   "(0..1, vllm:kv_cache_usage_perc).")
        running = gauge("hermeslet_engine_running_requests", "Requests in the engine's running "
                        "batch (vllm:num_requests_running).")
        waiting = gauge("hermeslet_engine_waiting_requests", "Requests waiting inside the engine "
                        "(vllm:num_requests_waiting).")
        pq = CounterMetricFamily("hermeslet_engine_prefix_cache_queries", "Prefix-cache tokens "
                                 "queried at the engine (vllm:prefix_cache_queries_total).",
                                 labels=labels)
        ph = CounterMetricFamily("hermeslet_engine_prefix_cache_hits", "Prefix-cache tokens hit "
                                 "at the engine (vllm:prefix_cache_hits_total).", labels=labels)
        for s in list(a.slots.values()):
            e = s.engine
            lv = [node, e.name, e.model, e.kind]
            queued.add_metric(lv, len(s.queue))
            inflight.add_metric(lv, len(s.inflight))
            window.add_metric(lv, e.max_inflight)
            m = e.last_metrics
            if m.kv_usage is not None:
                kv.add_metric(lv, float(m.kv_usage))
            if m.running is not None:
                running.add_metric(lv, m.running)
            if m.waiting is not None:
                waiting.add_metric(lv, m.waiting)
            extra = m.extra or {}
            q, h = _first(extra, PREFIX_QUERIES), _first(extra, PREFIX_HITS)
            if q is not None and h is not None:
                pq.add_metric(lv, q)
                ph.add_metric(lv, h)
        yield from (queued, inflight, window, kv, running, waiting, pq, ph)
        g = GaugeMetricFamily("hermeslet_tools_queued_requests", "Tool calls waiting.",
                              labels=["node"])
        g.add_metric([node], len(a.tool_queue))
        yield g
        g = GaugeMetricFamily("hermeslet_tools_running_requests", "Tool calls running.",
                              labels=["node"])
        g.add_metric([node], len(a.tool_tasks))
        yield g
        yield from sandbox_metrics(node, getattr(getattr(a, "tools", None), "subprocess", None))
        yield from prewarm_metrics(node, getattr(a, "prewarmer", None))


def sandbox_metrics(node: str, sub: Any) -> Iterator[Metric]:
    """How the subprocess sandbox bounds a tool call (``mode``: ``cgroup2``/``cgroup1``, the
    whole call by the kernel, or ``rlimit``, per process only: the loud fallback, alert on
    it) and the calls that ran with per-process limits only."""
    if sub is None or not getattr(sub, "available", False):
        return
    g = GaugeMetricFamily("hermeslet_tool_sandbox_kernel_limits",
                          "1 for how tool calls' memory and process count are bounded: "
                          "cgroup2/cgroup1 per call by the kernel, rlimit per process only.",
                          labels=["node", "mode"])
    for mode in ("cgroup2", "cgroup1", "rlimit"):
        g.add_metric([node, mode], 1.0 if sub.kernel_limits == mode else 0.0)
    yield g
    c = CounterMetricFamily("hermeslet_tool_rlimit_fallback_calls",
                            "Tool calls run with per-process limits only (no cgroup).",
                            labels=["node"])
    c.add_metric([node], float(sub.rlimit_fallbacks))
    yield c


#: PrewarmCounters field -> metric family (name, help) of the node's prewarm counters
_PREWARM_COUNTERS: dict[str, tuple[str, str]] = {
    "started": ("hermeslet_prewarm_started", "Backend prewarms started on the node."),
    "used": ("hermeslet_prewarm_used", "Prewarmed backends a request used."),
    "wasted": ("hermeslet_prewarm_wasted", "Prewarmed backends released unused (wrong branch "
               "or idle timeout)."),
    "wasted_backend_s": ("hermeslet_prewarm_wasted_backend_seconds", "Backend seconds held "
                         "warm and never used."),
    "cold_starts": ("hermeslet_prewarm_cold_starts", "Calls that found no warm backend and "
                    "started one themselves."),
    "warm_hits": ("hermeslet_prewarm_warm_hits", "Calls that found a warm backend."),
}
#: the counters exported at zero for backend types the node has no prewarmer of
_ZERO_FROM_START = ("started", "used", "wasted", "wasted_backend_s")
#: backend types whose prewarmer counts calls (cold_starts, warm_hits): the container pool
#: (tool calls) and the LoRA prewarmer (requests released with their adapter not loaded /
#: loaded)
_CALL_COUNTED = ("docker", "lora")


def prewarm_metrics(node: str, pw: Any) -> Iterator[Metric]:
    """The prewarm families of one node; ``pw`` is its
    :class:`~hermeslet.prewarmers.NodePrewarmer` or ``None``. Every family is yielded (so
    that it is listed before it has samples); see the module docstring for the rows."""
    labels = ["node", "backend_type", "target"]
    counters = {k: CounterMetricFamily(name, doc, labels=labels)
                for k, (name, doc) in _PREWARM_COUNTERS.items()}
    last = GaugeMetricFamily("hermeslet_prewarm_last_warmup_seconds", "The last measured "
                             "warm-up of a backend (create+start, adapter load, prefix "
                             "prefill, model load).", labels=labels)
    idle = GaugeMetricFamily("hermeslet_prewarm_idle_containers", "Prewarmed containers "
                             "waiting for a tool call.", labels=["node", "image"])
    loaded = GaugeMetricFamily("hermeslet_lora_adapters_loaded", "LoRA adapters the node's "
                               "prewarmer keeps loaded on the engine.", labels=["node", "model"])
    cap = GaugeMetricFamily("hermeslet_lora_adapters_max", "At most this many adapters loaded "
                            "(max_loras; vLLM's --max-cpu-loras).", labels=["node", "model"])
    la = {k: CounterMetricFamily(f"hermeslet_lora_lookahead_{k}", doc, labels=["node", "model"])
          for k, doc in (("loads", "Adapters the queue lookahead loaded ahead of their queued "
                                   "requests."),
                         ("failed", "Lookahead loads that failed."),
                         ("no_path", "Adapters the lookahead skipped: no path known "
                                     "(--lora-path)."))}
    dnn = GaugeMetricFamily("hermeslet_dnn_model_loaded", "Whether a DNN tool model is loaded "
                            "(0 or 1).", labels=["node", "model"])
    seen: set[str] = set()

    def add(btype: str, target: str, c: Any) -> None:
        seen.add(btype)
        for key, fam in counters.items():
            if key in _ZERO_FROM_START or btype in _CALL_COUNTED:
                fam.add_metric([node, btype, target], float(getattr(c, key)))
        if c.warmup_s_last > 0:
            last.add_metric([node, btype, target], float(c.warmup_s_last))

    if pw is not None:
        pool = pw.containers
        if pool is not None:
            add("docker", "", pool.counters)
            for image, ws in list(pool.idle.items()):
                idle.add_metric([node, image], len(ws))
        for model, lp in list(pw.loras.items()):
            add("lora", model, lp.counters)
            loaded.add_metric([node, model], len(lp.loaded))
            cap.add_metric([node, model], lp.max_loras)
            if pw.lora_lookahead is not None:
                for key, fam in la.items():
                    fam.add_metric([node, model], float(getattr(lp.lookahead, key)))
        for model, kp in list(pw.prefixes.items()):
            add("kv", model, kp.counters)
        for model, hook in list(pw.dnn.items()):
            counters["started"].add_metric([node, "dnn", model], float(hook.loads))
            if hook.load_s is not None:
                last.add_metric([node, "dnn", model], float(hook.load_s))
            dnn.add_metric([node, model], 0.0 if hook.model is None else 1.0)
    for btype in PREWARM_TYPES:
        if btype not in seen:
            for key in _ZERO_FROM_START:
                counters[key].add_metric([node, btype, ""], 0.0)
    yield from counters.values()
    yield from (last, idle, loaded, cap)
    yield from la.values()
    yield dnn


def node_registry(agent: Any) -> CollectorRegistry:
    """A fresh registry exporting ``agent``'s metrics."""
    reg = CollectorRegistry()
    reg.register(NodeCollector(agent))
    return reg


class MetricsServer:
    """A minimal HTTP/1.1 server for ``GET /metrics`` on the running event loop."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server: asyncio.base_events.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> MetricsServer:
        self._server = await asyncio.start_server(self._handle, host, port)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass
            parts = line.decode("latin-1").split()
            if len(parts) >= 2 and parts[0] in ("GET", "HEAD") and parts[1].split("?")[0] in (
                    "/metrics", "/"):
                body = generate_latest(self.registry)
                head = (f"HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE_LATEST}\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
                writer.write(head.encode() + (body if parts[0] == "GET" else b""))
            else:
                msg = b"not found: GET /metrics\n"
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(msg) + msg)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

"""Prometheus metrics of a HermesLet: its engine windows and its engines' own state.

:class:`NodeCollector` reads the agent when Prometheus scrapes: per engine the queue in front
of it, the in-flight window (used and size), and what the engine itself reports (vLLM's
``/metrics``, fetched by the adapter at every heartbeat: ``vllm:kv_cache_usage_perc``,
``vllm:num_requests_running``/``waiting``, ``vllm:prefix_cache_queries_total``/
``hits_total``; the built-in engine reports the same), plus the tool queue. Nothing is
updated per request.

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
        return self._server.sockets[0].getsockname()[1]

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

"""KV retention through tool calls in the simulator (issue 19 item 3): the glue between the
simulator's events and :mod:`hermes.core.kv_retention`.

:class:`SimRetention` gives each engine a :class:`~hermes.core.warm_models.
RetainingPrefixCache` and is told where each run's last LLM request went (its history key and
engine). When a run's tool call starts, it describes the hand-over from the run's PDGraph (the
probability that an LLM unit follows the tool unit, the tool's duration samples) and the
engine's cache (the KV's size, the GPU tier's pressure, the reload time from host memory), asks
the retention policy, and carries the answer out: a TTL pin, an offload to host memory (then an
asynchronous reload when the tool returns: the load overlaps the client's gap before the next
request; a request that arrives before it is done waits for the rest), or a drop. A TTL pin
ends when the run's next request is admitted, when it expires, or when the run ends.
Host-memory hits that were not reloaded in advance are loaded synchronously at admission (the
iteration stalls for the load), as the prefix cache model does for every rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from hermes.core.engine_model import EngineRequest
from hermes.core.kv_retention import Handover, RetentionPolicy
from hermes.core.pdgraph import PDGraph, next_llm_p
from hermes.core.state import RunState
from hermes.core.warm_models import RetainingPrefixCache
from hermes.workloads.base import Step


class _StallHook:
    """Admission hook of one engine: the cache's synchronous loads stall the iteration, and an
    admitted run's TTL pin ends (its request now holds the KV)."""

    def __init__(self, owner: SimRetention, cache: RetainingPrefixCache) -> None:
        self.owner = owner
        self.cache = cache

    def on_admit(self, req: EngineRequest, now: float) -> float:
        if req.prefix:
            self.cache.unpin(req.prefix)
        return self.cache.take_stall_s()


class SimRetention:
    """Retention decisions at every tool hand-over of a simulation (module docstring)."""

    def __init__(self, policy: RetentionPolicy, caches: list[RetainingPrefixCache],
                 graphs: Mapping[str, PDGraph] | None = None) -> None:
        self.policy = policy
        self.caches = caches
        self.graphs = graphs or {}
        self._where: dict[str, tuple[int, str]] = {}  # run -> (engine, history key)
        self._reload: set[str] = set()
        self.decisions: Counter[str] = Counter()

    def bind(self, engines: list[Any]) -> None:
        if len(engines) != len(self.caches):
            raise ValueError(f"{len(self.caches)} caches for {len(engines)} engines")
        for eng, cache in zip(engines, self.caches, strict=True):
            eng.prefix_cache = cache
            eng.admission_hook = _StallHook(self, cache)

    def on_route(self, run_id: str, key: str | None, engine: int) -> None:
        if key:
            self._where[run_id] = (engine, key)

    def handover(self, st: RunState, step: Step) -> Handover | None:
        """The hand-over of ``st``'s KV to tool ``step`` (``None``: the run holds none)."""
        where = self._where.get(st.run_id)
        if where is None:
            return None
        ei, key = where
        cache = self.caches[ei]
        tokens = cache.tokens(key)
        if tokens == 0:
            return None
        graph = self.graphs.get(st.app)
        p = next_llm_p(graph, step.unit, hops=1)  # an LLM unit right after the tool
        durs: tuple[float, ...] = ()
        if graph is not None and step.unit in graph.units:
            durs = tuple(graph.units[step.unit].consumption.duration_s)
        return Handover(tokens, min(1.0, p), durs, cache.pressure,
                        load_s=tokens * cache.swap_s_per_token,
                        has_cpu_tier=cache.cpu_capacity > 0,
                        cpu_room_tokens=self.cpu_room(ei))

    def cpu_room(self, ei: int) -> int:
        """Host-tier tokens of engine ``ei`` not held by the offloaded KV of runs still in
        their tool call (those will reload it)."""
        cache = self.caches[ei]
        held = sum(cache.cpu.get(key, 0) for rid in self._reload
                   if (w := self._where.get(rid)) is not None and w[0] == ei
                   for key in (w[1],))
        return max(0, cache.cpu_capacity - held)

    def on_tool_start(self, st: RunState, step: Step, now: float) -> None:
        h = self.handover(st, step)
        if h is None:
            return
        ei, key = self._where[st.run_id]
        cache = self.caches[ei]
        d = self.policy.decide(h)
        self.decisions[d.action] += 1
        if d.action == "keep":
            cache.pin_until(key, now + d.ttl_s)
        elif d.action == "offload":
            if cache.offload(key) and d.reload:
                self._reload.add(st.run_id)
        elif d.action == "drop":
            cache.drop(key)

    def on_tool_done(self, run_id: str, now: float) -> None:
        if run_id in self._reload:
            self._reload.discard(run_id)
            ei, key = self._where[run_id]
            self.caches[ei].prefetch(key, now)

    def on_run_finish(self, run_id: str) -> None:
        where = self._where.pop(run_id, None)
        self._reload.discard(run_id)
        if where is not None:
            self.caches[where[0]].unpin(where[1])

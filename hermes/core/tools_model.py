"""Tool backends as capacity-limited servers with cold starts, I/O-free and clock-free.

One :class:`ToolServer` per backend string (``docker:python:3.10-slim``, ``dnn:resnet50``,
``api:search``): at most ``instances`` instances (containers, model replicas, API
connections) serve one call each. Calls wait in the server's own queue, ordered by the same
policy keys as the engines (:class:`~hermes.core.ordering.KeyedQueue`).

Cold start: a call that finds no warm idle instance starts a new one (if capacity allows),
paying ``cold_start_s`` before its own service time. A finished instance stays warm for
``idle_timeout_s``; after that it is shut down and frees its slot. Defaults per kind
(:data:`TOOL_DEFAULTS`): docker 1.0 s cold start, dnn 3.0 s, api 0 s.

The driver asks the server what to start (:meth:`ToolServer.submit`,
:meth:`ToolServer.complete` return :class:`ToolStart` decisions with their finish times) and
reports completions; the server never reads a clock.

Prewarming hook (later issue): :meth:`ToolServer.prewarm` starts an instance now so that it
is warm at ``now + cold_start_s``; a call dispatched to a warming instance waits only for the
rest of its cold start.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from hermes.core.backend import BackendSpec
from hermes.core.ordering import Key, KeyedQueue


@dataclass(frozen=True, slots=True)
class ToolKindConfig:
    """Capacity and warm-up behaviour of one tool backend kind."""

    instances: int
    cold_start_s: float
    idle_timeout_s: float
    #: an instance serves one call and is then destroyed (code sandboxes: no state may leak
    #: from one run's call into another's, as in the HermesLet's container pool)
    single_use: bool = False


#: Defaults per backend kind. Instances: a node's container pool, a couple of DNN replicas,
#: generous API concurrency. Idle timeout: how long an instance is kept warm after a call.
TOOL_DEFAULTS: dict[str, ToolKindConfig] = {
    "docker": ToolKindConfig(instances=16, cold_start_s=1.0, idle_timeout_s=120.0),
    "dnn": ToolKindConfig(instances=4, cold_start_s=3.0, idle_timeout_s=120.0),
    "api": ToolKindConfig(instances=64, cold_start_s=0.0, idle_timeout_s=float("inf")),
}


@dataclass(slots=True)
class ToolCall:
    """One tool invocation: ``duration_s`` is its service time on a warm instance."""

    call_id: str
    run_id: str
    duration_s: float
    key: Key = ()
    arrival: float = 0.0


@dataclass(frozen=True, slots=True)
class ToolStart:
    """A call begins: it waits ``cold_start_s`` (0 when warm), then runs until ``finish_at``."""

    call_id: str
    run_id: str
    started: float
    cold_start_s: float
    finish_at: float
    queued_s: float


@dataclass(slots=True)
class _Instance:
    ready_at: float  # end of its cold start
    busy: str | None = None  # call id being served
    idle_since: float = 0.0
    prewarmed: bool = False  # started by a prewarm, not yet used


@dataclass(slots=True)
class ToolServer:
    """One tool backend: instances, their warm state, and a keyed waiting queue."""

    backend: str
    config: ToolKindConfig
    queue: KeyedQueue[ToolCall] = field(default_factory=KeyedQueue)
    _instances: list[_Instance] = field(default_factory=list)
    _serving: dict[str, _Instance] = field(default_factory=dict)
    cold_starts: int = 0
    calls: int = 0  # calls dispatched
    warm_hits: int = 0  # calls that found a warm idle instance (no cold start at all)

    def _expire(self, now: float) -> None:
        timeout = self.config.idle_timeout_s
        self._instances = [
            i
            for i in self._instances
            if i.busy is not None or i.ready_at > now or now - i.idle_since <= timeout
        ]

    def warm_idle(self, now: float) -> int:
        """Idle instances whose cold start is over and whose idle timeout has not passed."""
        self._expire(now)
        return sum(1 for i in self._instances if i.busy is None and i.ready_at <= now)

    def submit(self, call: ToolCall, now: float) -> list[ToolStart]:
        """Queue ``call``; returns the calls that start now (possibly this one)."""
        call.arrival = now
        self.queue.push(call.call_id, call, call.key, call.run_id)
        return self._dispatch(now)

    def complete(self, call_id: str, now: float) -> list[ToolStart]:
        """The call finished; its instance turns idle (warm) and serves the queue."""
        inst = self._serving.pop(call_id)
        inst.busy = None
        inst.idle_since = now
        if self.config.single_use:
            self._instances.remove(inst)
        return self._dispatch(now)

    def update_key(self, call_id: str, key: Key) -> None:
        if call_id in self.queue:
            self.queue.rekey(call_id, key)

    def prewarm(self, now: float) -> bool:
        """Start an instance now unless one is idle or warming, or capacity is full.

        Returns whether an instance was started (it is warm from ``now + cold_start_s``)."""
        self._expire(now)
        if any(i.busy is None for i in self._instances):
            return False
        if len(self._instances) >= self.config.instances:
            return False
        ready = now + self.config.cold_start_s
        self._instances.append(_Instance(ready_at=ready, idle_since=ready, prewarmed=True))
        self.cold_starts += 1
        return True

    def is_warm(self, now: float) -> bool:
        """An idle instance is warm or warming (a call would not start a new one)."""
        self._expire(now)
        return any(i.busy is None for i in self._instances)

    def release(self, now: float) -> bool:
        """Shut down one unused prewarmed idle instance (a prewarm that was not needed)."""
        self._expire(now)
        for i, inst in enumerate(self._instances):
            if inst.busy is None and inst.prewarmed:
                del self._instances[i]
                return True
        return False

    def _dispatch(self, now: float) -> list[ToolStart]:
        started: list[ToolStart] = []
        self._expire(now)
        while self.queue:
            # the instance that can start the call soonest: an idle one (warm or warming)
            # or, with spare capacity, a new one paying the full cold start
            best: _Instance | None = None
            best_start = float("inf")
            for inst in self._instances:
                if inst.busy is None:
                    s = max(now, inst.ready_at)
                    if s < best_start:
                        best, best_start = inst, s
            if len(self._instances) < self.config.instances:
                s = now + self.config.cold_start_s
                if s < best_start:
                    best = _Instance(ready_at=s)
                    best_start = s
                    self._instances.append(best)
                    self.cold_starts += 1
            if best is None:
                break
            call = self.queue.pop()
            self.calls += 1
            if best_start <= now:
                self.warm_hits += 1
            best.prewarmed = False
            best.busy = call.call_id
            self._serving[call.call_id] = best
            started.append(
                ToolStart(
                    call_id=call.call_id,
                    run_id=call.run_id,
                    started=now,
                    cold_start_s=best_start - now,
                    finish_at=best_start + call.duration_s,
                    queued_s=now - call.arrival,
                )
            )
        return started


class ToolPool:
    """All tool servers of a deployment, created on first use from per-kind configs."""

    def __init__(self, configs: dict[str, ToolKindConfig] | None = None,
                 **overrides: dict[str, Any]) -> None:
        self.configs = dict(TOOL_DEFAULTS)
        if configs:
            self.configs.update(configs)
        for kind, kw in overrides.items():
            self.configs[kind] = replace(self.configs[kind], **kw)
        self.servers: dict[str, ToolServer] = {}

    def server(self, backend: str) -> ToolServer:
        srv = self.servers.get(backend)
        if srv is None:
            kind = BackendSpec.parse(backend).kind
            if kind == "llm":
                raise ValueError(f"{backend!r} is an LLM backend, not a tool")
            srv = self.servers[backend] = ToolServer(backend, self.configs[kind])
        return srv

    @classmethod
    def client_side(cls) -> ToolPool:
        """Tools that each client runs itself (an agent's own process, ``hermes load --tools
        events``): no shared capacity, no queue, no cold start; a call takes its service
        time."""
        unlimited = 1 << 30
        return cls({kind: ToolKindConfig(instances=unlimited, cold_start_s=0.0,
                                         idle_timeout_s=float("inf"))
                    for kind in TOOL_DEFAULTS})

    def prewarm(self, backend: str, now: float) -> bool:
        """Prewarming hook: warm one instance of ``backend`` now (see ToolServer.prewarm)."""
        return self.server(backend).prewarm(now)

"""The live scheduler's prewarming: the core planner driven in wall-clock time.

:class:`GatewayPrewarmer` holds one :class:`~hermes.core.prewarm.PrewarmStrategy` (``hermes``
by default, ``scheduler.prewarm`` in the config; ``scheduler.k`` is the default K, a run's own
``k`` from the runs API overrides it) and turns its actions into ``prewarm`` messages to the
HermesLet that will serve the backend: containers and DNN models to the least-loaded tool
node, LoRA adapters and KV prefixes to the node with an engine of the model. The planner's
wake-ups are timers on the event loop; its warm-up estimates learn from the ``warmup_s=`` the
nodes report in their acks. A KV-prefix prewarm carries the unit's shared prompt prefix (the
system message its requests were last seen with), so it is only sent once the unit has run.
Prefixes are per tenant (tenants deploying one app each have their own prompts): the
resource of a unit's prefix is ``kv:MODEL/TENANT/APP/UNIT``, and only the prompt that
tenant's requests of that unit carried is prewarmed for its runs. A unit whose requests name
a LoRA adapter that an engine serves (``model: ADAPTER`` through the OpenAI API) needs that
adapter (``lora:BASE@ADAPTER``) and its prefix prefilled with it (the prewarm request names
the adapter: an adapter's KV blocks are its own).

It hears of unit starts and run ends as a :class:`~hermes.gateway.runs.RunObserver`
(:meth:`on_unit_start`, :meth:`on_run_finish`); dispatch calls :meth:`note_request` for every
LLM request and :meth:`on_ack` for the nodes' acks; :meth:`stats` is a flat dict for metrics
(started / used / wasted prewarms, wasted backend-seconds, messages sent, acks failed).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from hermes.core.backend import BackendSpec
from hermes.core.ordering import Key, prewarm_key
from hermes.core.prewarm import (
    DEFAULT_TIMING,
    PrewarmAction,
    PrewarmStrategy,
    default_resources,
    make_prewarm,
    resource_kind,
    resource_model,
)
from hermes.core.state import RunState
from hermes.gateway.context import SchedulerContext
from hermes.gateway.nodes import NodeTable
from hermes.gateway.prefixes import shared_prefix
from hermes.gateway.runs import RunObserver, RunRegistry
from hermes.gateway.state import ACTIVE, LiveRun, UnitInvocation
from hermes.protocol import Prewarm, PrewarmAck

log = logging.getLogger("hermes.prewarm")

#: (tenant, app, unit) prefixes and KV resources remembered (each, least recently used out)
MAX_PREFIXES = 10_000


class GatewayPrewarmer(RunObserver):
    """Planner + signalling for the live scheduler (see the module docstring)."""

    def __init__(self, ctx: SchedulerContext, nodes: NodeTable, runs: RunRegistry,
                 strategy: PrewarmStrategy, *, kv_recent_s: float = 0.0,
                 tick_s: float = 0.0) -> None:
        self.ctx = ctx
        self.nodes = nodes
        self.runs = runs
        self.strategy = strategy
        strategy.resources = self.resources
        self.warm: set[str] = set()  # resources we asked a node to warm and not released
        #: (tenant, app, unit) -> the system prompt its requests last carried; least
        #: recently noted out past MAX_PREFIXES (inferred apps and units come and go: an
        #: evicted unit's prefix is noted again by its next request)
        self.prefixes: OrderedDict[tuple[str, str, str], str] = OrderedDict()
        #: kv resource -> (tenant, app, unit, LoRA adapter its requests use or None): the
        #: prewarm request runs with that adapter, whose KV blocks are its own in vLLM
        #: (bounded alike)
        self._kv: OrderedDict[str, tuple[str, str, str, str | None]] = OrderedDict()
        #: :meth:`resources`' parsed backends and names (pure functions of their keys; at
        #: most MAX_PREFIXES each, then started afresh)
        self._spec: dict[str, BackendSpec] = {}
        self._named: dict[tuple[str, str, str, str, str | None],
                          tuple[tuple[tuple[str, bool], ...], str | None]] = {}
        self.sent = {"start": 0, "release": 0}
        #: KV resource -> units running now whose requests carry that prefix (the engine
        #: holds its blocks while they run), and id(invocation) -> (invocation, the resources
        #: it counts for)
        self._running: dict[str, int] = {}
        self._holding: dict[int, tuple[UnitInvocation, list[str]]] = {}
        #: KV resource -> when (``time.monotonic()``) the last unit holding it closed, least
        #: recently closed first (bounded by MAX_PREFIXES): a prefix used that recently is
        #: still in the engine's cache (``scheduler.prewarm_kv_recent_s``)
        self._recent: dict[str, float] = {}
        self.kv_recent_s = kv_recent_s
        #: started KV prewarms not sent because a running unit held the prefix, or one that
        #: ended within ``kv_recent_s`` (:meth:`_hold`)
        self._held: set[int] = set()
        self.held = 0
        self.acks_failed = 0
        self._timer: asyncio.TimerHandle | None = None
        #: when the timer fires, in the loop's time (``loop.time()``), and the planner's time
        #: it was set for (a prewarm due later than that needs no look at the loop)
        self._timer_at: float | None = None
        self._timer_due: float | None = None
        #: the timer's grid (wall s, ``scheduler.prewarm_tick_s``; 0: none): :meth:`_apply`
        self.tick_s = tick_s
        #: told of every decision (tracing on: :meth:`hermes.gateway.tracing.RunTracer.
        #: prewarm_action`)
        self.on_action: Callable[[PrewarmAction, float], None] | None = None

    @classmethod
    def build(cls, ctx: SchedulerContext, nodes: NodeTable, runs: RunRegistry,
              graphs: Callable[[str], Any | None]) -> GatewayPrewarmer:
        """The configured strategy (``scheduler.prewarm``), reading the apps' PDGraphs with
        ``graphs`` (learning's current ones) and their estimators from the policy's pool."""
        sc = ctx.config.scheduler
        name = getattr(sc, "prewarm", "hermes")

        def estimators(app: str) -> Any:
            # the policy's memoizing pool when it has one: the planner asks at every unit
            # start, in states the policy's walks have already been drawn for
            pool = getattr(ctx.policy, "estimators", None) or ctx.pool
            return pool.get(app) if pool is not None else None

        strategy = make_prewarm(name, k=sc.k, graphs=graphs, estimators=estimators,
                                n_walks=min(200, sc.n_walks),
                                timing=getattr(sc, "prewarm_timing", DEFAULT_TIMING))
        knobs = ctx.knobs  # live K settings (admin API, `hermes knob set`) apply at once
        strategy.k_by_app = knobs.setdefault("app", {})
        strategy.k_by_tenant = knobs.setdefault("tenant", {})
        strategy.k_default = knobs.setdefault("default", {})
        return cls(ctx, nodes, runs, strategy,
                   kv_recent_s=getattr(sc, "prewarm_kv_recent_s", 0.0),
                   tick_s=getattr(sc, "prewarm_tick_s", 0.0))

    # ------------------------------------------------------------------ naming
    def resources(self, run: RunState | None, app: str, unit: str, backend: str) -> list[str]:
        """:func:`~hermes.core.prewarm.default_resources`, with a unit's KV prefix named per
        tenant (``kv:MODEL/TENANT/APP/UNIT``) and only once that tenant's shared prompt of the
        unit is known (seen in a request: :meth:`note_request`).

        Asked at every unit start (the unit's own, and each next unit the planner looks at):
        the names, a function of the tenant, app, unit, backend and the base model an
        adapter is served on, are built once (:meth:`_names`); what can change between two
        asks (whether the prefix is known, the KV resources remembered) is looked at each
        time."""
        tenant = run.tenant if run is not None else "default"
        spec = self._spec.get(backend)
        if spec is None:
            spec = BackendSpec.parse(backend)
            if len(self._spec) >= MAX_PREFIXES:
                self._spec.clear()
            self._spec[backend] = spec
        base = None
        if spec.kind == "llm" and not spec.lora:
            base = self.nodes.base_model(spec.name)
        key = (tenant, app, unit, backend, base)
        names = self._named.get(key)
        if names is None:
            names = self._names(tenant, app, unit, backend, spec, base)
            if len(self._named) >= MAX_PREFIXES:
                self._named.clear()
            self._named[key] = names
        resources, adapter = names
        out = []
        for r, kv in resources:
            if kv:
                pkey = (tenant, app, unit)
                if pkey not in self.prefixes:
                    continue
                self._kv[r] = (tenant, app, unit, adapter)
                self._kv.move_to_end(r)
                if len(self._kv) > MAX_PREFIXES:
                    self._kv.popitem(last=False)
            out.append(r)
        return out

    @staticmethod
    def _names(tenant: str, app: str, unit: str, backend: str, spec: BackendSpec,
               base: str | None) -> tuple[tuple[tuple[str, bool], ...], str | None]:
        """The resources of :meth:`resources` before the prefix check: (name, whether it is
        the unit's KV prefix) each, and the adapter its requests use (``base``: the model
        an engine serves ``spec.name`` as an adapter of, the OpenAI API way)."""
        adapter = spec.lora
        if base is not None:
            backend, adapter = f"llm:{base}@{spec.name}", spec.name
        out = []
        for r in default_resources(None, app, unit, backend):
            if resource_kind(r) == "kv":
                out.append((f"kv:{resource_model(r)}/{tenant}/{app}/{unit}", True))
            else:
                out.append((r, False))
        return tuple(out), adapter

    def is_warm(self, resource: str, now: float) -> bool:
        return resource in self.warm

    def queue_key(self, run_id: str, unit: str) -> Key | None:
        """The queue key of a KV prewarm for ``unit`` of an active run, as the policy would key
        the run's own request for that unit now (:func:`hermes.core.ordering.prewarm_key`);
        ``None`` when the run is not active."""
        run = self.runs.runs.get(run_id)
        if run is None or run.status not in ACTIVE:
            return None
        return prewarm_key(self.ctx.policy, run.state, unit, self.ctx.now(), next(self.ctx.seq))

    # ------------------------------------------------------------------ run events
    def unit_started(self, run: LiveRun, inv: UnitInvocation, now: float) -> None:
        kv = [r for r in self.resources(run.state, run.app, inv.unit, inv.backend)
              if resource_kind(r) == "kv"]
        if kv:  # before planning: a prewarm due at once finds the prefix held
            self._holding[id(inv)] = (inv, kv)
            for r in kv:
                self._running[r] = self._running.get(r, 0) + 1
        self.on_unit_start(run.state, inv.unit, inv.backend, now)

    def unit_closed(self, run: LiveRun, inv: UnitInvocation, now: float) -> None:
        got = self._holding.pop(id(inv), None)
        if got is None or got[0] is not inv:
            return
        if self.kv_recent_s > 0:
            closed, recent = time.monotonic(), self._recent
            for r in got[1]:
                recent.pop(r, None)  # (re-inserted: the newest last)
                recent[r] = closed
            while len(recent) > MAX_PREFIXES:
                del recent[next(iter(recent))]
        for r in got[1]:
            left = self._running.get(r, 0) - 1
            if left > 0:
                self._running[r] = left
            else:
                self._running.pop(r, None)

    def run_ended(self, run: LiveRun) -> None:
        for inv in run.units:  # a cancelled run's units are not closed one by one
            if id(inv) in self._holding:
                self.unit_closed(run, inv, 0.0)
        self.on_run_finish(run.state, self.ctx.now())

    # ------------------------------------------------------------------ scheduler hooks
    def note_request(self, app: str, unit: str, body: dict[str, Any],
                     tenant: str = "default") -> None:
        """Remember a unit's shared prefix for ``tenant``: the system message of its chat
        requests (:func:`~hermes.gateway.prefixes.shared_prefix`)."""
        self.note_prefix(app, unit, shared_prefix(body), tenant)

    def note_prefix(self, app: str, unit: str, prefix: str | None,
                    tenant: str = "default") -> None:
        """:meth:`note_request` given the prefix (an edge's call carries it)."""
        if prefix is not None:
            key = (tenant, app, unit)
            self.prefixes[key] = prefix
            self.prefixes.move_to_end(key)
            if len(self.prefixes) > MAX_PREFIXES:
                self.prefixes.popitem(last=False)

    def on_unit_start(self, run: RunState, unit: str, backend: str, now: float) -> None:
        self._apply(self.strategy.on_unit_start(run, unit, backend, now, self), now)

    def on_run_finish(self, run: RunState, now: float) -> None:
        self._apply(self.strategy.on_run_finish(run, now), now)

    def on_ack(self, msg: PrewarmAck) -> None:
        if not msg.ok:
            self.acks_failed += 1
            self.warm.discard(msg.backend)
            log.info("prewarm %s %s failed: %s", msg.action, msg.backend, msg.detail)
            return
        if msg.action == "start" and msg.detail.startswith("warmup_s="):
            try:
                self.strategy.observe_warmup(msg.backend, float(msg.detail.split("=", 1)[1]))
            except ValueError:
                pass

    def _hold(self, a: PrewarmAction) -> bool:
        """Whether a KV prefix action needs no message: a start while a unit whose requests
        carry that prefix is running (the engine computes and holds its blocks for that
        request: a prefill of the same prefix would only cost the engine and this process a
        request), or within ``kv_recent_s`` of such a unit's end (its blocks are the most
        recently used of the engine's prefix cache, the last it would evict: an engine
        evicts only under allocation pressure, least recently used first), and the release
        of such a start. The planner's decision and counters are unchanged (the prefix is
        warm, as it planned); what it saves is the round trip, at every turn of an agent
        whose next turn shares the running (or just ended) turn's prompt prefix."""
        if a.action == "start" and (
                self._running.get(a.resource)
                or time.monotonic() - self._recent.get(a.resource, float("-inf"))
                < self.kv_recent_s):
            self._held.add(a.pid)
            self.held += 1
            self.warm.add(a.resource)
            return True
        if a.action == "release" and a.pid in self._held:
            self._held.discard(a.pid)
            self.warm.discard(a.resource)
            return True
        return False

    def stats(self) -> dict[str, Any]:
        """Planner counters, overall (``prewarm_*``) and per backend type (``by_type``: what
        ``hermes.metrics`` exports as ``hermes_prewarm_*{backend_type=...}``);
        ``prewarm_held``: KV prefix starts not sent because a running request held the
        prefix."""
        out: dict[str, Any] = {f"prewarm_{k}": v for k, v in self.strategy.stats().items()}
        out["prewarm_held"] = self.held
        out["by_type"] = self.strategy.stats_by_type()
        out["prewarm_sent_start"] = self.sent["start"]
        out["prewarm_sent_release"] = self.sent["release"]
        out["prewarm_acks_failed"] = self.acks_failed
        return out

    # ------------------------------------------------------------------ internals
    def _due(self) -> None:
        self._timer = self._timer_at = self._timer_due = None
        try:
            now = self.ctx.now()
            self._apply(self.strategy.due(now), now)
        except Exception:
            log.exception("prewarm wake-up failed")

    def _apply(self, actions: list[PrewarmAction], now: float) -> None:
        if self.on_action is not None:  # tracing: decisions are events of their runs' spans
            for a in actions:
                self.on_action(a, now)
        for a in actions:
            if a.action == "release" and a.used and resource_kind(a.resource) in ("docker", "dnn"):
                self.warm.discard(a.resource)  # the unit took the instance
                continue
            self._signal(a)
        self._set_timer(now)

    def _set_timer(self, now: float) -> None:
        """The wake-up for the planner's next due prewarm (none when nothing is planned).

        On the tick grid: the planner sets one per plan (a start, then an idle release), and
        most ended unstarted (the run's next unit came first) or fell due within a few ms of
        another, so that one wake-up per prewarm was ~2 event-loop wake-ups per agent request;
        on the grid, the prewarms due within one tick share one, each at most tick_s late
        (the simulator is not affected: it calls the planner at the times it computes).

        Moved when what it was set for ended first (a unit start or a run's end resolved
        it), or dropped when nothing is left: it used to fire for nothing then. At one
        agent client after 10,000 requests it fired 0.30 times per request, 0.09 so (a
        wake-up of the loop each, mostly idle at one client; cProfile call counts)."""
        nxt = self.strategy.next_due()
        timer = self._timer
        if nxt is None:
            if timer is not None:
                timer.cancel()
                self._timer = self._timer_at = self._timer_due = None
            return
        if timer is not None and self._timer_due == nxt:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        at = loop.time() + max(0.0, self.ctx.clock.wall_s(nxt - now))
        if self.tick_s > 0:
            at = math.ceil(at / self.tick_s) * self.tick_s
        if timer is not None:
            if self._timer_at == at:  # the same tick
                self._timer_due = nxt
                return
            timer.cancel()
        self._timer_at, self._timer_due = at, nxt
        self._timer = loop.call_at(at, self._due)

    def _signal(self, a: PrewarmAction) -> None:
        kind, _, name = a.resource.partition(":")
        if kind == "kv" and self._hold(a):
            return
        params: dict[str, Any] = {"run_id": a.run_id, "unit": a.unit, "pid": a.pid}
        try:
            if kind in ("docker", "dnn"):
                node = self.nodes.pick_tool_node(a.resource)
            else:
                node, _ = self.nodes.pick_engine(resource_model(a.resource))
                if kind == "kv":
                    key = self._kv.get(a.resource)
                    if key is None:
                        return
                    prefix = self.prefixes.get(key[:3])
                    if prefix is None:
                        return
                    params["prefix"] = prefix
                    if key[3]:
                        params["model"] = key[3]  # prefill with the unit's adapter
                    qkey = self.queue_key(a.run_id, a.unit) if a.run_id else None
                    if qkey is not None:  # the node queues it as the unit's request
                        params["key"] = list(qkey)
            self.nodes.send(node, Prewarm(backend=a.resource, action=a.action, params=params))
        except Exception as exc:  # no node for it: the unit will warm it reactively
            log.debug("prewarm %s %s not sent: %s", a.action, a.resource, exc)
            return
        self.sent[a.action] += 1
        if a.action == "start":
            self.warm.add(a.resource)
        else:
            self.warm.discard(a.resource)

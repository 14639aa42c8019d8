"""The live scheduler: the asyncio driver of the decision core, composed of small services.

:class:`LiveScheduler` builds and wires, for one gateway:

- a :class:`~hermes.gateway.context.SchedulerContext` (config, scheduler clock, policy and
  estimator pool, counters, metrics hooks) that every service shares;
- the run registry (:mod:`hermes.gateway.runs`): runs and unit invocations, their lifecycle,
  the policy hooks at the same points as the simulator;
- the node table (:mod:`hermes.gateway.nodes`): the ZeroMQ ROUTER socket and in-process
  links, connected HermesLets, engine choice;
- dispatch (:mod:`hermes.gateway.dispatch`): pending requests, sending, results, re-keying,
  failover;
- the prewarm planner (:mod:`hermes.gateway.prewarm`), learning
  (:mod:`hermes.gateway.learning`), durability (:mod:`hermes.gateway.durable`), recovery
  (:mod:`hermes.gateway.recovery`), hosted runs (:mod:`hermes.gateway.hosted`) and run
  identities (:mod:`hermes.gateway.identity`: runs inferred from plain traffic), which hear
  of runs as observers of the registry.

Its methods delegate to those services; it keeps only what spans them: start and stop, the
periodic sweep (re-key everything, drop silent nodes, close idle inferred runs, finish idle
client runs), recovery on
start and the live policy switch. Decision logic lives in :mod:`hermes.core`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Set
from typing import Any, Literal

import zmq.asyncio

from hermes.core.costmodel import CostModel, get_cost_model
from hermes.core.ordering import Key
from hermes.core.policies.base import SchedulingPolicy, policy_class
from hermes.core.policy_switch import adopt_runs
from hermes.gateway.config import GatewayConfig, resolve_state_dir
from hermes.gateway.context import (
    SchedulerClock,
    SchedulerContext,
    build_pool,
    startup_policy,
)
from hermes.gateway.dispatch import Dispatcher
from hermes.gateway.durable import DurableState
from hermes.gateway.errors import (
    ModelNotFound,
    NoCapacity,
    RequestFailed,
    RunCancelled,
    RunNotActive,
    RunNotFound,
    SchedulerError,
    WrongTask,
)
from hermes.gateway.finished import FinishedRun, FinishedRuns
from hermes.gateway.hosted import HostedApp, HostedRegistry, HostedRuns
from hermes.gateway.identity import RunIdentities
from hermes.gateway.learning import Learner, open_kb
from hermes.gateway.nodes import NODE_TIMEOUT_S, NodeTable
from hermes.gateway.prewarm import GatewayPrewarmer
from hermes.gateway.recovery import Recovery, Replay
from hermes.gateway.run_store import open_run_store
from hermes.gateway.runs import RunRegistry
from hermes.gateway.slices import SlicedQueue
from hermes.gateway.state import ACTIVE, LiveRun, Node, PendingRequest, UnitInvocation
from hermes.inproc import InprocLink
from hermes.protocol import Done, EncodedBody, EngineInfo, Token, ToolDone

#: the service types and errors, for code that speaks to the scheduler
__all__ = [
    "ACTIVE", "LiveRun", "LiveScheduler", "ModelNotFound", "NoCapacity", "PendingRequest",
    "RequestFailed", "RunCancelled", "RunNotActive", "RunNotFound", "SchedulerError",
    "UnitInvocation", "WrongTask",
]

log = logging.getLogger("hermes.gateway.scheduler")


class LiveScheduler:
    """The gateway's scheduler: runs, dispatch, nodes, learning, durability (module doc)."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        context: zmq.asyncio.Context | None = None,
        kb: Any | None = None,
        evidence_index: Any | None = None,
    ) -> None:
        """``evidence_index``: the run resolver's index in the shared store
        (:class:`hermes.gateway.shared.evidence.RedisKeyIndex`; default: in memory)."""
        self.config = config
        sc = config.scheduler
        cost: CostModel = get_cost_model(sc.cost_model)
        self.kb = kb if kb is not None else open_kb(config.stores.kb, config.stores.state_dir)
        pool = build_pool(config, self.kb, cost)
        self.ctx = SchedulerContext(config=config, clock=SchedulerClock(sc.time_scale),
                                    cost=cost, policy=startup_policy(config, pool), pool=pool)
        self.context = context or zmq.asyncio.Context.instance()
        state_dir = resolve_state_dir(config.stores.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.records_path = state_dir / "records.jsonl"

        ctx = self.ctx
        self.registry = RunRegistry(ctx)
        self.node_table = NodeTable(ctx, self.context,
                                    f"inproc://hermes-nodes-{uuid.uuid4().hex[:8]}")
        self.learner = Learner(ctx, self.kb, self.records_path)
        # the request path reads the graphs the learner has built, never builds one
        self.prewarm = GatewayPrewarmer.build(ctx, self.node_table, self.registry,
                                              self.learner.serving_graph)  # issue 5
        self.dispatch = Dispatcher(ctx, self.registry, self.node_table, self.prewarm,
                                   self.learner.serving_graph)
        self.node_table.handler = self.dispatch.handle
        # durable run state, recovery (issue 7)
        self.durable = DurableState(open_run_store(config), ctx, self.registry.finished)
        self.recovery = Recovery(ctx, self.durable, self.registry, self.dispatch,
                                 self.node_table, self.learner)
        self.hosted_runs = HostedRuns(self, config)
        # the order the registry tells them in: requests first (cancelled, re-keyed), then
        # prewarms, the record (before the durable end: see Learner.run_ended), the store,
        # and the hosted app's code
        # requests -> runs and units: Hermes headers, or runs inferred from plain traffic
        self.identities = RunIdentities(ctx, self.registry, config.identity,
                                        state_dir=state_dir, kb=self.kb,
                                        shared_index=evidence_index)
        for obs in (self.dispatch, self.prewarm, self.learner, self.durable, self.hosted_runs,
                    self.identities):
            self.registry.add_observer(obs)
        self._tasks: list[asyncio.Task[None]] = []
        #: runs closed and waiting to be finished a slice at a time (the resolver's sweep;
        #: an edge link adds its own): ``hermes_runs_closing``
        self.closing_queues: list[SlicedQueue[Any]] = [self.identities.closing]
        #: ``HERMES_ROLE_CPU=1``: the CPU time of the scheduler's own work (node messages,
        #: submissions, the sweep; not the HTTP edge's) in ``stats["scheduler_cpu_ns"]``,
        #: what a separate scheduler process would spend (``hermes bench ha --scale``)
        self.meter = os.environ.get("HERMES_ROLE_CPU") == "1"
        if self.meter:
            self.ctx.stats["scheduler_cpu_ns"] = 0
            self.node_table.meter = True
            self.identities.closing.work = self._metered(self.identities.closing.work)

    def _metered(self, work: Callable[[Any], object]) -> Callable[[Any], None]:
        """``work`` with its CPU time counted as the scheduler's (``HERMES_ROLE_CPU``)."""
        stats = self.ctx.stats

        def metered(item: Any) -> None:
            c0 = time.thread_time_ns()
            try:
                work(item)
            finally:
                stats["scheduler_cpu_ns"] += time.thread_time_ns() - c0
        return metered

    # ------------------------------------------------------------------ shared state
    @property
    def runs(self) -> dict[str, LiveRun]:
        """Active runs by id (ended ones are in :attr:`finished`)."""
        return self.registry.runs

    @property
    def finished(self) -> FinishedRuns:
        """Kept finished runs, compactly (:mod:`hermes.gateway.finished`)."""
        return self.registry.finished

    @property
    def requests(self) -> dict[str, PendingRequest]:
        """Requests sent to nodes and not settled, by id."""
        return self.dispatch.requests

    @property
    def nodes(self) -> dict[str, Node]:
        """Connected HermesLets by name."""
        return self.node_table.nodes

    @property
    def policy(self) -> SchedulingPolicy:
        return self.ctx.policy

    @property
    def pool(self) -> Any | None:
        """The policy's estimator pool (None for a policy without estimates)."""
        return self.ctx.pool

    @property
    def cost(self) -> CostModel:
        return self.ctx.cost

    @property
    def stats(self) -> dict[str, int]:
        return self.ctx.stats

    @property
    def knobs(self) -> dict[str, dict[str, float]]:
        """The K knob per scope (``default``, ``app``, ``tenant``), set by the admin API."""
        return self.ctx.knobs

    @property
    def metrics(self) -> Any:
        """Metrics hooks (:class:`hermes.metrics.GatewayMetrics`, set by the app) or None."""
        return self.ctx.metrics

    @metrics.setter
    def metrics(self, value: Any) -> None:
        self.ctx.metrics = value

    @property
    def time_scale(self) -> float:
        return self.ctx.clock.time_scale

    @property
    def inproc_address(self) -> str:
        return self.node_table.inproc_address

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Bind the ROUTER socket (inproc always, TCP when configured) and start the loops."""
        self.node_table.bind()
        self._tasks = [
            asyncio.create_task(self.node_table.recv_loop(), name="hermes-recv"),
            asyncio.create_task(self._sweep_loop(), name="hermes-sweep"),
            asyncio.create_task(self.learner.learn_loop(), name="hermes-learn"),
        ]

    async def stop(self) -> None:
        self.hosted_runs.close()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        self.identities.closing.drain_now()  # the runs closed idle end (not saved active)
        for req in list(self.dispatch.requests.values()):
            req.settle(exc=NoCapacity("gateway shutting down"))
        self.node_table.close()
        try:
            self.learner.flush()
        except Exception:
            log.exception("final knowledge-base flush failed")
        self.identities.save()
        self.recovery.close()
        self.durable.save_active(list(self.registry.runs.values()))
        self.durable.close()
        self.learner.close()

    def recover(self, apps: HostedRegistry) -> None:
        """Resume or fail the runs stored before a restart (:mod:`hermes.gateway.recovery`;
        hosted runs by replaying ``apps``' code). Also starts watching the node socket for
        disconnects, so that a dead node's work moves in seconds."""
        self.node_table.start_monitor(self.dispatch.redispatch)

        def launch(run: LiveRun, app: HostedApp, replay: Replay) -> None:
            self.hosted_runs.launch(run, app, replay=replay)

        self.recovery.recover(apps.get, launch)
        self.identities.load()

    def now(self) -> float:
        """The scheduler clock (model seconds; epoch time when ``time_scale`` is 1)."""
        return self.ctx.clock.now()

    def wall_s(self, model_s: float) -> float:
        """Wall seconds that ``model_s`` model seconds take at the configured time scale."""
        return self.ctx.clock.wall_s(model_s)

    async def _sweep_loop(self) -> None:
        """Periodic work: rekey everything, drop silent nodes, finish idle client runs."""
        sc = self.config.scheduler
        while True:
            await asyncio.sleep(sc.rekey_interval_s)
            c0 = time.thread_time_ns() if self.meter else 0
            try:
                t0 = time.perf_counter()
                self.dispatch.rekey_all()
                if self.metrics is not None:
                    self.metrics.on_rank_refresh(time.perf_counter() - t0)
                self.node_table.drop_silent(NODE_TIMEOUT_S, self.dispatch.redispatch)
                self.identities.sweep()
                self.registry.reap_idle(self.identities.closes_itself)
            except Exception:
                log.exception("scheduler sweep failed")
            if self.meter:
                self.ctx.stats["scheduler_cpu_ns"] += time.thread_time_ns() - c0

    def switch_policy(self, name: str) -> dict[str, Any]:
        """Install policy ``name`` live: every active run is ranked afresh and every queued
        request re-keyed at its node (``ValueError`` for an unknown policy)."""
        cls = policy_class(name)  # ValueError names the known policies
        previous = self.config.scheduler.policy
        self.config.scheduler.policy = name
        try:
            pool = (build_pool(self.config, self.kb, self.ctx.cost, name)
                    if getattr(cls, "uses_estimator", False) else None)
            if pool is not None:
                # the learned graphs as the learner holds them (its worker thread may be
                # feeding a profiler now: a profiler is read under its lock, by app_graph)
                for app in list(self.learner.profilers):
                    with contextlib.suppress(Exception):
                        graph = self.learner.app_graph(app)
                        if graph is not None:
                            pool.update(graph)
            # through the sample memo, as at startup (and within fair-share bands)
            policy = startup_policy(self.config, pool)
        except Exception:
            self.config.scheduler.policy = previous
            raise
        self.ctx.pool, self.ctx.policy = pool, policy
        now = self.now()
        n = adopt_runs(policy, (r.state for r in self.registry.active()), now)
        before = self.stats["rekeys_sent"]
        self.dispatch.rekey_all()
        if self.metrics is not None:
            self.metrics.on_policy_switch()
        return {"policy": name, "previous": previous, "runs_reranked": n,
                "requests_rekeyed": self.stats["rekeys_sent"] - before}

    # ------------------------------------------------------------------ runs
    def create_run(self, app: str, *, deadline_s: float | None = None, tenant: str | None = None,
                   k: float | None = None, input: Any = None, hosted: bool = False,
                   auto_finish: bool = False,
                   idempotency: dict[str, str] | None = None,
                   run_id: str | None = None) -> LiveRun:
        """A new run (:meth:`hermes.gateway.runs.RunRegistry.create_run`); ``run_id``: the
        id an idempotency claim reserved (default: a new one)."""
        return self.registry.create_run(app, deadline_s=deadline_s, tenant=tenant, k=k,
                                        input=input, hosted=hosted, auto_finish=auto_finish,
                                        idempotency=idempotency, run_id=run_id)

    def get_run(self, run_id: str) -> LiveRun | FinishedRun:
        try:
            return self.registry.get_run(run_id)
        except RunNotFound:
            self._still_restoring()
            raise

    def active_run(self, run_id: str) -> LiveRun:
        try:
            return self.registry.active_run(run_id)
        except RunNotFound:
            self._still_restoring()
            raise

    def recent_runs(self, match: Callable[[Any], bool],
                    limit: int) -> list[LiveRun | FinishedRun]:
        """Up to ``limit`` runs for which ``match`` holds, newest first."""
        return self.registry.recent_runs(match, limit)

    def idempotent_run(self, tenant: str,
                       key: str) -> tuple[LiveRun | FinishedRun, str] | None:
        found = self.registry.idempotent_run(tenant, key)
        if found is None:  # the key's run may be an ended one not restored yet
            self._still_restoring()
        return found

    def _still_restoring(self) -> None:
        """A lookup that missed while a new leader restores the ended runs in the background
        (:mod:`hermes.gateway.ha`): 503, retry, rather than a 404 or a second run."""
        if self.recovery.restoring_ended:
            raise NoCapacity("this scheduler took over moments ago and is still restoring "
                             "the stored runs; retry in a second")

    def finish_run(self, run_id: str, *, result: Any = None) -> LiveRun:
        return self.registry.finish_run(run_id, result=result)

    def fail_run(self, run_id: str, error: str) -> None:
        self.registry.fail_run(run_id, error)

    def cancel_run(self, run_id: str) -> LiveRun:
        return self.registry.cancel_run(run_id)

    def launch_hosted(self, run: LiveRun, app: HostedApp) -> None:
        """Run a hosted app's code for ``run`` (:mod:`hermes.gateway.hosted`)."""
        self.hosted_runs.launch(run, app)

    def begin_unit(self, run: LiveRun, unit: str, backend: str, *, explicit: bool = True,
                   upstream: str | None = None, at: float | None = None) -> UnitInvocation:
        return self.registry.begin_unit(run, unit, backend, explicit=explicit,
                                        upstream=upstream, at=at)

    def end_unit(self, run: LiveRun, inv: UnitInvocation, *,
                 duration_s: float | None = None) -> None:
        self.registry.end_unit(run, inv, duration_s=duration_s)

    def unit_for_request(self, run: LiveRun, unit: str, backend: str) -> UnitInvocation:
        return self.registry.unit_for_request(run, unit, backend)

    def unit_event(self, run: LiveRun, unit: str, event: str, *, backend: str | None = None,
                   at: float | None = None) -> UnitInvocation | None:
        return self.registry.unit_event(run, unit, event, backend=backend, at=at)

    def credit_tool_time(self, run: LiveRun, seconds: float) -> None:
        self.registry.credit_tool_time(run, seconds)

    # ------------------------------------------------------------------ nodes and dispatch
    async def wait_for_nodes(self, timeout: float = 10.0) -> bool:
        return await self.node_table.wait_for_nodes(timeout)

    def inproc_link(self, node: str) -> InprocLink:
        return self.node_table.inproc_link(node)

    def served_models(self, task: str | None = None) -> list[str]:
        return self.node_table.served_models(task)

    def base_model(self, model: str) -> str | None:
        return self.node_table.base_model(model)

    def resolve_model(self, model: str | None, *, strict: bool, task: str = "generate") -> str:
        return self.node_table.resolve_model(model, strict=strict, task=task)

    async def serving_model(self, model: str | None, *, strict: bool,
                            task: str = "generate") -> str:
        return await self.node_table.serving_model(model, strict=strict, task=task)

    def no_tool_sandbox(self) -> bool:
        """Connected nodes, none of which runs tool calls (none has a sandbox)."""
        return self.node_table.no_tool_sandbox()

    def _pick_engine(self, model: str, exclude: Set[str] = frozenset()) -> tuple[Node, EngineInfo]:
        """:meth:`hermes.gateway.nodes.NodeTable.pick_engine` (tests ask it directly)."""
        return self.node_table.pick_engine(model, exclude)

    def prewarm_key(self, run_id: str, unit: str) -> Key | None:
        return self.prewarm.queue_key(run_id, unit)

    async def submit_llm(self, run: LiveRun, inv: UnitInvocation, *, model: str,
                         endpoint: Literal["chat", "completions", "embeddings"],
                         body: dict[str, Any] | EncodedBody, stream: bool = False,
                         native: dict[str, Any] | None = None, request_id: str | None = None,
                         reply_to: str | None = None,
                         prompt_tokens: int | None = None) -> PendingRequest:
        if not self.meter:
            return await self.dispatch.submit_llm(run, inv, model=model, endpoint=endpoint,
                                                  body=body, stream=stream, native=native,
                                                  request_id=request_id, reply_to=reply_to,
                                                  prompt_tokens=prompt_tokens)
        c0 = time.thread_time_ns()
        try:
            return await self.dispatch.submit_llm(run, inv, model=model, endpoint=endpoint,
                                                  body=body, stream=stream, native=native,
                                                  request_id=request_id, reply_to=reply_to,
                                                  prompt_tokens=prompt_tokens)
        finally:
            self.ctx.stats["scheduler_cpu_ns"] += time.thread_time_ns() - c0

    def submit_llm_now(self, run: LiveRun, inv: UnitInvocation, *, model: str,
                       endpoint: Literal["chat", "completions", "embeddings"],
                       body: dict[str, Any] | EncodedBody, stream: bool = False,
                       native: dict[str, Any] | None = None, request_id: str | None = None,
                       reply_to: str | None = None,
                       prompt_tokens: int | None = None) -> PendingRequest:
        """:meth:`submit_llm` from a loop callback, with a node connected (see
        :meth:`hermes.gateway.dispatch.Dispatcher.submit_llm_now`)."""
        c0 = time.thread_time_ns() if self.meter else 0
        try:
            return self.dispatch.submit_llm_now(run, inv, model=model, endpoint=endpoint,
                                                body=body, stream=stream, native=native,
                                                request_id=request_id, reply_to=reply_to,
                                                prompt_tokens=prompt_tokens)
        finally:
            if self.meter:
                self.ctx.stats["scheduler_cpu_ns"] += time.thread_time_ns() - c0

    async def submit_tool(self, run: LiveRun, inv: UnitInvocation, *, backend: str,
                          code: str | None = None, command: list[str] | None = None,
                          timeout_s: float = 30.0) -> PendingRequest:
        return await self.dispatch.submit_tool(run, inv, backend=backend, code=code,
                                               command=command, timeout_s=timeout_s)

    async def wait(self, req: PendingRequest, timeout: float | None = None) -> Done | ToolDone:
        return await self.dispatch.wait(req, timeout)

    def stream(self, req: PendingRequest) -> AsyncIterator[Token]:
        return self.dispatch.stream(req)

    def abandon(self, req: PendingRequest) -> bool:
        return self.dispatch.abandon(req)

    def rekey_all(self) -> None:
        self.dispatch.rekey_all()

    # ------------------------------------------------------------------ learning
    def recorded_run_ids(self, tail_bytes: int = 1 << 16) -> set[str]:
        return self.learner.recorded_run_ids(tail_bytes)

    def refresh_graphs(self, apps: set[str] | None = None) -> dict[str, Any]:
        return self.learner.refresh_graphs(apps)

    def flush_learning(self) -> None:
        self.learner.flush()

    def app_graph(self, app: str) -> Any | None:
        return self.learner.app_graph(app)

    def put_graph(self, graph: Any) -> None:
        self.learner.put_graph(graph)

    def rename_app(self, name: str, to: str) -> dict[str, Any]:
        """Rename the inferred app ``name`` (:meth:`RunIdentities.rename`); its learned PDGraph
        is copied to the new name, so that the next runs are ranked as the old ones taught."""
        app_id = self.identities.rename(name, to)
        copied = self._copy_graph(name, to)
        return {"app_id": app_id, "name": to, "previous": name, "pdgraph_copied": copied}

    def merge_app(self, name: str, into: str) -> dict[str, Any]:
        """Merge the inferred app ``name`` into ``into`` (:meth:`RunIdentities.merge`): its
        next runs are runs of ``into`` and teach ``into``'s PDGraph."""
        target = self.identities.merge(name, into)
        return {"app_id": target, "name": into, "merged": name}

    def _copy_graph(self, name: str, to: str) -> bool:
        if name == to or self.learner.app_graph(to) is not None:
            return False
        graph = self.learner.app_graph(name)
        if graph is None:
            return False
        copy = type(graph).from_json(graph.to_json(), source=f"app {name!r}")
        copy.app = to
        self.put_graph(copy)
        return True

    def app_names(self) -> list[str]:
        return self.learner.app_names()

    def learned_runs(self, app: str) -> int:
        """Finished runs of ``app`` learned from since the gateway started."""
        return self.learner.profiled_runs.get(app, 0)

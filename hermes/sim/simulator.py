"""Discrete-event simulator: application runs on modelled engines and tools, in virtual time.

Inputs: application arrivals (time, app, seed, optional deadline), a cost setup (engines of one
model, :data:`SETUP_ENGINES`), a scheduling policy and, for the policies that need it, an
estimator pool. Each run executes its app model's generator (``AppModel.steps(rng)`` with
``rng = numpy.random.default_rng(seed)``) step by step, so the truth (what the run will still
do) stays inside the generator: the policy sees only what a live gateway would see
(:class:`~hermes.core.state.RunState`: finished units with their observed tokens, the current
unit, attained service). Only for a policy with ``uses_truth`` (the oracle) the simulator sets
``run.true_remaining_s`` from a replay of the same generator with the same seed.

The policy hooks are called as a live gateway calls them: ``on_arrival``, ``on_unit_start``,
``on_service`` (after each engine step that advanced the run's requests, and when a tool call
finishes), ``on_unit_finish`` and ``on_finish``. Every queue (engine waiting queues, tool
queues) is ordered by ``policy.request_key``; when a run's rank changes, its queued requests
are re-keyed.

Service accounting: the service a run has *attained* is measured in the estimator's unit,
isolated service seconds under the cost model (``CostModel.unit_service_s`` of the tokens its
current unit has processed so far: prompt tokens prefilled once, tokens generated), plus the
service time of finished tool calls. At a unit's end this equals the isolated service of the
unit that the estimator predicts, so conditioning on attained service is consistent. (The wall
time of a batched engine iteration is shared by the batch; splitting it by tokens would make
attained service depend on the load, which the estimator's samples do not.) Recomputation
after a preemption is not counted as service.

Events: one per engine step (a step may cover many decode iterations, see
:meth:`EngineModel.step`; when a request reaches an engine whose multi-iteration step is in
flight, the step is cut at the first iteration boundary after the arrival, exactly), one per
tool call completion, one per arrival and one per inter-step gap.

Every LLM backend of an app runs on the setup's engines (one model per setup); a request goes
to the engine the router picks (:mod:`hermes.core.routing`, ``router``; least outstanding work by
default, as the gateway).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from hermes.core.costmodel import CostModel, get_cost_model, split_mode
from hermes.core.engine_model import (
    EngineModel,
    EngineRequest,
    PrefixCache,
    StepResult,
)
from hermes.core.kv_gate import KvGate
from hermes.core.ordering import policy_key, prewarm_key
from hermes.core.pdgraph import UNKNOWN_NEXT_LLM_P, PDGraph, next_llm_p
from hermes.core.records import RequestRecord, RunRecord, UnitRecord
from hermes.core.routing import EngineState, RouteRequest, RouteStats, make_router
from hermes.core.state import RequestView, RunState, UnitObservation
from hermes.core.tools_model import ToolCall, ToolPool, ToolStart
from hermes.workloads.base import AppModel, LLMCall, Step

#: cost setups: name -> (cost model of one engine, number of engines)
SETUP_ENGINES: dict[str, tuple[str, int]] = {
    "llama2-7b-a100": ("llama2-7b-a100", 1),
    "llama3-70b-h800x8": ("llama3-70b-h800-tp4", 2),
}

#: the in-flight window the gateway gives an engine by default (``[[engines]] max_inflight``):
#: the denominator of an engine's load for the routers, as live
ROUTE_WINDOW = 32

_ARRIVE, _START, _ENGINE, _TOOL = 0, 1, 2, 3
_PREWARM = 4  # prewarm planner wake-up (hermes.sim.warm)


def setup_engines(setup: str, mode: str | None = None) -> tuple[CostModel, int]:
    """The cost model of one engine and the engine count of a named setup, in scheduler mode
    ``mode`` or the name's ``@MODE`` suffix (``vllm-v1`` | ``vllm-0.4``; default v1)."""
    base, suffix = split_mode(setup)
    if mode is None:
        mode = suffix
    if base in SETUP_ENGINES:
        name, n = SETUP_ENGINES[base]
        return get_cost_model(name, mode=mode), n
    return get_cost_model(setup, mode=mode), 1


@dataclass(frozen=True, slots=True)
class Arrival:
    """One application run to submit: when, which app, its seed, its (absolute) deadline."""

    time: float
    app: str
    seed: int
    deadline: float | None = None
    tenant: str | None = None  # default: the app name (VTC shares service among apps)
    run_id: str | None = None


@dataclass(slots=True)
class RunResult:
    run_id: str
    app: str
    submitted: float
    finished: float
    deadline: float | None
    units: int
    llm_requests: int
    input_tokens: int
    output_tokens: int
    #: time it spent waiting in engine queues: over its LLM units, the longest wait of a unit's
    #: requests (parallel requests wait side by side), each request's wait being from queued
    #: (or preempted) to the start of the engine step that served it again
    wait_s: float = 0.0

    @property
    def act_s(self) -> float:
        return self.finished - self.submitted

    @property
    def met(self) -> bool | None:
        return None if self.deadline is None else self.finished <= self.deadline + 1e-9


@dataclass(slots=True)
class SimResult:
    runs: list[RunResult]
    records: list[RunRecord]
    events: int
    engine_steps: int
    engine_iterations: int
    preemptions: int
    cold_starts: int
    wall_s: float
    end_time: float
    warm: dict = field(default_factory=dict)  # prewarm / cache counters (SimWarmState.stats)

    def acts(self) -> np.ndarray:
        return np.array([r.act_s for r in self.runs])


def isolated_step_service(steps: Sequence[Step], cost: CostModel, *,
                          tools: bool = True) -> list[float]:
    """Isolated service seconds of each step (LLM: cost model; tool: its warm duration, or 0
    with ``tools=False``: the engine service alone, what the policies order by)."""
    out = []
    for s in steps:
        if s.is_llm:
            if s.requests:
                i = np.array([r.input_tokens for r in s.requests], dtype=float)
                o = np.array([r.output_tokens for r in s.requests], dtype=float)
                out.append(float(cost.unit_service_s(i, o)))
            else:
                out.append(0.0)
        else:
            out.append(float(s.duration_s or 0.0) if tools else 0.0)
    return out


def _unit_attained(reqs: Sequence[EngineRequest], cost: CostModel) -> tuple[float, int]:
    """Isolated service and tokens (prompt tokens prefilled once, tokens generated) of what
    the requests of a unit have processed so far (see the module docstring)."""
    done = [r.prompt_done for r in reqs]
    gen = [r.generated for r in reqs]
    s = cost.partial_service_s(done, gen, [r.input_tokens for r in reqs])
    return s, sum(done) + sum(gen)


@dataclass(slots=True)
class _Run:
    state: RunState
    app: AppModel
    gen: Iterator[Step]
    step: Step | None = None
    index: int = -1  # index of the current step
    unit_started: float = 0.0
    unit_attained: float = 0.0
    unit_tokens: int = 0
    llm_reqs: list[EngineRequest] = field(default_factory=list)
    pending: int = 0
    views: dict[str, tuple[RequestView, int]] = field(default_factory=dict)  # id -> (view, where)
    tool_call: str | None = None
    truth_suffix: list[float] | None = None  # oracle: isolated service of steps i.. end
    units: list[UnitRecord] = field(default_factory=list)
    n_requests: int = 0
    in_tokens: int = 0
    out_tokens: int = 0
    queued_at: dict[str, float] = field(default_factory=dict)  # waiting request id -> since
    unit_waits: dict[str, float] = field(default_factory=dict)  # this unit's request waits
    wait_s: float = 0.0  # engine-queue wait of its finished units (RunResult.wait_s)


class Simulator:
    """Runs a set of application arrivals under one policy; see the module docstring."""

    def __init__(
        self,
        policy: object,
        *,
        cost: CostModel,
        n_engines: int = 1,
        apps: Callable[[str], AppModel] | Mapping[str, AppModel] | None = None,
        tools: ToolPool | None = None,
        record: bool = True,
        warm: object | None = None,
        prefix_cache: Callable[[], PrefixCache] | None = None,
        router: str = "least-loaded",
        retention: object | None = None,
        history_apps: Collection[str] = (),
        route_graphs: Mapping[str, PDGraph] | None = None,
        kv_gate: KvGate | None = None,
    ) -> None:
        self.policy = policy
        self.cost = cost
        # engine choice, as the gateway's (hermes.core.routing; scheduler.router)
        self.router = make_router(router)
        self.route_stats = RouteStats()
        # route_graphs: app -> PDGraph: a request's ``next_llm_p`` (will the run prompt an
        # engine again after this unit?) as the gateway reads it from the run's graph
        self.route_graphs = route_graphs or {}
        # prefix_cache: one cache per engine (as the HermesLet's built-in engine keeps one, so
        # that a live run and its simulation see the same prefix hits); default none.
        # kv_gate: the HermesLet's KV gate in front of every engine (hermes.core.kv_gate)
        self.engines = [
            EngineModel(cost, name=f"engine{i}",
                        prefix_cache=prefix_cache() if prefix_cache is not None else None,
                        kv_gate=kv_gate)
            for i in range(n_engines)
        ]
        self.tools = tools or ToolPool()
        self.record = record
        self._apps = apps
        self._app_cache: dict[str, AppModel] = {}
        self.uses_truth = bool(getattr(policy, "uses_truth", False))
        # policies whose request keys read state other than the run (VTC's tenant counters)
        # or the clock (a bounded-wait guard's promotion: ``aging_keys``)
        self.dynamic_keys = policy.dynamic_keys or bool(getattr(policy, "aging_keys", False))
        # backend warm state and prewarming (hermes.sim.warm.SimWarmState), optional
        self.warm = warm
        if warm is not None:
            warm.bind(self)
        # history_apps: apps whose LLM prompts grow with the run's own history (agent loops):
        # their requests' prefix key is the run's conversation (as the gateway's rolling
        # message digests), so the run's earlier turns are a cached prefix of its next one
        self.history_apps = frozenset(history_apps)
        # KV retention through tool calls (hermes.sim.retention.SimRetention), optional
        self.retention = retention
        if retention is not None:
            retention.bind(self.engines)

    # ------------------------------------------------------------------ setup helpers
    def app(self, name: str) -> AppModel:
        app = self._app_cache.get(name)
        if app is None:
            if self._apps is None:
                from hermes.workloads.registry import get_app

                app = get_app(name)
            elif isinstance(self._apps, Mapping):
                app = self._apps[name]
            else:
                app = self._apps(name)
            if isinstance(app, type):
                app = app()
            self._app_cache[name] = app
        return app

    # ------------------------------------------------------------------ main loop
    def run(self, arrivals: Sequence[Arrival], progress: Callable[[int], None] | None = None) -> SimResult:
        t_wall = time.perf_counter()
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = itertools.count()
        self._req_seq = itertools.count()
        self._runs: dict[str, _Run] = {}
        self._inflight: dict[int, tuple[float, StepResult, int]] = {}
        self._engine_version = [0] * len(self.engines)
        self._where_engine: dict[str, int] = {}
        self._results: list[RunResult] = []
        self._records: list[RunRecord] = []
        self._progress = progress
        self._steps = self._iters = self._preempt = 0
        for i, a in enumerate(arrivals):
            self._push(a.time, _ARRIVE, (a, i))
        events = 0
        now = 0.0
        heap = self._heap
        while heap:
            now, _, kind, payload = heapq.heappop(heap)
            events += 1
            if kind == _ENGINE:
                ei, version = payload  # type: ignore[misc]
                if version == self._engine_version[ei]:
                    self._engine_done(ei, now)
            elif kind == _TOOL:
                self._tool_done(payload, now)  # type: ignore[arg-type]
            elif kind == _START:
                self._start_unit(payload, now)  # type: ignore[arg-type]
            elif kind == _PREWARM:
                self.warm.due(now)  # type: ignore[union-attr]
            else:
                self._arrive(*payload, now)  # type: ignore[misc]
        unfinished = [r.state.run_id for r in self._runs.values()]
        if unfinished:
            raise RuntimeError(f"simulation ended with unfinished runs: {unfinished[:5]}")
        return SimResult(
            runs=sorted(self._results, key=lambda r: r.submitted),
            records=self._records,
            events=events,
            engine_steps=self._steps,
            engine_iterations=self._iters,
            preemptions=self._preempt,
            cold_starts=sum(s.cold_starts for s in self.tools.servers.values()),
            wall_s=time.perf_counter() - t_wall,
            end_time=now,
            warm=self.warm.stats() if self.warm is not None else {},
        )

    def _push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, payload))

    def schedule_prewarm(self, t: float) -> None:
        """Prewarm hook: wake the warm state's planner at ``t``."""
        self._push(t, _PREWARM, None)

    def prewarm_key(self, run_id: str, unit: str, now: float) -> tuple:
        """Prewarm hook: the queue key of a prewarm request for ``unit`` of ``run_id``, as the
        policy would key the run's own request arriving now (first when the run is gone)."""
        run = self._runs.get(run_id)
        if run is None:
            return (float("-inf"),)
        return prewarm_key(self.policy, run.state, unit, now, next(self._req_seq))

    def prewarm_queue_changed(self, ei: int, now: float) -> None:
        """Prewarm hook: a prefill-only request was queued on engine ``ei``, or taken out of
        its queue (the engine steps again from ``now``)."""
        self._engine_changed(ei, now)

    # ------------------------------------------------------------------ runs and units
    def _arrive(self, a: Arrival, i: int, now: float) -> None:
        app = self.app(a.app)
        run_id = a.run_id or f"{a.app}-{i}"
        state = RunState(
            run_id=run_id,
            app=a.app,
            submitted=now,
            tenant=a.tenant or a.app,
            deadline=a.deadline,
        )
        run = _Run(state=state, app=app, gen=iter(app.steps(np.random.default_rng(a.seed))))
        if self.uses_truth:
            steps = list(app.steps(np.random.default_rng(a.seed)))
            svc = isolated_step_service(steps, self.cost, tools=False)  # engine service
            suffix = [0.0] * (len(svc) + 1)
            for k in range(len(svc) - 1, -1, -1):
                suffix[k] = suffix[k + 1] + svc[k]
            run.truth_suffix = suffix
            state.true_remaining_s = suffix[0]
        self._runs[run_id] = run
        self.policy.on_arrival(state, now)
        self._advance(run, now)

    def _truth(self, run: _Run) -> None:
        if run.truth_suffix is not None:
            k = run.index
            if run.step is None:  # between units: everything from the next step on
                run.state.true_remaining_s = run.truth_suffix[k + 1]
            else:
                run.state.true_remaining_s = max(
                    0.0, run.truth_suffix[k] - run.state.progress.current_attained_s
                )

    def _advance(self, run: _Run, now: float) -> None:
        step = next(run.gen, None)
        if step is None:
            self._finish_run(run, now)
            return
        run.index += 1
        run.step = None
        if step.gap_s > 0:
            self._push(now + step.gap_s, _START, (run, step))
        else:
            self._start_unit((run, step), now)

    def _start_unit(self, payload: tuple[_Run, Step], now: float) -> None:
        run, step = payload
        run.step = step
        st = run.state
        st.begin_unit(step.unit)
        run.unit_started = now
        run.unit_attained = 0.0
        run.unit_tokens = 0
        self._truth(run)
        self.policy.on_unit_start(st, step.unit, now)
        if self.warm is not None:
            self.warm.on_unit_start(st, step, now)
        if step.is_llm:
            run.llm_reqs = []
            if not step.requests:
                self._finish_unit(run, now)
                return
            run.pending = len(step.requests)
            touched: set[int] = set()
            for j, call in enumerate(step.requests):
                rid = f"{st.run_id}/{run.index}/{j}"
                shared = call
                if st.app in self.history_apps:
                    call = dataclasses.replace(call, prefix=f"{st.run_id}#{call.prefix}",
                                               prefix_tokens=call.input_tokens)
                view = RequestView(
                    request_id=rid,
                    run_id=st.run_id,
                    unit=step.unit,
                    arrival=now,
                    input_tokens=call.input_tokens,
                    seq=next(self._req_seq),
                )
                req = EngineRequest(
                    request_id=rid,
                    run_id=st.run_id,
                    input_tokens=call.input_tokens,
                    output_tokens=call.output_tokens,
                    key=policy_key(self.policy, st, view, now),
                    prefix=call.prefix,
                    prefix_tokens=call.prefix_tokens,
                )
                if self.warm is not None:
                    self.warm.on_request(st, step, call, req)
                ei = self._route(st.run_id, call, now, shared,
                                 next_llm_p(self.route_graphs.get(st.app), step.unit))
                if self.retention is not None:
                    self.retention.on_route(st.run_id, call.prefix, ei)
                self.engines[ei].add(req, now)
                run.queued_at[rid] = now
                run.llm_reqs.append(req)
                run.views[rid] = (view, ei)
                touched.add(ei)
            if self.warm is not None:
                self.warm.on_enqueue(st, step, now)
            for ei in touched:
                self._engine_changed(ei, now)
        else:
            cid = f"{st.run_id}/{run.index}"
            view = RequestView(request_id=cid, run_id=st.run_id, unit=step.unit, arrival=now,
                               seq=next(self._req_seq))
            run.views[cid] = (view, -1)
            run.tool_call = cid
            call = ToolCall(cid, st.run_id, float(step.duration_s or 0.0),
                            key=policy_key(self.policy, st, view, now))
            server = self.tools.server(step.backend)
            if self.warm is not None:
                self.warm.on_enqueue(st, step, now)
            if self.retention is not None:
                self.retention.on_tool_start(st, step, now)
            self._tool_starts(server.submit(call, now), step.backend)

    def _finish_unit(self, run: _Run, now: float) -> None:
        step = run.step
        assert step is not None
        st = run.state
        if step.is_llm:
            i_tok = sum(r.input_tokens for r in step.requests)
            o_tok = sum(r.output_tokens for r in step.requests)
            par = max(1, len(step.requests))
            dur = now - run.unit_started
            run.wait_s += max(run.unit_waits.values(), default=0.0)
            run.unit_waits.clear()
            run.n_requests += len(step.requests)
            run.in_tokens += i_tok
            run.out_tokens += o_tok
        else:
            i_tok = o_tok = 0
            par = 1
            dur = float(step.duration_s or 0.0)
        obs = UnitObservation(
            unit=step.unit,
            input_tokens=i_tok,
            output_tokens=o_tok,
            parallelism=par,
            duration_s=dur,
            service_s=run.unit_attained if step.is_llm else 0.0,  # engine service only
            started=run.unit_started,
            finished=now,
        )
        if self.record:
            run.units.append(
                UnitRecord(
                    unit=step.unit,
                    backend=step.backend,
                    started=run.unit_started,
                    finished=now,
                    requests=[
                        RequestRecord(input_tokens=r.input_tokens, output_tokens=r.output_tokens)
                        for r in step.requests
                    ]
                    if step.is_llm
                    else None,
                    duration_s=None if step.is_llm else dur,
                    upstream=step.upstream,
                )
            )
        st.end_unit(obs)
        run.step = None
        run.llm_reqs = []
        run.tool_call = None
        self._truth(run)
        self._policy_call(run, now, self.policy.on_unit_finish, st, obs, now)
        self._advance(run, now)

    def _finish_run(self, run: _Run, now: float) -> None:
        st = run.state
        st.finished = now
        self.policy.on_finish(st, now)
        if self.retention is not None:
            self.retention.on_run_finish(st.run_id)
        if self.warm is not None:
            self.warm.on_run_finish(st, now)
        del self._runs[st.run_id]
        self._results.append(
            RunResult(
                run_id=st.run_id,
                app=st.app,
                submitted=st.submitted,
                finished=now,
                deadline=st.deadline,
                units=len(st.progress.finished),
                llm_requests=run.n_requests,
                input_tokens=run.in_tokens,
                output_tokens=run.out_tokens,
                wait_s=run.wait_s,
            )
        )
        if self.record:
            self._records.append(
                RunRecord(
                    app=st.app,
                    run_id=st.run_id,
                    submitted=st.submitted,
                    finished=now,
                    deadline=st.deadline,
                    units=run.units,
                )
            )
        if self._progress is not None:
            self._progress(1)

    # ------------------------------------------------------------------ ranks and keys
    def _policy_call(self, run: _Run, now: float, hook: Callable, *args: object) -> None:
        """Call a policy hook; re-key the run's queued requests if its rank changed."""
        before = run.state.rank
        hook(*args)
        if run.state.rank != before and run.views:
            self._rekey(run, now)

    def _rekey(self, run: _Run, now: float) -> None:
        st = run.state
        changed: set[int] = set()
        for rid, (view, ei) in run.views.items():
            key = policy_key(self.policy, st, view, now)
            if ei >= 0:
                eng = self.engines[ei]
                if rid in eng.waiting:
                    changed.add(ei)
                eng.update_key(rid, key)
            else:
                assert run.step is not None
                self.tools.server(run.step.backend).update_key(rid, key)
        for ei in changed:
            self._engine_changed(ei, now)

    def _rekey_all(self, ei: int, now: float) -> None:
        eng = self.engines[ei]
        runs = self._runs
        for req in list(eng.waiting.items()):
            run = runs.get(req.run_id)
            if run is None:
                continue  # a prewarm's prefill-only request
            view, _ = run.views[req.request_id]
            eng.update_key(req.request_id, policy_key(self.policy, run.state, view, now))

    # ------------------------------------------------------------------ engines
    def _route(self, run_id: str, call: LLMCall, now: float, shared: LLMCall | None = None,
               follow_p: float = UNKNOWN_NEXT_LLM_P) -> int:
        """The engine of an LLM call: the router's choice, each engine described as the
        gateway describes it (requests outstanding over the gateway's default in-flight
        window, :data:`ROUTE_WINDOW`; then prompt tokens still to prefill), the call's shared
        prefix (its name) as its one prefix key. With ``least-loaded``, the engine with the
        least outstanding work (ties: the first)."""
        if len(self.engines) == 1:
            return 0
        cap = float(ROUTE_WINDOW)
        states = [EngineState(str(i), n / cap, todo)
                  for i, (n, todo) in enumerate(e.outstanding() for e in self.engines)]
        keys = [(call.prefix, call.prefix_tokens)] if call.prefix else []
        if shared is not None and shared.prefix and shared.prefix != call.prefix:
            keys.insert(0, (shared.prefix, shared.prefix_tokens))  # the shared system prompt
        route = RouteRequest(run_id, keys, call.input_tokens, follow_p)
        chosen = self.router.pick(route, states, now).engine
        self.route_stats.note(chosen, call.input_tokens,
                              self.router.index.matched_tokens(chosen, route.prefixes))
        self.router.sent(route, chosen, now)
        return int(chosen)

    def _engine_changed(self, ei: int, now: float) -> None:
        """The waiting queue of engine ``ei`` changed: start a step, or cut a long one."""
        inflight = self._inflight.get(ei)
        if inflight is None:
            self._kick(ei, now)
            return
        t0, res, _ = inflight
        if res.iterations <= 1:
            return
        eng = self.engines[ei]
        keep = eng.iterations_started(res, now - t0)
        if keep < res.iterations:
            eng.truncate(res, keep)
            self._engine_version[ei] += 1
            self._inflight[ei] = (t0, res, self._engine_version[ei])
            self._push(t0 + res.duration_s, _ENGINE, (ei, self._engine_version[ei]))

    def _kick(self, ei: int, now: float) -> None:
        eng = self.engines[ei]
        if ei in self._inflight or not eng.has_work:
            return
        if self.dynamic_keys and eng.waiting:
            self._rekey_all(ei, now)
        res = eng.step(now, until=math.inf)
        if res.idle:
            return
        self._steps += 1
        self._engine_version[ei] += 1
        self._inflight[ei] = (now, res, self._engine_version[ei])
        self._push(now + res.duration_s, _ENGINE, (ei, self._engine_version[ei]))

    def _engine_done(self, ei: int, now: float) -> None:
        t0, res, _ = self._inflight.pop(ei)
        self._iters += res.iterations
        self._preempt += len(res.preempted)
        runs = self._runs
        self._note_waits(ei, res, t0, now)
        # in a deterministic order (dicts keep insertion order; sets of str do not)
        touched = dict.fromkeys(rid.rsplit("/", 2)[0] for rid in res.emitted)
        touched.update(dict.fromkeys(rid.rsplit("/", 2)[0] for rid in res.prefilled))
        for run_id in touched:
            run = runs.get(run_id)
            if run is None:
                continue  # a prewarm's prefill-only request
            new, new_tokens = _unit_attained(run.llm_reqs, self.cost)
            delta = new - run.unit_attained
            ntok = new_tokens - run.unit_tokens
            if ntok == 0:
                continue  # only recomputation after a preemption: no new service
            run.unit_attained = new
            run.unit_tokens = new_tokens
            st = run.state
            st.credit(delta, ntok, unit_attained_s=new)
            self._truth(run)
            self._policy_call(run, now, self.policy.on_service, st, delta, ntok, now)
        for rid in res.finished:
            run_id = rid.rsplit("/", 2)[0]
            run = runs.get(run_id)
            if run is None:
                continue  # a prewarm's prefill-only request
            del run.views[rid]
            run.pending -= 1
            if run.pending == 0:
                self._finish_unit(run, now)
        self._kick(ei, now)

    def _note_waits(self, ei: int, res: StepResult, t0: float, now: float) -> None:
        """Queue-wait accounting (``RunResult.wait_s``): a waiting request that the step
        started at ``t0`` served stops waiting at ``t0``; a preempted one waits again from
        ``now`` (when it is back in engine ``ei``'s waiting queue)."""
        runs = self._runs
        waiting = self.engines[ei].waiting
        for rid in itertools.chain(res.prefilled, res.emitted):
            run = runs.get(rid.rsplit("/", 2)[0])
            if run is not None:
                since = run.queued_at.pop(rid, None)
                if since is not None:
                    run.unit_waits[rid] = run.unit_waits.get(rid, 0.0) + max(0.0, t0 - since)
        for rid in res.preempted:
            run = runs.get(rid.rsplit("/", 2)[0])
            if run is not None and rid in waiting:
                run.queued_at[rid] = now

    # ------------------------------------------------------------------ tools
    def _tool_starts(self, starts: list[ToolStart], backend: str) -> None:
        for s in starts:
            self._push(s.finish_at, _TOOL, (s.run_id, s.call_id, backend))

    def _tool_done(self, payload: tuple[str, str, str], now: float) -> None:
        run_id, cid, backend = payload
        self._tool_starts(self.tools.server(backend).complete(cid, now), backend)
        run = self._runs[run_id]
        step = run.step
        assert step is not None
        del run.views[cid]
        if self.retention is not None:
            self.retention.on_tool_done(run_id, now)
        dur = float(step.duration_s or 0.0)
        run.unit_attained = dur
        st = run.state
        st.credit(dur, 0, unit_attained_s=dur)
        self._truth(run)
        self._policy_call(run, now, self.policy.on_service, st, dur, 0, now)
        self._finish_unit(run, now)

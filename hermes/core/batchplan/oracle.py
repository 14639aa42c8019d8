"""Run-time predictions of one model under one plan: SamuLLM's sampling-then-simulation.

A :class:`Segment` is a model running under one plan from some point on: its loading time, the
time to finish its remaining requests, when each request finishes, and its cumulative work
(FLOPs) against time (the stage throughput of Algorithm 1 is FLOPs over time). An oracle
(:class:`SegmentOracle`) produces segments; the search only ever asks an oracle.

- :class:`EngineOracle`: the paper's cost model. Each of the ``dp`` replicas is an
  :class:`~hermes.core.engine_model.EngineModel` (FCFS continuous batching, vLLM v1
  scheduling, the iteration costs of :func:`hermes.core.cluster.cost.to_cost_model`) fed
  round-robin; requests join when the requests they wait for have finished (upstream models'
  finish times are given by the caller). Output lengths are the application's (sampled from
  eCDFs beforehand). Iterations are simulated one by one (pure-decode stretches in closed form,
  exact for this cost model).
- :class:`TableOracle`: a model is ``k`` equal sequential requests with a given run time per GPU
  count (the paper's worked example, Figure 1; tests).

Preemption: a model whose plan changes is reloaded and its unfinished requests start over
(finished ones are kept), as when SamuLLM restarts a model's engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from hermes.core.batchplan.workload import App, ReqKey
from hermes.core.cluster.cost import (
    Plan,
    fits,
    load_s,
    to_cost_model,
    uniform_placement,
)
from hermes.core.cluster.devices import DeviceType
from hermes.core.cluster.topology import Cluster
from hermes.core.costmodel import CostModel
from hermes.core.engine_model import EngineModel, EngineRequest


@dataclass(frozen=True, slots=True)
class Segment:
    """A model under one plan from the segment's start (times relative to it)."""

    model: str
    plan: Plan
    load_s: float
    run_s: float  # after loading, until the last request finishes (inf: some never ready)
    finish: Mapping[int, float]  # request id -> finish time (from the segment start)
    times: np.ndarray  # cumulative work curve: time points (from the segment start) ...
    work: np.ndarray  # ... and FLOPs done by then
    #: each request's work (same unit); what a preemption throws away is the work done on
    #: requests not finished yet (:meth:`lost_at`)
    req_work: Mapping[int, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return self.load_s + self.run_s

    def work_at(self, t: float) -> float:
        return float(np.interp(t, self.times, self.work))

    def lost_at(self, t: float) -> float:
        """Work done by ``t`` on requests still unfinished then: lost if the model is stopped
        or re-planned at ``t`` (its unfinished requests start over)."""
        if not self.req_work:
            return 0.0
        kept = sum(self.req_work.get(r, 0.0) for r, f in self.finish.items() if f <= t + 1e-9)
        return max(0.0, self.work_at(t) - kept)

    def done_by(self, t: float) -> frozenset[int]:
        return frozenset(r for r, f in self.finish.items() if f <= t + 1e-9)


class SegmentOracle(Protocol):
    """What the search needs to know about models and plans."""

    n_gpus: int

    def plans(self, model: str) -> list[Plan]:
        """The model's feasible plans on at most ``n_gpus`` GPUs."""
        ...

    def segment(self, model: str, plan: Plan, done: frozenset[int],
                upstream: Mapping[ReqKey, float], *, load: bool) -> Segment:
        """Run ``model``'s requests not in ``done`` under ``plan``; a request waiting for
        another model's request may start at ``upstream[key]`` (from the segment start; a
        key that is absent is never ready within this segment). ``load``: the model is
        (re)loaded first."""
        ...


def plans_for(n_gpus: int) -> list[Plan]:
    """All (dp, tp) with tp a power of two and dp * tp <= n_gpus."""
    out = []
    tp = 1
    while tp <= n_gpus:
        for dp in range(1, n_gpus // tp + 1):
            out.append(Plan(dp, tp))
        tp *= 2
    return out


class EngineOracle:
    """SamuLLM's sampling-then-simulation cost model on the engine model (module doc)."""

    def __init__(self, app: App, device: DeviceType, n_gpus: int, *,
                 interconnect: str = "nvlink-pairs") -> None:
        self.app = app
        self.device = device
        self.n_gpus = n_gpus
        self.interconnect = interconnect
        self._plans: dict[str, list[Plan]] = {}
        self._costs: dict[tuple[str, int], CostModel] = {}

    def plans(self, model: str) -> list[Plan]:
        if model not in self._plans:
            spec = self.app.models[model].spec
            ok = []
            for p in plans_for(self.n_gpus):
                if not spec.valid_tp(p.tp):
                    continue
                cl = Cluster.single(self.device, p.tp, self.interconnect)
                if fits(cl, uniform_placement(spec, cl.gpus(), p.tp)):
                    ok.append(p)
            self._plans[model] = ok
        return self._plans[model]

    def _cost(self, model: str, tp: int) -> CostModel:
        key = (model, tp)
        if key not in self._costs:
            self._costs[key] = to_cost_model(self.app.models[model].spec, self.device, tp,
                                             interconnect=self.interconnect)
        return self._costs[key]

    def segment(self, model: str, plan: Plan, done: frozenset[int],
                upstream: Mapping[ReqKey, float], *, load: bool) -> Segment:
        node = self.app.models[model]
        spec = node.spec
        lt = load_s(spec, plan) if load else 0.0
        todo = [r for r in node.requests if r.rid not in done]
        cost = self._cost(model, plan.tp)
        engines = [EngineModel(cost, name=f"{model}#{i}") for i in range(plan.dp)]
        home = {r.rid: i % plan.dp for i, r in enumerate(todo)}
        reqs = {r.rid: r for r in todo}
        # readiness: outstanding prerequisite count, earliest start (after loading)
        waiting_on: dict[int, int] = {}
        ready_at: dict[int, float] = {}
        dependents: dict[int, list[int]] = {}
        never: set[int] = set()
        for r in todo:
            n = 0
            t = lt
            for m, rid in r.after:
                if m == model:
                    if rid not in done:
                        n += 1
                        dependents.setdefault(rid, []).append(r.rid)
                elif (m, rid) in upstream:
                    t = max(t, upstream[(m, rid)])
                else:
                    never.add(r.rid)
            waiting_on[r.rid] = n
            ready_at[r.rid] = t
        pending: list[list[tuple[float, int]]] = [[] for _ in engines]
        for r in todo:
            if waiting_on[r.rid] == 0 and r.rid not in never:
                pending[home[r.rid]].append((ready_at[r.rid], r.rid))
        for p in pending:
            p.sort(reverse=True)  # pop() takes the earliest
        clock = [lt] * len(engines)
        finish: dict[int, float] = {}
        per_token = 2.0 * (spec.active_params - spec.embedding_params)
        t_pts = [0.0, lt]
        w_pts = [0.0, 0.0]
        work = 0.0
        order = {r.rid: i for i, r in enumerate(todo)}
        while True:
            best = -1
            best_t = float("inf")
            for i, e in enumerate(engines):
                if e.has_work:
                    t = clock[i]
                elif pending[i]:
                    t = max(clock[i], pending[i][-1][0])
                else:
                    continue
                if t < best_t:
                    best, best_t = i, t
            if best < 0:
                break
            i, e = best, engines[best]
            clock[i] = best_t
            while pending[i] and pending[i][-1][0] <= clock[i] + 1e-12:
                _, rid = pending[i].pop()
                r = reqs[rid]
                e.add(EngineRequest(str(rid), model, r.input_tokens, r.output_tokens,
                                    key=(float(order[rid]),)), clock[i])
            until = pending[i][-1][0] if pending[i] else float("inf")
            res = e.step(clock[i], until=until)
            if res.idle:
                continue
            clock[i] += res.duration_s
            work += per_token * (res.prefill_tokens + res.decode_tokens)
            t_pts.append(clock[i])
            w_pts.append(work)
            for sid in res.finished:
                rid = int(sid)
                finish[rid] = clock[i]
                for d in dependents.get(rid, ()):
                    waiting_on[d] -= 1
                    ready_at[d] = max(ready_at[d], clock[i])
                    if waiting_on[d] == 0 and d not in never:
                        lst = pending[home[d]]
                        lst.append((ready_at[d], d))
                        lst.sort(reverse=True)
        run = (max(finish.values()) if finish else lt) - lt
        if len(finish) < len(todo):
            run = float("inf")
        order_t = np.argsort(np.asarray(t_pts), kind="stable")
        times = np.asarray(t_pts)[order_t]
        works = np.maximum.accumulate(np.asarray(w_pts)[order_t])
        req_work = {r.rid: per_token * (r.input_tokens + r.output_tokens) for r in todo}
        return Segment(model, plan, lt, run, finish, times, works, req_work)


class TableOracle:
    """Toy oracle (module doc): ``times[model][g]`` is the model's run time on ``g`` GPUs
    (``Plan(1, g)``); it runs as ``k`` equal sequential requests; ``load`` seconds to (re)load."""

    def __init__(self, times: Mapping[str, Mapping[int, float]], n_gpus: int, *, k: int = 100,
                 load: float = 0.0, upstream: Mapping[str, Sequence[str]] | None = None) -> None:
        self.times = times
        self.n_gpus = n_gpus
        self.k = k
        self.load = load
        self.ups = {m: tuple((upstream or {}).get(m, ())) for m in times}

    def plans(self, model: str) -> list[Plan]:
        return [Plan(1, g) for g in sorted(self.times[model]) if g <= self.n_gpus]

    def segment(self, model: str, plan: Plan, done: frozenset[int],
                upstream: Mapping[ReqKey, float], *, load: bool) -> Segment:
        lt = self.load if load else 0.0
        per = self.times[model][plan.tp] / self.k
        t = lt
        for u in self.ups[model]:  # waits for every request of its upstream models
            ends = [upstream.get((u, i)) for i in range(self.k)]
            if any(e is None for e in ends):
                return Segment(model, plan, lt, float("inf"), {}, np.array([0.0, lt]),
                               np.array([0.0, 0.0]))
            t = max(t, *(e for e in ends if e is not None))
        finish: dict[int, float] = {}
        times = [0.0, t]
        work = [0.0, 0.0]
        for i in range(self.k):
            if i in done:
                continue
            t += per
            finish[i] = t
            times.append(t)
            work.append(work[-1] + self.times[model][1] / self.k)  # work: 1-GPU seconds
        return Segment(model, plan, lt, t - lt, finish, np.array(times), np.array(work),
                       {i: self.times[model][1] / self.k for i in finish})


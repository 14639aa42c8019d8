"""Execution-stage search: SamuLLM's greedy (Algorithm 1), its baselines, exhaustive search.

An execution stage is a set of (model, plan) pairs that run together on the node; it ends when
its first model finishes (the paper: stage duration ``t_E = min t_{M,P}``), and then every
unfinished model is reconsidered. A model keeps running across the boundary when the next
stage gives it the same plan (no reload); otherwise it is stopped (preempted) or reloaded under
its new plan (loading time counted, unfinished requests restart).

Planners (:data:`PLANNERS`; each returns a :class:`Schedule`):

- ``greedy`` (SamuLLM, Algorithm 1): grow the stage by the (model, plan) with the highest
  stage-throughput gain per added GPU (a new model, or a model moved to a plan with more GPUs)
  until no candidate fits or none raises the throughput. Models are ready when their upstream
  models are finished or in the stage (model-level pipelining).
  Preemptive stages are charged the work they throw away (requests in flight on a model that
  is stopped or re-planned start over): the stage grown from nothing is weighed against the
  one grown around the running models, each net of that loss (:meth:`Planner.greedy_stage`);
  without it the search stops models seconds from their end to make stages longer for
  newly loaded ones (on 8xA100-80, ensembling: 352.2 s plain, 262.9 s priced).
- ``greedy-plain``: Algorithm 1 as written (no charge for preemption), for comparison.
- ``greedy-nopreempt``: the paper's no-preemption variant: a running model keeps its plan and
  GPUs until it finishes; only free GPUs go to new models.
- ``max``: all GPUs to one model at a time (the first ready one), its best plan.
- ``min``: as many ready models as fit, GPUs split as evenly as possible (every way of handing
  out the remainder is evaluated; the highest-throughput one is taken), each model's best plan
  within its share; preemptive (re-split at every stage boundary), ``min-nopreempt`` not.
- :func:`exhaustive`: every sequence of stages (tiny applications: tests).

Stage throughput is FLOPs over time (the paper's ``T_E``); candidate segments are simulated by
the oracle, several at once through ``simulate`` (the command layer passes a process pool).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hermes.core.batchplan.oracle import Segment, SegmentOracle
from hermes.core.batchplan.workload import App, ReqKey
from hermes.core.cluster.cost import Plan

#: a job for the oracle: (model, plan, done, upstream finish times, load)
Job = tuple[str, Plan, frozenset[int], tuple[tuple[ReqKey, float], ...], bool]
Simulate = Callable[[Sequence[Job]], list[Segment]]

INF = float("inf")


@dataclass(slots=True)
class Running:
    seg: Segment
    started: float  # absolute time the segment started


@dataclass(slots=True)
class State:
    """The application at a stage boundary."""

    now: float = 0.0
    done: dict[str, frozenset[int]] = field(default_factory=dict)
    finish_abs: dict[ReqKey, float] = field(default_factory=dict)
    running: dict[str, Running] = field(default_factory=dict)

    def copy(self) -> State:
        return State(self.now, dict(self.done), dict(self.finish_abs), dict(self.running))


@dataclass(frozen=True, slots=True)
class StagePair:
    model: str
    plan: Plan
    remaining_s: float  # predicted time from the stage start to the model's finish
    reload: bool  # (re)loaded at the stage start


@dataclass(frozen=True, slots=True)
class Stage:
    start_s: float
    duration_s: float
    pairs: tuple[StagePair, ...]
    throughput: float  # FLOP/s

    @property
    def n_gpus(self) -> int:
        return sum(p.plan.n_gpus for p in self.pairs)


@dataclass(slots=True)
class Schedule:
    planner: str
    stages: list[Stage]
    total_s: float
    evaluations: int = 0


@dataclass(slots=True)
class Evaluation:
    segs: dict[str, tuple[Segment, float]]  # model -> (segment, elapsed at the stage start)
    t_stage: float
    throughput: float


class Planner:
    """Shared machinery: the stage loop, candidate evaluation with a segment cache."""

    def __init__(self, app: App, oracle: SegmentOracle, *,
                 simulate: Simulate | None = None,
                 progress: Callable[[str], None] | None = None,
                 price_preemption: bool = True) -> None:
        self.app = app
        #: the greedy search charges a stage for the work its preemptions throw away
        self.price_preemption = price_preemption
        self.oracle = oracle
        self.order = app.validate()
        self.n = oracle.n_gpus
        self._sim = simulate or (lambda jobs: [oracle.segment(m, p, d, dict(u), load=ld)
                                               for m, p, d, u, ld in jobs])
        self._cache: dict[Job, Segment] = {}
        self.progress = progress or (lambda _msg: None)
        self.evaluations = 0
        for m in self.order:
            if not oracle.plans(m):
                raise ValueError(f"model {m!r} ({app.models[m].spec.name}) fits nowhere on "
                                 f"{self.n} GPUs")

    # ------------------------------------------------------------------ state helpers
    def finished(self, st: State, m: str) -> bool:
        return len(st.done.get(m, frozenset())) == len(self.app.models[m].requests)

    def unfinished(self, st: State) -> list[str]:
        return [m for m in self.order if not self.finished(st, m)]

    def ready(self, st: State, chosen: Iterable[str]) -> list[str]:
        c = set(chosen)
        return [m for m in self.unfinished(st) if m not in c
                and all(self.finished(st, u) or u in c for u in self.app.upstream(m))]

    # ------------------------------------------------------------------ evaluation
    def _job(self, st: State, m: str, plan: Plan, up_segs: Mapping[str, tuple[Segment, float]],
             load: bool) -> Job:
        ups: list[tuple[ReqKey, float]] = []
        for u in sorted(self.app.upstream(m)):
            for rid in st.done.get(u, frozenset()):
                ups.append(((u, rid), round(st.finish_abs[(u, rid)] - st.now, 6)))
            if u in up_segs:
                seg, el = up_segs[u]
                for rid, f in seg.finish.items():
                    if f > el + 1e-9:
                        ups.append(((u, rid), round(f - el, 6)))
        return (m, plan, st.done.get(m, frozenset()), tuple(sorted(ups)), load)

    def _continues(self, st: State, m: str, plan: Plan, stage: Mapping[str, Plan]) -> bool:
        r = st.running.get(m)
        if r is None or r.seg.plan != plan:
            return False
        return all(self.finished(st, u) or (u in st.running and stage.get(u) == st.running[u].seg.plan)
                   for u in self.app.upstream(m))

    def evaluate_many(self, st: State, stages: Sequence[Mapping[str, Plan]], *,
                      price_preemption: bool = False) -> list[Evaluation | None]:
        """Evaluate candidate stages (segments simulated in batches, upstream models first).
        ``price_preemption``: the work a running model loses when the stage stops or
        re-plans it (done on its unfinished requests, which start over) counts against the
        stage's FLOPs (the greedy search's "possible preemption costs are considered")."""
        results: list[dict[str, tuple[Segment, float]]] = [{} for _ in stages]
        for level in self._levels():
            jobs: list[Job] = []
            where: list[tuple[int, str, Job]] = []
            for i, stage in enumerate(stages):
                for m in level:
                    if m not in stage:
                        continue
                    plan = stage[m]
                    if self._continues(st, m, plan, stage):
                        r = st.running[m]
                        results[i][m] = (r.seg, st.now - r.started)
                        continue
                    same_plan = m in st.running and st.running[m].seg.plan == plan
                    job = self._job(st, m, plan, results[i], load=not same_plan)
                    where.append((i, m, job))
                    if job not in self._cache and job not in jobs:
                        jobs.append(job)
            if jobs:
                for job, seg in zip(jobs, self._sim(jobs), strict=True):
                    self._cache[job] = seg
            for i, m, job in where:
                results[i][m] = (self._cache[job], 0.0)
        out: list[Evaluation | None] = []
        for segs in results:
            self.evaluations += 1
            if not segs:
                out.append(None)
                continue
            t = min(seg.total_s - el for seg, el in segs.values())
            if t == INF or t <= 0:
                out.append(None)
                continue
            work = sum(seg.work_at(el + t) - seg.work_at(el) for seg, el in segs.values())
            if price_preemption:
                work -= sum(r.seg.lost_at(st.now - r.started) for m, r in st.running.items()
                            if m not in segs or segs[m][0] is not r.seg)
            out.append(Evaluation(segs, t, work / t))
        return out

    def _levels(self) -> list[list[str]]:
        depth: dict[str, int] = {}
        for m in self.order:
            depth[m] = 1 + max((depth[u] for u in self.app.upstream(m)), default=-1)
        levels: dict[int, list[str]] = {}
        for m, d in depth.items():
            levels.setdefault(d, []).append(m)
        return [levels[d] for d in sorted(levels)]

    # ------------------------------------------------------------------ the stage loop
    def advance(self, st: State, ev: Evaluation, stage: Mapping[str, Plan]) -> tuple[State, Stage]:
        t = ev.t_stage
        pairs = []
        nxt = State(st.now + t, dict(st.done), dict(st.finish_abs), {})
        for m, (seg, el) in ev.segs.items():
            started = st.now - el
            newly = seg.done_by(el + t) - st.done.get(m, frozenset())
            for rid in newly:
                nxt.finish_abs[(m, rid)] = started + seg.finish[rid]
            nxt.done[m] = st.done.get(m, frozenset()) | newly
            if not self.finished(nxt, m):
                nxt.running[m] = Running(seg, started)
            pairs.append(StagePair(m, stage[m], seg.total_s - el, reload=el == 0.0 and seg.load_s > 0))
        return nxt, Stage(st.now, t, tuple(sorted(pairs, key=lambda p: self.order.index(p.model))),
                          ev.throughput)

    def run(self, name: str, choose: Callable[[State], dict[str, Plan]]) -> Schedule:
        st = State()
        stages: list[Stage] = []
        while self.unfinished(st):
            stage = choose(st)
            if not stage:
                raise ValueError(f"{name}: no model can run with {self.n} GPUs "
                                 f"(unfinished: {', '.join(self.unfinished(st))})")
            ev = self.evaluate_many(st, [stage])[0]
            if ev is None:
                raise ValueError(f"{name}: stage {stage} makes no progress")
            st, s = self.advance(st, ev, stage)
            stages.append(s)
            self.progress(f"{name}: stage {len(stages)} at {s.start_s:.0f} s: "
                          + ", ".join(f"{p.model}[{p.plan}]" for p in s.pairs))
        return Schedule(name, stages, st.now, self.evaluations)

    # ------------------------------------------------------------------ planners
    def locked(self, st: State, preemptive: bool) -> dict[str, Plan]:
        return {} if preemptive else {m: r.seg.plan for m, r in st.running.items()}

    def greedy_stage(self, st: State, preemptive: bool = True) -> dict[str, Plan]:
        """Algorithm 1, lines 3-23. Preemptive, with ``price_preemption``: the stage grown
        from nothing (the paper's) is weighed against the stage grown around the running
        models kept as they are, each charged the work its preemptions throw away; the higher
        stage throughput wins (a plain greedy stage ignores what stopping a model costs)."""
        grown = self._grow(st, self.locked(st, preemptive))
        if not (preemptive and self.price_preemption and st.running):
            return grown
        kept = self._grow(st, self.locked(st, False))
        if kept == grown:
            return grown
        ev_g, ev_k = self.evaluate_many(st, [grown, kept], price_preemption=True)
        if ev_k is not None and (ev_g is None or ev_k.throughput > ev_g.throughput):
            return kept
        return grown

    def _grow(self, st: State, seed: Mapping[str, Plan]) -> dict[str, Plan]:
        """Lines 4-23 from ``seed`` (kept as it is): add or widen the pair of highest
        throughput gain per added GPU while one raises the stage throughput."""
        best: dict[str, Plan] = dict(seed)
        fixed = set(best)
        best_t = 0.0
        if best:  # (the gain rule itself is the paper's: stage throughput, no charge)
            ev0 = self.evaluate_many(st, [best])[0]
            best_t = ev0.throughput if ev0 else 0.0
        while True:
            used = sum(p.n_gpus for p in best.values())
            cands: list[dict[str, Plan]] = []
            for m in self.ready(st, best) + [m for m in best if m not in fixed]:
                for p in self.oracle.plans(m):
                    if m in best:
                        e = dict(best)
                        e[m] = p
                        if not used < used - best[m].n_gpus + p.n_gpus <= self.n:
                            continue
                    elif used + p.n_gpus <= self.n:
                        e = dict(best)
                        e[m] = p
                    else:
                        continue
                    cands.append(e)
            if not cands:
                break
            evs = self.evaluate_many(st, cands)
            pick, gain = None, -INF
            for e, ev in zip(cands, evs, strict=True):
                if ev is None:
                    continue
                dn = sum(p.n_gpus for p in e.values()) - used
                g = (ev.throughput - best_t) / dn
                if g > gain:
                    pick, gain, t = e, g, ev.throughput
            if pick is None or (best and gain <= 0):
                break
            best, best_t = pick, t
        return best

    def best_single(self, st: State, m: str, max_gpus: int,
                    base: Mapping[str, Plan] | None = None) -> Plan | None:
        """``m``'s plan of highest throughput on at most ``max_gpus`` GPUs (alone)."""
        plans = [p for p in self.oracle.plans(m) if p.n_gpus <= max_gpus]
        evs = self.evaluate_many(st, [{**(base or {}), m: p} for p in plans])
        scored = [(ev.throughput, -p.n_gpus, p) for p, ev in zip(plans, evs, strict=True) if ev]
        return max(scored, key=lambda x: (x[0], x[1]))[2] if scored else None

    def max_stage(self, st: State) -> dict[str, Plan]:
        r = st.running
        if r:  # one model at a time: it runs to its end
            m = next(iter(r))
            return {m: r[m].seg.plan}
        for m in self.ready(st, ()):
            p = self.best_single(st, m, self.n)
            if p is not None:
                return {m: p}
        return {}

    def min_stage(self, st: State, preemptive: bool = True) -> dict[str, Plan]:
        stage = self.locked(st, preemptive)
        free = self.n - sum(p.n_gpus for p in stage.values())
        models: list[str] = []
        need = 0
        for m in self.ready(st, stage):
            lo = min(p.n_gpus for p in self.oracle.plans(m))
            if need + lo <= free:
                models.append(m)
                need += lo
        if not models:
            return stage
        k = len(models)
        base, extra = divmod(free, k)
        best: tuple[float, dict[str, Plan]] | None = None
        combos = list(itertools.islice(itertools.combinations(range(k), extra), 64))
        for combo in combos:
            share = [base + (1 if i in combo else 0) for i in range(k)]
            e = dict(stage)
            for i, m in enumerate(models):
                p = self.best_single(st, m, max(share[i], 1))
                if p is None:
                    p = min(self.oracle.plans(m), key=lambda q: q.n_gpus)
                e[m] = p
            if sum(p.n_gpus for p in e.values()) > self.n:
                continue
            ev = self.evaluate_many(st, [e])[0]
            if ev and (best is None or ev.throughput > best[0]):
                best = (ev.throughput, e)
        return best[1] if best else stage


def plan(app: App, oracle: SegmentOracle, planner: str, *, simulate: Simulate | None = None,
         progress: Callable[[str], None] | None = None) -> Schedule:
    """Run one planner of :data:`PLANNERS` on ``app``."""
    if planner not in PLANNERS:
        raise ValueError(f"unknown planner {planner!r}; known: {', '.join(PLANNERS)}")
    pl = Planner(app, oracle, simulate=simulate, progress=progress,
                 price_preemption=planner != "greedy-plain")
    choose: Callable[[State], dict[str, Plan]] = {
        "greedy": lambda s: pl.greedy_stage(s, True),
        "greedy-plain": lambda s: pl.greedy_stage(s, True),
        "greedy-nopreempt": lambda s: pl.greedy_stage(s, False),
        "max": pl.max_stage,
        "min": lambda s: pl.min_stage(s, True),
        "min-nopreempt": lambda s: pl.min_stage(s, False),
    }[planner]
    return pl.run(planner, choose)


PLANNERS = ("greedy", "greedy-plain", "greedy-nopreempt", "max", "min", "min-nopreempt")


def exhaustive(app: App, oracle: SegmentOracle, *, max_stages: int = 8) -> Schedule:
    """The best preemptive stage sequence by exhaustive search (tiny applications only)."""
    pl = Planner(app, oracle)
    best: list[Schedule] = []

    def options(st: State) -> list[dict[str, Plan]]:
        out: list[dict[str, Plan]] = []

        def grow(chosen: dict[str, Plan], used: int) -> None:
            if chosen:
                out.append(dict(chosen))
            for m in pl.ready(st, chosen):
                if chosen and pl.order.index(m) < max(pl.order.index(c) for c in chosen):
                    continue
                for p in oracle.plans(m):
                    if used + p.n_gpus <= pl.n:
                        chosen[m] = p
                        grow(chosen, used + p.n_gpus)
                        del chosen[m]

        grow({}, 0)
        return out

    def rec(st: State, stages: list[Stage]) -> None:
        if best and st.now >= best[0].total_s:
            return
        if not pl.unfinished(st):
            best[:] = [Schedule("exhaustive", list(stages), st.now, pl.evaluations)]
            return
        if len(stages) >= max_stages:
            return
        opts = options(st)
        for stage, ev in zip(opts, pl.evaluate_many(st, opts), strict=True):
            if ev is None:
                continue
            nxt, s = pl.advance(st, ev, stage)
            rec(nxt, stages + [s])

    rec(State(), [])
    if not best:
        raise ValueError("exhaustive search found no complete schedule")
    return best[0]

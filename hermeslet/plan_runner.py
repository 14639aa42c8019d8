"""Carry out a batch plan (``hermes plan batch --emit FILE``) on this node, stage by stage.

The plan (:mod:`hermes.plan.emit`, format ``hermes-batch-plan/1``) lists stages of (model, dp,
tp) pairs with their GPU ids, and each model's request set. The runner starts the first stage's
engines, feeds every running model the requests whose prerequisites are done (round robin over
its replicas), and when a model has answered all its requests it stops that model's engines and
moves on by SamuLLM's running-phase rule (:func:`hermes.core.batchplan.adjust.on_finish`): the
next stage's pairs are placed (those that do not fit yet wait for GPUs, and a later stage is
only considered once every pair of the one before is placed or finished); running models whose
plan changes are stopped, their unfinished requests start over on the new engines.

Engines come from a factory per kind (:data:`ENGINE_KINDS`): ``sim`` (the built-in engine with
the planner's iteration costs for the model, device and tp, plus the predicted start-up time;
``time_scale`` speeds it up) and ``vllm`` (a supervised vLLM server with the plan's arguments
and ``CUDA_VISIBLE_DEVICES``). Progress goes to a callback (stderr in ``hermeslet run-plan``).
Where the GPUs the plan names for a pair are still held (a model kept running by the rule), the
pair gets other free GPUs, tp-aligned blocks first.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes.core.batchplan.adjust import on_finish
from hermes.core.cluster.cost import Plan
from hermeslet.engines.base import EngineAdapter
from hermeslet.engines.planned import builtin_cost, need, split_vllm_args

FORMAT = "hermes-batch-plan/1"

ReqKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PlanRequest:
    rid: int
    input_tokens: int
    output_tokens: int
    after: tuple[ReqKey, ...] = ()


@dataclass(frozen=True, slots=True)
class ReplicaLaunch:
    """One engine of a pair: its GPUs and how to start it."""

    gpu_ids: tuple[int, ...]
    vllm_args: tuple[str, ...]
    builtin: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PairLaunch:
    name: str  # the model's name in the application
    plan: Plan
    load_s: float
    replicas: tuple[ReplicaLaunch, ...]


@dataclass(slots=True)
class BatchPlan:
    n_gpus: int
    models: dict[str, list[PlanRequest]]
    stages: list[dict[str, PairLaunch]]
    predicted_s: float = 0.0


def _need(d: Any, key: str, where: str) -> Any:
    return need(d, key, where, plan="batch plan")


def parse_plan(doc: Any) -> BatchPlan:
    """A :class:`BatchPlan` from the emitted JSON; ``ValueError`` names what is wrong."""
    if _need(doc, "format", "the document") != FORMAT:
        raise ValueError(f"batch plan: format {doc['format']!r}, expected {FORMAT!r}")
    n = int(_need(doc, "n_gpus", "the document"))
    models: dict[str, list[PlanRequest]] = {}
    for name, m in _need(doc, "models", "the document").items():
        reqs = []
        for r in _need(m, "requests", f"model {name!r}"):
            rid, n_in, n_out, after = r
            if int(n_in) < 1 or int(n_out) < 1:
                raise ValueError(f"batch plan: model {name!r} request {rid}: token counts must be >= 1")
            reqs.append(PlanRequest(int(rid), int(n_in), int(n_out),
                                    tuple((str(a), int(b)) for a, b in after)))
        models[name] = reqs
    for name, reqs in models.items():
        for r in reqs:
            for a, _ in r.after:
                if a not in models:
                    raise ValueError(f"batch plan: model {name!r} request {r.rid} waits for "
                                     f"unknown model {a!r}")
    stages: list[dict[str, PairLaunch]] = []
    for i, st in enumerate(_need(doc, "stages", "the document")):
        pairs: dict[str, PairLaunch] = {}
        for p in _need(st, "pairs", f"stage {i}"):
            name = _need(p, "name", f"a pair of stage {i}")
            if name not in models:
                raise ValueError(f"batch plan: stage {i} runs unknown model {name!r}")
            plan = Plan(int(_need(p, "dp", f"{name} in stage {i}")),
                        int(_need(p, "tp", f"{name} in stage {i}")))
            reps = tuple(ReplicaLaunch(tuple(int(g) for g in e["gpu_ids"]),
                                       tuple(e.get("vllm_args", ())), dict(e.get("builtin", {})))
                         for e in _need(p, "engines", f"{name} in stage {i}"))
            if len(reps) != plan.dp or any(len(r.gpu_ids) != plan.tp for r in reps):
                raise ValueError(f"batch plan: {name} in stage {i}: engines do not match "
                                 f"dp={plan.dp} tp={plan.tp}")
            if any(g < 0 or g >= n for r in reps for g in r.gpu_ids):
                raise ValueError(f"batch plan: {name} in stage {i}: GPU ids outside 0..{n - 1}")
            pairs[name] = PairLaunch(name, plan, float(p.get("load_s", 0.0)), reps)
        if sum(p.plan.n_gpus for p in pairs.values()) > n:
            raise ValueError(f"batch plan: stage {i} needs more than {n} GPUs")
        stages.append(pairs)
    return BatchPlan(n, models, stages, float(doc.get("predicted_s", 0.0)))


def load_plan(path: str | Path) -> BatchPlan:
    return parse_plan(json.loads(Path(path).read_text()))


#: builds one replica's engine: (pair, replica index, GPU ids) -> an adapter (not started)
EngineFactory = Callable[[PairLaunch, int, tuple[int, ...]], EngineAdapter]


def sim_factory(time_scale: float = 1.0) -> EngineFactory:
    """Built-in engines with the planner's iteration costs (``builtin``: model, device, tp)."""
    from hermeslet.engines.sim_engine import SimEngine

    def make(pair: PairLaunch, r: int, gpus: tuple[int, ...]) -> EngineAdapter:
        cost = builtin_cost(pair.replicas[r].builtin, where=f"{pair.name}'s builtin",
                            plan="batch plan", default_tp=pair.plan.tp)
        return SimEngine(name=f"{pair.name}#{r}", model=pair.name, cost=cost,
                         time_scale=time_scale, max_inflight=1 << 20, use_priority=False)

    return make


def vllm_factory(python: str | None = None) -> EngineFactory:
    """Supervised vLLM servers with the plan's arguments on the pair's GPUs."""
    from hermeslet.engines.vllm import VLLMEngine

    def make(pair: PairLaunch, r: int, gpus: tuple[int, ...]) -> EngineAdapter:
        model, rest = split_vllm_args(pair.replicas[r].vllm_args, where=pair.name,
                                      plan="batch plan")
        return VLLMEngine(name=f"{pair.name}#{r}", model=model, served_model_name=pair.name,
                          python=python, extra_args=rest, max_inflight=1 << 20,
                          use_priority=False,
                          env={"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))})

    return make


ENGINE_KINDS = ("sim", "vllm")


@dataclass(slots=True)
class _Running:
    pair: PairLaunch
    gpus: list[tuple[int, ...]]
    engines: list[EngineAdapter]
    tasks: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    next_replica: int = 0


@dataclass(slots=True)
class RunReport:
    wall_s: float
    finished_at: dict[str, float]  # model -> wall seconds from the start
    events: list[str]  # what happened, in order (also sent to the progress callback)
    restarted: int  # requests started over after their model was stopped


class PlanRunner:
    """Runs one :class:`BatchPlan` (module doc)."""

    def __init__(self, plan: BatchPlan, factory: EngineFactory, *,
                 progress: Callable[[str], None] | None = None, load_scale: float = 0.0) -> None:
        self.plan = plan
        self.factory = factory
        self.progress = progress or (lambda _m: None)
        #: seconds slept per predicted start-up second when an engine starts (built-in
        #: engines: 1 / time_scale; real engines take their own time: 0)
        self.load_scale = load_scale
        self.done: set[ReqKey] = set()
        self.running: dict[str, _Running] = {}
        self.finished: set[str] = set()
        self.free = set(range(plan.n_gpus))
        self.events: list[str] = []
        self.restarted = 0
        self._t0 = 0.0
        self._changed = asyncio.Event()
        self._errors: list[BaseException] = []

    def _log(self, msg: str) -> None:
        line = f"[{time.monotonic() - self._t0:8.2f} s] {msg}"
        self.events.append(msg)
        self.progress(line)

    # ------------------------------------------------------------------ engines
    def _take_gpus(self, pair: PairLaunch) -> list[tuple[int, ...]] | None:
        if pair.plan.n_gpus > len(self.free):
            return None
        out: list[tuple[int, ...]] = []
        free = set(self.free)
        for rep in pair.replicas:
            if set(rep.gpu_ids) <= free:
                block = rep.gpu_ids
            else:
                tp = len(rep.gpu_ids)
                aligned = [tuple(range(s, s + tp)) for s in range(0, self.plan.n_gpus - tp + 1, tp)
                           if set(range(s, s + tp)) <= free]
                block = aligned[0] if aligned else tuple(sorted(free)[:tp])
            free -= set(block)
            out.append(block)
        self.free = free
        return out

    async def _start(self, pairs: list[PairLaunch]) -> list[PairLaunch]:
        """Start the pairs that fit (side by side, as their engines load in parallel); returns
        those that wait for GPUs."""
        wait: list[PairLaunch] = []
        runs: list[_Running] = []
        for pair in pairs:
            gpus = self._take_gpus(pair)
            if gpus is None:
                wait.append(pair)
                continue
            run = _Running(pair, gpus, [self.factory(pair, r, g) for r, g in enumerate(gpus)])
            self.running[pair.name] = run
            runs.append(run)
            self._log(f"start {pair.name} dp={pair.plan.dp} tp={pair.plan.tp} on GPUs "
                      + " ".join(",".join(map(str, g)) for g in gpus))
        await asyncio.gather(*(self._launch(r) for r in runs))
        return wait

    async def _launch(self, run: _Running) -> None:
        await asyncio.gather(*(e.start() for e in run.engines))
        if self.load_scale > 0 and run.pair.load_s > 0:
            await asyncio.sleep(run.pair.load_s * self.load_scale)

    async def _stop(self, name: str, why: str) -> None:
        run = self.running.pop(name)
        lost = [t for t in run.tasks.values() if not t.done()]
        for t in lost:
            t.cancel()
        await asyncio.gather(*lost, return_exceptions=True)
        self.restarted += len(lost)
        await asyncio.gather(*(e.close() for e in run.engines), return_exceptions=True)
        for g in run.gpus:
            self.free |= set(g)
        self._log(f"stop {name} ({why}" + (f"; {len(lost)} requests start over)" if lost else ")"))

    # ------------------------------------------------------------------ requests
    def _feed(self) -> None:
        for name, run in self.running.items():
            for r in self.plan.models[name]:
                if (name, r.rid) in self.done or r.rid in run.tasks:
                    continue
                if not all(k in self.done for k in r.after):
                    continue
                eng = run.engines[run.next_replica % len(run.engines)]
                run.next_replica += 1
                run.tasks[r.rid] = asyncio.create_task(self._request(name, eng, r))

    async def _request(self, name: str, eng: EngineAdapter, r: PlanRequest) -> None:
        body = {"model": name, "prompt": [1] * r.input_tokens, "max_tokens": r.output_tokens,
                "ignore_eos": True}
        try:
            async for _ in eng.generate("completions", body, False,
                                        request_id=f"{name}-{r.rid}-{time.monotonic_ns()}"):
                pass
        except asyncio.CancelledError:
            raise
        except Exception as e:  # an engine error ends the run with it
            self._errors.append(e)
            self._changed.set()
            return
        self.done.add((name, r.rid))
        self._changed.set()

    def _model_done(self, name: str) -> bool:
        return all((name, r.rid) in self.done for r in self.plan.models[name])

    # ------------------------------------------------------------------ the stage loop
    async def run(self) -> RunReport:
        self._t0 = time.monotonic()
        stages = self.plan.stages
        finished_at: dict[str, float] = {}
        for m in self.plan.models:
            if self._model_done(m):  # no requests
                self.finished.add(m)
        current = 0
        waiting: list[PairLaunch] = list(stages[0].values()) if stages else []
        self._log(f"stage 0: {', '.join(p.name for p in waiting)}")
        try:
            while len(self.finished) < len(self.plan.models):
                waiting = [p for p in waiting if p.name not in self.finished
                           and p.name not in self.running]
                waiting = await self._start(waiting)
                self._feed()
                if not any(not t.done() for r in self.running.values() for t in r.tasks.values()):
                    # nothing in flight: move on (a later stage, or models stranded by the rule)
                    if not waiting and current + 1 < len(stages):
                        current, waiting = await self._advance(current, waiting)
                        continue
                    stranded = [m for m in self.plan.models
                                if m not in self.finished and m not in self.running]
                    last = {m: s[m] for s in stages for m in s}
                    todo = [last[m] for m in stranded if m in last]
                    if todo and len(await self._start(todo)) < len(todo):
                        continue
                    raise RuntimeError("batch plan stalled: unfinished "
                                       + ", ".join(sorted(set(self.plan.models) - self.finished)))
                self._changed.clear()
                await self._changed.wait()
                if self._errors:
                    raise self._errors[0]
                newly = [m for m in list(self.running) if self._model_done(m)]
                for m in newly:
                    self.finished.add(m)
                    finished_at[m] = time.monotonic() - self._t0
                    await self._stop(m, "finished")
                if not newly:
                    continue
                if waiting:  # this stage's pairs first
                    continue
                current, waiting = await self._advance(current, waiting)
        finally:
            for m in list(self.running):
                await self._stop(m, "run over")
        wall = time.monotonic() - self._t0
        self._log(f"done in {wall:.2f} s (plan predicted {self.plan.predicted_s:.1f} s model "
                  f"time); {self.restarted} requests restarted")
        return RunReport(wall, finished_at, self.events, self.restarted)

    async def _advance(self, current: int,
                       waiting: list[PairLaunch]) -> tuple[int, list[PairLaunch]]:
        stages = self.plan.stages
        adj = on_finish([{m: p.plan for m, p in s.items()} for s in stages], current,
                        {m: r.pair.plan for m, r in self.running.items()}, set(self.finished),
                        self.plan.n_gpus)
        if adj.stage == current:
            return current, waiting
        for m in adj.stop:
            await self._stop(m, f"stage {adj.stage} gives it other GPUs")
        nxt = stages[adj.stage]
        self._log(f"stage {adj.stage}: keep {', '.join(m for m, _ in adj.keep) or '-'}; "
                  f"start {', '.join(m for m, _ in adj.start) or '-'}; "
                  f"wait {', '.join(m for m, _ in adj.waiting) or '-'}")
        return adj.stage, [nxt[m] for m, _ in adj.start] + [nxt[m] for m, _ in adj.waiting]


def run_plan(plan: BatchPlan, factory: EngineFactory, *,
             progress: Callable[[str], None] | None = None,
             load_scale: float = 0.0) -> RunReport:
    """Run ``plan`` to its end (a fresh event loop)."""
    return asyncio.run(PlanRunner(plan, factory, progress=progress, load_scale=load_scale).run())

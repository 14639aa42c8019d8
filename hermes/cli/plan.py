"""``hermes plan``: GPU planning commands.

- ``hermes plan batch``: SamuLLM's multi-LLM offline planner (:mod:`hermes.core.batchplan`) on
  a scenario or a ``--dag`` file and a node's GPUs (``--gpus 8xA100-80``): the greedy plan's
  stages and its predicted end-to-end time beside the Max and Min heuristics (and the
  no-preemption variants) on the same sampled workload. Candidate plans are simulated in
  parallel processes (``--workers``); progress on stderr. ``--emit FILE`` writes the greedy
  plan in the form ``hermeslet run-plan FILE`` carries out (:mod:`hermes.plan.emit`).
- ``hermes plan placement``: SeaLLM's placement of several LLM services on a node's GPUs;
  ``--emit FILE`` writes the plan ``hermeslet run --placement FILE`` serves
  (:mod:`hermes.plan.placement`).
- ``hermes plan calibrate``: the cluster model against Vidur's measurements
  (:mod:`hermes.plan.calibrate`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from hermes.core.batchplan.oracle import EngineOracle, Segment
from hermes.core.batchplan.search import Job, Schedule, plan
from hermes.core.batchplan.workload import App
from hermes.core.cluster.cost import GPU_MEMORY_UTILIZATION, Plan
from hermes.core.cluster.devices import parse_gpus

ADJUSTMENT_RULE = (
    "when a model finishes before the plan expects, move to the next stage at once: a running "
    "model whose current stage is its last keeps running; one whose (model, plan) is in the next "
    "stage keeps running; otherwise the next stage's pairs are placed first and it keeps its "
    "GPUs only if some are left (SamuLLM 4.3; hermes.core.batchplan.adjust.on_finish)")

_ORACLE: EngineOracle | None = None


def _init(oracle: EngineOracle) -> None:
    global _ORACLE
    _ORACLE = oracle


def _segment(job: Job) -> Segment:
    assert _ORACLE is not None
    m, p, done, ups, load = job
    return _ORACLE.segment(m, p, done, dict(ups), load=load)


class ParallelSimulate:
    """The search's ``simulate``: a batch of segment jobs over a process pool, counted on
    stderr."""

    def __init__(self, oracle: EngineOracle, workers: int, label: str) -> None:
        self.oracle = oracle
        self.pool = ProcessPoolExecutor(workers, initializer=_init, initargs=(oracle,)) if workers > 1 else None
        self.count = 0
        self.label = label

    def __call__(self, jobs: Sequence[Job]) -> list[Segment]:
        if self.pool is None:
            out = [self.oracle.segment(m, p, d, dict(u), load=ld) for m, p, d, u, ld in jobs]
        else:
            out = list(self.pool.map(_segment, jobs, chunksize=max(1, len(jobs) // 16)))
        self.count += len(jobs)
        print(f"\r{self.label}: {self.count} plan simulations", end="", file=sys.stderr, flush=True)
        return out

    def close(self) -> None:
        print(file=sys.stderr)
        if self.pool is not None:
            self.pool.shutdown()


def assign_gpus(schedule: Schedule, n_gpus: int) -> list[dict[str, list[list[int]]]]:
    """GPU ids per stage and model (one list per replica): a model that keeps its plan keeps
    its GPUs; others take free tp-aligned blocks (NVLink pairs first), else any free GPUs."""
    owner: dict[str, list[list[int]]] = {}
    plans: dict[str, Plan] = {}
    out = []
    for st in schedule.stages:
        keep = {p.model: owner[p.model] for p in st.pairs
                if p.model in owner and plans.get(p.model) == p.plan and not p.reload}
        used = {g for reps in keep.values() for rep in reps for g in rep}
        cur: dict[str, list[list[int]]] = dict(keep)
        for p in st.pairs:
            if p.model in cur:
                continue
            reps = []
            for _ in range(p.plan.dp):
                tp = p.plan.tp
                block = next((list(range(s, s + tp)) for s in range(0, n_gpus - tp + 1, tp)
                              if not used & set(range(s, s + tp))), None)
                if block is None:
                    block = [g for g in range(n_gpus) if g not in used][:tp]
                used |= set(block)
                reps.append(block)
            cur[p.model] = reps
        owner, plans = cur, {p.model: p.plan for p in st.pairs}
        out.append(cur)
    return out


def stages_json(app: App, schedule: Schedule, n_gpus: int) -> list[dict[str, Any]]:
    gpus = assign_gpus(schedule, n_gpus)
    rows = []
    for st, ids in zip(schedule.stages, gpus, strict=True):
        rows.append({
            "start_s": round(st.start_s, 3),
            "duration_s": round(st.duration_s, 3),
            "models": [{
                "name": p.model,
                "model": app.models[p.model].spec.name,
                "dp": p.plan.dp,
                "tp": p.plan.tp,
                "gpu_ids": ids[p.model],
                "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
                "reload": p.reload,
                "predicted_finish_s": round(p.remaining_s, 3),
            } for p in st.pairs],
        })
    return rows


def run_batch(app: App, device_spec: str, *, workers: int, progress: Callable[[str], None],
              planners: Sequence[str] = ("greedy", "max", "min", "greedy-nopreempt",
                                         "min-nopreempt")) -> dict[str, Any]:
    n, device = parse_gpus(device_spec)
    app.validate()
    oracle = EngineOracle(app, device, n)
    out: dict[str, Any] = {}
    for name in planners:
        sim = ParallelSimulate(oracle, workers, name)
        t0 = time.perf_counter()
        try:
            sched = plan(app, oracle, name, simulate=sim, progress=progress)
        finally:
            sim.close()
        out[name] = (sched, time.perf_counter() - t0)
    return out


def cmd_batch(args: argparse.Namespace) -> int:
    from hermes.cliout import print_table
    from hermes.plan.scenarios import build, load_dag

    n, _ = parse_gpus(args.gpus)  # malformed or unknown device: exit 2 before any work
    if args.dag:
        app, data = load_dag(args.dag, seed=args.seed), f"--dag {args.dag}"
    elif args.scenario:
        app, data = build(args.scenario, seed=args.seed, n_requests=args.requests, scale=args.scale)
    else:
        raise ValueError("hermes plan batch: give --scenario or --dag")
    app.validate()

    def progress(msg: str) -> None:
        print(f"\r{msg}", file=sys.stderr)

    res = run_batch(app, args.gpus, workers=args.workers, progress=progress)
    g, g_s = res["greedy"]
    mx, _ = res["max"]
    mn, _ = res["min"]
    rows = [{"planner": k, "predicted_s": round(s.total_s, 1), "stages": len(s.stages),
             "search_s": round(t, 2), "speedup_of_greedy": round(s.total_s / g.total_s, 3)}
            for k, (s, t) in res.items()]
    print_table(rows, title=f"{args.scenario or args.dag} on {args.gpus}: {data}")
    stages = stages_json(app, g, n)
    print_table([{"stage": i, "start_s": s["start_s"], "duration_s": s["duration_s"],
                  "models": ", ".join(f"{m['name']}[dp{m['dp']} tp{m['tp']} gpus "
                                      f"{'/'.join(','.join(map(str, r)) for r in m['gpu_ids'])}]"
                                      for m in s["models"])}
                 for i, s in enumerate(stages)], title="greedy plan (SamuLLM)")
    doc = {
        "scenario": args.scenario, "dag": args.dag, "gpus": args.gpus, "data": data,
        "plan_s": round(g.total_s, 3),
        "max_heuristic_s": round(mx.total_s, 3),
        "min_heuristic_s": round(mn.total_s, 3),
        "nopreempt_s": round(res["greedy-nopreempt"][0].total_s, 3),
        "min_nopreempt_s": round(res["min-nopreempt"][0].total_s, 3),
        "search_s": round(g_s, 3),
        "speedup_over_max": round(mx.total_s / g.total_s, 3),
        "speedup_over_min": round(mn.total_s / g.total_s, 3),
        "stages": stages,
        "adjustment_rule": ADJUSTMENT_RULE,
    }
    if args.json:
        import json
        from pathlib import Path

        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    if args.emit:  # the greedy plan in the form `hermeslet run-plan` carries out
        import json
        from pathlib import Path

        from hermes.plan.emit import emit_plan

        Path(args.emit).write_text(json.dumps(emit_plan(app, g, args.gpus, assign_gpus(g, n),
                                                        adjustment_rule=ADJUSTMENT_RULE)) + "\n")
        print(f"wrote {args.emit} (hermeslet run-plan {args.emit})", file=sys.stderr)
    return 0


def add_plan_parser(sub: Any) -> None:
    from hermes.plan.calibrate import add_calibrate_parser
    from hermes.plan.scenarios import SCENARIOS

    p = sub.add_parser("plan", help="GPU planning: SamuLLM's multi-LLM batch planner, the "
                       "cluster model's calibration")
    psub = p.add_subparsers(dest="plan", required=True)
    s = psub.add_parser("batch", help="plan which LLMs run together on a node, with which "
                        "(dp, tp) (SamuLLM)")
    s.add_argument("--scenario", choices=SCENARIOS)
    s.add_argument("--dag", metavar="FILE", help="application JSON (hermes.plan.scenarios.load_dag)")
    s.add_argument("--gpus", default="8xA100-80", help="COUNTxDEVICE (default 8xA100-80)")
    s.add_argument("--json", metavar="FILE")
    s.add_argument("--emit", metavar="FILE", help="write the greedy plan for `hermeslet "
                   "run-plan` (engines per stage: vLLM arguments, GPU ids; hermes.plan.emit)")
    s.add_argument("--seed", type=int, default=0, help="output-length sampling seed")
    s.add_argument("--requests", type=int, help="requests (ensembling) or documents (chain)")
    s.add_argument("--scale", type=float, default=1.0, help="routing: request counts x this")
    s.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="processes simulating candidate plans")
    s.set_defaults(func=cmd_batch)
    add_calibrate_parser(psub)
    from hermes.plan.hetero import add_hetero_parser

    add_hetero_parser(psub)
    from hermes.plan.placement import add_placement_parser

    add_placement_parser(psub)

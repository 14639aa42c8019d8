"""Scheduling benchmarks on the simulator: ``sched``, ``ddl``, ``ablation``, ``overhead``.

Each benchmark returns a flat list of row dicts (what ``--json`` writes); :func:`print_table`
prints them, :func:`plot_act_cdf` draws the ACT CDF per policy.

Workload (as the Hermes paper's evaluation): ``apps`` application runs of the paper's mix,
arrival times resampled from a Mooncake trace into the submission window
(:mod:`hermes.sim.arrivals`), one seed per experiment; the same arrivals for every policy. The
mix (``mix``): ``stratified`` (the benchmarks' default: the paper's class counts exactly,
:func:`hermes.workloads.registry.stratified_mix`) or ``random`` (each run's app drawn
independently, :func:`hermes.workloads.registry.sample_mix`; the number of DM runs then varies
from seed to seed and with it half the GPU work). The workload (``workload``, ``--workload``):
``paper`` (the paper's apps, as above), ``agents`` (the tool-using agent loops SWE and RES,
half each; :data:`hermes.workloads.registry.AGENT_APPS`) or ``mixed`` (half the runs agents,
half the paper's mix; :func:`hermes.workloads.registry.draw_workload`). VTC's tenants are the apps (fair share among
applications). Each benchmark runs every seed of ``seeds``; the simulations of all (seed,
window, policy) cells run in parallel worker processes with a progress bar
(:func:`map_jobs`), and :func:`seed_summary` shows each figure as its mean and min-max over
seeds.

- ``sched``: rows ``{window_min, policy, seed, mean_act_s, p50_act_s, p95_act_s, p99_act_s,
  runs, mean_wait_s, p99_wait_s, max_wait_s}``, one per window, policy and seed, plus a
  pseudo-policy ``isolated``: each run alone on the engine, the bound no policy beats. A run's
  wait is its time in engine waiting queues (``RunResult.wait_s``: per LLM unit, the longest
  wait of its requests, summed over units): the starvation a policy's order causes, which
  ``hermes``'s wait guard bounds.
- ``ddl``: deadline = submit + isolated run time (``hermes.workloads.isolated.run_isolated`` on the
  setup's cost model) x a factor drawn from 1.2 / 1.5 / 2.0 (tight / modest / loose); rows
  ``{policy, seed, dsr, dsr_tight, dsr_modest, dsr_loose}``.
- ``ablation``: rows ``{policy, seed, mean_act_s, normalized}`` for hermes, hermes-no-refine,
  srpt, oracle; ``normalized`` = mean ACT / mean ACT of ``oracle`` (1.0 = the oracle), same
  seed.
- ``overhead``: rows ``{active_runs, buckets, median_ms, p99_ms}``: wall time of one
  re-rank of every active run (``policy.rank(run, now)`` for all of them) with the ``hermes``
  policy, over runs placed at random points of their apps.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from hermes import cliout
from hermes.core.engine_model import PrefixCache
from hermes.core.tools_model import ToolPool
from hermes.sim.arrivals import resample_arrivals
from hermes.sim.simulator import Arrival, RunResult, SimResult, Simulator, setup_engines

#: Fig. 9/10: Hermes against the systems users would otherwise run; the ablations (srpt,
#: oracle, hermes-no-refine) are ``bench ablation``'s (``--policies all`` runs every one here)
DEFAULT_POLICIES = ("hermes", "vllm", "parrot", "vtc", "llmsched", "seallm")
ALL_POLICIES = (*DEFAULT_POLICIES, "llmsched-lite", "srpt", "sjf", "autellix-plas",
                "autellix-atlas", "oracle", "hermes-no-refine", "hermes-noguard")
DDL_POLICIES = ("hermes-ddl", "edf", "hermes", "srpt", "parrot", "vllm")
ABLATION_POLICIES = ("hermes", "hermes-no-refine", "srpt", "oracle")
DEADLINE_FACTORS = {"tight": 1.2, "modest": 1.5, "loose": 2.0}
#: seeds of a benchmark cell unless told (issue 18: at least 5 per cell)
DEFAULT_SEEDS = (0, 1, 2, 3, 4)


# ---------------------------------------------------------------------------- workload
def build_arrivals(
    n_apps: int,
    window_min: float,
    *,
    seed: int = 0,
    trace: str = "conversation",
    deadlines: bool = False,
    setup: str = "llama2-7b-a100",
    mix: str = "random",
    workload: str = "paper",
) -> tuple[list[Arrival], list[str | None]]:
    """The arrivals of one experiment and, with ``deadlines``, each run's tightness class.
    ``mix``: ``random`` (each run's app drawn independently) or ``stratified`` (the paper's
    class counts exactly); ``workload``: ``paper`` | ``agents`` | ``mixed``
    (:func:`hermes.workloads.registry.draw_workload`); the apps and their seeds do not depend
    on the window."""
    from hermes.workloads.registry import draw_workload, get_app

    times = resample_arrivals(n_apps, window_min * 60.0, trace=trace, seed=seed)
    rng = np.random.default_rng([seed, 1])
    names = draw_workload(rng, n_apps, mix, workload)
    seeds = rng.integers(0, 2**31 - 1, size=n_apps)
    classes: list[str | None] = [None] * n_apps
    out = []
    cost, _ = setup_engines(setup)
    for i, (t, app, s) in enumerate(zip(times, names, seeds, strict=False)):
        deadline = None
        if deadlines:
            from hermes.workloads.isolated import run_isolated

            rec = run_isolated(get_app(app), np.random.default_rng(int(s)), cost, run_id=f"i{i}")
            cls = str(rng.choice(list(DEADLINE_FACTORS)))
            classes[i] = cls
            deadline = float(t) + rec.act_s * DEADLINE_FACTORS[cls]
        out.append(Arrival(float(t), app, int(s), deadline=deadline, run_id=f"{app}-{i}"))
    return out, classes


_GRAPHS: dict[str, dict] = {}


def kb_spec(pdgraph_dir: str | Path | None = None) -> str:
    """The knowledge base a benchmark reads: ``--pdgraphs``, else ``$HERMES_KB``, else the
    PDGraphs shipped with Hermes (:func:`hermes.kb.default_kb`)."""
    from hermes.kb import default_kb

    return str(pdgraph_dir) if pdgraph_dir else default_kb()


def load_graphs(pdgraph_dir: str | Path | None = None) -> dict:
    """Every PDGraph of the knowledge base (:func:`kb_spec`), by app name; cached per process.
    Agent apps (``--workload agents|mixed``) the knowledge base has no PDGraph for get the
    shipped agent PDGraphs (:func:`hermes.workloads.registry.agent_pdgraphs_dir`)."""
    from hermes.kb import open_store
    from hermes.workloads.registry import agent_pdgraphs_dir

    key = kb_spec(pdgraph_dir)
    if key not in _GRAPHS:
        store = open_store(key)
        try:
            graphs = {a: g for a in store.list_apps() if (g := store.get(a)) is not None}
        finally:
            store.close()
        agents = open_store(str(agent_pdgraphs_dir()))
        try:
            for a in agents.list_apps():
                if a not in graphs and (g := agents.get(a)) is not None:
                    graphs[a] = g
        finally:
            agents.close()
        _GRAPHS[key] = graphs
    return _GRAPHS[key]


def make_sim_policy(name: str, setup: str, *, seed: int = 0, pdgraph_dir: str | None = None, **kw):
    """Build policy ``name``; estimator-driven ones get an EstimatorPool over the PDGraphs."""
    from hermes.core.policies import make_policy, policy_class

    cls = policy_class(name)
    if getattr(cls, "uses_estimator", False):
        from hermes.core.estimator import EstimatorPool

        graphs = load_graphs(pdgraph_dir)
        if not graphs:
            raise FileNotFoundError(
                f"policy {name!r} needs PDGraphs but none were found in {kb_spec(pdgraph_dir)}"
            )
        cost, _ = setup_engines(setup)
        pool = EstimatorPool(graphs, cost, refine=getattr(cls, "refine", True), seed=seed)
        return make_policy(name, estimators=pool, seed=seed, **kw)
    try:
        return make_policy(name, seed=seed, **kw)
    except TypeError:
        return make_policy(name, **kw)


def simulate_runs(policy: str, setup: str, arrivals: list[Arrival], seed: int,
                  pdgraph_dir: str | None = None, *, tools: ToolPool | None = None,
                  prefix_cache: Callable[[], PrefixCache] | None = None,
                  kv_gate: bool = False,
                  ) -> tuple[list[RunResult], SimResult]:
    """:func:`simulate`'s simulation: each run's result in arrival order, and the whole
    result (wall seconds, engine preemptions, ...).
    ``kv_gate``: the HermesLet's KV gate in front of the engines (:mod:`hermes.core.kv_gate`)."""
    from hermes.core.kv_gate import KvGate

    cost, n_engines = setup_engines(setup)
    pol = make_sim_policy(policy, setup, seed=seed, pdgraph_dir=pdgraph_dir)
    res = Simulator(pol, cost=cost, n_engines=n_engines, tools=tools, record=False,
                    prefix_cache=prefix_cache,
                    kv_gate=KvGate() if kv_gate else None).run(arrivals)
    by_id = {r.run_id: r for r in res.runs}
    return [by_id[a.run_id] for a in arrivals], res


def simulate(policy: str, setup: str, arrivals: list[Arrival], seed: int,
             pdgraph_dir: str | None = None, *, tools: ToolPool | None = None,
             prefix_cache: Callable[[], PrefixCache] | None = None,
             ) -> tuple[np.ndarray, np.ndarray, float]:
    """One simulation of ``arrivals`` under ``policy`` on ``setup``'s engines.

    Returns (ACTs in arrival order, met flags (nan: no deadline), wall s). ``tools`` replaces
    the default tool servers (e.g. :meth:`ToolPool.client_side` when the clients run their
    tools themselves, as ``hermes load --tools events`` does); ``prefix_cache`` gives each
    engine a prompt-prefix cache (default: none, every prompt is prefilled)."""
    ordered, res = simulate_runs(policy, setup, arrivals, seed, pdgraph_dir, tools=tools,
                                 prefix_cache=prefix_cache)
    acts = np.array([r.act_s for r in ordered])
    met = np.array([np.nan if r.met is None else float(r.met) for r in ordered])
    return acts, met, res.wall_s


def _simulate(job: tuple) -> tuple[tuple, np.ndarray, np.ndarray, np.ndarray, int, float]:
    """Worker: one simulation. Returns (tag, ACTs, met flags (nan: no deadline), engine-queue
    waits (``RunResult.wait_s``), per run in arrival order; the engines' preemptions, wall)."""
    tag, policy, setup, arrivals, seed, pdgraph_dir, *rest = job
    tools = tool_pool(rest[0]) if rest and rest[0] else None
    gate = bool(rest[1]) if len(rest) > 1 else False
    ordered, res = simulate_runs(policy, setup, arrivals, seed, pdgraph_dir, tools=tools,
                                 kv_gate=gate)
    acts = np.array([r.act_s for r in ordered])
    met = np.array([np.nan if r.met is None else float(r.met) for r in ordered])
    return tag, acts, met, np.array([r.wait_s for r in ordered]), res.preemptions, res.wall_s


def tool_pool(instances: Mapping[str, int]) -> ToolPool:
    """The default tool servers (:data:`hermes.core.tools_model.TOOL_DEFAULTS`) with
    ``instances`` per backend of each named kind (``{"dnn": 1}``: one replica per DNN
    model); ``ValueError`` naming an unknown kind or a count below 1."""
    from hermes.core.tools_model import TOOL_DEFAULTS

    for kind, n in instances.items():
        if kind not in TOOL_DEFAULTS:
            raise ValueError(f"unknown tool kind {kind!r}; known: {', '.join(TOOL_DEFAULTS)}")
        if int(n) < 1:
            raise ValueError(f"tool instances for {kind!r} must be >= 1, got {n}")
    return ToolPool(**{k: {"instances": int(n)} for k, n in instances.items()})


def map_jobs(fn: Callable, jobs: Sequence, *, workers: int | None = None,
             progress: bool = True) -> Iterator:
    """``fn(job)`` for each job, in job order: in worker processes (``fn`` a module-level
    function; default one per core) with a progress bar. Every simulation benchmark runs
    its simulations through this."""
    from tqdm import tqdm

    workers = workers or min(len(jobs), os.cpu_count() or 1)
    bar = tqdm(total=len(jobs), desc="simulations", file=sys.stderr, disable=not progress)
    try:
        if workers <= 1:
            for job in jobs:
                yield fn(job)
                bar.update(1)
        else:
            with ProcessPoolExecutor(max_workers=workers) as ex:
                for result in ex.map(fn, jobs):
                    yield result
                    bar.update(1)
    finally:
        bar.close()


def check_extras(policies: Sequence[str]) -> None:
    """Refuse, before any worker starts, a policy whose optional extra is not installed
    (``llmsched``: pgmpy, ``hermes-gateway[baselines]``; ``llmsched-lite`` needs nothing)."""
    from hermes.extras import require

    if "llmsched" in policies:
        require("baselines")


def run_jobs(jobs: list[tuple], *, workers: int | None = None, progress: bool = True) -> dict:
    """Run simulation jobs (in parallel processes); returns ``{tag: (acts, met, waits,
    preemptions)}``."""
    check_extras(sorted({j[1] for j in jobs}))
    return {
        tag: (acts, met, waits, preempted)
        for tag, acts, met, waits, preempted, _ in map_jobs(_simulate, jobs, workers=workers,
                                                            progress=progress)
    }


def _order_jobs(jobs: list[tuple]) -> list[tuple]:
    # slow policies first so that the parallel tail is short
    slow = {"hermes": 0, "hermes-no-refine": 0, "hermes-ddl": 0, "srpt": 1, "llmsched": 0,
            "llmsched-lite": 1, "seallm": 1, "sjf": 1}
    return sorted(jobs, key=lambda j: slow.get(j[1], 0 if j[1].startswith("hermes") else 2))


# ---------------------------------------------------------------------------- benchmarks
def _seeds(seed: int, seeds: Sequence[int] | None) -> list[int]:
    """The seeds of a benchmark: ``seeds``, else the one ``seed``."""
    out = [seed] if seeds is None else [int(x) for x in seeds]
    if not out:
        raise ValueError("seeds must not be empty")
    return out


def act_row(a: np.ndarray) -> dict:
    """Mean and percentiles of an array of ACTs (a ``sched`` row's figures)."""
    return {
        "mean_act_s": float(a.mean()),
        "p50_act_s": float(np.percentile(a, 50)),
        "p95_act_s": float(np.percentile(a, 95)),
        "p99_act_s": float(np.percentile(a, 99)),
        "runs": int(a.size),
    }


def wait_row(w: np.ndarray) -> dict:
    """Mean, P99 and maximum of the runs' engine-queue waits (``RunResult.wait_s``)."""
    return {
        "mean_wait_s": float(w.mean()),
        "p99_wait_s": float(np.percentile(w, 99)),
        "max_wait_s": float(w.max()),
    }


def bench_sched(
    apps: int = 300,
    windows: Sequence[float] = (10, 15, 30),
    policies: Sequence[str] = DEFAULT_POLICIES,
    seed: int = 0,
    trace: str = "conversation",
    setup: str = "llama2-7b-a100",
    *,
    seeds: Sequence[int] | None = None,
    mix: str = "stratified",
    workload: str = "paper",
    workers: int | None = None,
    progress: bool = True,
    pdgraph_dir: str | None = None,
    tool_instances: Mapping[str, int] | None = None,
    kv_gate: bool = False,
) -> tuple[list[dict], dict]:
    """Fig. 9/10, at every seed of ``seeds`` (default: ``seed`` alone). Returns the rows (one
    per window, policy and seed) and ``{(window_min, policy): ACT array}`` for plotting (the
    ACTs of every seed, pooled). ``tool_instances`` overrides the tool servers' capacity
    per kind (:func:`tool_pool`; the tool-capacity sensitivity study); ``kv_gate`` puts the
    HermesLet's KV gate in front of the engines for every policy (:mod:`hermes.core.kv_gate`;
    each row says ``kv_gate``)."""
    seed_list = _seeds(seed, seeds)
    tools = dict(tool_instances or {})
    if tools:
        tool_pool(tools)  # refuse bad counts before any worker starts
    jobs, alone = [], {}
    for s in seed_list:
        iso = None  # a seed's runs are the same in every window: their isolated ACTs too
        for w in windows:
            arrivals, _ = build_arrivals(apps, w, seed=s, trace=trace, setup=setup, mix=mix,
                                         workload=workload)
            for p in policies:
                jobs.append(((s, w, p), p, setup, arrivals, s, pdgraph_dir, tools, kv_gate))
            # the same runs, each alone on the engine: a lower bound on any policy's ACT
            alone[(s, w)] = iso = isolated_acts(arrivals, setup) if iso is None else iso
    results = run_jobs(_order_jobs(jobs), workers=workers, progress=progress)
    rows, acts = [], {}
    for w in windows:
        for p in (*policies, ISOLATED):
            per_seed = [alone[(s, w)] if p == ISOLATED else results[(s, w, p)][0]
                        for s in seed_list]
            waits = [np.zeros_like(alone[(s, w)]) if p == ISOLATED else results[(s, w, p)][2]
                     for s in seed_list]
            preempted = [0 if p == ISOLATED else results[(s, w, p)][3] for s in seed_list]
            acts[(w, p)] = np.concatenate(per_seed)
            for s, a, wt, pre in zip(seed_list, per_seed, waits, preempted, strict=True):
                rows.append({"window_min": w, "policy": p, "seed": s, **act_row(a),
                             **wait_row(wt), "preemptions": int(pre), "kv_gate": kv_gate})
    return rows, acts


#: pseudo-policy row of ``bench sched``: every run alone on the engine (no queueing at all)
ISOLATED = "isolated"


def isolated_acts(arrivals: Sequence[Arrival], setup: str) -> np.ndarray:
    """ACT of each arrival's run alone on an idle engine (``hermes.workloads.isolated``): no
    scheduler can beat it on average, so ``isolated / policy`` is the best ratio reachable."""
    from hermes.workloads.isolated import run_isolated
    from hermes.workloads.registry import get_app

    cost, _ = setup_engines(setup)
    return np.array(
        [
            run_isolated(get_app(a.app), np.random.default_rng(a.seed), cost, run_id=f"i{i}").act_s
            for i, a in enumerate(arrivals)
        ]
    )


def bench_ddl(
    apps: int = 300,
    window: float = 15,
    policies: Sequence[str] = DDL_POLICIES,
    seed: int = 0,
    trace: str = "conversation",
    setup: str = "llama2-7b-a100",
    *,
    seeds: Sequence[int] | None = None,
    mix: str = "stratified",
    workload: str = "paper",
    workers: int | None = None,
    progress: bool = True,
    pdgraph_dir: str | None = None,
) -> list[dict]:
    """Fig. 11: deadline satisfaction ratio per policy and seed (default: ``seed`` alone),
    overall and per tightness class."""
    seed_list = _seeds(seed, seeds)
    jobs, classes = [], {}
    for s in seed_list:
        arrivals, classes[s] = build_arrivals(
            apps, window, seed=s, trace=trace, deadlines=True, setup=setup, mix=mix,
            workload=workload,
        )
        jobs += [((s, p), p, setup, arrivals, s, pdgraph_dir) for p in policies]
    results = run_jobs(_order_jobs(jobs), workers=workers, progress=progress)
    rows = []
    for p in policies:
        for s in seed_list:
            met = results[(s, p)][1]
            cls = np.array(classes[s])
            row = {"policy": p, "seed": s, "dsr": float(np.nanmean(met))}
            for name in DEADLINE_FACTORS:
                sel = cls == name
                row[f"dsr_{name}"] = float(np.nanmean(met[sel])) if sel.any() else float("nan")
            rows.append(row)
    return rows


def bench_ablation(
    apps: int = 300,
    window: float = 15,
    policies: Sequence[str] = ABLATION_POLICIES,
    seed: int = 0,
    trace: str = "conversation",
    setup: str = "llama2-7b-a100",
    *,
    seeds: Sequence[int] | None = None,
    mix: str = "stratified",
    workload: str = "paper",
    workers: int | None = None,
    progress: bool = True,
    pdgraph_dir: str | None = None,
) -> list[dict]:
    """Fig. 12: mean ACT per policy and seed (default: ``seed`` alone), normalized to the
    ``oracle`` of the same seed (or to the first policy when the oracle is not among them)."""
    seed_list = _seeds(seed, seeds)
    jobs = []
    for s in seed_list:
        arrivals, _ = build_arrivals(apps, window, seed=s, trace=trace, setup=setup, mix=mix,
                                     workload=workload)
        jobs += [((s, p), p, setup, arrivals, s, pdgraph_dir) for p in policies]
    results = run_jobs(_order_jobs(jobs), workers=workers, progress=progress)
    ref = "oracle" if "oracle" in policies else policies[0]
    rows = []
    for p in policies:
        for s in seed_list:
            mean = float(results[(s, p)][0].mean())
            rows.append({"policy": p, "seed": s, "mean_act_s": mean,
                         "normalized": mean / float(results[(s, ref)][0].mean())})
    return rows


def _active_runs(n: int, setup: str, seed: int) -> list:
    """``n`` runs of mixed apps, each stopped at a random point of its app (unit boundary or
    inside a unit), as the scheduler would see them."""
    from hermes.core.state import RunProgress, RunState, UnitObservation
    from hermes.workloads.isolated import step_service_s
    from hermes.workloads.registry import get_app, sample_mix

    cost, _ = setup_engines(setup)
    rng = np.random.default_rng(seed)
    runs = []
    for i, app_name in enumerate(sample_mix(rng, n)):
        steps = list(get_app(app_name).steps(np.random.default_rng(int(rng.integers(1 << 31)))))
        k = int(rng.integers(0, len(steps)))
        prog = RunProgress()
        attained = 0.0
        for s in steps[:k]:
            svc = step_service_s(s, cost)
            attained += svc
            prog.finished.append(
                UnitObservation(
                    unit=s.unit,
                    input_tokens=sum(r.input_tokens for r in s.requests),
                    output_tokens=sum(r.output_tokens for r in s.requests),
                    parallelism=max(1, len(s.requests)),
                    duration_s=svc,
                    service_s=svc,
                )
            )
        prog.current = steps[k].unit
        prog.current_attained_s = float(rng.uniform(0, 1)) * step_service_s(steps[k], cost)
        attained += prog.current_attained_s
        runs.append(
            RunState(run_id=f"r{i}", app=app_name, submitted=0.0, progress=prog, attained_s=attained)
        )
    return runs


def bench_overhead(
    active_runs: Sequence[int] = (100, 1000, 5000),
    buckets: Sequence[int] = (10, 20, 50, 100),
    *,
    repeats: int = 20,
    max_s_per_config: float = 5.0,
    seed: int = 0,
    setup: str = "llama2-7b-a100",
    progress: bool = True,
    pdgraph_dir: str | None = None,
) -> list[dict]:
    """Fig. 15: the ``hermes`` policy's scheduling overhead.

    Runs of mixed apps are stopped at random points of their apps (:func:`_active_runs`);
    each one's current unit is started as a driver would (``on_unit_start``: walks drawn once
    per run, then conditioned and ranked at every bucket boundary of the unit ahead), then
    advanced to its attained service inside the unit. Per (active runs, buckets):

    - ``median_ms`` / ``p99_ms``: one re-rank of every active run (``policy.rank`` for each,
      i.e. a bucket lookup, and sorting the runs by rank), over ``repeats`` rounds;
    - ``table_ms``: median time to tabulate one run's ranks when its unit starts, given its
      walks (linear in buckets: one conditioning and one Gittins index per boundary);
    - ``walks_ms``: median time to draw one run's walks (independent of buckets).
    """
    from tqdm import tqdm

    rows = []
    # counted in runs prepared (walks drawn, rank tables built: the slow part, minutes at
    # 5000 runs), so that the bar moves from the start; each config's re-rank rounds are
    # bounded by max_s_per_config
    bar = tqdm(total=sum(n * (1 + len(buckets)) for n in active_runs), desc="overhead",
               unit="run", file=sys.stderr, disable=not progress)
    for n in active_runs:
        runs = _active_runs(n, setup, seed)
        into = [r.progress.current_attained_s for r in runs]
        for r, a in zip(runs, into, strict=True):  # back to the start of the current unit
            r.attained_s -= a
            r.progress.current_attained_s = 0.0
        pol = make_sim_policy("hermes", setup, seed=seed, pdgraph_dir=pdgraph_dir, buckets=1)
        walk_t = []
        for r in runs:  # the walks: drawn once per run, reused by every bucket setting
            t0 = time.perf_counter()
            pol.on_unit_start(r, r.progress.current, 0.0)
            walk_t.append(time.perf_counter() - t0)
            bar.update(1)
        for b in buckets:
            pol = make_sim_policy("hermes", setup, seed=seed, pdgraph_dir=pdgraph_dir, buckets=b)
            table_t = []
            for r, a in zip(runs, into, strict=True):
                r.attained_s -= r.progress.current_attained_s
                r.progress.current_attained_s = 0.0
                t0 = time.perf_counter()
                pol.on_unit_start(r, r.progress.current, 0.0)
                table_t.append(time.perf_counter() - t0)
                r.attained_s += a
                r.progress.current_attained_s = a
                bar.update(1)
            times = []
            t_cfg = time.perf_counter()
            for _ in range(repeats):
                t0 = time.perf_counter()
                for r in runs:
                    r.rank = pol.rank(r, 1.0)
                sorted(runs, key=_by_rank)
                times.append(time.perf_counter() - t0)
                if time.perf_counter() - t_cfg > max_s_per_config and len(times) >= 3:
                    break
            ms = np.array(times) * 1e3
            rows.append(
                {
                    "active_runs": n,
                    "buckets": b,
                    "median_ms": float(np.median(ms)),
                    "p99_ms": float(np.percentile(ms, 99)),
                    "table_ms": float(np.median(table_t) * 1e3),
                    "walks_ms": float(np.median(walk_t) * 1e3),
                    "rounds": len(times),
                }
            )
    bar.close()
    return rows


def _by_rank(run) -> float:  # noqa: ANN001
    return run.rank


# ---------------------------------------------------------------------------- output
def ratio_rows(rows: Sequence[dict], ref: str = "hermes") -> list[dict]:
    """``ref``'s mean and P95 ACT over every other policy's, per window and seed (same run,
    same arrivals): the figures the paper reports (e.g. Hermes 0.23x vLLM)."""
    by = {(r["window_min"], r.get("seed"), r["policy"]): r for r in rows}
    out = []
    for (w, s, p), r in by.items():
        base = by.get((w, s, ref))
        if p in (ref, ISOLATED) or base is None:
            continue
        row = {
            "window_min": w,
            "vs": p,
            f"{ref}_mean_ratio": base["mean_act_s"] / r["mean_act_s"],
            f"{ref}_p95_ratio": base["p95_act_s"] / r["p95_act_s"],
        }
        if s is not None:
            row["seed"] = s
        alone = by.get((w, s, ISOLATED))
        if alone is not None:  # what a perfect scheduler (no queueing at all) would reach
            row["best_mean_ratio"] = alone["mean_act_s"] / r["mean_act_s"]
        out.append(row)
    return out


def span(values: Sequence[float], nd: int = 1) -> str:
    """``mean (min-max)`` of a figure over seeds (just the value for one seed)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 1:
        return f"{v[0]:.{nd}f}"
    return f"{v.mean():.{nd}f} ({v.min():.{nd}f}-{v.max():.{nd}f})"


def gate_ratio_rows(rows: Sequence[dict]) -> list[dict]:
    """Per window, policy and seed: mean ACT with the KV gate over mean ACT without it (rows
    of both, same arrivals; ``gate_ratio`` < 1: the gate helps). Cells without both are
    skipped."""
    by: dict[tuple, dict[bool, float]] = {}
    for r in rows:
        by.setdefault((r["window_min"], r["policy"], r["seed"]), {})[bool(r["kv_gate"])] = \
            r["mean_act_s"]
    return [{"window_min": w, "policy": p, "seed": s, "gate_ratio": v[True] / v[False]}
            for (w, p, s), v in by.items() if True in v and False in v and v[False] > 0]


def seed_summary(rows: Sequence[dict], by: Sequence[str], columns: str, values: Sequence[str],
                 nd: int = 1) -> list[dict]:
    """Rows of one seed each, summarised over seeds: one row per distinct ``by``; with
    ``columns`` (e.g. ``policy``), one column per value of that field showing ``values[0]``,
    else one column per field of ``values``; each cell is the mean (min-max) over seeds."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    out = []
    for key, mine in groups.items():
        row: dict = dict(zip(by, key, strict=True))
        row["seeds"] = len({r.get("seed") for r in mine})
        if columns:
            for col in dict.fromkeys(r[columns] for r in mine):
                row[col] = span([r[values[0]] for r in mine if r[columns] == col], nd)
        else:
            for v in values:
                row[v] = span([r[v] for r in mine], nd)
        out.append(row)
    return out


def print_table(rows: Sequence[dict], title: str | None = None, file=None) -> None:  # noqa: ANN001
    """Print rows as a table (:func:`hermes.cliout.print_table`, compact floats; nothing when
    there are no rows)."""
    cliout.print_table(rows, title, compact=True, empty=None, file=file)


def write_json(path: str | Path, rows: Iterable[dict]) -> None:
    """The rows as a JSON list in ``path`` (:func:`hermes.cliout.write_json`, as the benchmarks
    write them: one-space indent, nothing said on stderr)."""
    cliout.write_json(path, rows, indent=1, quiet=True)


def plot_act_cdf(acts: dict, path: str | Path, title: str = "ACT CDF") -> None:
    """One panel per window: the empirical ACT CDF of every policy."""
    from hermes.extras import require

    matplotlib = require("plot")  # the `plot` extra
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows = sorted({w for w, _ in acts})
    fig, axes = plt.subplots(1, len(windows), figsize=(5 * len(windows), 4), squeeze=False)
    for ax, w in zip(axes[0], windows, strict=False):
        for (ww, p), a in acts.items():
            if ww != w:
                continue
            x = np.sort(a)
            ax.plot(x, np.arange(1, x.size + 1) / x.size, label=p)
        ax.set_xscale("log")
        ax.set_xlabel("ACT (s)")
        ax.set_ylabel("CDF")
        ax.set_title(f"{title}, {w:g}-min window")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


BenchFn = Callable[..., list[dict]]

"""Prewarming benchmarks on the simulator: ``prewarm`` (KV / LoRA) and ``knob`` (K sweep).

Every strategy of one experiment sees the same arrivals (``hermes.bench.sched.build_arrivals``:
the paper's app mix, Mooncake arrival pattern) under the same scheduling policy (default
``vllm``, so that only the prewarm strategy differs). The ``hermes`` strategy's planner draws
``--walks`` Monte Carlo walks per plan (default 200, fewer than the scheduler's 1000, to keep
the run short).

- ``prewarm --cache-gb 8,16,32`` (paper Fig. 13a): a KV prefix cache of that many GB per
  engine (tokens = GB / the cost model's KV bytes per token) and a host-memory tier of
  ``--cpu-cache-gb``; rows ``{cache_gb, strategy, kv_hit_ratio, mean_act_s, ...}``. Prefixes
  are the units' system prompts; with ``--tenants T`` every app is deployed by T tenants, each
  with its own prompts (T x the distinct prefixes). ``--bound`` adds the ``bound`` row: no
  prefix computed twice (:func:`bench_prewarm_kv`).
- ``prewarm --lora`` (Fig. 13b): ``--adapters`` rank-8 LoRA adapters, one per (tenant, app,
  LLM unit) until there are that many, tenants drawn uniformly per run; ``--max-loras`` GPU
  slots and ``--max-cpu-loras`` host slots; rows ``{strategy, lora_hit_ratio, mean_act_s, ...}``.
  A LoRA *hit* is an adapter already loaded when its request is admitted, in host memory or in
  a GPU slot: nothing is read from disk. That is what a prewarm can change in vLLM, whose
  ``load_lora_adapter`` loads into the host-memory LRU cache (``max_cpu_loras``) while the GPU
  slots (``max_loras``) are (re)filled per batch from there by a short copy;
  ``lora_gpu_hit_ratio`` counts only adapters already in a GPU slot.
- ``knob --apps CG,PE --k ...`` (Fig. 14): only those apps; per K (and ``--timing``, the
  planner's start-time rule) the mean ACT, its reduction against ``lru`` (no prewarm) measured
  on the same arrivals, and the wasted backend-seconds, added up over ``--seeds``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from hermes.bench.sched import build_arrivals, load_graphs, make_sim_policy, map_jobs
from hermes.core.prewarm import DEFAULT_TIMING
from hermes.sim.simulator import Arrival, Simulator, setup_engines

STRATEGIES = ("hermes", "epwq", "lru")
#: the host-memory KV tier per engine, GB: vLLM's default swap space (``--swap-space 4``)
DEFAULT_CPU_CACHE_GB = 4.0
#: the host tier of the ``bound`` row (:func:`bench_prewarm_kv`): more than any workload needs
UNLIMITED_GB = 1e6


@dataclass(frozen=True, slots=True)
class WarmJob:
    """One simulation: a strategy and the warm-state configuration."""

    tag: tuple
    strategy: str
    arrivals: tuple[Arrival, ...]
    setup: str = "llama2-7b-a100"
    policy: str = "vllm"
    k: float = 0.5
    timing: str = DEFAULT_TIMING  # how the planner's start time follows from K (start_offset)
    cache_gb: float | None = None
    cpu_cache_gb: float = 0.0
    swap_bytes_per_s: float = 16e9  # host-tier swap-in bandwidth (inf: instant)
    max_loras: int | None = None
    max_cpu_loras: int | None = None
    adapters: tuple[tuple[str, str, str], ...] = ()  # (tenant, app, unit) -> index = adapter
    walks: int = 200
    seed: int = 0
    pdgraph_dir: str | None = None
    single_use_sandboxes: bool = True  # docker instances serve one call (the live pool's way)


def _adapter_fn(job: WarmJob):  # noqa: ANN202
    table = {key: f"adapter{i}" for i, key in enumerate(job.adapters)}

    def adapter(run, app: str, unit: str) -> str | None:  # noqa: ANN001
        return table.get((run.tenant, app, unit))

    return adapter


def simulate(job: WarmJob) -> tuple[tuple, np.ndarray, dict, float]:
    """Worker: one simulation; returns (tag, ACTs in arrival order, warm stats, wall s)."""
    from hermes.core.estimator import EstimatorPool
    from hermes.core.prewarm import make_prewarm
    from hermes.sim.warm import SimWarmState

    cost, n_engines = setup_engines(job.setup)
    graphs = load_graphs(job.pdgraph_dir)
    pool = EstimatorPool(graphs, cost, n_walks=job.walks, seed=job.seed)
    strategy = make_prewarm(job.strategy, k=job.k, graphs=graphs.get, estimators=pool.get,
                            n_walks=job.walks, timing=job.timing)
    warm = SimWarmState(
        strategy, cost, n_engines=n_engines, cache_gb=job.cache_gb, cpu_cache_gb=job.cpu_cache_gb,
        swap_bytes_per_s=job.swap_bytes_per_s,
        max_loras=job.max_loras, max_cpu_loras=job.max_cpu_loras,
        adapter=_adapter_fn(job) if job.adapters else None,
    )
    pol = make_sim_policy(job.policy, job.setup, seed=job.seed, pdgraph_dir=job.pdgraph_dir)
    from hermes.core.tools_model import ToolPool

    tools = ToolPool(docker={"single_use": job.single_use_sandboxes})
    res = Simulator(pol, cost=cost, n_engines=n_engines, record=False, warm=warm,
                    tools=tools).run(
        list(job.arrivals)
    )
    by_id = {r.run_id: r for r in res.runs}
    acts = np.array([by_id[a.run_id].act_s for a in job.arrivals])
    return job.tag, acts, res.warm, res.wall_s


def run_warm_jobs(jobs: Sequence[WarmJob], *, workers: int | None = None,
                  progress: bool = True) -> dict:
    """Run the jobs (in parallel processes); ``{tag: (acts, stats)}``."""
    return {
        tag: (acts, stats)
        for tag, acts, stats, _ in map_jobs(simulate, jobs, workers=workers, progress=progress)
    }


def with_tenants(arrivals: Sequence[Arrival], tenants: int, seed: int) -> list[Arrival]:
    """Give every run a tenant ``t0..t{T-1}`` of its app, uniformly at random."""
    rng = np.random.default_rng([seed, 7])
    ids = rng.integers(0, tenants, size=len(arrivals))
    return [replace(a, tenant=f"{a.app}#t{int(t)}") for a, t in zip(arrivals, ids, strict=True)]


def _row_stats(stats: dict, keys: Sequence[str]) -> dict:
    return {k: stats.get(k, 0.0) for k in keys}


def bench_prewarm_kv(
    apps: int = 500,
    window_min: float = 15.0,
    cache_gbs: Sequence[float] = (8, 16, 32),
    strategies: Sequence[str] = STRATEGIES,
    *,
    tenants: int = 1,
    cpu_cache_gb: float = DEFAULT_CPU_CACHE_GB,
    k: float = 0.5,
    seed: int = 0,
    trace: str = "conversation",
    setup: str = "llama2-7b-a100",
    policy: str = "vllm",
    walks: int = 200,
    workers: int | None = None,
    progress: bool = True,
    pdgraph_dir: str | None = None,
    bound: bool = False,
) -> list[dict]:
    """Fig. 13a: KV prefix hit ratio and mean ACT per (cache size, strategy).

    ``bound``: one more row per cache size, ``bound``: ``lru`` with an unlimited host tier
    that swaps a prefix in at no cost, so that no prefix is ever computed twice (its blocks
    still come out of the GPU pool when a request uses it). It is what perfect foresight
    could at most save at that GPU cache size; its ``kv_hit_ratio`` counts the host-tier hits
    too (nothing recomputed, no stall)."""
    arrivals, _ = build_arrivals(apps, window_min, seed=seed, trace=trace, setup=setup)
    if tenants > 1:
        arrivals = with_tenants(arrivals, tenants, seed)
    jobs = [
        WarmJob((gb, s), s, tuple(arrivals), setup, policy, k, cache_gb=gb,
                cpu_cache_gb=cpu_cache_gb, walks=walks, seed=seed, pdgraph_dir=pdgraph_dir)
        for gb in cache_gbs
        for s in strategies
    ]
    if bound:
        jobs += [WarmJob((gb, "bound"), "lru", tuple(arrivals), setup, policy, k, cache_gb=gb,
                         cpu_cache_gb=UNLIMITED_GB, swap_bytes_per_s=float("inf"), walks=walks,
                         seed=seed, pdgraph_dir=pdgraph_dir)
                 for gb in cache_gbs]
    res = run_warm_jobs(jobs, workers=workers, progress=progress)
    rows = []
    for gb in cache_gbs:
        for s in [*strategies, *(["bound"] if bound else [])]:
            acts, st = res[(gb, s)]
            hits = "kv_resident_hit_ratio" if s == "bound" else "kv_hit_ratio"
            rows.append({
                "cache_gb": gb,
                "strategy": s,
                "kv_hit_ratio": st.get(hits, 0.0),
                "mean_act_s": float(acts.mean()),
                "p95_act_s": float(np.percentile(acts, 95)),
                **_row_stats(st, ("kv_cpu_hits", "kv_warming_hits", "prewarm_started",
                                  "prewarm_used", "prewarm_wasted", "prewarm_wasted_backend_s",
                                  "kv_prewarm_prefill_tokens", "kv_prewarm_dequeued",
                                  "kv_holds_dropped",
                                  "kv_pins_refused")),
                "runs": int(acts.size),
            })
    return rows


def lora_adapters(arrivals: Sequence[Arrival], n_adapters: int) -> tuple[tuple[str, str, str], ...]:
    """(tenant, app, LLM unit) triples, one adapter each, for the tenants in ``arrivals``:
    tenants in order of first appearance, units of each app from its shipped PDGraph."""
    graphs = load_graphs()
    out: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for a in arrivals:
        t = a.tenant or a.app
        if t in seen:
            continue
        seen.add(t)
        g = graphs.get(a.app)
        if g is None:
            continue
        for unit, node in g.units.items():
            if node.is_llm and len(out) < n_adapters:
                out.append((t, a.app, unit))
    return tuple(out)


def bench_prewarm_lora(
    apps: int = 1000,
    window_min: float = 25.0,
    strategies: Sequence[str] = STRATEGIES,
    *,
    adapters: int = 200,
    max_loras: int = 10,
    max_cpu_loras: int = 20,
    tenants: int = 8,
    k: float = 0.5,
    seed: int = 0,
    trace: str = "conversation",
    setup: str = "llama2-7b-a100",
    policy: str = "vllm",
    walks: int = 200,
    workers: int | None = None,
    progress: bool = True,
    pdgraph_dir: str | None = None,
) -> list[dict]:
    """Fig. 13b: LoRA adapter hit ratio and mean ACT per strategy."""
    arrivals, _ = build_arrivals(apps, window_min, seed=seed, trace=trace, setup=setup)
    arrivals = with_tenants(arrivals, tenants, seed)
    table = lora_adapters(arrivals, adapters)
    jobs = [
        WarmJob((s,), s, tuple(arrivals), setup, policy, k, max_loras=max_loras,
                max_cpu_loras=max_cpu_loras, adapters=table, walks=walks, seed=seed,
                pdgraph_dir=pdgraph_dir)
        for s in strategies
    ]
    res = run_warm_jobs(jobs, workers=workers, progress=progress)
    rows = []
    for s in strategies:
        acts, st = res[(s,)]
        rows.append({
            "strategy": s,
            "adapters": len(table),
            # a hit: the adapter is loaded (host memory or GPU) when its request is admitted,
            # so no load from disk stalls the batch (module docstring)
            "lora_hit_ratio": st.get("lora_resident_hit_ratio", 0.0),
            "lora_gpu_hit_ratio": st.get("lora_hit_ratio", 0.0),
            "mean_act_s": float(acts.mean()),
            "p95_act_s": float(np.percentile(acts, 95)),
            **_row_stats(st, ("lora_cpu_hits", "lora_warming_hits", "lora_stall_s",
                              "prewarm_started", "prewarm_used", "prewarm_wasted")),
            "runs": int(acts.size),
        })
    return rows


def bench_knob(
    app_names: Sequence[str] = ("CG", "PE"),
    ks: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9),
    apps: int = 200,
    window_min: float = 10.0,
    *,
    cache_gb: float | None = 8.0,
    cpu_cache_gb: float = DEFAULT_CPU_CACHE_GB,
    seed: int = 0,
    trace: str = "conversation",
    setup: str = "llama2-7b-a100",
    policy: str = "vllm",
    walks: int = 200,
    workers: int | None = None,
    progress: bool = True,
    pdgraph_dir: str | None = None,
    timings: Sequence[str] = (DEFAULT_TIMING,),
    seeds: Sequence[int] | None = None,
) -> list[dict]:
    """Fig. 14: per K, mean ACT reduction against ``lru`` and wasted backend-seconds.

    ``timings``: the planner's start-time rules to sweep (``ready``, ``late``; see
    :func:`hermes.core.prewarm.start_offset`). ``seeds``: arrival seeds; the figures of a row
    add up over them (every seed's runs against its own ``lru`` run), so that the differences
    between K are not within one seed's noise."""
    from hermes.workloads.registry import APPS

    by_short = {cls.short: name for name, cls in APPS.items()}
    names = [by_short.get(a, a) for a in app_names]
    for n in names:
        if n not in APPS:
            raise ValueError(f"unknown app {n!r}; known: {', '.join(sorted(by_short))}")
    from hermes.core.prewarm import TIMINGS

    for t in timings:
        if t not in TIMINGS:
            raise ValueError(f"--timing must be among {', '.join(TIMINGS)}, not {t!r}")
    seeds = [seed] if seeds is None else list(seeds)
    jobs = []
    for sd in seeds:
        arrivals = _arrivals_of(names, apps, window_min, sd, trace)
        base = WarmJob(("lru", sd), "lru", tuple(arrivals), setup, policy, cache_gb=cache_gb,
                       cpu_cache_gb=cpu_cache_gb, walks=walks, seed=sd, pdgraph_dir=pdgraph_dir)
        jobs.append(base)
        jobs += [replace(base, tag=("k", t, k, sd), strategy="hermes", k=k, timing=t)
                 for t in timings for k in ks]
    res = run_warm_jobs(jobs, workers=workers, progress=progress)
    acts0 = np.concatenate([res[("lru", sd)][0] for sd in seeds])
    counts = ("prewarm_planned", "prewarm_started", "prewarm_used", "prewarm_wasted")
    rows = []
    for t in timings:
        for k in ks:
            acts = np.concatenate([res[("k", t, k, sd)][0] for sd in seeds])
            stats = [res[("k", t, k, sd)][1] for sd in seeds]
            rows.append({
                "apps": ",".join(app_names),
                "timing": t,
                "k": k,
                "mean_act_s": float(acts.mean()),
                "lru_mean_act_s": float(acts0.mean()),
                "latency_reduction": 1.0 - float(acts.mean()) / float(acts0.mean()),
                "wasted_backend_s": sum(st.get("prewarm_wasted_backend_s", 0.0) for st in stats),
                **{c: sum(st.get(c, 0.0) for st in stats) for c in counts},
                "tool_hit_ratio": float(np.mean([st.get("tool_hit_ratio", 0.0) for st in stats])),
            })
    return rows


def _arrivals_of(names: Sequence[str], n: int, window_min: float, seed: int,
                 trace: str) -> list[Arrival]:
    from hermes.sim.arrivals import resample_arrivals

    times = resample_arrivals(n, window_min * 60.0, trace=trace, seed=seed)
    rng = np.random.default_rng([seed, 1])
    picks = rng.integers(0, len(names), size=n)
    seeds = rng.integers(0, 2**31 - 1, size=n)
    return [Arrival(float(t), names[int(p)], int(s), run_id=f"{names[int(p)]}-{i}")
            for i, (t, p, s) in enumerate(zip(times, picks, seeds, strict=True))]


def plot_knob(rows: Sequence[dict], path: str) -> None:
    """Latency reduction vs wasted backend-seconds, one point per K."""
    from hermes.extras import require

    matplotlib = require("plot")  # the `plot` extra
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for timing in dict.fromkeys(r.get("timing", DEFAULT_TIMING) for r in rows):
        sel = [r for r in rows if r.get("timing", DEFAULT_TIMING) == timing]
        x = [r["wasted_backend_s"] for r in sel]
        y = [100 * r["latency_reduction"] for r in sel]
        ax.plot(x, y, "o-", label=f"timing {timing}")
        for r, xi, yi in zip(sel, x, y, strict=True):
            ax.annotate(f"K={r['k']:g}", (xi, yi), textcoords="offset points", xytext=(4, 4))
    ax.legend()
    ax.set_xlabel("wasted backend-seconds")
    ax.set_ylabel("mean ACT reduction vs lru (%)")
    ax.set_title(f"K sweep ({rows[0]['apps'] if rows else ''})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

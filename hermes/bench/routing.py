"""``hermes bench routing``: the routers of :mod:`hermes.core.routing` on several engines, in
the simulator (issue 19).

Each cell simulates the same arrivals (``apps`` runs of the paper's mix in a ``window``-minute
window, Mooncake arrival times; :func:`hermes.bench.sched.build_arrivals`) on ``engines``
copies of one engine (``setup``'s cost model), each with its own prompt-prefix cache (the
built-in engine's LRU of whole prefixes: an app's unit prompts share a named prefix), under the
``hermes`` scheduling policy, once per router and seed. Rows: ``{router, seed, engines,
window_min, apps, prefix_hit_ratio, mean_act_s, p95_act_s, imbalance}``: prefix tokens found
in the chosen engine's cache over those looked up, ACT in model seconds, and the busiest
engine's share of the LLM requests over the mean share (1.0: even). Seeds run in parallel
processes with a progress bar.

Workloads (``workload``): ``paper`` (the paper's apps: their shared prefixes are unit roles)
or ``agents`` (issue 18's tool-using agent loops, SWE and RES: multi-turn runs whose prompts
grow with their own history; the prefix cache still sees only the named system-prompt
prefixes, so per-run history reuse is not modelled).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

WORKLOADS = ("paper", "agents")


def _cell(job: tuple) -> dict[str, Any]:
    """Worker: one simulation (module-level for the process pool)."""
    router, seed, engines, window, apps, setup, pdgraph_dir, workload = job
    from hermes.bench.sched import build_arrivals, make_sim_policy
    from hermes.core.warm_models import LRUPrefixCache
    from hermes.sim.simulator import Simulator, setup_engines

    arrivals, _ = build_arrivals(apps, window, seed=seed, setup=setup, workload=workload)
    cost, _ = setup_engines(setup)
    pol = make_sim_policy("hermes", setup, seed=seed, pdgraph_dir=pdgraph_dir)
    sim = Simulator(pol, cost=cost, n_engines=engines, record=False,
                    prefix_cache=LRUPrefixCache, router=router)
    res = sim.run(arrivals)
    acts = np.array([r.act_s for r in res.runs])
    caches = [e.prefix_cache for e in sim.engines]
    queries = sum(getattr(c, "queries", 0) for c in caches)
    hits = sum(getattr(c, "hits", 0) for c in caches)
    per_engine = list(sim.route_stats.by_engine.values())
    share = np.array(per_engine + [0] * (engines - len(per_engine)), dtype=float)
    return {
        "router": router, "seed": seed, "engines": engines, "window_min": window, "apps": apps,
        "prefix_hit_ratio": hits / queries if queries else 0.0,
        "mean_act_s": float(acts.mean()), "p95_act_s": float(np.percentile(acts, 95)),
        "imbalance": float(share.max() / share.mean()) if share.sum() else 1.0,
    }


def bench_routing(
    routers: Sequence[str] = ("least-loaded", "prefix", "session", "hermes"),
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    *,
    engines: int = 4,
    window_min: float = 10.0,
    apps: int | None = None,
    workload: str = "paper",
    setup: str = "llama2-7b-a100",
    pdgraph_dir: str | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """One row per router and seed (module docstring); ``apps`` default ``150 x engines``."""
    from hermes.bench.sched import map_jobs
    from hermes.core.routing import router_names

    if workload not in WORKLOADS:
        raise ValueError(f"--workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    bad = [r for r in routers if r not in router_names()]
    if bad or not routers:
        raise ValueError(f"--routers must list {', '.join(router_names())}, got {bad or '[]'}")
    if engines < 1 or not seeds or window_min <= 0:
        raise ValueError("--engines must be >= 1, --seeds non-empty, --window > 0")
    n_apps = apps if apps is not None else 150 * engines
    jobs = [(r, s, engines, window_min, n_apps, setup, pdgraph_dir, workload) for s in seeds
            for r in routers]
    return list(map_jobs(_cell, jobs, workers=workers, progress=progress))


def summary_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per router: mean and min-max over seeds of the hit ratio and the ACTs."""
    out = []
    for router in dict.fromkeys(r["router"] for r in rows):
        mine = [r for r in rows if r["router"] == router]

        def span(key: str, nd: int, rows: list[dict[str, Any]] = mine) -> str:
            v = np.array([r[key] for r in rows])
            return f"{v.mean():.{nd}f} ({v.min():.{nd}f}-{v.max():.{nd}f})"

        out.append({"router": router, "seeds": len(mine),
                    "prefix_hit_ratio": span("prefix_hit_ratio", 3),
                    "mean_act_s": span("mean_act_s", 1), "p95_act_s": span("p95_act_s", 1),
                    "imbalance": span("imbalance", 2)})
    return out

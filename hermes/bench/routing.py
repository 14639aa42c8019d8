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
grow with their own history). On ``agents`` each request's prefix key is its run's conversation
(``Simulator(history_apps=...)``: a turn's prompt is the previous prompt, the reply and the
tool's output, so the previous prompt is a cached prefix of it where the run's KV still is),
and each engine's cache is a :class:`~hermes.core.warm_models.RetainingPrefixCache` of
``cache_gb`` GiB of GPU KV and ``cpu_cache_gb`` GiB of host memory, under a KV retention rule
through tool calls (``retention``: :mod:`hermes.core.kv_retention`; ``lru``: none). Rows then
also carry ``retention``, ``cpu_hit_ratio`` (prefix tokens found in host memory over those
looked up) and ``decisions`` (retention actions taken).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

WORKLOADS = ("paper", "agents")


def _cell(job: tuple) -> dict[str, Any]:
    """Worker: one simulation (module-level for the process pool)."""
    (router, seed, engines, window, apps, setup, pdgraph_dir, workload, retention, cache_gb,
     cpu_gb) = job
    from hermes.bench.sched import build_arrivals, load_graphs, make_sim_policy
    from hermes.core.kv_retention import make_retention
    from hermes.core.warm_models import LRUPrefixCache, RetainingPrefixCache, gb_to_tokens
    from hermes.sim.retention import SimRetention
    from hermes.sim.simulator import Simulator, setup_engines
    from hermes.workloads.registry import AGENT_APPS

    arrivals, _ = build_arrivals(apps, window, seed=seed, setup=setup, workload=workload)
    cost, _ = setup_engines(setup)
    pol = make_sim_policy("hermes", setup, seed=seed, pdgraph_dir=pdgraph_dir)
    keeper = None
    if workload == "agents":
        caches = [RetainingPrefixCache(gb_to_tokens(cache_gb, cost.kv_bytes_per_token),
                                       cpu_capacity_tokens=gb_to_tokens(cpu_gb,
                                                                        cost.kv_bytes_per_token),
                                       kv_bytes_per_token=cost.kv_bytes_per_token)
                  for _ in range(engines)]
        keeper = SimRetention(make_retention(retention), caches, load_graphs(pdgraph_dir))
    sim = Simulator(pol, cost=cost, n_engines=engines, record=False,
                    prefix_cache=LRUPrefixCache if keeper is None else None, router=router,
                    retention=keeper, history_apps=AGENT_APPS if keeper is not None else (),
                    route_graphs=load_graphs(pdgraph_dir) if router == "hermes" else None)
    res = sim.run(arrivals)
    acts = np.array([r.act_s for r in res.runs])
    caches_ = [e.prefix_cache for e in sim.engines]
    queries = sum(getattr(c, "queries", 0) for c in caches_)
    hits = sum(getattr(c, "hits", 0) for c in caches_)
    cpu_hits = sum(getattr(c, "cpu_hit_tokens", 0) for c in caches_)
    per_engine = list(sim.route_stats.by_engine.values())
    share = np.array(per_engine + [0] * (engines - len(per_engine)), dtype=float)
    return {
        "router": router, "retention": retention if keeper is not None else "-", "seed": seed,
        "engines": engines, "window_min": window, "apps": apps,
        "prefix_hit_ratio": hits / queries if queries else 0.0,
        "cpu_hit_ratio": cpu_hits / queries if queries else 0.0,
        "decisions": dict(keeper.decisions) if keeper is not None else {},
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
    retention: Sequence[str] = ("lru",),
    cache_gb: float = 16.0,
    cpu_cache_gb: float = 64.0,
) -> list[dict[str, Any]]:
    """One row per router, retention rule and seed (module docstring); ``apps`` default
    ``150 x engines``. ``retention``, ``cache_gb`` and ``cpu_cache_gb`` apply to ``agents``."""
    from hermes.bench.sched import map_jobs
    from hermes.core.kv_retention import retention_names
    from hermes.core.routing import router_names

    if workload not in WORKLOADS:
        raise ValueError(f"--workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    bad = [r for r in routers if r not in router_names()]
    if bad or not routers:
        raise ValueError(f"--routers must list {', '.join(router_names())}, got {bad or '[]'}")
    badr = [r for r in retention if r not in retention_names()]
    if badr or not retention:
        raise ValueError(f"--retention must list {', '.join(retention_names())}, "
                         f"got {badr or '[]'}")
    if workload != "agents":
        retention = retention[:1]  # no history keys, no retention: one cell per router
    if cache_gb <= 0 or cpu_cache_gb < 0:
        raise ValueError(f"--cache-gb must be > 0 and --cpu-cache-gb >= 0, got {cache_gb}, "
                         f"{cpu_cache_gb}")
    if engines < 1 or not seeds or window_min <= 0:
        raise ValueError("--engines must be >= 1, --seeds non-empty, --window > 0")
    n_apps = apps if apps is not None else 150 * engines
    jobs = [(r, s, engines, window_min, n_apps, setup, pdgraph_dir, workload, k, cache_gb,
             cpu_cache_gb) for s in seeds for r in routers for k in retention]
    return list(map_jobs(_cell, jobs, workers=workers, progress=progress))


def summary_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per router and retention rule: mean and min-max over seeds of the hit ratios and the
    ACTs."""
    out = []
    for router, keep in dict.fromkeys((r["router"], r.get("retention", "-")) for r in rows):
        mine = [r for r in rows if r["router"] == router and r.get("retention", "-") == keep]

        def span(key: str, nd: int, rows: list[dict[str, Any]] = mine) -> str:
            v = np.array([r[key] for r in rows])
            return f"{v.mean():.{nd}f} ({v.min():.{nd}f}-{v.max():.{nd}f})"

        out.append({"router": router, "retention": keep, "seeds": len(mine),
                    "prefix_hit_ratio": span("prefix_hit_ratio", 3),
                    "cpu_hit_ratio": span("cpu_hit_ratio", 3) if "cpu_hit_ratio" in mine[0]
                    else "-",
                    "mean_act_s": span("mean_act_s", 1), "p95_act_s": span("p95_act_s", 1),
                    "imbalance": span("imbalance", 2)})
    return out

"""``hermes bench ...``: the benchmarks' command line (simulator and live).

:func:`add_parsers` adds the ``bench`` group; :func:`add_bench_parsers` its simulator
benchmarks (``sched``, ``ddl``, ``ablation``, ``overhead``, ``prewarm``, ``knob``, ``routing``,
``gateway``, ``seallm``), argparse wiring of :mod:`hermes.bench.sched` and its siblings; the
other benchmark modules (``soak``, ``calibrate``, ``forward``) add their own. Each handler
takes the parsed namespace and returns an exit status.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from hermes.argtypes import int_list, positive_float, positive_floats, positive_int
from hermes.bench import sched as B
from hermes.bench.prewarm import DEFAULT_CPU_CACHE_GB
from hermes.cliout import print_table, progress_bar, write_json


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> list[str]:
    if text.strip() == "all":
        return list(B.ALL_POLICIES)
    return [x.strip() for x in text.split(",") if x.strip()]


def _common(p: argparse.ArgumentParser, *, window: bool) -> None:
    p.add_argument("--apps", type=positive_int, default=300, help="application runs (default 300)")
    if window:
        p.add_argument("--window", type=positive_float, default=15.0,
                       help="submission window, minutes")
    p.add_argument("--seeds", type=int_list, default=None,
                   help="arrival seeds, comma-separated, run in parallel; tables show each "
                        "figure as mean (min-max) over them (default "
                        f"{','.join(map(str, B.DEFAULT_SEEDS))})")
    p.add_argument("--seed", type=int, default=None, help="one seed (same as --seeds N)")
    p.add_argument("--mix", default="stratified", choices=("stratified", "random"),
                   help="apps of the runs: stratified (the paper's 72/26/2 class counts "
                        "exactly; default) or random (each run's app drawn independently)")
    p.add_argument("--workload", default="paper", choices=("paper", "agents", "mixed"),
                   help="paper (the paper's apps; default), agents (the tool-using agent loops "
                        "SWE and RES, half each) or mixed (half agents, half the paper's mix)")
    p.add_argument("--trace", default="conversation", help="conversation | synthetic | PATH")
    p.add_argument("--setup", default="llama2-7b-a100-cal",
                   help="llama2-7b-a100-cal (default: LLaMA-2-7B on one A100-40GB, calibrated "
                        "on Vidur's profiles) | llama2-7b-a100 (the idealised model) | "
                        "llama3-70b-h800x8")
    p.add_argument("--mode", default=None, choices=("vllm-v1", "vllm-0.4"),
                   help="engine scheduler mode: runs SETUP@MODE (default: the setup's own, v1)")
    p.add_argument("--pdgraphs", default=None, help="knowledge base: a PDGraph directory or redis:// URL (default: $HERMES_KB, else the shipped PDGraphs)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="worker processes (default: cores)")
    p.add_argument("--json", default=None, help="write the rows as a JSON list to FILE")
    p.add_argument("--no-progress", action="store_true")


def _finish(
    rows: list[dict], args: argparse.Namespace, title: str, t0: float,
    extra: tuple[list[dict], str] | None = None, json_rows: list[dict] | None = None,
) -> int:
    """Print ``rows`` (and ``extra``), write ``json_rows`` (default ``rows``) to ``--json``."""
    B.print_table(rows, title=title)
    if extra and extra[0]:
        B.print_table(extra[0], title=extra[1])
    if args.json:
        B.write_json(args.json, rows if json_rows is None else json_rows)
    print(f"wall time: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def _setup(args: argparse.Namespace) -> str:
    """``--setup``, with ``--mode`` as its ``@MODE`` suffix (refused when it already has one)."""
    if args.mode is None:
        return args.setup
    if "@" in args.setup:
        raise SystemExit(f"--mode {args.mode}: --setup {args.setup!r} already names a mode")
    return f"{args.setup}@{args.mode}"


def _seed_list(args: argparse.Namespace) -> list[int]:
    """``--seeds``, else ``--seed``, else the default seeds."""
    if args.seeds:
        return list(args.seeds)
    return [args.seed] if args.seed is not None else list(B.DEFAULT_SEEDS)


def _seeds_text(seeds: list[int]) -> str:
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {','.join(map(str, seeds))}"


def _tool_instances(text: str | None) -> dict[str, int]:
    """``--tool-instances docker=4,dnn=1`` as ``{"docker": 4, "dnn": 1}`` (``SystemExit``
    naming a malformed item)."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        kind, sep, n = item.partition("=")
        if not sep or not n.strip().isdigit():
            raise SystemExit(f"--tool-instances: {item.strip()!r} is not KIND=N "
                             "(e.g. docker=4,dnn=1)")
        out[kind.strip()] = int(n)
    return out


def _default_policies() -> str:
    """The default ``bench sched`` policies; without pgmpy (the ``baselines`` extra) the
    faithful ``llmsched`` gives way to ``llmsched-lite``, said on stderr (asked for by name,
    ``llmsched`` is refused with the extra to install instead)."""
    import importlib.util

    names = list(B.DEFAULT_POLICIES)
    if "llmsched" in names and importlib.util.find_spec("pgmpy") is None:
        names[names.index("llmsched")] = "llmsched-lite"
        print("note: pgmpy is not installed (pip install 'hermes-gateway[baselines]'): "
              "running llmsched-lite in place of llmsched", file=sys.stderr)
    return ",".join(names)


def cmd_sched(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    if args.policies is None:
        args.policies = _default_policies()
    seeds = _seed_list(args)
    gates = {"off": (False,), "on": (True,), "both": (False, True)}[args.kv_gate]
    rows: list[dict] = []
    ratio_src: list[dict] = []
    acts: dict = {}
    for gate in gates:  # the same arrivals (seeded) with the gate off, then on
        got, got_acts = B.bench_sched(
            args.apps, args.window, _names(args.policies), seeds[0], args.trace,
            _setup(args), seeds=seeds, mix=args.mix, workload=args.workload,
            workers=args.workers, progress=not args.no_progress, pdgraph_dir=args.pdgraphs,
            tool_instances=_tool_instances(args.tool_instances), kv_gate=gate,
        )
        rows += got
        ratio_src += [{**r, "kv_gate": gate} for r in B.ratio_rows(got)]
        label = " (KV gate)" if gate and len(gates) > 1 else ""
        acts.update({(w, f"{p}{label}"): a for (w, p), a in got_acts.items()})
    if args.plot:
        B.plot_act_cdf(acts, args.plot, title=f"{_setup(args)}, {args.trace}")
    by = ("window_min", "kv_gate") if len(gates) > 1 else ("window_min",)
    ratios = B.seed_summary(ratio_src, (*by, "vs"), "",
                            ("hermes_mean_ratio", "hermes_p95_ratio", "best_mean_ratio"), nd=2)
    extra = (ratios, "hermes ACT / policy ACT, same arrivals (< 1: hermes faster); "
                     "mean (min-max) over seeds")
    gate_text = {"off": "", "on": ", KV gate", "both": ", KV gate off and on"}[args.kv_gate]
    title = (f"sched: mean ACT s, mean (min-max) over {_seeds_text(seeds)} ({_setup(args)}, "
             f"{args.trace}, {args.workload} workload, {args.mix} mix{gate_text})")
    summary = B.seed_summary(rows, by, "policy", ("mean_act_s",))
    if len(gates) > 1:
        B.print_table(B.seed_summary(B.gate_ratio_rows(rows), ("window_min",), "policy",
                                     ("gate_ratio",), nd=3),
                      title="mean ACT with the KV gate / without it, same arrivals (< 1: the "
                            "gate helps); mean (min-max) over seeds")
    return _finish(summary, args, title, t0, extra=extra, json_rows=rows)


def cmd_ddl(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    seeds = _seed_list(args)
    rows = B.bench_ddl(
        args.apps, args.window, _names(args.policies), seeds[0], args.trace, _setup(args),
        seeds=seeds, mix=args.mix, workload=args.workload, workers=args.workers,
        progress=not args.no_progress,
        pdgraph_dir=args.pdgraphs,
    )
    summary = B.seed_summary(rows, ("policy",), "",
                             ("dsr", "dsr_tight", "dsr_modest", "dsr_loose"), nd=3)
    title = (f"ddl ({args.window:g}-min window, {args.mix} mix; mean (min-max) over "
             f"{_seeds_text(seeds)})")
    return _finish(summary, args, title, t0, json_rows=rows)


def cmd_ablation(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    seeds = _seed_list(args)
    rows = B.bench_ablation(
        args.apps, args.window, _names(args.policies), seeds[0], args.trace, _setup(args),
        seeds=seeds, mix=args.mix, workload=args.workload, workers=args.workers,
        progress=not args.no_progress,
        pdgraph_dir=args.pdgraphs,
    )
    summary = B.seed_summary(rows, ("policy",), "", ("mean_act_s", "normalized"), nd=3)
    title = (f"ablation ({args.window:g}-min window, {args.mix} mix; normalized to oracle; "
             f"mean (min-max) over {_seeds_text(seeds)})")
    return _finish(summary, args, title, t0, json_rows=rows)


def cmd_overhead(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    rows = B.bench_overhead(
        args.active_runs, args.buckets, repeats=args.repeats, seed=args.seed,
        setup=args.setup, progress=not args.no_progress, pdgraph_dir=args.pdgraphs,
    )
    return _finish(rows, args, "overhead (re-rank of all active runs, hermes policy)", t0)


def cmd_prewarm(args: argparse.Namespace) -> int:
    from hermes.bench import prewarm as W

    t0 = time.perf_counter()
    common = dict(seed=args.seed, trace=args.trace, setup=args.setup, policy=args.policy,
                  walks=args.walks, workers=args.workers, progress=not args.no_progress,
                  pdgraph_dir=args.pdgraphs, k=args.k)
    if args.lora:
        rows = W.bench_prewarm_lora(
            args.apps or 1000, args.window or 25.0, _names(args.strategies),
            adapters=args.adapters, max_loras=args.max_loras, max_cpu_loras=args.max_cpu_loras,
            tenants=args.tenants or 8, **common,
        )
        title = (f"prewarm --lora ({args.adapters} adapters, max-loras {args.max_loras}, "
                 f"max-cpu-loras {args.max_cpu_loras}, seed {args.seed})")
    else:
        rows = W.bench_prewarm_kv(
            args.apps or 500, args.window or 15.0, _floats(args.cache_gb), _names(args.strategies),
            tenants=args.tenants or 1, cpu_cache_gb=args.cpu_cache_gb, bound=args.bound,
            **common,
        )
        title = f"prewarm KV prefixes (cpu tier {args.cpu_cache_gb:g} GB, seed {args.seed})"
    return _finish(rows, args, title, t0)


def cmd_knob(args: argparse.Namespace) -> int:
    from hermes.bench import prewarm as W

    t0 = time.perf_counter()
    rows = W.bench_knob(
        _names(args.apps), _floats(args.k), args.runs, args.window, cache_gb=args.cache_gb,
        cpu_cache_gb=args.cpu_cache_gb, seed=args.seed, trace=args.trace, setup=args.setup,
        policy=args.policy, walks=args.walks, workers=args.workers,
        progress=not args.no_progress, pdgraph_dir=args.pdgraphs,
        timings=[t.strip() for t in args.timing.split(",") if t.strip()],
        seeds=args.seeds,
    )
    if args.plot:
        W.plot_knob(rows, args.plot)
    seeds = args.seeds or args.seed
    return _finish(rows, args, f"knob: K sweep ({args.apps}, {args.runs} runs, seeds {seeds})",
                   t0)


# ----------------------------------------------------------------------------- bench estimator
def cmd_bench_estimator(args: argparse.Namespace) -> int:
    from hermes.bench.estimator import (
        REFINE_APPS,
        rank_agreement,
        refinement_accuracy,
        walks_per_second,
    )
    from hermes.bench.sched import load_graphs
    from hermes.core.costmodel import get_cost_model
    from hermes.kb import open_store
    from hermes.workloads.isolated import profile_app

    cost = get_cost_model(args.setup)
    store = open_store(args.pdgraphs)
    apps = args.apps.split(",") if args.apps else store.list_apps()
    speed = [walks_per_second(store.get(a), cost, n_walks=args.walks) for a in apps if store.get(a)]
    print_table(speed, title="Monte Carlo walks from the start of each app")
    rows = []
    for app in args.refine_apps.split(","):
        graph = store.get(app)
        if graph is None:
            raise SystemExit(f"no PDGraph for {app!r} in {store.describe()}")
        with progress_bar(args.runs, f"fresh runs of {app}") as bar:
            recs = profile_app(app, args.runs, args.seed, cost)
            rows.append(refinement_accuracy(graph, recs, cost, n_walks=args.walks, progress=bar.update))
    print_table(rows, title="Remaining-service MAE when the first unit finishes")
    agree = []
    graphs = load_graphs(args.pdgraphs) if args.rank_apps else {}
    for app in (args.rank_apps.split(",") if args.rank_apps else []):
        graph = graphs.get(app)
        if graph is None:
            raise SystemExit(f"no PDGraph for {app!r} in {store.describe()} or the agent "
                             "PDGraphs")
        with progress_bar(args.rank_runs, f"rank agreement, runs of {app}") as bar:
            recs = profile_app(app, args.rank_runs, args.seed, cost)
            agree.append(rank_agreement(graph, recs, cost, n_walks=args.walks,
                                        progress=bar.update)[0])
    if agree:
        print_table(agree, title="Gittins vs SRPT-on-the-mean at every unit boundary "
                    "(Kendall tau over all pairs of states; discordant: pairs ordered "
                    "differently)")
    write_json(args.json, [dict(r, table="walks") for r in speed]
               + [dict(r, table="refinement") for r in rows]
               + [dict(r, table="rank_agreement") for r in agree])
    assert REFINE_APPS
    return 0


def _prewarm_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", default="conversation", help="conversation | synthetic | PATH")
    p.add_argument("--setup", default="llama2-7b-a100", help="llama2-7b-a100 | llama3-70b-h800x8")
    p.add_argument("--policy", default="vllm", help="scheduling policy (same for all strategies)")
    p.add_argument("--walks", type=int, default=200, help="Monte Carlo walks per prewarm plan")
    p.add_argument("--pdgraphs", default=None, help="knowledge base: a PDGraph directory or redis:// URL (default: $HERMES_KB, else the shipped PDGraphs)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: cores)")
    p.add_argument("--cpu-cache-gb", dest="cpu_cache_gb", type=float,
                   default=DEFAULT_CPU_CACHE_GB,
                   help="host-memory KV tier per engine, GB (default: vLLM's default swap "
                        "space, %(default)g)")
    p.add_argument("--json", default=None, help="write the rows as a JSON list to FILE")
    p.add_argument("--no-progress", action="store_true")


def add_bench_parsers(bsub: argparse._SubParsersAction) -> None:
    """Add ``sched``, ``ddl``, ``ablation`` and ``overhead`` to ``hermes bench``."""
    s = bsub.add_parser("sched", help="ACT per policy and window (paper Fig. 9/10)")
    _common(s, window=False)
    s.add_argument("--window", type=positive_floats, default="10,15,30",
                   help="submission windows, minutes")
    s.add_argument("--policies", default=None,
                   help="comma-separated policy names, or 'all' (adds the ablations and the other "
                        f"baselines: srpt, sjf, autellix-plas, autellix-atlas); default "
                        f"{','.join(B.DEFAULT_POLICIES)} (llmsched-lite for llmsched when the "
                        "'baselines' extra is not installed, said on stderr)")
    s.add_argument("--plot", default=None, help="write the ACT CDF per policy to FILE.png")
    s.add_argument("--tool-instances", dest="tool_instances", default=None,
                   help="tool capacity per backend, KIND=N,... (kinds docker, dnn, api; "
                        "default docker=16,dnn=4,api=64: hermes/core/tools_model.py "
                        "TOOL_DEFAULTS), for the sensitivity of a table to the tool testbed")
    s.add_argument("--kv-gate", dest="kv_gate", nargs="?", const="on", default="off",
                   choices=("off", "on", "both"),
                   help="put the HermesLet's KV gate in front of the engines, for every policy: "
                        "a request starts only when its whole prompt fits in free KV "
                        "(hermes/core/kv_gate.py); default off (vLLM's rule: its first chunk); "
                        "--kv-gate alone is on; both runs the same arrivals without and with "
                        "it and prints the ratio")
    s.set_defaults(func=cmd_sched)

    s = bsub.add_parser("ddl", help="deadline satisfaction ratio (paper Fig. 11)")
    _common(s, window=True)
    s.add_argument("--policies", default=",".join(B.DDL_POLICIES))
    s.set_defaults(func=cmd_ddl)

    s = bsub.add_parser("ablation", help="Gittins / refinement ablation (paper Fig. 12)")
    _common(s, window=True)
    s.add_argument("--policies", default=",".join(B.ABLATION_POLICIES))
    s.set_defaults(func=cmd_ablation)

    s = bsub.add_parser("overhead", help="re-ranking time vs active runs and buckets (Fig. 15)")
    s.add_argument("--active-runs", dest="active_runs", type=int_list, default="100,1000,5000")
    s.add_argument("--buckets", type=int_list, default="10,20,50,100")
    s.add_argument("--repeats", type=int, default=20)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--setup", default="llama2-7b-a100")
    s.add_argument("--pdgraphs", default=None)
    s.add_argument("--json", default=None)
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=cmd_overhead)
    add_prewarm_parsers(bsub)
    add_gateway_parser(bsub)
    add_routing_parser(bsub)


def cmd_routing(args: argparse.Namespace) -> int:
    from hermes.bench.routing import bench_routing, summary_rows

    t0 = time.perf_counter()
    rows = bench_routing(_names(args.routers), args.seeds, engines=args.engines,
                         window_min=args.window, apps=args.apps, workload=args.workload,
                         setup=args.setup, pdgraph_dir=args.pdgraphs, workers=args.workers,
                         progress=not args.no_progress, retention=_names(args.retention),
                         cache_gb=args.cache_gb, cpu_cache_gb=args.cpu_cache_gb)
    title = (f"routing ({args.engines} engines, {args.workload} mix, {rows[0]['apps']} apps in "
             f"{args.window:g} min, hermes policy; mean (min-max) over seeds)")
    return _finish(summary_rows(rows), args, title, t0, json_rows=rows)


def add_routing_parser(bsub: argparse._SubParsersAction) -> None:
    """Add ``routing`` (the engine routers on several simulated engines)."""
    s = bsub.add_parser("routing", help="engine routers on several engines: prefix hit ratio, "
                                        "ACT, load imbalance (simulator)")
    s.add_argument("--engines", type=positive_int, default=4)
    s.add_argument("--routers", default="least-loaded,prefix,session,hermes")
    s.add_argument("--seeds", type=int_list, default="0,1,2,3,4")
    s.add_argument("--workload", default="paper", choices=("paper", "agents"),
                   help="paper (the paper's apps; default) or agents (SWE and RES agent loops)")
    s.add_argument("--window", type=positive_float, default=10.0, help="submission window, minutes")
    s.add_argument("--apps", type=positive_int, default=None,
                   help="runs per cell (default 150 x engines)")
    s.add_argument("--retention", default="lru",
                   help="KV retention through tool calls, agents only: lru,ttl,hermes")
    s.add_argument("--cache-gb", dest="cache_gb", type=float, default=16.0,
                   help="GPU KV prefix cache per engine, GiB (agents)")
    s.add_argument("--cpu-cache-gb", dest="cpu_cache_gb", type=float, default=64.0,
                   help="host-memory KV tier per engine, GiB (agents)")
    s.add_argument("--setup", default="llama2-7b-a100")
    s.add_argument("--pdgraphs", default=None)
    s.add_argument("--workers", type=positive_int, default=None)
    s.add_argument("--json", default=None, help="one row per router and seed")
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=cmd_routing)


def add_prewarm_parsers(bsub: argparse._SubParsersAction) -> None:
    """Add ``prewarm`` and ``knob`` to ``hermes bench``."""
    s = bsub.add_parser("prewarm", help="KV prefix / LoRA hit ratio and ACT per prewarm strategy "
                                         "(paper Fig. 13)")
    _prewarm_common(s)
    s.add_argument("--cache-gb", dest="cache_gb", default="8,16,32",
                   help="KV prefix cache sizes per engine, GB")
    s.add_argument("--lora", action="store_true", help="LoRA adapters instead of KV prefixes")
    s.add_argument("--strategies", default="hermes,epwq,lru")
    s.add_argument("--apps", type=positive_int, default=None, help="runs (default 500; --lora: 1000)")
    s.add_argument("--window", type=positive_float, default=None,
                   help="submission window, minutes (default 15; --lora: 25)")
    s.add_argument("--tenants", type=int, default=None,
                   help="tenants per app, each with its own prompts/adapters "
                        "(default 1; --lora: 8)")
    s.add_argument("--adapters", type=int, default=200)
    s.add_argument("--max-loras", dest="max_loras", type=int, default=10)
    s.add_argument("--max-cpu-loras", dest="max_cpu_loras", type=int, default=20)
    s.add_argument("--k", type=float, default=0.5, help="prewarm knob K of the hermes strategy")
    s.add_argument("--bound", action="store_true",
                   help="KV: add a 'bound' row per cache size: lru with an unlimited host tier "
                        "swapping in at no cost (no prefix computed twice), the most any "
                        "prewarm could save")
    s.set_defaults(func=cmd_prewarm)

    s = bsub.add_parser("knob", help="K sweep: ACT reduction vs wasted backend-seconds (Fig. 14)")
    _prewarm_common(s)
    s.add_argument("--apps", default="CG,PE", help="apps (short or full names)")
    s.add_argument("--k", default="0.1,0.3,0.5,0.7,0.9")
    s.add_argument("--runs", type=positive_int, default=100)
    s.add_argument("--window", type=positive_float, default=15.0, help="submission window, minutes")
    s.add_argument("--cache-gb", dest="cache_gb", type=float, default=8.0)
    s.add_argument("--plot", default=None, help="write the figure to FILE.png")
    s.add_argument("--timing", default="late",
                   help="planner start-time rules to sweep, comma-separated: late (p_s P(t_c <= "
                        "t_s + t_p) = K, the default) and/or ready (p_s P(t_c > t_s + t_p) = K, "
                        "as first specified)")
    s.add_argument("--seeds", type=int_list, default=None,
                   help="arrival seeds, comma-separated (figures add up over them; default "
                        "--seed)")
    s.set_defaults(func=cmd_knob)


def cmd_gateway(args: argparse.Namespace) -> int:
    from hermes.bench.gateway import bench_gateway

    t0 = time.perf_counter()
    rows = bench_gateway(args.requests, args.concurrency, tuple(_names(args.policies)),
                         warmup=args.warmup, progress=not args.no_progress, client=args.client,
                         fill_history=args.fill_history,
                         identities=tuple(_names(args.identity)), messages=args.messages,
                         tracing=tuple(_names(args.tracing)), baseline_src=args.baseline_src,
                         warm_history=args.warm_history, floor=args.floor)
    body = f"{args.messages}-message chats" if args.messages else "one-line completions"
    modes = _names(args.identity)
    # the table stays narrow: the request count (and one identity mode) is in the title, and
    # the stall's CPU columns have short names there (the JSON rows keep every field)
    short = {"concurrency": "conc", "max_pause_cpu_ms": "pause_cpu_ms", "max_busy_ms": "busy_ms",
             "max_gc_ms": "gc_ms", "client_cpu_ms": "client_cpu", "gateway_cpu_ms": "gw_cpu",
             "gateway_loop_cpu_ms": "gw_loop",
             "engine_cpu_ms": "engine_cpu", "export_cpu_ms": "export_cpu",
             "history_kind": "kind", "cpu_over_floor": "x_floor"}
    drop = {"requests"} | ({"identity"} if len(modes) == 1 else set()) | (
        set() if any(args.warm_history) else {"history_kind", "gateway_loop_cpu_ms"})
    if args.tracing == "off" and not args.baseline_src:
        drop |= {"tracing", "export_cpu_ms"}
    if len(modes) == 1:
        body += f", identity {modes[0]}"
    shown = [{short.get(k, k): v for k, v in r.items() if k not in drop} for r in rows]
    # (with a warm history: the learner's worker threads are the rest of gw_cpu)
    loop_note = " (gw_loop: the gateway's event-loop thread alone)" if any(args.warm_history) else ""
    floor_note = ("; x_floor: gw_cpu over the floor row's of the same concurrency and kind, "
                  "which the machine's speed does not move") if args.floor else ""
    if args.plot:
        from hermes.bench.gateway import plot_gateway

        plot_gateway(rows, args.plot)
    return _finish(shown, args, f"gateway overhead ({args.requests} requests of {body}, "
                   f"concurrency {args.concurrency}, {args.client} client; *_cpu: CPU ms "
                   f"per request of each process{loop_note}; max_pause_ms: longest event-loop "
                   f"stall of "
                   f"the gateway in the row, pause_cpu_ms: the gateway's CPU during it, "
                   f"busy_ms: the most the loop's own work used between two 5 ms wake-ups; gc_ms: "
                   f"longest collection; history: finished runs it "
                   f"keeps, or with kind inferred the header-less agent requests before the "
                   f"row{floor_note})", t0, json_rows=rows)


def add_gateway_parser(bsub: argparse._SubParsersAction) -> None:
    """Add ``gateway`` (direct vs through-the-gateway latency and throughput)."""
    s = bsub.add_parser("gateway", help="latency/throughput the gateway adds over its engine")
    s.add_argument("--requests", type=int, default=2000)
    s.add_argument("--concurrency", type=int_list, default="1,32",
                   help="requests in flight, comma-separated levels (default 1,32: the latency "
                        "added to a lone request, and the throughput under load)")
    s.add_argument("--warmup", type=int, default=200)
    s.add_argument("--policies", default="hermes,vllm")
    s.add_argument("--client", default="aiohttp", choices=("aiohttp", "httpx"),
                   help="benchmark HTTP client, the same for both paths (default aiohttp)")
    s.add_argument("--fill-history", dest="fill_history", type=int, default=10_000,
                   metavar="N",
                   help="one more row per policy at the highest concurrency, after filling the "
                        "gateway's finished-run history: keep_finished_runs = N, and N runs "
                        "first (default 10000, the gateway's default; 0: no such row)")
    s.add_argument("--identity", default="none",
                   help="how the gateway binds the requests, comma-separated modes measured "
                        "in turn in the same gateway: infer (no Hermes header: the run "
                        "resolver) | none (X-Hermes-Run: none: one-request runs); "
                        "'none,infer' gives the resolver's cost per request (default none)")
    s.add_argument("--messages", type=int, default=0, metavar="N",
                   help="send N-message chat requests (an agent's later turns) instead of "
                        "one-line completions (default 0)")
    s.add_argument("--tracing", default="off",
                   help="traces of runs, comma-separated modes, one gateway each: off | on "
                        "(OTLP/HTTP to a receiver in the benchmark that discards them); "
                        "'off,on' gives what tracing costs per request (default off)")
    s.add_argument("--baseline-src", dest="baseline_src", default=None, metavar="DIR",
                   help="also measure a gateway run from the Hermes source tree DIR (e.g. the "
                        "code before a change): rows with tracing = base, in the same run")
    s.add_argument("--warm-history", dest="warm_history", type=int_list, default=[],
                   metavar="N[,N...]",
                   help="also measure header-less agent traffic (history_kind inferred): fresh, "
                        "then after N such requests through the resolver and the learner, "
                        "in the same gateway; several increasing N (e.g. 10000,20000,50000): "
                        "rows after each, the history growing from one to the next (default: "
                        "no such rows)")
    s.add_argument("--floor", action="store_true",
                   help="also measure the floor (path floor): the same requests through a "
                        "proxy on the gateway's HTTP stack and engine client with nothing of "
                        "Hermes in it (python -m hermes.bench.floor); the gateway's CPU above "
                        "it is Hermes' own work")
    s.add_argument("--plot", default=None, metavar="FILE",
                   help="write a bar chart of the serving process's CPU per request (floor and "
                        "gateway rows, per concurrency level) to FILE.png (the plot extra)")
    s.add_argument("--json", default=None)
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=cmd_gateway)

    from hermes.bench.seallm import add_parser as add_seallm_parser

    add_seallm_parser(bsub)


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option of ``parser`` (and of its sub-commands) says its default in ``--help``,
    as argparse.ArgumentDefaultsHelpFormatter would, also where it has no help text (that
    formatter skips those) and not twice where the text already says it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                show_defaults(child)
            continue
        if (not action.option_strings or action.default is None or action.default is False
                or action.default is argparse.SUPPRESS):
            continue
        if action.help is None:
            action.help = "default: %(default)s"
        elif "default" not in action.help.lower():
            action.help += " (default: %(default)s)"


def add_parsers(sub: Any) -> None:
    """Add the ``bench`` group to the ``hermes`` sub-parsers."""
    b = sub.add_parser("bench", help="benchmarks (simulator and live)")
    bsub = b.add_subparsers(dest="bench", required=True)
    s = bsub.add_parser("estimator", help="walks per second and the refinement accuracy table")
    s.add_argument("--pdgraphs", help="knowledge base (default: $HERMES_KB, else the shipped PDGraphs)")
    s.add_argument("--apps", help="apps for the speed table (default: all)")
    s.add_argument("--refine-apps", dest="refine_apps", default="got_docmerge,factool_kbqa,langchain_mapreduce")
    s.add_argument("--runs", type=int, default=1000)
    s.add_argument("--seed", type=int, default=12345, help="seed of the fresh runs (shipped graphs use 0)")
    s.add_argument("--walks", type=int, default=1000)
    s.add_argument("--rank-apps", dest="rank_apps", default="",
                   help="apps for the Gittins-vs-mean rank agreement table, e.g. "
                        "swe_agent,research_agent,got_docmerge (default: none)")
    s.add_argument("--rank-runs", dest="rank_runs", type=int, default=200,
                   help="fresh runs per app for the rank agreement table")
    s.add_argument("--setup", default="llama2-7b-a100")
    s.add_argument("--json")
    s.set_defaults(func=cmd_bench_estimator)
    add_bench_parsers(bsub)
    from hermes.bench.soak import add_soak_parser

    add_soak_parser(bsub)
    from hermes.bench.calibrate import add_calibrate_parser

    add_calibrate_parser(bsub)
    from hermes.bench.forward_check import add_forward_parser

    add_forward_parser(bsub)
    from hermes.bench.quota import add_quota_parser

    add_quota_parser(bsub)
    from hermes.bench.ha import add_ha_parser

    add_ha_parser(bsub)
    show_defaults(b)

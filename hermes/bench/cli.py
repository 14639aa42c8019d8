"""``hermes bench sched|ddl|ablation|overhead``: argparse wiring of :mod:`hermes.bench.sched`.

``hermes.cli`` calls :func:`add_bench_parsers` with the ``bench`` sub-parsers; each handler
takes the parsed namespace and returns an exit status.
"""

from __future__ import annotations

import argparse
import sys
import time

from hermes.bench import sched as B


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _common(p: argparse.ArgumentParser, *, window: bool) -> None:
    p.add_argument("--apps", type=int, default=300, help="application runs (default 300)")
    if window:
        p.add_argument("--window", type=float, default=15.0, help="submission window, minutes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", default="conversation", help="conversation | synthetic | PATH")
    p.add_argument("--setup", default="llama2-7b-a100", help="llama2-7b-a100 | llama3-70b-h800x8")
    p.add_argument("--pdgraphs", default=None, help="PDGraph directory (default: pdgraphs/)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: cores)")
    p.add_argument("--json", default=None, help="write the rows as a JSON list to FILE")
    p.add_argument("--no-progress", action="store_true")


def _finish(rows: list[dict], args: argparse.Namespace, title: str, t0: float) -> int:
    B.print_table(rows, title=title)
    if args.json:
        B.write_json(args.json, rows)
    print(f"wall time: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def cmd_sched(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    rows, acts = B.bench_sched(
        args.apps, _floats(args.window), _names(args.policies), args.seed, args.trace, args.setup,
        workers=args.workers, progress=not args.no_progress, pdgraph_dir=args.pdgraphs,
    )
    if args.plot:
        B.plot_act_cdf(acts, args.plot, title=f"{args.setup}, {args.trace}")
    return _finish(rows, args, f"sched ({args.setup}, {args.trace}, seed {args.seed})", t0)


def cmd_ddl(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    rows = B.bench_ddl(
        args.apps, args.window, _names(args.policies), args.seed, args.trace, args.setup,
        workers=args.workers, progress=not args.no_progress, pdgraph_dir=args.pdgraphs,
    )
    return _finish(rows, args, f"ddl ({args.window:g}-min window, seed {args.seed})", t0)


def cmd_ablation(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    rows = B.bench_ablation(
        args.apps, args.window, _names(args.policies), args.seed, args.trace, args.setup,
        workers=args.workers, progress=not args.no_progress, pdgraph_dir=args.pdgraphs,
    )
    return _finish(rows, args, f"ablation ({args.window:g}-min window; normalized to oracle)", t0)


def cmd_overhead(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    rows = B.bench_overhead(
        _ints(args.active_runs), _ints(args.buckets), repeats=args.repeats, seed=args.seed,
        setup=args.setup, progress=not args.no_progress, pdgraph_dir=args.pdgraphs,
    )
    return _finish(rows, args, "overhead (re-rank of all active runs, hermes policy)", t0)


def add_bench_parsers(bsub: argparse._SubParsersAction) -> None:
    """Add ``sched``, ``ddl``, ``ablation`` and ``overhead`` to ``hermes bench``."""
    s = bsub.add_parser("sched", help="ACT per policy and window (paper Fig. 9/10)")
    _common(s, window=False)
    s.add_argument("--window", default="10,15,30", help="submission windows, minutes")
    s.add_argument("--policies", default=",".join(B.DEFAULT_POLICIES))
    s.add_argument("--plot", default=None, help="write the ACT CDF per policy to FILE.png")
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
    s.add_argument("--active-runs", dest="active_runs", default="100,1000,5000")
    s.add_argument("--buckets", default="10,20,50,100")
    s.add_argument("--repeats", type=int, default=20)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--setup", default="llama2-7b-a100")
    s.add_argument("--pdgraphs", default=None)
    s.add_argument("--json", default=None)
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=cmd_overhead)
    add_gateway_parser(bsub)


def cmd_gateway(args: argparse.Namespace) -> int:
    from hermes.bench.gateway import bench_gateway

    t0 = time.perf_counter()
    rows = bench_gateway(args.requests, args.concurrency, tuple(_names(args.policies)),
                         warmup=args.warmup, progress=not args.no_progress)
    return _finish(rows, args, f"gateway overhead ({args.requests} requests, "
                   f"concurrency {args.concurrency})", t0)


def add_gateway_parser(bsub: argparse._SubParsersAction) -> None:
    """Add ``gateway`` (direct vs through-the-gateway latency and throughput)."""
    s = bsub.add_parser("gateway", help="latency/throughput the gateway adds over its engine")
    s.add_argument("--requests", type=int, default=2000)
    s.add_argument("--concurrency", type=int, default=32)
    s.add_argument("--warmup", type=int, default=200)
    s.add_argument("--policies", default="hermes,vllm")
    s.add_argument("--json", default=None)
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=cmd_gateway)

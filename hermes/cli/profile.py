"""``hermes profile`` (learn a PDGraph) and ``hermes estimate`` (an app's demand before it starts)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hermes.cliout import print_json, print_table, progress_bar


def cmd_profile(args: argparse.Namespace) -> int:
    from hermes.core.costmodel import get_cost_model
    from hermes.core.profiler import Profiler
    from hermes.core.records import read_records, write_records

    if args.app:
        if not args.records and not args.out:
            raise SystemExit("hermes profile --app: give --records OUT.jsonl and/or --out PDGRAPH.json")
        from hermes.workloads.isolated import profile_app

        cost = get_cost_model(args.setup)
        with progress_bar(args.runs, f"profiling {args.app}") as bar:
            records = profile_app(args.app, args.runs, args.seed, cost, progress=lambda d, t: bar.update(1))
        if args.records:
            n = write_records(args.records, records)
            print(f"wrote {n} run records to {args.records}", file=sys.stderr)
        source = records
    else:
        if not args.records or not args.out:
            raise SystemExit("hermes profile: give --app NAME (simulate) or --records IN.jsonl --out PDGRAPH.json")
        source = read_records(args.records)
    if args.out:
        from tqdm import tqdm

        prof = Profiler(rho_threshold=args.rho, buckets=args.buckets)
        n = prof.add_many(tqdm(source, desc="learning", unit="run", file=sys.stderr, leave=False,
                               disable=None))
        prof.graph.save(args.out)
        masks = {e: m for e, m in prof.graph.summary()["masks"].items() if m}
        print(f"learned {prof.graph.app} from {n} runs -> {args.out}", file=sys.stderr)
        print_json({"app": prof.graph.app, "runs": n, "units": list(prof.graph.units), "masks": masks})
    return 0


# ----------------------------------------------------------------------------- estimate
def cmd_estimate(args: argparse.Namespace) -> int:
    from hermes.core.costmodel import get_cost_model
    from hermes.core.estimator import DemandEstimator
    from hermes.core.pdgraph import PDGraph

    graph = PDGraph.load(args.pdgraph)
    est = DemandEstimator(graph, get_cost_model(args.setup), n_walks=args.walks, seed=args.seed)
    summary = est.sample().summary()
    summary.pop("wall_s")
    if args.json:
        print_json(summary)
    else:
        rows = [{"demand": k, **{q: round(v, 2) for q, v in s.items()}} for k, s in summary.items()]
        print_table(rows, title=f"{graph.app}: total demand before start ({args.walks} walks)")
    return 0



def add_parsers(sub: Any) -> None:
    """Add ``profile`` and ``estimate`` to the ``hermes`` sub-parsers."""
    s = sub.add_parser("profile", help="run a benchmark app in simulation and/or learn a PDGraph from run records")
    s.add_argument("--app", help="benchmark app to run in simulation (then --records is an output)")
    s.add_argument("--runs", type=int, default=1000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--records", help="run records JSONL: written with --app, read otherwise")
    s.add_argument("--out", help="write the learned PDGraph here")
    s.add_argument("--setup", default="llama2-7b-a100", help="cost model for simulated runs")
    s.add_argument("--rho", type=float, default=0.5, help="correlation threshold of the masks")
    s.add_argument("--buckets", type=int, default=10)
    s.set_defaults(func=cmd_profile)

    s = sub.add_parser("estimate", help="an app's total demand before it starts")
    s.add_argument("--pdgraph", required=True)
    s.add_argument("--json", action="store_true")
    s.add_argument("--walks", type=int, default=5000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--setup", default="llama2-7b-a100")
    s.set_defaults(func=cmd_estimate)

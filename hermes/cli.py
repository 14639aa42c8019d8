"""The ``hermes`` command line: serve, profile, estimate, bench, load and admin commands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hermes import __version__
from hermes.cliout import print_json, print_table, write_json
from hermes.extras import MissingExtraError


def _progress(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="run", file=sys.stderr, leave=False, disable=None)


# ----------------------------------------------------------------------------- profile
def cmd_profile(args: argparse.Namespace) -> int:
    from hermes.core.costmodel import get_cost_model
    from hermes.core.profiler import Profiler
    from hermes.core.records import read_records, write_records

    if args.app:
        if not args.records and not args.out:
            raise SystemExit("hermes profile --app: give --records OUT.jsonl and/or --out PDGRAPH.json")
        from hermes.workloads.isolated import profile_app

        cost = get_cost_model(args.setup)
        with _progress(args.runs, f"profiling {args.app}") as bar:
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
        with _progress(args.runs, f"fresh runs of {app}") as bar:
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
        with _progress(args.rank_runs, f"rank agreement, runs of {app}") as bar:
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


# ----------------------------------------------------------------------------- serve
def cmd_serve(args: argparse.Namespace) -> int:
    from hermes.gateway.config import load_config
    from hermes.gateway.server import GatewayStartupError, serve

    config = load_config(
        args.config,
        host=args.host,
        port=args.port,
        policy=args.policy,
        time_scale=args.time_scale,
        apps=args.apps or None,
        kb=args.kb,
        state_dir=args.state_dir,
        bind=args.bind,
        auth_file=args.auth_file,
        state_redis=args.redis,
        election=args.ha,
        curve_dir=args.curve_dir,
        unsafe_unsandboxed=True if args.unsafe_unsandboxed_tools else None,
    )
    try:
        serve(config)
    except GatewayStartupError as exc:  # one line, not uvicorn's traceback
        print(f"hermes: error: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_example_config(args: argparse.Namespace) -> int:
    from importlib import resources

    sys.stdout.write((resources.files("hermes") / "data" / "hermes.example.toml").read_text())
    return 0


def _policy_names() -> str:
    from hermes.core.policies import policy_names

    return ", ".join(policy_names())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hermes", description=__doc__)
    p.add_argument("--version", action="version", version=f"hermes {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gateway and scheduler (embedded defaults: no arguments needed)",
                       description="Run the gateway. Flags override the config file and HERMES_* "
                       "environment variables (docs/configuration.md).")
    s.add_argument("--config", metavar="FILE",
                   help="hermes.toml (`hermes example-config` prints the commented example)")
    s.add_argument("--host", help="HTTP listen address (default 127.0.0.1; another needs --auth-file)")
    s.add_argument("--port", type=int, help="HTTP port (default 8000; 0: any free port)")
    s.add_argument("--policy", help=f"scheduling policy (default hermes): {_policy_names()}")
    s.add_argument("--time-scale", dest="time_scale", type=float, metavar="X",
                   help="the built-in engine and the scheduler clock run X times faster (default 1)")
    s.add_argument("--state-dir", dest="state_dir", help="durable state: runs, records, learned PDGraphs (default: the user data dir, ~/.local/share/hermes)")
    s.add_argument("--apps", action="append", metavar="MODULE",
                   help="Python module registering hosted apps (repeatable)")
    s.add_argument("--kb", help="PDGraph knowledge base: 'shipped' (default: the PDGraphs shipped "
                   "with Hermes), a directory, or redis://HOST:PORT/DB (env HERMES_KB)")
    s.add_argument("--bind", help="ZeroMQ address remote HermesLets connect to, e.g. "
                   "tcp://127.0.0.1:5557 (default: none with the embedded node, that address "
                   "without it)")
    s.add_argument("--auth-file", dest="auth_file",
                   help="API keys (hermes keys create): turns authentication on")
    s.add_argument("--redis", help="durable run state in Redis (default: SQLite in --state-dir)")
    s.add_argument("--curve-dir", dest="curve_dir",
                   help="CURVE certificates (hermes keys curve): HermesLets must authenticate")
    s.add_argument("--ha", metavar="REDIS_URL",
                   help="elected schedulers: take part in the election for the scheduler lease "
                   "in this Redis (a standby until elected; needs --redis and remote "
                   "HermesLets; docs/ha.md)")
    s.add_argument("--unsafe-unsandboxed-tools", dest="unsafe_unsandboxed_tools",
                   action="store_true",
                   help="UNSAFE, local development only: without bubblewrap, run tool calls as "
                   "plain subprocesses of the gateway (refused with a --host off loopback)")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("example-config", help="print the commented example hermes.toml "
                       "(every key and its default): hermes example-config > hermes.toml")
    s.set_defaults(func=cmd_example_config)

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
    try:
        from hermes.bench.cli import add_bench_parsers
    except ImportError:  # pragma: no cover - while the simulator benchmarks are absent
        pass
    else:
        add_bench_parsers(bsub)
    from hermes.bench.soak import add_soak_parser

    add_soak_parser(bsub)
    from hermes.bench.ha import add_ha_parser

    add_ha_parser(bsub)
    from hermes.bench.calibrate import add_calibrate_parser

    add_calibrate_parser(bsub)
    from hermes.bench.forward_check import add_forward_parser

    add_forward_parser(bsub)
    try:
        from hermes.admin import add_admin_parsers
    except ImportError:
        pass
    else:
        add_admin_parsers(sub)
    from hermes.plan.cli import add_plan_parser

    add_plan_parser(sub)
    from hermes.keys_cli import add_keys_parser

    add_keys_parser(sub)
    try:
        from hermes.loadgen import add_load_parser
    except ImportError:
        pass
    else:
        add_load_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, MissingExtraError) as exc:
        print(f"hermes: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

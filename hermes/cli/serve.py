"""``hermes serve`` (the gateway) and ``hermes example-config`` (its commented settings)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


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
        curve_key=args.curve_key,
        unsafe_unsandboxed=True if args.unsafe_unsandboxed_tools else None,
        **{"ha.role": args.role, "ha.edge_bind": args.edge_bind,
           "ha.advertise": args.advertise},
    )
    try:
        serve(config)
    except GatewayStartupError as exc:  # one line, not uvicorn's traceback
        print(f"hermes: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down; it re-raises the signal
        print("hermes: gateway stopped", file=sys.stderr)
    return 0


def cmd_example_config(args: argparse.Namespace) -> int:
    from importlib import resources

    sys.stdout.write((resources.files("hermes") / "data" / "hermes.example.toml").read_text())
    return 0


def _policy_names() -> str:
    from hermes.core.policies import policy_names

    return ", ".join(policy_names())



def add_parsers(sub: Any) -> None:
    """Add ``serve`` and ``example-config`` to the ``hermes`` sub-parsers."""
    s = sub.add_parser("serve", help="run the gateway and scheduler (embedded defaults: no arguments needed)",
                       description="Run the gateway. Flags override the config file and HERMES_* "
                       "environment variables (HERMES_SECTION__KEY, e.g. HERMES_SCHEDULER__K=0.3; "
                       "every key: `hermes example-config`). It says on stdout when it is "
                       "ready: its URL, model names and where its state is.")
    s.add_argument("--config", metavar="FILE",
                   help="hermes.toml (`hermes example-config` prints the commented example)")
    s.add_argument("--host", help="HTTP listen address (default 127.0.0.1; another needs --auth-file)")
    s.add_argument("--port", type=int, help="HTTP port (default 8000; 0: any free port)")
    s.add_argument("--policy", help=f"scheduling policy (default hermes): {_policy_names()}")
    s.add_argument("--time-scale", dest="time_scale", type=float, metavar="X",
                   help="the built-in engine and the scheduler clock run X times faster (default 1)")
    s.add_argument("--state-dir", dest="state_dir", help="durable state: runs, run records, learned PDGraphs (default: the user's data "
                   "directory, ~/.local/share/hermes on Linux, shared by the user's gateways "
                   "that have no --state-dir; shown at start)")
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
    s.add_argument("--ha", metavar="URL",
                   help="elected schedulers: take part in the election for the scheduler lease "
                   "in this store, redis://HOST:PORT/DB or etcd://HOST:PORT (a standby until "
                   "elected; needs --redis and remote HermesLets; see the High availability "
                   "page of the docs)")
    s.add_argument("--role", choices=("all", "edge", "scheduler"),
                   help="which part of the gateway this process runs (default all: HTTP and "
                   "scheduler in one process). edge: HTTP only, many behind a load balancer, "
                   "answers straight from the nodes (--bind: the address nodes send them "
                   "to); scheduler: ranking, runs, dispatch, node sockets, elected (--ha) and "
                   "called by edges on --edge-bind. Both need --ha (see the High availability "
                   "page of the docs)")
    s.add_argument("--edge-bind", dest="edge_bind", metavar="ADDRESS",
                   help="--role scheduler: the ZeroMQ address edges send calls to, e.g. "
                   "tcp://0.0.0.0:5560 (advertised in the lease record)")
    s.add_argument("--advertise", metavar="HOST",
                   help="the host others reach this process by, in place of 0.0.0.0 in the "
                   "addresses it advertises (e.g. the pod IP)")
    s.add_argument("--curve-dir", dest="curve_dir",
                   help="CURVE certificates (hermes keys curve): HermesLets (and, with split "
                   "roles, edges) must authenticate")
    s.add_argument("--curve-key", dest="curve_key", metavar="FILE",
                   help="--role edge with --curve-dir: this edge's certificate, "
                   "DIR/edges/NAME.key_secret (hermes keys curve --dir DIR --edge NAME)")
    s.add_argument("--unsafe-unsandboxed-tools", dest="unsafe_unsandboxed_tools",
                   action="store_true",
                   help="UNSAFE, local development only: without bubblewrap, run tool calls as "
                   "plain subprocesses of the gateway (refused with a --host off loopback)")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("example-config", help="print the commented example hermes.toml "
                       "(every key and its default): hermes example-config > hermes.toml")
    s.set_defaults(func=cmd_example_config)

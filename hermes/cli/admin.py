"""Admin commands of the ``hermes`` CLI: they talk to a running gateway's admin API.

``hermes apps list|show|import|export``, ``hermes runs list|show|cancel``,
``hermes policy show|set``, ``hermes knob show|set``, ``hermes top``. Every command takes
``--url`` (``$HERMES_URL``, default ``http://127.0.0.1:8000``), ``--token``
(``$HERMES_ADMIN_TOKEN``; not needed on loopback when the gateway has no token) and ``--json``
(machine-readable output on stdout; tables otherwise). Imports and exports of several apps show
a progress bar on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hermes.admin_client import DEFAULT_URL, AdminClient, AdminError
from hermes.cliout import print_json, print_json_pretty, print_table


def _client(args: argparse.Namespace) -> AdminClient:
    return AdminClient(args.url, args.token)


def _out(args: argparse.Namespace, data: Any, rows: list[dict] | None = None,
         title: str | None = None) -> None:
    """``--json``: ``data`` as JSON; else ``rows`` as a table (or ``data`` pretty-printed)."""
    if args.json:
        print_json(data)
    elif rows is not None:
        print_table(rows, title=title)
    else:
        print_json_pretty(data)


def _fmt(x: Any, nd: int = 2) -> Any:
    if isinstance(x, float):
        return round(x, nd)
    return "-" if x is None else x


# ----------------------------------------------------------------------------- apps
def cmd_apps_list(args: argparse.Namespace) -> int:
    data = _client(args).call("GET", "/admin/apps")
    rows = [{"name": a["name"], "hosted": a["hosted"], "pdgraph": a["pdgraph"],
             "inferred": a.get("inferred", False), "active_runs": a["active_runs"],
             "learned_runs": a["learned_runs"], "tenant": a.get("tenant", ""),
             "tools": ",".join(a.get("tools") or ())} for a in data["apps"]]
    _out(args, data, rows, title="apps")
    return 0


def cmd_apps_rename(args: argparse.Namespace) -> int:
    data = _client(args).call("POST", f"/admin/apps/{args.name}/rename", json={"to": args.to})
    if args.json:
        print_json(data)
    else:
        print(f"{data['previous']} is now {data['name']} (its PDGraph copied: "
              f"{'yes' if data['pdgraph_copied'] else 'no'})")
    return 0


def cmd_apps_merge(args: argparse.Namespace) -> int:
    data = _client(args).call("POST", f"/admin/apps/{args.name}/merge",
                              json={"into": args.into})
    if args.json:
        print_json(data)
    else:
        print(f"{data['merged']} merged into {data['name']}: its next runs are {data['name']}'s")
    return 0


def cmd_apps_show(args: argparse.Namespace) -> int:
    data = _client(args).call("GET", f"/admin/apps/{args.name}")
    pd = data.get("pdgraph")
    rows = None
    if pd:
        rows = [{"unit": u, "backend": v["backend"], "visits": v["visits"],
                 "in_tok": _fmt(v["mean_input_tokens"], 0), "out_tok": _fmt(v["mean_output_tokens"], 0),
                 "par": _fmt(v["mean_parallelism"]), "dur_s": _fmt(v["mean_duration_s"]),
                 "next": ", ".join(f"{k}:{p:.2f}" for k, p in v["next"].items())}
                for u, v in pd["units"].items()]
    _out(args, data, rows, title=f"{args.name} (runs learned: {pd['runs'] if pd else 0}, "
                                 f"hosted: {data['hosted']})")
    return 0


def cmd_apps_import(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    files = list(args.files)
    if args.shipped:
        from hermes.kb import shipped_pdgraphs_dir

        files += sorted(shipped_pdgraphs_dir().glob("*.json"))
    if not files:
        raise AdminError("give PDGraph JSON files, or --shipped")
    c = _client(args)
    done = []
    for path in tqdm(files, desc="importing", unit="app", file=sys.stderr, disable=None,
                     leave=False):
        text = Path(path).read_text()
        try:
            name = args.name or json.loads(text)["app"]
        except (ValueError, KeyError, TypeError):
            raise AdminError(f"{path}: not a PDGraph JSON document (no 'app' field)") from None
        res = c.call("PUT", f"/admin/apps/{name}", content=text,
                     headers={"Content-Type": "application/json"})
        done.append({"app": name, "file": str(path), "units": len(res.get("units", []))})
    _out(args, {"imported": done}, done, title="imported")
    return 0


def cmd_apps_export(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    c = _client(args)
    names = list(args.names)
    if args.all:
        names = [a["name"] for a in c.call("GET", "/admin/apps")["apps"] if a["pdgraph"]]
    if not names:
        raise AdminError("hermes apps export: name one or more apps, or --all")
    if len(names) > 1 and not args.dir:
        raise AdminError("hermes apps export: several apps need --dir DIR")
    out = []
    for name in tqdm(names, desc="exporting", unit="app", file=sys.stderr, disable=None,
                     leave=False):
        text = c.call("GET", f"/admin/apps/{name}/pdgraph")
        text = text if isinstance(text, str) else json.dumps(text)
        if args.dir:
            Path(args.dir).mkdir(parents=True, exist_ok=True)
            path = Path(args.dir) / f"{name}.json"
        elif args.output:
            path = Path(args.output)
        else:
            print(text)
            continue
        path.write_text(text)
        out.append({"app": name, "file": str(path)})
    if out:
        _out(args, {"exported": out}, out, title="exported")
    return 0


# ----------------------------------------------------------------------------- runs
_RUN_COLS = ("run_id", "app", "tenant", "state", "rank", "act_s", "attained_s", "current_unit",
             "pending_requests")


def _run_rows(runs: list[dict]) -> list[dict]:
    return [{k: _fmt(r.get(k)) for k in _RUN_COLS} for r in runs]


def cmd_runs_list(args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("state", args.state), ("app", args.app),
                                ("tenant", args.tenant), ("limit", args.limit)) if v is not None}
    data = _client(args).call("GET", "/admin/runs", params=params)
    _out(args, data, _run_rows(data["runs"]), title="runs (newest first)")
    return 0


def cmd_runs_show(args: argparse.Namespace) -> int:
    if args.timeline and not args.json:  # units, requests and tools on a time axis
        from hermes.cli.timeline import print_timeline

        print_timeline(_client(args).call("GET", f"/admin/runs/{args.run_id}/timeline"))
        return 0
    data = _client(args).call("GET", f"/admin/runs/{args.run_id}")
    if args.json:
        _out(args, data)
        return 0
    rows = [{"unit": u["unit"], "backend": u["backend"], "started": _fmt(u["started"]),
             "finished": _fmt(u["finished"]), "requests": len(u["requests"])}
            for u in data["units"]]
    head = {k: _fmt(data.get(k)) for k in ("run_id", "app", "tenant", "state", "rank", "act_s",
                                           "attained_s", "current_unit", "error")}
    _out(args, data, [head], title="run")
    if rows:
        _out(args, data, rows, title="units")
    return 0


def cmd_runs_cancel(args: argparse.Namespace) -> int:
    c = _client(args)
    rows = [c.call("POST", f"/admin/runs/{rid}/cancel") for rid in args.run_ids]
    _out(args, {"cancelled": rows}, _run_rows(rows), title="cancelled")
    return 0


# ----------------------------------------------------------------------------- policy, knobs
def cmd_policy_show(args: argparse.Namespace) -> int:
    data = _client(args).call("GET", "/admin/policy")
    _out(args, data, [{"policy": data["policy"], "k": data["k"], "switches": data["switches"],
                       "available": ", ".join(data["available"])}], title="policy")
    return 0


def cmd_policy_set(args: argparse.Namespace) -> int:
    data = _client(args).call("PUT", "/admin/policy", json={"policy": args.policy})
    _out(args, data, [data], title="policy switched")
    return 0


def _knob_rows(data: dict) -> list[dict]:
    rows = [{"scope": "default", "name": "", "k": data["knobs"].get("default", {}).get("", data["k"])}]
    for scope in ("tenant", "app"):
        rows += [{"scope": scope, "name": n, "k": k}
                 for n, k in sorted(data["knobs"].get(scope, {}).items())]
    return rows


def cmd_knob_show(args: argparse.Namespace) -> int:
    data = _client(args).call("GET", "/admin/knobs")
    _out(args, data, _knob_rows(data), title="K (prewarming knob)")
    return 0


def cmd_knob_set(args: argparse.Namespace) -> int:
    if args.app:
        scope, name = "app", args.app
    elif args.tenant:
        scope, name = "tenant", args.tenant
    else:
        scope, name = "default", ""
    if args.clear and scope == "default":
        raise AdminError("hermes knob set: --clear needs --app or --tenant")
    if not args.clear and args.k is None:
        raise AdminError("hermes knob set: give K (a number in [0, 1]) or --clear")
    k = None if args.clear else args.k
    data = _client(args).call("PUT", "/admin/knobs", json={"scope": scope, "name": name, "k": k})
    _out(args, data, _knob_rows(data), title="K (prewarming knob)")
    return 0


# ----------------------------------------------------------------------------- top
def render_top(snap: dict[str, Any]) -> Any:
    """A rich renderable of one ``/admin/top`` snapshot: a header, runs, engines."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    t = snap["totals"]
    head = Text(f"hermes top  policy={snap['policy']}  active={t['active']} "
                f"(queued {t['queued']}, running {t['running']})  finished={t['finished']}  "
                f"pending requests={t['requests_pending']}  nodes={t['nodes']}", style="bold")
    runs = Table(title="Runs (by rank, lowest first)", expand=False)
    for col in ("run", "app", "tenant", "state", "rank", "ACT s", "service s", "unit", "pend"):
        runs.add_column(col, justify="right" if col in ("rank", "ACT s", "service s", "pend")
                        else "left")
    for r in snap["runs"]:
        runs.add_row(r["run_id"][-12:], r["app"], r["tenant"], r["state"],
                     "-" if r["rank"] is None else f"{r['rank']:.2f}", f"{r['act_s']:.1f}",
                     f"{r['attained_s']:.1f}", r["current_unit"] or "-",
                     str(r["pending_requests"]))
    engines = Table(title="Engines", expand=False)
    for col in ("node", "engine", "model", "kind", "outstanding", "window", "queued", "KV %"):
        engines.add_column(col, justify="right" if col in ("outstanding", "window", "queued",
                                                            "KV %") else "left")
    for e in snap["engines"]:
        kv = "-" if e["kv_usage"] is None else f"{100 * e['kv_usage']:.0f}"
        engines.add_row(e["node"], e["engine"], e["model"], e["kind"], str(e["outstanding"]),
                        str(e["max_inflight"]), str(e["queued"]), kv)
    return Group(head, runs, engines)


def cmd_top(args: argparse.Namespace) -> int:
    c = _client(args)
    n = 0

    def snap() -> dict:
        return c.call("GET", "/admin/top", params={"limit": args.limit})

    if args.json or args.once:
        while True:
            s = snap()
            if args.json:
                print_json(s, flush=True)
            else:
                from rich.console import Console

                Console().print(render_top(s))
            n += 1
            if args.once or (args.iterations and n >= args.iterations):
                return 0
            time.sleep(args.interval)
    from rich.live import Live

    with Live(render_top(snap()), auto_refresh=False, screen=False) as live:
        try:
            while not args.iterations or n < args.iterations:
                time.sleep(args.interval)
                live.update(render_top(snap()), refresh=True)
                n += 1
        except KeyboardInterrupt:
            pass
    return 0


# ----------------------------------------------------------------------------- parsers
def _run(func: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except AdminError as e:
            print(f"hermes: error: {e}", file=sys.stderr)
            return 1

    return wrapped


def add_admin_parsers(sub: Any) -> None:
    """Add ``apps``, ``runs``, ``policy``, ``knob`` and ``top`` to the ``hermes`` parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("HERMES_URL", DEFAULT_URL),
                        help="gateway URL (default $HERMES_URL or %(default)s)")
    common.add_argument("--token", default=os.environ.get("HERMES_ADMIN_TOKEN"),
                        help="admin token (default $HERMES_ADMIN_TOKEN)")
    common.add_argument("--json", action="store_true", help="JSON output for scripts")

    a = sub.add_parser("apps", help="applications and their PDGraphs on a running gateway")
    asub = a.add_subparsers(dest="apps_cmd", required=True)
    s = asub.add_parser("list", parents=[common],
                        help="apps with a PDGraph, hosted, or inferred from plain traffic")
    s.set_defaults(func=_run(cmd_apps_list))
    s = asub.add_parser("rename", parents=[common],
                        help="rename an app inferred from plain traffic (from its next run on)")
    s.add_argument("name")
    s.add_argument("to")
    s.set_defaults(func=_run(cmd_apps_rename))
    s = asub.add_parser("merge", parents=[common],
                        help="merge an inferred app into another (its next runs are the other's)")
    s.add_argument("name")
    s.add_argument("into")
    s.set_defaults(func=_run(cmd_apps_merge))
    s = asub.add_parser("show", parents=[common], help="an app's PDGraph summary")
    s.add_argument("name")
    s.set_defaults(func=_run(cmd_apps_show))
    s = asub.add_parser("import", parents=[common], help="upload PDGraph JSON files")
    s.add_argument("files", nargs="*")
    s.add_argument("--shipped", action="store_true",
                   help="also every PDGraph shipped with Hermes (e.g. to seed a Redis knowledge base)")
    s.add_argument("--name", help="app name (default: the file's 'app' field)")
    s.set_defaults(func=_run(cmd_apps_import))
    s = asub.add_parser("export", parents=[common], help="download PDGraph JSON")
    s.add_argument("names", nargs="*")
    s.add_argument("--all", action="store_true", help="every app with a PDGraph")
    s.add_argument("-o", "--output", help="file for one app (default: stdout)")
    s.add_argument("--dir", help="directory for several apps (NAME.json)")
    s.set_defaults(func=_run(cmd_apps_export))

    r = sub.add_parser("runs", help="runs on a running gateway")
    rsub = r.add_subparsers(dest="runs_cmd", required=True)
    s = rsub.add_parser("list", parents=[common], help="recent runs, newest first")
    s.add_argument("--state", choices=["active", "queued", "running", "finished", "failed",
                                       "cancelled"])
    s.add_argument("--app")
    s.add_argument("--tenant")
    s.add_argument("--limit", type=int, default=50)
    s.set_defaults(func=_run(cmd_runs_list))
    s = rsub.add_parser("show", parents=[common], help="one run with its units")
    s.add_argument("run_id")
    s.add_argument("--timeline", action="store_true",
                   help="draw its units, requests and tools on a time axis (waiting vs serving)")
    s.set_defaults(func=_run(cmd_runs_show))
    s = rsub.add_parser("cancel", parents=[common], help="cancel runs")
    s.add_argument("run_ids", nargs="+")
    s.set_defaults(func=_run(cmd_runs_cancel))

    p = sub.add_parser("policy", help="the scheduling policy of a running gateway")
    psub = p.add_subparsers(dest="policy_cmd", required=True)
    s = psub.add_parser("show", parents=[common], help="current and available policies")
    s.set_defaults(func=_run(cmd_policy_show))
    s = psub.add_parser("set", parents=[common], help="switch live (ranks recomputed)")
    s.add_argument("policy")
    s.set_defaults(func=_run(cmd_policy_set))

    k = sub.add_parser("knob", help="the prewarming knob K per app or tenant")
    ksub = k.add_subparsers(dest="knob_cmd", required=True)
    s = ksub.add_parser("show", parents=[common], help="K by scope")
    s.set_defaults(func=_run(cmd_knob_show))
    s = ksub.add_parser("set", parents=[common],
                        help="set K for an app, a tenant, or the default")
    s.add_argument("k", nargs="?", type=float, help="K in [0, 1]")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--app")
    g.add_argument("--tenant")
    s.add_argument("--clear", action="store_true", help="remove the app/tenant override")
    s.set_defaults(func=_run(cmd_knob_set))

    t = sub.add_parser("top", parents=[common], help="live view of runs and engines")
    t.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    t.add_argument("--limit", type=int, default=20, help="runs shown")
    t.add_argument("--once", action="store_true", help="print one frame and exit")
    t.add_argument("--iterations", type=int, default=0, help="stop after N refreshes (0: never)")
    t.set_defaults(func=_run(cmd_top))

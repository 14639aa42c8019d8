"""``hermes run APP``: one run of a hosted app on a gateway, start to finish, failing loudly.

It waits until the gateway answers ``/healthz`` (``--ready-timeout``: a gateway started a
moment ago, on a loaded machine, may take tens of seconds), starts the run (``POST /v1/runs``
with ``input``: the gateway runs the hosted app itself), follows it until it ends
(``--timeout``) and prints it. The exit status says how it went: 0 finished, 1 the run failed,
was cancelled or did not end in time, 2 no gateway answered or it refused the run; each
with one line on stderr saying which. It is the README's first command's check that the
gateway works, and a script's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from hermes.admin_client import DEFAULT_URL
from hermes.cliout import print_json, print_table

TERMINAL = ("finished", "failed", "cancelled")


class RunCommandError(Exception):
    """What went wrong, in one line, and the exit status it gives."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def wait_ready(client: Any, url: str, timeout_s: float) -> dict[str, Any]:
    """``GET /healthz`` until the gateway answers 200 (its startup is over); its answer.
    Raises :class:`RunCommandError` (status 2) when ``timeout_s`` passes first."""
    import httpx

    deadline = time.monotonic() + timeout_s
    said = False
    last = "no answer"
    while True:
        try:
            r = client.get(f"{url}/healthz", timeout=5.0)
            if r.status_code == 200:
                return dict(r.json())
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            last = str(e) or type(e).__name__
        if time.monotonic() >= deadline:
            raise RunCommandError(f"no gateway ready at {url} after {timeout_s:g} s ({last}); "
                                  "is `hermes serve` running there?", 2)
        if not said:
            print(f"waiting for the gateway at {url} ...", file=sys.stderr, flush=True)
            said = True
        time.sleep(0.2)


def _error_text(r: Any) -> str:
    try:
        err = r.json().get("error", {})
        return str(err.get("message") or r.text)
    except ValueError:
        return r.text[:300]


def run_app(url: str, app: str, run_input: dict[str, Any], *, token: str | None,
            ready_timeout_s: float, timeout_s: float) -> dict[str, Any]:
    """Wait for the gateway, run ``app`` on ``run_input``, follow it to its end; the run."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(headers=headers) as client:
        health = wait_ready(client, url, ready_timeout_s)
        if health.get("status") != "ok":
            print(f"note: the gateway says {health.get('status')!r} (no node has joined yet)",
                  file=sys.stderr)
        r = client.post(f"{url}/v1/runs", json={"app": app, "input": run_input}, timeout=30.0)
        if r.status_code != 201:
            raise RunCommandError(f"the gateway refused the run (HTTP {r.status_code}): "
                                  f"{_error_text(r)}", 2)
        run = dict(r.json())
        print(f"run {run['run_id']} of {app}: {run['state']}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + timeout_s
        while run["state"] not in TERMINAL:
            if time.monotonic() >= deadline:
                raise RunCommandError(f"run {run['run_id']} did not end within {timeout_s:g} s "
                                      f"(state {run['state']})", 1)
            time.sleep(0.1)
            r = client.get(f"{url}/v1/runs/{run['run_id']}", timeout=30.0)
            if r.status_code != 200:
                raise RunCommandError(f"GET /v1/runs/{run['run_id']}: HTTP {r.status_code}: "
                                      f"{_error_text(r)}", 1)
            run = dict(r.json())
    return run


def cmd_run(args: argparse.Namespace) -> int:
    try:
        run_input = json.loads(args.input)
    except ValueError as e:
        raise SystemExit(f"hermes run: --input is not JSON: {e}") from None
    if not isinstance(run_input, dict):
        raise SystemExit("hermes run: --input must be a JSON object, e.g. '{\"seed\": 1}'")
    url = args.url.rstrip("/")
    try:
        run = run_app(url, args.app, run_input,
                      token=args.token or os.environ.get("HERMES_API_KEY"),
                      ready_timeout_s=args.ready_timeout, timeout_s=args.timeout)
    except RunCommandError as e:
        print(f"hermes run: error: {e}", file=sys.stderr)
        return e.status
    if args.json:
        print_json(run)
    else:
        print_table([{"run_id": run["run_id"], "app": run["app"], "state": run["state"],
                      "act_s": run["act_s"], "units": len(run.get("units") or ())}],
                    title="hermes run")
        if run.get("result") is not None:
            print("result:", json.dumps(run["result"]))
    if run["state"] != "finished":
        print(f"hermes run: error: run {run['run_id']} {run['state']}"
              f"{': ' + str(run['error']) if run.get('error') else ''}", file=sys.stderr)
        return 1
    return 0


def add_run_parser(sub: Any) -> None:
    """Add ``run`` to the ``hermes`` sub-parsers."""
    s = sub.add_parser("run", help="run a hosted app once on a gateway and wait for its end "
                       "(waits for the gateway to be ready; non-zero exit on any failure)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s.add_argument("app", help="hosted app, e.g. factool_kbqa (`hermes apps list`)")
    s.add_argument("--input", default="{}", help="the run's input, a JSON object")
    s.add_argument("--url", default=os.environ.get("HERMES_URL", DEFAULT_URL),
                   help="gateway base URL ($HERMES_URL)")
    s.add_argument("--token", default=None,
                   help="API key when the gateway has authentication on ($HERMES_API_KEY)")
    s.add_argument("--ready-timeout", dest="ready_timeout", type=float, default=120.0,
                   help="seconds to wait for the gateway to answer")
    s.add_argument("--timeout", type=float, default=300.0,
                   help="seconds to wait for the run to end")
    s.add_argument("--json", action="store_true", help="print the run as JSON")
    s.set_defaults(func=cmd_run)

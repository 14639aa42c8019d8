"""``hermes load``: the benchmark apps as real HTTP clients of a live gateway.

The workload is the one ``hermes bench sched`` simulates (:func:`hermes.bench.sched.build_arrivals`:
``apps`` runs drawn from the paper's mix, arrival times resampled from a Mooncake trace into
the submission window, one seed per run), so a live figure and a simulated one are of the same
experiment. Each run is an independent client, as an agent written against the OpenAI SDK is:

- ``POST /v1/runs {"app", "tenant"}`` when it arrives (tenant = app, as in the simulator);
- every LLM step: its requests, in parallel, through the **OpenAI SDK** (``AsyncOpenAI`` with
  the gateway as ``base_url`` and the ``X-Hermes-Run`` / ``X-Hermes-Unit`` headers); prompts
  have the step's input token count (4 characters a token) and ``max_tokens`` its output
  tokens (:func:`hermes.gateway.hosted.step_request`, the same bodies hosted apps send);
- every tool step: ``POST /v1/runs/{id}/events`` start, the tool's duration (model time),
  ``events`` finish (``--tools events``, the default), or a real call of the tools endpoint
  that sleeps the duration in a HermesLet's sandbox (``--tools runner``);
- ``POST /v1/runs/{id}/finish`` after the last step.

Time: the gateway's engine and clock run ``time_scale`` times faster than wall time (``hermes
serve --time-scale X``), so the driver sleeps arrival offsets, client gaps and tool durations
divided by ``X`` and reports ACT in *model* seconds (wall ACT x ``X``), the unit of ``hermes
bench sched``. Rows: ``{window_min, policy, mean_act_s, p50_act_s, p95_act_s, p99_act_s, runs,
failed, server_mean_act_s, wall_s}`` (``server_mean_act_s``: the gateway's own ACT of the same
runs, for cross-checking the clock). ``--sim`` adds the simulator's row for the same arrivals,
policy and engine setup, and the ratio of the two means.

``--identity headers|infer|none`` sends the same arrivals as programs send them instead
(conversations with the replies the gateway returned, independent prompts; with full Hermes
headers, none at all, or ``X-Hermes-Run: none``) and scores the runs, units and apps the
gateway inferred against the truth (:mod:`hermes.bench.identity_load`). Without it, the
bodies are the ones above, so earlier figures stay reproducible.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

LOAD_COLUMNS = ("window_min", "policy", "mean_act_s", "p50_act_s", "p95_act_s", "p99_act_s", "runs")


@dataclass(slots=True)
class RunOutcome:
    """One client run: its app, ACT in model seconds (client-measured and gateway-reported).

    ``act_s`` runs from just before the create request to the finish response, ``inner_act_s``
    from the create response to just before the finish request: the gateway's own ACT
    (``server_act_s``) lies between the two whatever the HTTP latency, so the pair is how a
    client checks the gateway's clock without trusting its own round trips.
    """

    app: str
    arrival_s: float
    run_id: str | None = None
    act_s: float | None = None
    inner_act_s: float | None = None
    server_act_s: float | None = None
    llm_requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None
    units: list[str] = field(default_factory=list)


class LoadDriver:
    """Drives one experiment against a gateway at ``url`` (HTTP only; nothing in-process)."""

    def __init__(
        self,
        url: str,
        *,
        time_scale: float = 1.0,
        tools: str = "events",
        model: str | None = None,
        request_timeout_s: float = 600.0,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"--time-scale must be > 0, got {time_scale}")
        if tools not in ("events", "runner"):
            raise ValueError(f"--tools must be 'events' or 'runner', got {tools!r}")
        self.url = url.rstrip("/")
        self.time_scale = time_scale
        self.tools = tools
        self.model = model
        self.timeout = request_timeout_s
        from hermes.extras import require

        openai = require("load")  # the `load` extra: the clients are OpenAI-SDK agents
        limits = httpx.Limits(max_connections=2000, max_keepalive_connections=500)
        self.http = httpx.AsyncClient(base_url=self.url, timeout=request_timeout_s, limits=limits)
        self.openai = openai.AsyncOpenAI(
            base_url=self.url + "/v1", api_key="hermes-load", max_retries=0,
            timeout=request_timeout_s,
            http_client=httpx.AsyncClient(timeout=request_timeout_s, limits=limits),
        )

    async def close(self) -> None:
        await self.openai.close()
        await self.http.aclose()

    async def info(self) -> dict[str, Any]:
        """The gateway's health (policy, nodes); picks the served model if none was given."""
        try:
            health = (await self.http.get("/healthz")).json()
            models = (await self.http.get("/v1/models")).json()
        except httpx.HTTPError as e:
            raise OSError(f"gateway at {self.url} is not reachable: {e}") from e
        served = [m["id"] for m in models.get("data", [])]
        if not served:
            raise OSError(f"gateway at {self.url} serves no model (no HermesLet connected?)")
        if self.model is None:
            self.model = served[0]
        return health

    def wall(self, model_s: float) -> float:
        return model_s / self.time_scale

    async def _post(self, path: str, body: dict[str, Any], expect: int = 200) -> dict[str, Any]:
        r = await self.http.post(path, json=body)
        if r.status_code != expect:
            raise RuntimeError(f"POST {path} -> {r.status_code}: {r.text[:200]}")
        return r.json()

    async def _llm(self, run_id: str, unit: str, endpoint: str, body: dict[str, Any]) -> Any:
        headers = {"X-Hermes-Run": run_id, "X-Hermes-Unit": unit}
        if endpoint == "chat":
            return await self.openai.chat.completions.create(
                model=self.model, messages=body["messages"], max_tokens=body["max_tokens"], extra_body={"ignore_eos": True},
                extra_headers=headers)
        return await self.openai.completions.create(
            model=self.model, prompt=body["prompt"], max_tokens=body["max_tokens"], extra_body={"ignore_eos": True},
            extra_headers=headers)

    async def run_one(self, app_name: str, seed: int, arrival_s: float, start_wall: float) -> RunOutcome:
        """One run of ``app_name`` arriving ``arrival_s`` model seconds after ``start_wall``."""
        from hermes.gateway.hosted import step_request
        from hermes.workloads.registry import get_app

        out = RunOutcome(app=app_name, arrival_s=arrival_s)
        delay = start_wall + self.wall(arrival_s) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        t0 = time.monotonic()
        try:
            run = await self._post("/v1/runs", {"app": app_name, "tenant": app_name}, expect=201)
            rid = out.run_id = run["run_id"]
            t_created = time.monotonic()
            for step in get_app(app_name).steps(np.random.default_rng(seed)):
                if step.gap_s > 0:
                    await asyncio.sleep(self.wall(step.gap_s))
                out.units.append(step.unit)
                if step.is_llm:
                    calls = [step_request(app_name, step.unit, c.input_tokens, c.output_tokens,
                                          c.prefix_tokens) for c in step.requests]
                    results = await asyncio.gather(*(self._llm(rid, step.unit, ep, body)
                                                     for ep, body in calls))
                    for res in results:
                        out.llm_requests += 1
                        out.input_tokens += res.usage.prompt_tokens
                        out.output_tokens += res.usage.completion_tokens
                else:
                    await self._tool(rid, step.unit, step.backend, float(step.duration_s or 0.0))
            t_finishing = time.monotonic()
            fin = await self._post(f"/v1/runs/{rid}/finish", {})
            out.inner_act_s = (t_finishing - t_created) * self.time_scale
            out.act_s = (time.monotonic() - t0) * self.time_scale
            out.server_act_s = fin.get("act_s")
        except Exception as e:  # a failed run is reported, not fatal to the experiment
            out.error = f"{type(e).__name__}: {e}"
        return out

    async def _tool(self, rid: str, unit: str, backend: str, duration_s: float) -> None:
        wall = self.wall(duration_s)
        if self.tools == "runner" and backend.startswith("docker:"):
            await self._post(f"/v1/runs/{rid}/tools", {
                "unit": unit, "backend": backend, "code": f"import time; time.sleep({wall!r})",
                "timeout_s": max(30.0, 2 * wall + 5)})
            return
        await self._post(f"/v1/runs/{rid}/events", {"unit": unit, "event": "start",
                                                    "backend": backend})
        await asyncio.sleep(wall)
        await self._post(f"/v1/runs/{rid}/events", {"unit": unit, "event": "finish"})

    async def run(self, arrivals: list[Any], *, progress: bool = True) -> list[RunOutcome]:
        """Run every arrival (``hermes.sim.simulator.Arrival``) as its own client task."""
        from tqdm import tqdm

        bar = tqdm(total=len(arrivals), desc="runs", unit="run", file=sys.stderr,
                   disable=not progress)
        start = time.monotonic() + 0.2
        t0 = min((a.time for a in arrivals), default=0.0)

        async def one(a: Any) -> RunOutcome:
            res = await self.run_one(a.app, a.seed, a.time - t0, start)
            bar.update(1)
            if res.error:
                bar.write(f"run of {a.app} failed: {res.error}")
            return res

        try:
            return list(await asyncio.gather(*(one(a) for a in arrivals)))
        finally:
            bar.close()


def summarize(outcomes: list[RunOutcome], *, window_min: float, policy: str,
              wall_s: float) -> dict[str, Any]:
    """The ``hermes bench sched`` row of a live experiment (ACT in model seconds)."""
    ok = [o for o in outcomes if o.error is None and o.act_s is not None]
    a = np.array([o.act_s for o in ok], dtype=float)
    srv = np.array([o.server_act_s for o in ok if o.server_act_s is not None], dtype=float)

    def pct(q: float) -> float:
        return float(np.percentile(a, q)) if a.size else float("nan")

    return {
        "window_min": window_min,
        "policy": policy,
        "mean_act_s": float(a.mean()) if a.size else float("nan"),
        "p50_act_s": pct(50),
        "p95_act_s": pct(95),
        "p99_act_s": pct(99),
        "runs": int(a.size),
        "failed": len(outcomes) - len(ok),
        "server_mean_act_s": float(srv.mean()) if srv.size else float("nan"),
        "wall_s": wall_s,
    }


def simulate_row(arrivals: list[Any], *, window_min: float, policy: str, setup: str,
                 seed: int, pdgraph_dir: str | None = None, tools: str = "events",
                 ) -> dict[str, Any]:
    """The simulator's row for the same arrivals, policy, engine setup and tool placement.

    ``tools="events"``: the load clients run their tool steps themselves (a wait between two
    unit events), so the simulator gives every tool call its service time, unqueued and warm
    (:meth:`ToolPool.client_side`); ``"runner"``: the calls share the node's tool servers
    (the simulator's default pool, with its capacities and cold starts). The simulated engine
    keeps the same prompt-prefix cache as the gateway's built-in engine (``LRUPrefixCache``):
    without it every system prompt is prefilled again and the simulator is ~15-20% slower
    than the live engine on the same arrivals."""
    from hermes.bench.sched import simulate
    from hermes.core.tools_model import ToolPool
    from hermes.core.warm_models import LRUPrefixCache

    pool = ToolPool.client_side() if tools == "events" else None
    acts, _, wall = simulate(policy, setup, arrivals, seed, pdgraph_dir, tools=pool,
                             prefix_cache=LRUPrefixCache)
    return {
        "window_min": window_min,
        "policy": f"{policy} (sim)",
        "mean_act_s": float(acts.mean()),
        "p50_act_s": float(np.percentile(acts, 50)),
        "p95_act_s": float(np.percentile(acts, 95)),
        "p99_act_s": float(np.percentile(acts, 99)),
        "runs": int(acts.size),
        "failed": 0,
        "server_mean_act_s": float("nan"),
        "wall_s": wall,
    }


async def load(
    url: str,
    *,
    apps: int,
    window_min: float,
    trace: str = "conversation",
    seed: int = 0,
    time_scale: float = 1.0,
    tools: str = "events",
    setup: str = "llama2-7b-a100",
    progress: bool = True,
) -> tuple[dict[str, Any], list[Any], list[RunOutcome]]:
    """One live experiment: returns its row, the arrivals, and each run's outcome."""
    from hermes.bench.sched import build_arrivals

    if apps < 1:
        raise ValueError(f"--apps must be >= 1, got {apps}")
    if window_min <= 0:
        raise ValueError(f"--window must be > 0 minutes, got {window_min}")
    arrivals, _ = build_arrivals(apps, window_min, seed=seed, trace=trace, setup=setup)
    driver = LoadDriver(url, time_scale=time_scale, tools=tools)
    try:
        health = await driver.info()
        t0 = time.perf_counter()
        outcomes = await driver.run(arrivals, progress=progress)
        wall = time.perf_counter() - t0
    finally:
        await driver.close()
    row = summarize(outcomes, window_min=window_min, policy=str(health.get("policy", "?")),
                    wall_s=wall)
    return row, arrivals, outcomes


# ---------------------------------------------------------------------------------- CLI
def cmd_load(args: argparse.Namespace) -> int:
    from hermes.bench.sched import print_table, write_json

    if args.identity is not None:
        return _cmd_identity(args)

    row, arrivals, outcomes = asyncio.run(load(
        args.url, apps=args.apps, window_min=args.window, trace=args.trace, seed=args.seed,
        time_scale=args.time_scale, tools=args.tools, setup=args.setup,
        progress=not args.no_progress,
    ))
    rows = [row]
    if args.sim:
        sim = simulate_row(arrivals, window_min=args.window, policy=row["policy"],
                           setup=args.setup, seed=args.seed, pdgraph_dir=args.pdgraphs,
                           tools=args.tools)
        rows.append(sim)
        row["live_over_sim"] = row["mean_act_s"] / sim["mean_act_s"]
        sim["live_over_sim"] = 1.0
    print_table(rows, title=f"load ({args.url}, {args.apps} apps, {args.window:g}-min window, "
                f"{args.trace}, seed {args.seed}, time scale {args.time_scale:g})")
    if args.json:
        write_json(args.json, rows)
    failed = [o for o in outcomes if o.error]
    if failed:
        print(f"{len(failed)} of {len(outcomes)} runs failed; first: {failed[0].error}",
              file=sys.stderr)
    return 1 if failed else 0


def _cmd_identity(args: argparse.Namespace) -> int:
    """``--identity MODE``: the runs as plain agents (see :mod:`hermes.bench.identity_load`)."""
    import json

    from hermes.bench.identity_load import IdentityDriver, app_rows, summarize
    from hermes.bench.sched import build_arrivals, print_table

    if args.apps < 1 or args.window <= 0:
        raise ValueError("--apps must be >= 1 and --window > 0")
    if args.tools != "events":
        raise ValueError("--identity runs tool steps on the client (--tools events)")
    arrivals, _ = build_arrivals(args.apps, args.window, seed=args.seed, trace=args.trace,
                                 setup=args.setup)

    if args.warmup_apps < 0:
        raise ValueError(f"--warmup-apps must be >= 0, got {args.warmup_apps}")
    warm_window = args.window * args.warmup_apps / args.apps  # the measured arrival rate
    warm_arrivals = (build_arrivals(args.warmup_apps, warm_window, seed=args.seed + 1000,
                                    trace=args.trace, setup=args.setup)[0]
                     if args.warmup_apps else [])
    warm: list = []

    async def go() -> tuple[list, str, float]:
        driver = IdentityDriver(args.url, args.identity, time_scale=args.time_scale)
        try:
            health = (await driver.http.get("/healthz")).json()
            if warm_arrivals:
                print(f"warm-up: {len(warm_arrivals)} runs (seed {args.seed + 1000}, "
                      f"{warm_window:g}-min window), not measured", file=sys.stderr)
                warm.extend(await driver.run(warm_arrivals, progress=not args.no_progress))
                waited = await driver.settle()
                print(f"warm-up done; the gateway settled in {waited:.0f} s", file=sys.stderr)
            t0 = time.perf_counter()
            outcomes = await driver.run(arrivals, progress=not args.no_progress)
            return outcomes, str(health.get("policy", "?")), time.perf_counter() - t0
        finally:
            await driver.close()

    outcomes, policy, wall = asyncio.run(go())
    row = summarize(outcomes, args.identity, window_min=args.window, policy=policy, wall_s=wall)
    if warm:
        w = summarize(warm, args.identity, window_min=warm_window, policy=policy, wall_s=0.0)
        row["warmup"] = {k: w[k] for k in ("runs", "failed", "mean_act_s", "p95_act_s",
                                           "identity") if k in w}
        if "identity" in w:
            wi = w["identity"]
            print(f"warm-up (cold start) grouping precision {wi['grouping_precision']:.3f} "
                  f"recall {wi['grouping_recall']:.3f}, unit accuracy "
                  f"{wi['unit_accuracy']:.3f}, mean ACT {w['mean_act_s']:.1f} s",
                  file=sys.stderr)
    flat = {k: v for k, v in row.items() if k not in ("identity", "apps", "warmup")}
    print_table([flat], title=f"load --identity {args.identity} ({args.url}, {args.apps} apps, "
                f"{args.window:g}-min window, seed {args.seed}; ACT in model seconds)")
    print_table(app_rows(row), title="per app (* conversation; prompt/model, output/model: "
                "tokens sent over the app model's; infer: run grouping, unit and app accuracy "
                "against the truth)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(row, fh, indent=2)
    failed = [o for o in outcomes if o.error]
    if failed:
        print(f"{len(failed)} of {len(outcomes)} runs failed; first: {failed[0].error}",
              file=sys.stderr)
    return 1 if failed else 0


def add_load_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``hermes load`` to the top-level sub-parsers."""
    s = sub.add_parser("load", help="run the benchmark apps as HTTP clients of a live gateway; "
                       "ACT like `hermes bench sched`")
    s.add_argument("--url", default="http://127.0.0.1:8000", help="gateway base URL")
    s.add_argument("--apps", type=int, default=60, help="application runs (default 60)")
    s.add_argument("--window", type=float, default=3.0, help="submission window, model minutes")
    s.add_argument("--trace", default="conversation", help="conversation | synthetic | PATH")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--time-scale", dest="time_scale", type=float, default=1.0,
                   help="the gateway's --time-scale (model seconds per wall second)")
    s.add_argument("--tools", default="events", choices=("events", "runner"),
                   help="tool steps: unit events around a client-side wait, or docker steps "
                   "on a HermesLet tool runner")
    s.add_argument("--setup", default="llama2-7b-a100",
                   help="engine setup for --sim (the gateway's engine cost model)")
    s.add_argument("--sim", action="store_true",
                   help="also simulate the same arrivals and policy; print the live/sim ratio")
    s.add_argument("--pdgraphs", default=None, help="PDGraph directory for --sim")
    s.add_argument("--identity", default=None, choices=("headers", "infer", "none"),
                   help="send the runs as agents do (conversations, fan-outs) with full "
                        "Hermes headers, none at all (the gateway infers runs, apps, units: "
                        "scored against the truth), or none with X-Hermes-Run: none "
                        "(per-request baseline); --json then writes one object")
    s.add_argument("--warmup-apps", dest="warmup_apps", type=int, default=0,
                   help="--identity: first send this many runs of other arrivals (seed + 1000, "
                        "the same rate), unmeasured, and wait until the gateway has closed "
                        "them: apps measured after their PDGraphs are learned (steady state)")
    s.add_argument("--json", default=None, help="write the rows as a JSON list to FILE")
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=cmd_load)

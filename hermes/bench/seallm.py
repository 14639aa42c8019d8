"""``hermes bench seallm``: several LLM services on shared GPUs (SeaLLM, Table 2 / Fig. 6).

The systems (:mod:`hermes.core.multillm`) run on the discrete-event simulator of sharing groups
:mod:`hermes.sim.multillm` (one iteration of one service and phase at a time per group,
per-iteration preemption, unified or split KV; requests go to the replica group with the fewest
requests), which also scores the candidate plans of the placement search
(:func:`hermes.sim.multillm.score_plan`, as ``hermes plan placement`` does).

Systems (rows): ``vllm`` (GPUs split evenly, one service per group, FCFS), ``alpaserve``
(SeaLLM's placement search with FCFS inside, unified KV, placed once), ``muxserve``
(same placement, round-robin between a group's services with fixed quotas from the rates
seen at placement, FCFS within, split KV, placed once; ``muxserve-spatial``: the same with each
service of a group on a fixed share of the GPUs side by side, as SeaLLM describes MuxServe,
:class:`hermes.sim.multillm.Sim` ``spatial``), ``seallm`` (placement + DB ordering +
adaptive replacement + unified KV), and the ablations ``seallm-fcfs``, ``seallm-mlfq``,
``seallm-norepl``, ``seallm-split`` (``--ablations``). ``hermes`` (issue 22 item 3) is SeaLLM's
placement, replacement and DB ordering fed by the PDGraph forecast of per-service demand
(:mod:`hermes.core.multillm.forecast`) instead of the recent window's requests: at each
re-placement the forecast of the next ``history_s`` (runs in flight: their current unit, next-unit
probabilities and step times; plus each app's recent run arrival rate) sets the services' rates
and the request counts of the simulated set (the window's own requests thinned, or topped up with
copies of the service's earlier requests); a candidate plan is scored on the mean over
:data:`HERMES_DRAWS` such sets (randomised thinning, top-ups and rounding: draws of the forecast,
:func:`hermes.core.multillm.placement.mean_scores`), and the plan in force stays unless the new
one scores :data:`HERMES_MIN_GAIN` better (``min_gain`` of
:func:`~hermes.core.multillm.placement.seallm_place`; ablations ``hermes-1draw``,
``hermes-nokeep``, and ``seallm-keep``: SeaLLM with that rule). The app tables are learned from
the calls seen so far (a PDGraph's next-unit frequencies); ablations ``hermes-oracle`` (the generating tables) and
``hermes-norun`` (no runs in flight: new runs only), and two look-ahead upper bounds (diagnostics,
not systems): ``hermes-perfect`` (the real next-window counts through Hermes' pipeline) and
``seallm-future`` (SeaLLM evaluating plans on the real next-window requests). Every row of a replacing system records
``rate_err`` / ``forecast_err``: the mean over re-placements of the relative L1 error of the
recent-window counts and of the forecast (the row's mode; learned for non-Hermes rows) against
the real per-service calls of the next ``history_s`` (windows past ``--duration`` skipped). With
:data:`FORECAST_INTERVAL` the forecast covers the whole next replacement interval instead
(measured no better: off).

Workload (differs from the paper, which used clustered ShareGPT/LongBench lengths, Llama2-7B/
13B/70B and OPT-6.7B, the Azure Functions trace and 32 A800s): lengths are Mooncake's (input
tokens / 8, clipped to [16, 3072]; output clipped to [1, 1024]) clustered into three groups by
k-means on log lengths; each cluster with Llama-2-7B and Llama-2-13B is a service (six).
``--workload apps`` (default): arrival instants of the Mooncake conversation trace (bursty),
time-compressed so that the runs' calls average ``--rate``, start *app runs* of the four apps of
:data:`APPS` (drawn from weights that random-walk every 60 s: shifting popularity); each run walks
its app's next-unit table, one call per unit, the next call issued after the previous one's
reference execution time plus an exponential gap (open loop: every system sees the same
requests; calls after ``--duration`` are dropped). ``--workload independent`` (the earlier one):
each arrival is one request to a service drawn from random-walk weights. The cluster is
``--gpus`` A100-80s in one node.

Defaults the paper leaves open (ours): starvation threshold 10 x L̂_s; first interval
I_0 = 60 s, bounds [10, 600] s; the metric compared for replacement is L_N; placement is
evaluated by simulating the last ``history_s`` = 30 s of requests (plus 10 s to drain) on the
candidate plan; TP sizes tried 1, 2, 4; α = 1e-4 (the paper's); a re-placement pauses the new
groups ``SWITCH_S`` = 2 s and drops KV (requests recompute); the first placement sees the first
60 s of traffic; the reference execution time is alone on one GPU, batch one; L_N is the mean
over requests of latency / L̂_s (the service's mean execution time); requests still running
600 s after the last arrival count with their latency so far. Default load: 4 req/s for 300 s
on 8 A100-80s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from scipy.cluster.vq import kmeans2  # type: ignore[import-untyped]

from hermes.argtypes import int_list, positive_float, positive_floats, positive_int
from hermes.core.multillm.budget import DoublingBudget
from hermes.core.multillm.forecast import (
    AppTable,
    Forecast,
    ObservedCall,
    RunInFlight,
    Unit,
    forecast_demand,
    learn_table,
)
from hermes.core.multillm.ordering import make_ordering
from hermes.core.multillm.placement import (
    PlacementPlan,
    ServiceScore,
    even_split,
    mean_scores,
    seallm_place,
)
from hermes.core.multillm.replacement import AdaptiveInterval
from hermes.core.multillm.service import Service, ServiceStats, exec_times, services_fit
from hermes.sim.multillm import (
    DEVICE,
    SLO_FACTOR,
    STARVATION_FACTOR,
    Sim,
    SimRequest,
    score_plan,
)

#: the request lengths and instants (``hermes.sim.arrivals.load_trace_requests``: the full
#: trace in ``$HERMES_TRACES``, else the copy shipped with Hermes)
TRACE = "conversation"
MODELS = ("llama-2-7b", "llama-2-13b")
SWITCH_S = 2.0
#: the paper's simulated L_N (Table 2)
PAPER_L_N = {"vllm": 13.05, "alpaserve": 11.18, "muxserve": 19.39, "seallm": 1.60}

DEFAULT_RATE = 4.0
DEFAULT_DURATION_S = 300.0
DEFAULT_GPUS = 8

#: Hermes forecasts the demand of the whole next replacement interval (ours; else the next
#: ``history_s``, the span SeaLLM's recent window covers)
FORECAST_INTERVAL = False

SYSTEMS = ("vllm", "alpaserve", "muxserve", "seallm", "hermes")
ABLATIONS = ("muxserve-spatial", "seallm-fcfs", "seallm-mlfq", "seallm-norepl", "seallm-split", "seallm-keep",
             "hermes-1draw", "hermes-nokeep", "hermes-oracle", "hermes-norun", "hermes-perfect",
             "seallm-future")
#: Hermes' placement scores a candidate plan on the mean over this many request sets drawn
#: from its forecast (``hermes-1draw``: one), and keeps the plan in force unless the new one
#: scores HERMES_MIN_GAIN better (``hermes-nokeep``: re-place whenever the plan differs)
HERMES_DRAWS = 8
HERMES_MIN_GAIN = 0.1


# ----------------------------------------------------------------------------- workload
@dataclass
class Workload:
    """Requests (arrays, arrival order) and the services they belong to."""

    services: list[Service]
    svc: np.ndarray
    arrival: np.ndarray
    inp: np.ndarray
    out: np.ndarray
    ref: np.ndarray  # reference execution time of each request
    mean_ref: np.ndarray  # L̂_s per service index
    stats: list[ServiceStats] = field(default_factory=list)
    run: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))  # run id, -1: none
    run_app: list[str] = field(default_factory=list)  # app of each run
    tables: dict[str, AppTable] = field(default_factory=dict)  # app -> transition table


def _trace_lengths() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from hermes.sim.arrivals import load_trace_requests

    return load_trace_requests(TRACE)


#: the apps of the ``apps`` workload (ours): per app, the entry unit, the next-unit table over
#: the six services (``""`` ends the run) and the mean gap (think / tool time) between a call's
#: end and the run's next call. A chat (turns on c0-13b), an agent (a long plan on c2-13b, then a
#: loop of short reads on c1-7b that may re-plan), a RAG pipeline (read on c1-13b, answer on
#: c0-7b) and a coder (draft on c0-7b, long edits on c2-7b, back to drafting).
APPS: dict[str, tuple[dict[str, float], dict[str, dict[str, float]], float]] = {
    "chat": ({"c0-13b": 1.0}, {"c0-13b": {"c0-13b": 0.6, "": 0.4}}, 5.0),
    "agent": ({"c2-13b": 1.0}, {"c2-13b": {"c1-7b": 1.0},
                                "c1-7b": {"c1-7b": 0.6, "c2-13b": 0.25, "": 0.15}}, 3.0),
    "rag": ({"c1-13b": 1.0}, {"c1-13b": {"c0-7b": 1.0}, "c0-7b": {"": 1.0}}, 1.0),
    "code": ({"c0-7b": 1.0}, {"c0-7b": {"c2-7b": 0.8, "": 0.2},
                              "c2-7b": {"c0-7b": 0.5, "": 0.5}}, 2.0),
}
WORKLOADS = ("apps", "independent")


def app_tables(services: list[Service], mean_ref: np.ndarray) -> dict[str, AppTable]:
    """The apps' transition tables (what a PDGraph learned from past runs holds), with each
    unit's step = its service's mean reference time + the app's mean gap."""
    names = [s.name for s in services]
    tok = {s.name: float(np.mean(s.input_lengths) + np.mean(s.output_lengths)) for s in services}
    out = {}
    for app, (entry, nxt, gap) in APPS.items():
        units = {u: Unit(u, tok[u], float(mean_ref[names.index(u)]) + gap)
                 for u in {*entry, *nxt, *(v for p in nxt.values() for v in p if v)}}
        out[app] = AppTable(app, units, entry, nxt)
    return out


def _services() -> list[Service]:
    _, inp, out = _trace_lengths()
    inp = np.clip(inp // 8, 16, 3072)
    out = np.clip(out, 1, 1024)
    feats = np.column_stack([np.log(inp), np.log(out)])
    _, label = kmeans2(feats, 3, seed=7, minit="++")
    services: list[Service] = []
    for c in range(3):
        m = label == c
        for model in MODELS:
            services.append(Service(f"c{c}-{model.split('-')[-1]}", model, inp[m], out[m]))
    return services


def make_workload(seed: int, *, rate: float, duration_s: float, kind: str = "apps") -> Workload:
    """The workload of one seed (module doc): ``apps`` (runs of :data:`APPS`) or
    ``independent`` (one request per arrival, to a service drawn by popularity)."""
    if kind not in WORKLOADS:
        raise ValueError(f"unknown workload {kind!r}; known: {', '.join(WORKLOADS)}")
    rng = np.random.default_rng(seed)
    ts, _, _ = _trace_lengths()
    services = _services()
    stats = [ServiceStats.of(sv, DEVICE, 1) for sv in services]
    mean_ref = np.array([st.mean_s for st in stats])
    names = [s.name for s in services]
    tables: dict[str, AppTable] = {}
    kinds = names
    if kind == "apps":
        tables = app_tables(services, mean_ref)
        kinds = list(APPS)
        per_run = float(np.mean([t.calls_per_run() for t in tables.values()]))
    # arrival instants (requests, or app runs): a random window of the trace, compressed
    n = int(rate * duration_s / (per_run if kind == "apps" else 1.0))
    start = int(rng.integers(0, max(1, len(ts) - n)))
    t = ts[start:start + n] - ts[start]
    t = t * (duration_s / max(t[-1], 1e-9))
    n = len(t)
    # shifting popularity (of services, or apps): per-60 s block weights, log-space random walk
    blocks = int(np.ceil(duration_s / 60.0)) + 1
    logw = np.cumsum(rng.normal(0.0, 0.8, size=(blocks, len(kinds))), axis=0)
    w = np.exp(logw - logw.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    blk = np.minimum((t // 60.0).astype(int), blocks - 1)
    u = rng.random(n)
    pick = np.minimum((u[:, None] > np.cumsum(w[blk], axis=1)).sum(axis=1), len(kinds) - 1)
    if kind == "apps":
        rows: list[tuple[float, int, int, int, int, float]] = []  # arrival, svc, run, in, out, ref
        run_app = [kinds[int(j)] for j in pick]
        for r, (t0, app) in enumerate(zip(t, run_app, strict=True)):
            entry, nxt, gap = APPS[app]
            unit = _draw(rng, entry)
            at = float(t0)
            while unit and at < duration_s:
                sv = services[names.index(unit)]
                j = int(rng.integers(0, len(sv.input_lengths)))
                i_, o_ = int(sv.input_lengths[j]), int(sv.output_lengths[j])
                ref1 = float(exec_times(sv.model, DEVICE, 1, np.array([i_]), np.array([o_]))[0])
                rows.append((at, names.index(unit), r, i_, o_, ref1))
                # the next call: after this one's execution alone (open loop) and the app's gap
                at += ref1 + float(rng.exponential(gap))
                unit = _draw(rng, nxt.get(unit, {"": 1.0}))
        rows.sort(key=lambda x: x[0])
        t = np.array([x[0] for x in rows])
        svc = np.array([x[1] for x in rows], dtype=int)
        run = np.array([x[2] for x in rows], dtype=int)
        ri = np.array([x[3] for x in rows], dtype=int)
        ro = np.array([x[4] for x in rows], dtype=int)
        ref = np.array([x[5] for x in rows])
        return Workload(services, svc, t, ri, ro, ref, mean_ref, stats, run, run_app, tables)
    svc = pick
    ri = np.empty(n, dtype=int)
    ro = np.empty(n, dtype=int)
    for s, sv in enumerate(services):
        m = svc == s
        k = rng.integers(0, len(sv.input_lengths), size=int(m.sum()))
        ri[m] = sv.input_lengths[k]
        ro[m] = sv.output_lengths[k]
    ref = np.empty(n)
    for s, sv in enumerate(services):
        m = svc == s
        if m.any():
            ref[m] = exec_times(sv.model, DEVICE, 1, ri[m], ro[m])
    return Workload(services, svc, t, ri, ro, ref, mean_ref, stats, np.full(n, -1), [], tables)


def _draw(rng: np.random.Generator, probs: dict[str, float]) -> str:
    keys = list(probs)
    return keys[int(rng.choice(len(keys), p=np.asarray([probs[k] for k in keys])))]


# ----------------------------------------------------------------------------- simulator
def _reqs(wl: Workload, idx: np.ndarray, shift: float = 0.0) -> list[SimRequest]:
    return [SimRequest(int(i), int(wl.svc[i]), float(wl.arrival[i]) - shift, int(wl.inp[i]), int(wl.out[i]))
            for i in idx]


# ----------------------------------------------------------------------------- forecast
def forecast_at(wl: Workload, order: np.ndarray, t: float, window_s: float,
                mode: str = "forecast", horizon_s: float | None = None) -> Forecast:
    """The PDGraph forecast of per-service demand over ``[t, t + horizon_s)`` (default
    ``window_s``), scaled to calls per ``window_s``, from what is known at ``t``: the runs in
    flight and each app's run arrival rate over the last ``window_s``
    (:func:`runs_at`), with the apps' tables learned from the calls seen before ``t``
    (``forecast``), the generating tables (``forecast-oracle``), or learned tables and no runs
    in flight (``forecast-norun``: new runs only, an ablation); ``forecast-perfect`` is the real
    calls of the horizon (it looks ahead: an upper bound, not a forecast)."""
    h = window_s if horizon_s is None else horizon_s
    if mode == "forecast-perfect":
        a = wl.arrival
        real = np.bincount(wl.svc[(a >= t) & (a < t + h)], minlength=len(wl.services))
        calls = {sv.name: float(c) * window_s / h for sv, c in zip(wl.services, real, strict=True)}
        return Forecast(calls, {})
    runs, rates, tables = runs_at(wl, order, t, window_s)
    if mode == "forecast-oracle":
        tables = wl.tables
    elif mode == "forecast-norun":
        runs = []
    elif mode != "forecast":
        raise ValueError(f"unknown forecast mode {mode!r}")
    fc = forecast_demand(tables, [r for r in runs if r.app in tables],
                         {a: v for a, v in rates.items() if a in tables}, h)
    k = window_s / h
    return Forecast({s: v * k for s, v in fc.calls.items()}, {s: v * k for s, v in fc.tokens.items()},
                    {u: v * k for u, v in fc.unit_calls.items()})


def runs_at(wl: Workload, order: np.ndarray, t: float, window_s: float
            ) -> tuple[list[RunInFlight], dict[str, float], dict[str, AppTable]]:
    """What the gateway knows at ``t``: the runs in flight (latest call issued before ``t``;
    a run is over once its last call would have finished alone), per app the runs started
    over the last ``window_s`` per second, and the app tables learned from the calls so far."""
    names = [s.name for s in wl.services]
    seen: dict[int, list[int]] = {}
    for i in order[wl.arrival[order] < t]:
        seen.setdefault(int(wl.run[i]), []).append(int(i))
    last = _last_call(wl)
    runs = []
    obs: dict[str, list[tuple[list[ObservedCall], bool]]] = {}
    rates = dict.fromkeys(wl.tables, 0.0)
    for r, calls in seen.items():
        i = calls[-1]
        over = last[r] == i and wl.arrival[i] + wl.ref[i] <= t
        if not over:
            runs.append(RunInFlight(wl.run_app[r], names[int(wl.svc[i])], t - float(wl.arrival[i])))
        if wl.arrival[calls[0]] >= t - window_s:
            rates[wl.run_app[r]] += 1.0 / window_s
        obs.setdefault(wl.run_app[r], []).append(
            ([ObservedCall(names[int(wl.svc[j])], names[int(wl.svc[j])], float(wl.arrival[j]),
                           float(wl.inp[j] + wl.out[j])) for j in calls], bool(over)))
    step = {n: float(m) for n, m in zip(names, wl.mean_ref, strict=True)}
    tables = {a: tb for a, o in obs.items() if (tb := learn_table(a, o, step)) is not None}
    return runs, rates, tables


def _last_call(wl: Workload) -> dict[int, int]:
    last: dict[int, int] = {}
    for i in np.argsort(wl.arrival, kind="stable"):
        last[int(wl.run[i])] = int(i)
    return last


def _demand_errors(wl: Workload, t: float, window_s: float, horizon_s: float,
                   fc: Forecast) -> tuple[float, float]:
    """Relative L1 errors (sum over services |estimate - actual| / actual) of the recent-rate
    estimate (the last ``window_s``'s counts) and of the forecast (calls per ``window_s``),
    against the real calls over ``[t, t + horizon_s)`` scaled to ``window_s``."""
    a = wl.arrival
    nxt = np.bincount(wl.svc[(a >= t) & (a < t + horizon_s)],
                      minlength=len(wl.services)) * (window_s / horizon_s)
    past = np.bincount(wl.svc[(a >= t - window_s) & (a < t)], minlength=len(wl.services))
    f = np.array([fc.calls.get(s.name, 0.0) for s in wl.services])
    tot = max(float(nxt.sum()), 1.0)
    return float(np.abs(past - nxt).sum()) / tot, float(np.abs(f - nxt).sum()) / tot


def _forecast_reqs(wl: Workload, order: np.ndarray, t0: float, t1: float,
                   calls: dict[str, float], rng: np.random.Generator) -> list[SimRequest]:
    """A request set for ``[t0, t1)`` (shifted to 0) with ``calls[service]`` requests per
    service (randomised rounding): the window's own requests of the service, a random subset
    when fewer are forecast, topped up with copies of the service's earlier requests (arrival
    instants drawn from the window's, keeping its burstiness) when more are."""
    a = wl.arrival[order]
    hist = order[(a >= t0) & (a < t1)]
    past = order[a < t1]
    times = wl.arrival[hist] - t0
    span = t1 - t0
    out: list[SimRequest] = []
    for k, sv in enumerate(wl.services):
        want = max(calls.get(sv.name, 0.0), 0.0)
        n = int(np.floor(want)) + int(rng.random() < want - np.floor(want))
        mine = hist[wl.svc[hist] == k]
        if n <= len(mine):
            out += _reqs(wl, mine[np.sort(rng.choice(len(mine), size=n, replace=False))], t0)
            continue
        out += _reqs(wl, mine, t0)
        pool = past[wl.svc[past] == k]
        if not len(pool):
            continue
        extra = rng.choice(pool, size=n - len(mine))
        at = (np.clip(rng.choice(times, size=len(extra)) + rng.uniform(-0.5, 0.5, len(extra)), 0.0,
                      span - 1e-6) if len(times) else rng.uniform(0.0, span, len(extra)))
        out += [SimRequest(int(i), k, float(x), int(wl.inp[i]), int(wl.out[i]))
                for i, x in zip(extra, at, strict=True)]
    out.sort(key=lambda r: r.arr)
    return out


# ----------------------------------------------------------------------------- systems
@dataclass(frozen=True)
class SystemSpec:
    ordering: str
    kv_mode: str
    placement: str  # even | search
    replace: bool
    demand: str = "rates"  # placement input: recent requests | a forecast mode (forecast_at)
    draws: int = 1  # request sets a candidate plan is scored on (Hermes: draws of its forecast)
    switch_gain: float = 0.0  # re-place only when the new plan scores this much better
    spatial: bool = False  # MuxServe's fixed compute shares side by side (hermes.sim.multillm)


SPECS = {
    "vllm": SystemSpec("fcfs", "unified", "even", False),
    "alpaserve": SystemSpec("fcfs", "unified", "search", False),
    "muxserve": SystemSpec("rr", "split", "search", False),
    # MuxServe with fixed spatial compute shares from the rates (a sensitivity row, ours)
    "muxserve-spatial": SystemSpec("fcfs", "split", "search", False, spatial=True),
    "seallm": SystemSpec("db", "unified", "search", True),
    "hermes": SystemSpec("db", "unified", "search", True, "forecast", HERMES_DRAWS, HERMES_MIN_GAIN),
    # Hermes' ablations: one draw of the forecast; every search's plan taken (the paper's rule)
    "hermes-1draw": SystemSpec("db", "unified", "search", True, "forecast", 1, HERMES_MIN_GAIN),
    "hermes-nokeep": SystemSpec("db", "unified", "search", True, "forecast", HERMES_DRAWS),
    "hermes-oracle": SystemSpec("db", "unified", "search", True, "forecast-oracle", HERMES_DRAWS,
                                HERMES_MIN_GAIN),
    "hermes-norun": SystemSpec("db", "unified", "search", True, "forecast-norun", HERMES_DRAWS,
                               HERMES_MIN_GAIN),
    # upper bounds that look ahead (diagnostics, not systems): the real next-window counts
    # through Hermes' pipeline, and SeaLLM evaluating on the real next-window requests
    "hermes-perfect": SystemSpec("db", "unified", "search", True, "forecast-perfect", HERMES_DRAWS,
                                 HERMES_MIN_GAIN),
    "seallm-future": SystemSpec("db", "unified", "search", True, "future"),
    # SeaLLM keeping the plan in force unless the new one is HERMES_MIN_GAIN better (ours)
    "seallm-keep": SystemSpec("db", "unified", "search", True, "rates", 1, HERMES_MIN_GAIN),
    "seallm-fcfs": SystemSpec("fcfs", "unified", "search", True),
    "seallm-mlfq": SystemSpec("mlfq", "unified", "search", True),
    "seallm-norepl": SystemSpec("db", "unified", "search", False),
    "seallm-split": SystemSpec("db", "split", "search", True),
}


def run_system(name: str, wl: Workload, *, n_gpus: int, duration_s: float, i0_s: float = 60.0,
               history_s: float = 30.0, drain_s: float = 600.0,
               forecast_interval: bool = FORECAST_INTERVAL) -> dict[str, float]:
    """Simulate system ``name`` on ``wl``; returns its metrics. ``forecast_interval``: the
    forecast covers the next replacement interval (else the next ``history_s``)."""
    spec = SPECS[name]
    names = [s.name for s in wl.services]
    budgets = {s.name: DoublingBudget(st.mean_s + st.std_s, st.mean_s)
               for s, st in zip(wl.services, wl.stats, strict=True)}
    ordering = make_ordering(spec.ordering, budgets, starvation_factor=STARVATION_FACTOR)
    models = {s.name: s.model for s in wl.services}
    order = np.argsort(wl.arrival, kind="stable")

    fits = services_fit(models, DEVICE)

    def place(t0: float, t1: float, demand: Forecast | None = None,
              current: PlacementPlan | None = None) -> tuple[PlacementPlan, float]:
        idx = order[(wl.arrival[order] >= t0) & (wl.arrival[order] < t1)]
        span = max(t1 - t0, 1e-9)
        rates = {n: float((wl.svc[idx] == k).sum()) / span for k, n in enumerate(names)}
        reqs = _reqs(wl, idx, t0)
        if demand is not None:
            # Hermes: the forecast's per-service calls over the next ``span`` replace the counts
            # of the recent window (its requests thinned, or topped up from the service's past)
            rates = demand.rates(span)
            rng = np.random.default_rng(int(t1 * 1000))
            sets = [_forecast_reqs(wl, order, t0, t1, demand.calls, rng) for _ in range(spec.draws)]
        else:
            sets = [reqs]

        def evaluate(plan: PlacementPlan) -> dict[str, ServiceScore]:
            return mean_scores([score_plan(wl, plan, ordering, spec.kv_mode, r, span)
                                for r in sets])

        plan, _ = seallm_place(names, rates, n_gpus, fits, evaluate, tps=(1, 2, 4),
                               current=current, min_gain=spec.switch_gain)
        est = evaluate(plan)
        n = sum(s.n for s in est.values())
        if (spec.ordering == "rr" or spec.spatial) and ordering.quotas is None:
            # MuxServe: fixed compute quotas from the rates seen at (first) placement
            nonlocal_ordering[0] = replace(ordering, quotas={k: max(v, 1e-3) for k, v in rates.items()})
        return plan, sum(s.sum_norm for s in est.values()) / max(n, 1)

    nonlocal_ordering = [ordering]
    if spec.placement == "even":
        plan = even_split(names, n_gpus, 1)
        est = 0.0
    else:
        # the first plan sees the first interval's traffic (a profiling window)
        plan, est = place(0.0, min(i0_s, duration_s))
    ordering = nonlocal_ordering[0]
    spatial = ordering.quotas if spec.spatial else None
    rule = AdaptiveInterval(beta=0.1, min_s=10.0, max_s=600.0)
    interval = i0_s
    sim = Sim(wl, plan, ordering, spec.kv_mode, 0.0, spatial=spatial)
    pending = _reqs(wl, order)
    done: list[SimRequest] = []
    dropped: list[SimRequest] = []
    t = 0.0
    n_repl = 0
    n_switch = 0
    errs: list[tuple[float, float]] = []  # (rate estimate, forecast) relative error per interval
    while True:
        t_next = t + interval if spec.replace else np.inf
        t_stop = min(t_next, duration_s + drain_s)
        cut = next((k for k, r in enumerate(pending) if r.arr >= t_stop), len(pending))
        sim.run(pending[:cut], t_stop)
        pending = pending[cut:]
        if t_stop >= duration_s + drain_s or t_next >= duration_s:
            if t_stop < duration_s + drain_s:
                sim.run(pending, duration_s + drain_s)
                pending = []
            break
        # adaptive replacement: compare the interval's real L_N with the estimate
        done_now = [r for r in sim.finished if t <= r.arr < t_next]
        real = (float(np.mean([(r.done - r.arr) / wl.mean_ref[r.svc] for r in done_now]))
                if done_now else est)
        interval = rule.next(interval, est, real)
        fc = None
        if wl.tables:
            horizon = interval if forecast_interval else history_s
            fc = forecast_at(wl, order, t_next, history_s,
                             spec.demand if spec.demand.startswith("forecast") else "forecast",
                             horizon)
            if t_next + horizon <= duration_s:  # calls after the duration are not generated
                errs.append(_demand_errors(wl, t_next, history_s, horizon, fc))
        if spec.demand == "future":
            new_plan, est = place(t_next, t_next + history_s)
        else:
            new_plan, est = place(max(0.0, t_next - history_s), t_next,
                                  fc if spec.demand != "rates" else None, plan)
        n_repl += 1
        if new_plan != plan:
            n_switch += 1
            left = sim.unfinished()
            done += sim.finished
            dropped += sim.dropped
            sim = Sim(wl, new_plan, ordering, spec.kv_mode, t_next + SWITCH_S, spatial=spatial)
            for r in left:
                r.kv = 0
            sim.run(sorted(left, key=lambda r: r.arr), t_next)
            plan = new_plan
        t = t_next
    done += sim.finished
    dropped += sim.dropped
    left = sim.unfinished()
    end = duration_s + drain_s
    lat = np.array([r.done - r.arr for r in done] + [end - r.arr for r in left] + [end - r.arr for r in dropped])
    norm = np.array([(r.done - r.arr) / wl.mean_ref[r.svc] for r in done]
                    + [(end - r.arr) / wl.mean_ref[r.svc] for r in left + dropped])
    slo_ok = sum((r.done - r.arr) <= SLO_FACTOR * wl.ref[r.i] for r in done)
    ttft = np.array([r.first - r.arr for r in done])
    return {"l_n": float(norm.mean()), "p99_s": float(np.percentile(lat, 99)),
            "slo_attainment": float(slo_ok / len(lat)), "ttft_s": float(ttft.mean()),
            "unfinished": float(len(left) + len(dropped)), "replacements": float(n_repl),
            "switches": float(n_switch),
            **({"rate_err": float(np.mean([e[0] for e in errs])),
                "forecast_err": float(np.mean([e[1] for e in errs]))} if errs else {}),
            "plan": plan.describe()}  # type: ignore[dict-item]


def _one(job: tuple[int, str, float, float, int, str]) -> dict[str, object]:
    seed, name, rate, duration_s, n_gpus, workload = job
    t0 = time.perf_counter()
    wl = make_workload(seed, rate=rate, duration_s=duration_s, kind=workload)
    m = run_system(name, wl, n_gpus=n_gpus, duration_s=duration_s)
    print(f"seed {seed} {name:14s} L_N {m['l_n']:7.2f}  P99 {m['p99_s']:7.1f}s  "
          f"SLO {m['slo_attainment']:.3f}  TTFT {m['ttft_s']:6.2f}s  "
          f"({time.perf_counter() - t0:.1f}s) {m['plan']}", file=sys.stderr, flush=True)
    return {"system": name, "seed": seed, "rate": rate, **m}


def main(seeds: list[int], *, systems: list[str], rate: float | Sequence[float], duration_s: float,
         n_gpus: int, json_path: str | None, workers: int = 2, workload: str = "apps",
         plot_path: str | None = None) -> list[dict[str, object]]:
    """Run every (rate, seed, system) (``workers`` processes), print the table (one per rate,
    with the L_N ratios of the baselines to SeaLLM), write the JSON and, with ``plot_path``,
    L_N against the rate per system (the paper's Fig. 6)."""
    rates = [float(rate)] if isinstance(rate, int | float) else [float(x) for x in rate]
    jobs = [(seed, name, r, duration_s, n_gpus, workload)
            for r in rates for seed in seeds for name in systems]
    # the slow systems (placement searches) and high rates first, for a better spread
    jobs.sort(key=lambda j: (SPECS[j[1]].placement != "search" or not SPECS[j[1]].replace,
                             -j[2], j[0]))
    t0 = time.perf_counter()
    rows: list[dict[str, object]] = []
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for k, row in enumerate(pool.map(_one, jobs), 1):
                rows.append(row)
                _progress(k, len(jobs), t0)
    else:
        for k, j in enumerate(jobs, 1):
            rows.append(_one(j))
            _progress(k, len(jobs), t0)
    rows.sort(key=lambda r: (float(r["rate"]), systems.index(str(r["system"])),  # type: ignore[arg-type]
                             int(r["seed"])))  # type: ignore[call-overload]
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
    for r in rates:
        sel = [x for x in rows if float(x["rate"]) == r]  # type: ignore[arg-type]
        if len(rates) > 1:
            print(f"\n{r:g} req/s")
        print(table(sel))
        line = ratio_line(sel)
        if line:
            print(line)
    if plot_path:
        plot_rates(rows, plot_path, f"hermes bench seallm --workload {workload}: {n_gpus} "
                   f"{DEVICE}, {len(seeds)} seeds")
    return rows


def _progress(done: int, total: int, t0: float) -> None:
    print(f"[{done}/{total} runs, {time.perf_counter() - t0:.0f} s]", file=sys.stderr, flush=True)


def ratio_line(rows: Sequence[dict[str, object]]) -> str:
    """Each baseline's mean L_N over SeaLLM's (same rows), beside the paper's Table 2 ratio
    and the issue's target (half the paper's); empty when SeaLLM or no baseline is present."""
    def mean(n: str) -> float | None:
        v = [float(r["l_n"]) for r in rows if r["system"] == n]  # type: ignore[arg-type]
        return float(np.mean(v)) if v else None

    sea = mean("seallm")
    if not sea:
        return ""
    parts = []
    for b in ("vllm", "alpaserve", "muxserve"):
        m = mean(b)
        if m is None:
            continue
        paper = PAPER_L_N[b] / PAPER_L_N["seallm"]
        parts.append(f"{b} {m / sea:.2f}x (paper {paper:.1f}x, half {paper / 2:.1f}x)")
    return ("L_N ratio to seallm: " + ", ".join(parts)) if parts else ""


def plot_rates(rows: Sequence[dict[str, object]], path: str,
               title: str = "hermes bench seallm") -> None:
    """Mean L_N (min-max band over seeds) against the request rate, one line per system."""
    from hermes.extras import require

    matplotlib = require("plot")  # the `plot` extra
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for n in dict.fromkeys(str(r["system"]) for r in rows):
        xs = sorted({float(r["rate"]) for r in rows if r["system"] == n})  # type: ignore[arg-type]
        v = [[float(r["l_n"]) for r in rows if r["system"] == n  # type: ignore[arg-type]
              and float(r["rate"]) == x] for x in xs]  # type: ignore[arg-type]
        ax.plot(xs, [np.mean(a) for a in v], "o-", label=n)
        ax.fill_between(xs, [min(a) for a in v], [max(a) for a in v], alpha=0.15)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("requests/s")
    ax.set_ylabel("normalised latency L_N (mean, min-max over seeds)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(rows: list[dict[str, object]]) -> str:
    """Mean and [min, max] over seeds per system, beside the paper's simulated L_N; for the
    replacing systems on the apps workload, the mean demand-estimate errors (module doc)."""
    out = [f"{'system':14s} {'L_N mean [min-max]':>24s} {'paper L_N':>9s} {'P99 s':>8s} "
           f"{'SLO att.':>8s} {'TTFT s':>7s} {'rate err':>8s} {'fcst err':>8s}"]
    names = list(dict.fromkeys(str(r["system"]) for r in rows))
    for n in names:
        rs = [r for r in rows if r["system"] == n]
        ln = np.array([float(r["l_n"]) for r in rs])  # type: ignore[arg-type]
        p = np.mean([float(r["p99_s"]) for r in rs])  # type: ignore[arg-type]
        slo = np.mean([float(r["slo_attainment"]) for r in rs])  # type: ignore[arg-type]
        tt = np.mean([float(r["ttft_s"]) for r in rs])  # type: ignore[arg-type]
        paper = PAPER_L_N.get(n)
        errs = [f"{np.mean([float(r[k]) for r in rs]):8.3f}"  # type: ignore[arg-type]
                if all(k in r for r in rs) else f"{'-':>8s}" for k in ("rate_err", "forecast_err")]
        out.append(f"{n:14s} {ln.mean():8.2f} [{ln.min():6.2f}-{ln.max():6.2f}] "
                   f"{(f'{paper:.2f}' if paper else '-'):>9s} {p:8.1f} {slo:8.3f} {tt:7.2f} "
                   + " ".join(errs))
    return "\n".join(out)


def add_parser(bsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``hermes bench seallm``."""
    s = bsub.add_parser("seallm", help="several LLMs on shared GPUs: SeaLLM vs vLLM / AlpaServe / "
                                       "MuxServe (paper Table 2 / Fig. 6)")
    s.add_argument("--seeds", type=int_list, default="0,1,2,3,4",
                   help="comma-separated seeds (default 0..4)")
    s.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"comma-separated, of {', '.join(SPECS)} (default {','.join(SYSTEMS)})")
    s.add_argument("--ablations", action="store_true", help="add the SeaLLM and Hermes ablations")
    s.add_argument("--rate", type=positive_floats, default=str(DEFAULT_RATE),
                   help="requests/s, or comma-separated rates for a sweep (default %(default)s)")
    s.add_argument("--duration", type=positive_float, default=DEFAULT_DURATION_S,
                   help="seconds of arrivals (default %(default)g)")
    s.add_argument("--gpus", type=positive_int, default=DEFAULT_GPUS,
                   help="A100-80 GPUs (default %(default)d)")
    s.add_argument("--workers", type=positive_int, default=2, help="processes (default %(default)d)")
    s.add_argument("--workload", choices=WORKLOADS, default="apps",
                   help="app runs (default) or independent requests (the earlier workload)")
    s.add_argument("--json", default=None, help="write the rows as a JSON list to FILE")
    s.add_argument("--plot", default=None,
                   help="write L_N against the rate per system to FILE.png (needs the plot extra)")
    s.set_defaults(func=cmd_seallm)


def cmd_seallm(args: argparse.Namespace) -> int:
    systems = [x.strip() for x in args.systems.split(",") if x.strip()]
    if args.ablations:
        systems += [a for a in ABLATIONS if a not in systems]
    bad = [x for x in systems if x not in SPECS]
    if bad or not systems:
        raise SystemExit(f"unknown systems {bad}; known: {', '.join(SPECS)}" if bad
                         else "--systems: no system named")
    n_services = len(_services())
    if args.gpus < n_services and any(SPECS[x].placement == "even" for x in systems):
        # vLLM's even split gives each service a group of its own
        raise SystemExit(f"--gpus {args.gpus}: vllm (GPUs split evenly, one service per group) "
                         f"needs at least {n_services} GPUs for the {n_services} services")
    if args.gpus * 2 < n_services:
        raise SystemExit(f"--gpus {args.gpus}: {n_services} services need at least "
                         f"{(n_services + 1) // 2} GPUs (two services per group at most)")
    main(list(args.seeds), systems=systems, rate=list(args.rate), duration_s=args.duration,
         n_gpus=args.gpus, json_path=args.json, workers=args.workers, workload=args.workload,
         plot_path=args.plot)
    return 0

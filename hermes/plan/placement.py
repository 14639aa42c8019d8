"""``hermes plan placement``: SeaLLM's placement of several LLM services on one node's GPUs, as a
plan a HermesLet applies (issue 22 item 5).

Inputs: the services (``--services FILE``: a JSON list of ``{"name", "model", "rate"}`` with
optional ``input_tokens`` / ``output_tokens`` (means; default :data:`DEFAULT_INPUT_TOKENS` /
:data:`DEFAULT_OUTPUT_TOKENS`) and ``served_model`` (the model name clients send and engines
announce; default the service's name); or ``--preset``, :data:`PRESETS`: ``seallm``, the six
services of ``hermes bench seallm`` with its default load), ``--gpus N`` and ``--device``
(default ``A100-80``, as the benchmark). The search is :func:`hermes.core.multillm.placement.
seallm_place` (group partition per TP size, greedy allocation by unsatisfaction index, the best
TP by evaluation); a plan is evaluated as ``hermes bench seallm`` evaluates one, with the same
simulator (:func:`hermes.sim.multillm.score_plan`: SeaLLM's DB ordering, unified KV; requests
over the SLO, 5x their reference time, and normalised latencies) on a synthetic stream
(:func:`request_stream`): :data:`WINDOW_S` of Poisson arrivals at each service's rate, then 10 s
to drain; each service's lengths are a profile of :data:`PROFILE_N` draws, input and output
each lognormal with the service's mean and sigma :data:`LENGTH_SIGMA` (rounded, at least one
token), which gives its mean reference time L̂_s and DB budget (as the benchmark's profiled
lengths do), and each request picks its lengths from it; one fixed seed (:data:`SEED`), so
every plan of a search, and every run, sees the same requests. An unplaced service misses all
its requests.

Command: ``hermes plan placement [--services FILE | --preset seallm] [--gpus N] [--device D]
[--tps 1,2,4] [--max-per-group 2] [--draws N] [--current PLAN [--min-gain 0.1]] [--emit FILE]``
(``--draws``: score plans on the mean over N streams, seeds :data:`SEED` onwards; ``--current``:
keep the plan in force unless the new one scores ``--min-gain`` better); bad input ends it with ``hermes: error: ...``
(exit 2) naming the service or flag.

Output: a printed table and, with ``--emit FILE``, the plan document, format
``hermes-placement-plan/1`` (:func:`emit_placement`)::

    {"format", "device", "gpus", "score",
     "services": [{"name", "model", "served_model", "rate", "input_tokens", "output_tokens"}],
     "groups": [{"gpus": [..], "tp": n, "services": [..],
                 "engines": [{"name": "g<i>-<service>", "service", "model", "gpus": [..],
                              "env": {"CUDA_VISIBLE_DEVICES": ".."}, "vllm_args": [..],
                              "builtin": {"engine": "sim", "model", "device", "tp"}}]}]}

One engine per (group, service); ``model`` is the name it serves (the service's
``served_model``); ``vllm_args`` are those of the vLLM OpenAI server (``--model`` the Hugging
Face id, ``--served-model-name``, ``--tensor-parallel-size`` the group's TP,
``--gpu-memory-utilization`` the engine's share of the group's memory: its weights plus an
equal part of what is left for KV cache; 0.9 alone); ``builtin`` gives the built-in engine the
planner's iteration costs. ``hermeslet run --placement FILE`` serves a plan
(:mod:`hermeslet.placement`); a running HermesLet applies a new one on ``SIGHUP``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hermes.argtypes import fraction, positive_float, positive_int
from hermes.core.cluster.devices import get_device
from hermes.core.cluster.models import get_model
from hermes.core.multillm.budget import DoublingBudget
from hermes.core.multillm.ordering import Ordering, make_ordering
from hermes.core.multillm.placement import (
    Group,
    PlacementPlan,
    ServiceScore,
    mean_scores,
    seallm_place,
    usable_tps,
)
from hermes.core.multillm.service import (
    GPU_MEMORY_UTILIZATION,
    Service,
    ServiceStats,
    exec_times,
    group_fits,
    services_fit,
    weight_bytes,
)
from hermes.plan.emit import HF_MODELS, vllm_args
from hermes.sim.multillm import DEVICE, STARVATION_FACTOR, ServiceSet, SimRequest, score_plan

FORMAT = "hermes-placement-plan/1"
DEFAULT_INPUT_TOKENS = 512
DEFAULT_OUTPUT_TOKENS = 128
WINDOW_S = 60.0  # seconds of synthetic requests a plan is scored on (then 10 s to drain)
SEED = 0  # of the synthetic requests: the same stream for every plan, and every run
LENGTH_SIGMA = 0.5  # of the lognormal request lengths around a service's means
PROFILE_N = 512  # length samples per service (its profile: L̂_s, the DB budgets; requests pick)

#: ``hermes bench seallm``'s services: the Mooncake length clusters (means of the clustered
#: trace lengths) x Llama-2-7B/13B, at its default 4 req/s split by the clusters' shares
PRESETS: dict[str, list[dict[str, Any]]] = {
    "seallm": [
        {"name": f"c{c}-{m.split('-')[-1]}", "model": m, "rate": round(4.0 * share / 2, 3),
         "input_tokens": i, "output_tokens": o}
        for c, (share, i, o) in enumerate(((0.315, 260, 383), (0.164, 1170, 22),
                                           (0.521, 1769, 408)))
        for m in ("llama-2-7b", "llama-2-13b")],
}


@dataclass(frozen=True)
class ServiceSpec:
    """One service to place: its name, cluster model, request rate and mean lengths."""

    name: str
    model: str
    rate: float
    input_tokens: int = DEFAULT_INPUT_TOKENS
    output_tokens: int = DEFAULT_OUTPUT_TOKENS
    served_model: str = ""

    @property
    def served(self) -> str:
        return self.served_model or self.name


def parse_services(doc: Any, where: str = "services") -> list[ServiceSpec]:
    """Services from a JSON list (module doc); ``ValueError`` names what is wrong."""
    if not isinstance(doc, list) or not doc:
        raise ValueError(f"{where}: expected a non-empty JSON list of services")
    out: list[ServiceSpec] = []
    for k, s in enumerate(doc):
        if not isinstance(s, dict):
            raise ValueError(f"{where}: service {k} is not an object")
        name = s.get("name")
        if not isinstance(name, str) or not name.strip() or any(c.isspace() for c in name):
            raise ValueError(f"{where}: service {k}: 'name' must be a non-empty string "
                             "without spaces")
        model = s.get("model")
        if not isinstance(model, str):
            raise ValueError(f"{where}: service {name!r}: 'model' missing")
        try:
            get_model(model)
        except ValueError as e:
            raise ValueError(f"{where}: service {name!r}: {e}") from None
        unknown = set(s) - {"name", "model", "rate", "input_tokens", "output_tokens",
                            "served_model"}
        if unknown:
            raise ValueError(f"{where}: service {name!r}: unknown fields {sorted(unknown)}")
        try:
            rate = float(s.get("rate", 1.0))
            n_in = int(s.get("input_tokens", DEFAULT_INPUT_TOKENS))
            n_out = int(s.get("output_tokens", DEFAULT_OUTPUT_TOKENS))
        except (TypeError, ValueError):
            raise ValueError(f"{where}: service {name!r}: rate / token counts must be "
                             "numbers") from None
        if not (rate >= 0 and math.isfinite(rate)) or n_in < 1 or n_out < 1:
            raise ValueError(f"{where}: service {name!r}: need rate >= 0 and token counts >= 1")
        served = s.get("served_model", "")
        if not isinstance(served, str):
            raise ValueError(f"{where}: service {name!r}: 'served_model' must be a string")
        out.append(ServiceSpec(name, get_model(model).name, rate, n_in, n_out, served))
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: service names must be unique: {names}")
    return out


# ----------------------------------------------------------------------------- evaluation
def _lengths(rng: np.random.Generator, mean: int, n: int) -> np.ndarray:
    """``n`` lengths drawn lognormal with mean ``mean`` and :data:`LENGTH_SIGMA`, rounded, >= 1."""
    mu = math.log(mean) - LENGTH_SIGMA ** 2 / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, LENGTH_SIGMA, n))).astype(int)


@dataclass(frozen=True)
class RequestStream:
    """The synthetic requests a plan is scored on (module doc): the services with their length
    profiles, reference times and L̂_s (:class:`~hermes.sim.multillm.ServiceSet`), the requests
    (arrivals in ``[0, window_s)``) and SeaLLM's DB ordering over the services' budgets."""

    services: ServiceSet
    requests: list[SimRequest]
    ordering: Ordering
    window_s: float

    def count(self, service: str) -> int:
        """The requests of ``service``."""
        k = [s.name for s in self.services.services].index(service)
        return sum(r.svc == k for r in self.requests)


def request_stream(services: Sequence[ServiceSpec], device: str, window_s: float = WINDOW_S,
                   seed: int = SEED) -> RequestStream:
    """``window_s`` of synthetic requests to ``services`` (module doc), fixed by ``seed``."""
    rng = np.random.default_rng(seed)
    profiles = [Service(s.name, s.model, _lengths(rng, s.input_tokens, PROFILE_N),
                        _lengths(rng, s.output_tokens, PROFILE_N)) for s in services]
    stats = [ServiceStats.of(p, device, 1) for p in profiles]
    rows: list[tuple[float, int, int, int]] = []  # arrival, service, input, output tokens
    for k, (s, p) in enumerate(zip(services, profiles, strict=True)):
        n = int(rng.poisson(s.rate * window_s))
        pick = rng.integers(0, PROFILE_N, n)
        rows += [(float(t), k, int(p.input_lengths[j]), int(p.output_lengths[j]))
                 for t, j in zip(rng.uniform(0.0, window_s, n), pick, strict=True)]
    rows.sort()
    svc = np.array([r[1] for r in rows], dtype=int)
    inp = np.array([r[2] for r in rows], dtype=int)
    out = np.array([r[3] for r in rows], dtype=int)
    ref = np.empty(len(rows))
    for k, p in enumerate(profiles):
        m = svc == k
        if m.any():
            ref[m] = exec_times(p.model, device, 1, inp[m], out[m])
    budgets = {p.name: DoublingBudget(st.mean_s + st.std_s, st.mean_s)
               for p, st in zip(profiles, stats, strict=True)}
    return RequestStream(
        ServiceSet(profiles, ref, np.array([st.mean_s for st in stats])),
        [SimRequest(i, k, t, a, b) for i, (t, k, a, b) in enumerate(rows)],
        make_ordering("db", budgets, starvation_factor=STARVATION_FACTOR), window_s)


def simulate(stream: RequestStream, plan: PlacementPlan, device: str) -> dict[str, ServiceScore]:
    """The plan's :class:`ServiceScore` per service: ``stream`` simulated on its groups (SeaLLM:
    DB ordering, unified KV), as ``hermes bench seallm`` scores a candidate plan."""
    return score_plan(stream.services, plan, stream.ordering, "unified", stream.requests,
                      stream.window_s, device=device)


def estimate(services: Sequence[ServiceSpec], device: str, plan: PlacementPlan,
             window_s: float = WINDOW_S) -> dict[str, ServiceScore]:
    """The plan's :class:`ServiceScore` per service on :func:`request_stream`'s ``window_s`` of
    requests (:func:`simulate`); an unplaced service misses all its requests."""
    return simulate(request_stream(services, device, window_s), plan, device)


def place(services: Sequence[ServiceSpec], n_gpus: int, device: str = DEVICE, *,
          tps: Sequence[int] = (1, 2, 4), node_gpus: int = 8, max_per_group: int = 2,
          current: PlacementPlan | None = None, min_gain: float = 0.0,
          draws: int = 1) -> tuple[PlacementPlan, float]:
    """SeaLLM's placement of ``services`` on ``n_gpus`` GPUs of ``device``, plans scored by the
    simulator (:func:`simulate`) on the mean over ``draws`` synthetic streams (seeds
    :data:`SEED`, :data:`SEED` + 1, ...: :func:`~hermes.core.multillm.placement.mean_scores`);
    with ``current`` (the plan in force) it is kept unless the search's plan scores
    ``min_gain`` better (:func:`~hermes.core.multillm.placement.seallm_place`). ``ValueError``
    names what cannot be placed."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    get_device(device)  # a clear error for an unknown device
    if n_gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {n_gpus}")
    if not services:
        raise ValueError("no services to place")
    usable = usable_tps(tps, n_gpus, node_gpus)
    if not usable:
        raise ValueError(f"no TP size in {tuple(tps)} divides {n_gpus} GPUs")
    for s in services:
        if not any(group_fits((s.model,), device, t) for t in usable):
            raise ValueError(f"service {s.name!r} ({s.model}) fits no group of "
                             f"{'/'.join(map(str, usable))} {device} GPUs")

    streams = [request_stream(services, device, seed=SEED + k) for k in range(draws)]

    def evaluate(p: PlacementPlan) -> dict[str, ServiceScore]:
        return mean_scores([simulate(st, p, device) for st in streams])

    try:
        return seallm_place([s.name for s in services], {s.name: s.rate for s in services},
                            n_gpus, services_fit({s.name: s.model for s in services}, device), evaluate,
                            tps=usable, node_gpus=node_gpus, max_per_group=max_per_group,
                            current=current, min_gain=min_gain)
    except ValueError as e:
        raise ValueError(f"{e} (at most {max_per_group} services per group; give more GPUs "
                         "or fewer services)") from None


# ----------------------------------------------------------------------------- the document
def memory_shares(models: Sequence[str], device: str, tp: int) -> list[float]:
    """Each engine's ``--gpu-memory-utilization`` on a group running ``models`` side by side:
    its weights plus an equal part of the rest of the group's budget (together 0.9)."""
    if len(models) <= 1:
        return [GPU_MEMORY_UTILIZATION] * len(models)
    mem = get_device(device).memory_bytes
    budget = mem * GPU_MEMORY_UTILIZATION
    w = [weight_bytes(m) / tp for m in models]
    rest = max(budget - sum(w), 0.0) / len(models)
    return [math.floor(1000 * (x + rest) / mem) / 1000 for x in w]


def emit_placement(services: Sequence[ServiceSpec], plan: PlacementPlan, device: str,
                   n_gpus: int, score: float | None = None) -> dict[str, Any]:
    """The ``hermes-placement-plan/1`` document of ``plan`` (module doc)."""
    by = {s.name: s for s in services}
    dev = get_device(device).name
    groups = []
    for i, g in enumerate(plan.groups):
        members = [by[m] for m in g.services]
        shares = memory_shares([m.model for m in members], dev, g.tp)
        gpus = list(g.gpus)
        groups.append({"gpus": gpus, "tp": g.tp, "services": list(g.services), "engines": [{
            "name": f"g{i}-{s.name}", "service": s.name, "model": s.served, "gpus": gpus,
            "env": {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))},
            "vllm_args": vllm_args(HF_MODELS.get(s.model, s.model), s.served, g.tp, u),
            "builtin": {"engine": "sim", "model": s.model, "device": dev, "tp": g.tp},
        } for s, u in zip(members, shares, strict=True)]})
    return {"format": FORMAT, "device": dev, "gpus": n_gpus,
            **({"score": round(score, 4)} if score is not None else {}),
            "services": [{"name": s.name, "model": s.model, "served_model": s.served,
                          "rate": s.rate, "input_tokens": s.input_tokens,
                          "output_tokens": s.output_tokens} for s in services],
            "groups": groups}


def plan_of(doc: Mapping[str, Any], where: str = "plan") -> PlacementPlan:
    """The :class:`PlacementPlan` a ``hermes-placement-plan/1`` document holds (its groups'
    GPUs and services); ``ValueError`` naming ``where`` for anything else."""
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
        raise ValueError(f"{where}: not a {FORMAT} document")
    try:
        return PlacementPlan(tuple(Group(tuple(int(x) for x in g["gpus"]),
                                         tuple(str(x) for x in g["services"]))
                                   for g in doc["groups"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: a group without gpus/services ({e!r})") from None


def plan_engines(doc: Mapping[str, Any]) -> dict[str, str]:
    """The engines a plan document starts: engine name -> the model it serves (what a node
    announces once it has applied the plan)."""
    return {e["name"]: e["model"] for g in doc["groups"] for e in g["engines"]}


def plan_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One table row per engine of a plan document."""
    return [{"group": i, "gpus": ",".join(map(str, g["gpus"])), "tp": g["tp"],
             "engine": e["name"], "serves": e["model"], "model": e["builtin"]["model"],
             "mem_share": e["vllm_args"][e["vllm_args"].index("--gpu-memory-utilization") + 1]}
            for i, g in enumerate(doc["groups"]) for e in g["engines"]]


# ----------------------------------------------------------------------------- command
def services_from_forecast(doc: Any, model_map: dict[str, str] | None = None,
                           where: str = "forecast") -> list[ServiceSpec]:
    """Services to place from a gateway's ``GET /admin/forecast`` answer: one per model it
    expects calls for, at its forecast call rate and mean lengths. ``model_map`` maps a served
    model name to the planner's model (:func:`~hermes.core.cluster.models.get_model`) where
    the two differ; ``ValueError`` names a model the planner does not know and the flag."""
    rows = doc.get("services") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise ValueError(f"{where}: not a forecast (no 'services' list)")
    if not rows:
        raise ValueError(f"{where}: the gateway forecasts no LLM calls (no runs in flight and "
                         "no recent arrivals of apps it has PDGraphs for): nothing to place")
    model_map = model_map or {}
    out = []
    for r in rows:
        served = str(r["model"])
        model = model_map.get(served, served)
        try:
            get_model(model)
        except ValueError:
            raise ValueError(f"{where}: served model {served!r} is not a model the planner "
                             f"knows; map it with --model-map {served}=MODEL") from None
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", served)
        out.append({"name": name, "model": model, "rate": float(r["calls_per_s"]),
                    "input_tokens": max(1, round(float(r["input_tokens"]))),
                    "output_tokens": max(1, round(float(r["output_tokens"]))),
                    "served_model": served})
    return parse_services(out, where)


def fetch_forecast(url: str, token: str | None, horizon_s: float, window_s: float) -> Any:
    """``GET URL/admin/forecast``; ``ValueError`` with the gateway's message on failure."""
    from hermes.admin_client import AdminClient, AdminError

    client = AdminClient(url, token)
    try:
        return client.call("GET", "/admin/forecast",
                           params={"horizon_s": horizon_s, "window_s": window_s})
    except AdminError as e:
        raise ValueError(f"--from-gateway {url}: {e}") from None
    finally:
        client.close()


def _model_map(items: Sequence[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        served, sep, model = item.partition("=")
        if not sep or not served or not model:
            raise ValueError(f"--model-map: expected SERVED=MODEL, got {item!r}")
        out[served] = model
    return out


def cmd_placement(args: argparse.Namespace) -> int:
    from hermes.cliout import print_table

    if args.from_gateway:
        doc = fetch_forecast(args.from_gateway, args.token, args.horizon, args.window)
        services = services_from_forecast(doc, _model_map(args.model_map),
                                          f"--from-gateway {args.from_gateway}")
        print(f"forecast over {args.horizon:g} s from {doc['runs_in_flight']} runs in flight "
              f"and {len(doc['app_rates'])} apps' arrivals: "
              + ", ".join(f"{s.served} {s.rate:.3g} calls/s" for s in services),
              file=sys.stderr)
    elif args.services:
        try:
            doc = json.loads(Path(args.services).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"--services {args.services}: not JSON ({e})") from None
        services = parse_services(doc, f"--services {args.services}")
    else:
        services = parse_services(PRESETS[args.preset], f"--preset {args.preset}")
    try:
        tps = tuple(int(t) for t in args.tps.split(",") if t.strip())
    except ValueError:
        raise ValueError(f"--tps: expected comma-separated integers, got {args.tps!r}") from None
    current = None
    if args.current:
        try:
            current = plan_of(json.loads(Path(args.current).read_text()), f"--current {args.current}")
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"--current {args.current}: cannot read a plan ({e})") from None
    plan, score = place(services, args.gpus, args.device, tps=tps,
                        max_per_group=args.max_per_group, current=current,
                        min_gain=args.min_gain if current is not None else 0.0, draws=args.draws)
    if current is not None:
        print("keeping the plan in force (--current): the search's best is not "
              f"{args.min_gain:.1%} better" if plan == current else
              "the plan in force (--current) is replaced", file=sys.stderr)
    doc = emit_placement(services, plan, args.device, args.gpus, score)
    print_table(plan_rows(doc), title=f"SeaLLM placement: {len(services)} services on "
                f"{args.gpus} {doc['device']}")
    print(f"plan: {plan.describe()}; score {score:.3f} (requests over SLO + alpha x L_N, "
          f"estimated)")
    if args.emit:
        Path(args.emit).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.emit} (hermeslet run --placement {args.emit})", file=sys.stderr)
    return 0


def add_placement_parser(psub: Any) -> None:
    """Register ``hermes plan placement``."""
    s = psub.add_parser("placement", help="place several LLM services on a node's GPUs "
                        "(SeaLLM) and emit the plan a HermesLet serves")
    src = s.add_mutually_exclusive_group()
    src.add_argument("--services", metavar="FILE", help="JSON list of {name, model, rate, "
                     "[input_tokens, output_tokens, served_model]}")
    src.add_argument("--preset", choices=sorted(PRESETS), default="seallm",
                     help="built-in service set (default %(default)s: hermes bench seallm's)")
    src.add_argument("--from-gateway", dest="from_gateway", metavar="URL",
                     help="place the models a running gateway forecasts demand for (its runs "
                          "in flight, their PDGraphs, recent arrivals: GET /admin/forecast)")
    s.add_argument("--token", default=os.environ.get("HERMES_ADMIN_TOKEN"),
                   help="with --from-gateway: admin token (default $HERMES_ADMIN_TOKEN)")
    s.add_argument("--horizon", type=positive_float, default=60.0,
                   help="with --from-gateway: forecast horizon, s (default %(default)g)")
    s.add_argument("--window", type=positive_float, default=300.0,
                   help="with --from-gateway: arrival-rate window, s (default %(default)g)")
    s.add_argument("--model-map", dest="model_map", action="append", metavar="SERVED=MODEL",
                   help="with --from-gateway: the planner's model for a served model name "
                        "(repeatable)")
    s.add_argument("--gpus", type=int, default=8, help="GPUs of the node (default %(default)s)")
    s.add_argument("--device", default=DEVICE, help="GPU type (default %(default)s)")
    s.add_argument("--tps", default="1,2,4", help="TP sizes tried (default %(default)s)")
    s.add_argument("--max-per-group", dest="max_per_group", type=positive_int, default=2,
                   help="services sharing one group at most (default %(default)s)")
    s.add_argument("--current", metavar="PLAN", help="the plan in force (a hermes-placement-plan/1 "
                   "file): kept unless the new plan scores --min-gain better (a re-placement "
                   "pauses the groups that change and drops their KV)")
    s.add_argument("--min-gain", dest="min_gain", type=fraction, default=0.1,
                   help="with --current: the fraction by which a new plan must score better "
                        "(default %(default)g)")
    s.add_argument("--draws", type=int, default=1,
                   help="score each candidate plan on the mean over N synthetic request "
                        "streams (N x the search time; Hermes' placer uses 8; default %(default)s)")
    s.add_argument("--emit", metavar="FILE", help="write the plan (hermes-placement-plan/1)")
    s.set_defaults(func=cmd_placement)

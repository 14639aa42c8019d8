"""``hermes plan placement``: SeaLLM's placement of several LLM services on one node's GPUs, as a
plan a HermesLet applies (issue 22 item 5).

Inputs: the services (``--services FILE``: a JSON list of ``{"name", "model", "rate"}`` with
optional ``input_tokens`` / ``output_tokens`` (means; default :data:`DEFAULT_INPUT_TOKENS` /
:data:`DEFAULT_OUTPUT_TOKENS`) and ``served_model`` (the model name clients send and engines
announce; default the service's name); or ``--preset``, :data:`PRESETS`: ``seallm``, the six
services of ``hermes bench seallm`` with its default load), ``--gpus N`` and ``--device``
(default ``A100-80``, as the benchmark). The search is :func:`hermes.core.multillm.placement.
seallm_place` (group partition per TP size, greedy allocation by unsatisfaction index, the best
TP by evaluation); the evaluation here is an analytic estimate (:func:`estimate`), not the
benchmark's simulator (``hermes.plan`` does not import ``hermes.bench``): per group, a
continuous-batching fixed point over the planner's iteration cost model
(:func:`hermes.core.multillm.service.cost_model`) gives each service's batch and mean latency
(:func:`_group_latency`); requests over the SLO (5x the reference time) are counted with an
exponential tail, ``exp(-5 ref / latency)``; a group that cannot keep up misses every request.

Command: ``hermes plan placement [--services FILE | --preset seallm] [--gpus N] [--device D]
[--tps 1,2,4] [--max-per-group 2] [--emit FILE]``; bad input ends it with ``hermes: error: ...``
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
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes.core.cluster.devices import get_device
from hermes.core.cluster.models import get_model
from hermes.core.multillm.placement import PlacementPlan, ServiceScore, seallm_place
from hermes.core.multillm.service import (
    GPU_MEMORY_UTILIZATION,
    cost_model,
    group_fits,
    group_kv_bytes,
    kv_bytes_per_token,
    weight_bytes,
)
from hermes.plan.emit import HF_MODELS, vllm_args

FORMAT = "hermes-placement-plan/1"
DEVICE = "A100-80"  # as `hermes bench seallm`
DEFAULT_INPUT_TOKENS = 512
DEFAULT_OUTPUT_TOKENS = 128
SLO_FACTOR = 5.0  # as the benchmark: a request over 5x its reference time misses its SLO
WINDOW_S = 30.0  # the requests scored per plan: rate x this (the benchmark's history_s)
MAX_NUM_SEQS = 256

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
def _group_latency(members: Sequence[ServiceSpec], shares: Mapping[str, float], device: str,
                   tp: int) -> tuple[bool, dict[str, float]]:
    """Whether a group keeps up, and each member's mean latency (module doc). The group runs
    one iteration at a time, a prefill or one service's decode batch (as the benchmark's
    simulator): a request decodes one token per round of its group's decode steps, rounds
    slowed by the share of time spent in prefills; each service's batch is its concurrency by
    Little's law (a fixed point from one request up), capped by ``max_num_seqs`` and its part
    of the KV pool. It does not keep up when prefills take all the time or a batch would
    exceed its cap."""
    models = tuple(s.model for s in members)
    kv = max(group_kv_bytes(models, device, tp), 0) / max(len(members), 1)
    cms = {s.name: cost_model(s.model, device, tp) for s in members}
    pre = {s.name: cms[s.name].iteration_s(s.input_tokens, 0, 0) for s in members}
    cap = {s.name: max(1.0, min(MAX_NUM_SEQS, kv / (kv_bytes_per_token(s.model)
                                                     * (s.input_tokens + s.output_tokens))))
           for s in members}
    busy_pre = sum(shares[s.name] * pre[s.name] for s in members)
    if busy_pre >= 1.0:
        return False, {}
    batch = dict.fromkeys(cap, 1.0)
    lat: dict[str, float] = {}
    for _ in range(200):
        rnd = sum(cms[s.name].iteration_s(0, max(1, round(batch[s.name])),
                                          int(batch[s.name] * (s.input_tokens
                                                               + s.output_tokens / 2)))
                  for s in members if shares[s.name] > 0)
        lat = {s.name: pre[s.name] + s.output_tokens * rnd / (1.0 - busy_pre) for s in members}
        want = {s.name: max(1.0, shares[s.name] * lat[s.name]) for s in members}
        if any(want[k] > cap[k] * (1 + 1e-6) and batch[k] >= cap[k] for k in want):
            return False, lat  # more requests at once than the batch can hold: a queue grows
        new = {k: min(cap[k], w) for k, w in want.items()}
        if all(abs(new[k] - batch[k]) <= 1e-3 * batch[k] for k in new):
            return True, lat
        batch = new
    return False, lat  # no fixed point: the batches keep growing


def reference_s(s: ServiceSpec, device: str) -> float:
    """The service's reference time: one request alone on one GPU (prefill, then decode)."""
    cm = cost_model(s.model, device, 1)
    return float(cm.unit_service_s([[s.input_tokens]], [[s.output_tokens]])[0])  # type: ignore[arg-type]


def estimate(services: Sequence[ServiceSpec], device: str, plan: PlacementPlan,
             window_s: float = WINDOW_S) -> dict[str, ServiceScore]:
    """The plan's :class:`ServiceScore` per service over ``window_s`` of requests (module
    doc): a service's rate is split evenly over its replicas; an unplaced service misses all."""
    by = {s.name: s for s in services}
    n = {s.name: s.rate * window_s for s in services}
    ref = {s.name: reference_s(s, device) for s in services}
    acc = {s.name: [0.0, 0.0, 0.0] for s in services}
    for g in plan.groups:
        members = [by[m] for m in g.services]
        if not members:
            continue
        shares = {m.name: m.rate / len(plan.replicas(m.name)) for m in members}
        ok, lat = _group_latency(members, shares, device, g.tp)
        for m in members:
            k = n[m.name] * shares[m.name] / m.rate if m.rate > 0 else 0.0
            a = acc[m.name]
            if not ok:  # overloaded: every request misses, waits the whole window
                a[0] += k
                a[1] += k * window_s / ref[m.name]
            else:
                a[0] += k * math.exp(-SLO_FACTOR * ref[m.name] / lat[m.name])
                a[1] += k * lat[m.name] / ref[m.name]
            a[2] += k
    for s in services:
        if not plan.replicas(s.name):
            acc[s.name] = [n[s.name], 0.0, 0.0]
    return {k: ServiceScore(v[0], v[1], round(v[2])) for k, v in acc.items()}


def place(services: Sequence[ServiceSpec], n_gpus: int, device: str = DEVICE, *,
          tps: Sequence[int] = (1, 2, 4), node_gpus: int = 8,
          max_per_group: int = 2) -> tuple[PlacementPlan, float]:
    """SeaLLM's placement of ``services`` on ``n_gpus`` GPUs of ``device`` with the analytic
    evaluation; ``ValueError`` names what cannot be placed."""
    get_device(device)  # a clear error for an unknown device
    if n_gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {n_gpus}")
    if not services:
        raise ValueError("no services to place")
    models = {s.name: s.model for s in services}
    usable = [t for t in tps if t <= min(n_gpus, node_gpus) and n_gpus % t == 0 and not t & (t - 1)]
    if not usable:
        raise ValueError(f"no TP size in {tuple(tps)} divides {n_gpus} GPUs")
    for s in services:
        if not any(group_fits((s.model,), device, t) for t in usable):
            raise ValueError(f"service {s.name!r} ({s.model}) fits no group of "
                             f"{'/'.join(map(str, usable))} {device} GPUs")

    def fits(members: tuple[str, ...], tp: int) -> bool:
        return group_fits(tuple(models[m] for m in members), device, tp)

    try:
        return seallm_place([s.name for s in services], {s.name: s.rate for s in services},
                            n_gpus, fits, lambda p: estimate(services, device, p),
                            tps=usable, node_gpus=node_gpus, max_per_group=max_per_group)
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


def plan_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One table row per engine of a plan document."""
    return [{"group": i, "gpus": ",".join(map(str, g["gpus"])), "tp": g["tp"],
             "engine": e["name"], "serves": e["model"], "model": e["builtin"]["model"],
             "mem_share": e["vllm_args"][e["vllm_args"].index("--gpu-memory-utilization") + 1]}
            for i, g in enumerate(doc["groups"]) for e in g["engines"]]


# ----------------------------------------------------------------------------- command
def cmd_placement(args: argparse.Namespace) -> int:
    from hermes.cliout import print_table

    if args.services:
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
    plan, score = place(services, args.gpus, args.device, tps=tps,
                        max_per_group=args.max_per_group)
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
    s.add_argument("--gpus", type=int, default=8, help="GPUs of the node (default %(default)s)")
    s.add_argument("--device", default=DEVICE, help="GPU type (default %(default)s)")
    s.add_argument("--tps", default="1,2,4", help="TP sizes tried (default %(default)s)")
    s.add_argument("--max-per-group", dest="max_per_group", type=int, default=2,
                   help="services sharing one group at most (default %(default)s)")
    s.add_argument("--emit", metavar="FILE", help="write the plan (hermes-placement-plan/1)")
    s.set_defaults(func=cmd_placement)

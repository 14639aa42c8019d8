"""``hermes plan hetero``: HexGen asymmetric pipelines on a heterogeneous cluster (issue 21).

Glue only: presets, cluster files, JSON and the comparison table; the decisions are in
:mod:`hermes.core.hexgen`.

Presets after HexGen section 5 (per-GPU prices per hour are ours, chosen so the totals match
the paper's budgets): ``homogeneous-16xA100-40``: two nodes of 8 A100-40GB, $4.09625/GPU
($65.54/h); ``hexgen-hetero``: the 58-GPU mixed set over four regions, RTX3090Ti $0.98,
A5000 $1.00, A6000 $1.40, A40 $1.27 ($65.04/h); ``hexgen-half``: its Iceland, Norway and
Nevada part ($29.56/h; paper $29.6/h). Links after the paper's measurements: 2 ms and 5 Gbit/s
within a region, 80 ms and 0.5 Gbit/s between regions (the paper's ranges: 40-150 ms,
0.3-1.0 Gbit/s).

Cluster file (JSON): ``{"nodes": [{"device", "gpus", "region", "interconnect"?}],
"links": [{"regions": [A, B], "latency_ms", "gbps"}], "intra_region": {"latency_ms",
"gbps"}?}``; every pair of distinct regions must have a link. The cluster model has one
inter-region link class, so the slowest listed link stands for all (stated, conservative).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np

from hermes.core.cluster.cost import Placement, uniform_placement
from hermes.core.cluster.devices import get_device
from hermes.core.cluster.models import ModelSpec, get_model
from hermes.core.cluster.topology import INTERCONNECTS, Cluster, Link, Node
from hermes.core.hexgen.fitness import Workload, deadline_at, latencies
from hermes.core.hexgen.layout import placement_fits, placement_latency_s
from hermes.core.hexgen.search import Evaluator, GAConfig, SearchResult, search

PRICES = {"A100-40": 65.54 / 16, "RTX3090Ti": 0.98, "A5000": 1.00, "A6000": 1.40, "A40": 1.27}
TARGET = 0.9  # SLO attainment the comparison holds fixed


def _link(name: str, latency_s: float, gbps: float) -> Link:
    bw = gbps * 1e9 / 8
    return Link(name, latency_s, bw, 2 * latency_s, bw)


INTRA_REGION = _link("intra-region", 2e-3, 5.0)
CROSS_REGION = _link("cross-region", 80e-3, 0.5)


def _nodes(spec: list[tuple[str, int, str]], interconnect: str = "pcie") -> tuple[Node, ...]:
    return tuple(Node(get_device(d), n, interconnect, r) for d, n, r in spec)


_HALF = [("RTX3090Ti", 8, "iceland")] * 2 + [("RTX3090Ti", 3, "norway")] * 2 + [("A5000", 8, "nevada")]
PRESETS: dict[str, Cluster] = {
    "homogeneous-16xA100-40": Cluster(_nodes([("A100-40", 8, "us-east")] * 2, "nvswitch"),
                                      inter_node=replace(INTRA_REGION, p2p_bytes_s=100e9 / 8,
                                                         ar_bus_bytes_s=100e9 / 8,
                                                         p2p_latency_s=30e-6, ar_latency_s=80e-6),
                                      inter_region=CROSS_REGION),
    "hexgen-hetero": Cluster(_nodes(_HALF + [("A6000", 8, "illinois")] * 2
                                    + [("A5000", 8, "illinois"), ("A40", 4, "illinois")]),
                             inter_node=INTRA_REGION, inter_region=CROSS_REGION),
    "hexgen-half": Cluster(_nodes(_HALF), inter_node=INTRA_REGION, inter_region=CROSS_REGION),
}


def price_per_hour(cluster: Cluster) -> float:
    return sum(PRICES.get(n.device.name, float("nan")) * n.n_gpus for n in cluster.nodes)


def load_cluster(path: str) -> Cluster:
    """A cluster from a JSON file (module doc); ``ValueError`` naming what is wrong."""
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cluster file {path}: {e}") from None
    nodes = []
    for i, n in enumerate(raw.get("nodes") or []):
        try:
            ic = n.get("interconnect", "pcie")
            if ic not in INTERCONNECTS:
                raise ValueError(f"unknown interconnect {ic!r}; known: {', '.join(INTERCONNECTS)}")
            nodes.append(Node(get_device(str(n["device"])), int(n["gpus"]), ic, str(n.get("region", "r0"))))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"cluster file {path}: node {i}: {e}") from None
    if not nodes:
        raise ValueError(f"cluster file {path}: no nodes")
    regions = sorted({n.region for n in nodes})
    links: dict[frozenset[str], Link] = {}
    for lk in raw.get("links") or []:
        try:
            a, b = lk["regions"]
            links[frozenset((a, b))] = _link(f"{a}-{b}", float(lk["latency_ms"]) / 1e3, float(lk["gbps"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"cluster file {path}: bad link {lk!r}: {e}") from None
    missing = [f"{a}<->{b}" for a, b in itertools.combinations(regions, 2)
               if frozenset((a, b)) not in links]
    if missing:
        raise ValueError(f"cluster file {path}: missing links between regions: {', '.join(missing)}")
    intra = raw.get("intra_region")
    inter_node = (_link("intra-region", float(intra["latency_ms"]) / 1e3, float(intra["gbps"]))
                  if intra else INTRA_REGION)
    inter_region = (min(links.values(), key=lambda x: x.p2p_bytes_s) if links else CROSS_REGION)
    return Cluster(tuple(nodes), inter_node=inter_node, inter_region=inter_region)


def check_model_fits(cluster: Cluster, model: ModelSpec) -> None:
    """Reject a model that fits on no single region's GPUs (the largest useful group)."""
    from hermes.core.hexgen.layout import best_pipeline

    for region in sorted({n.region for n in cluster.nodes}):
        gpus = [g for g in cluster.gpus() if cluster.nodes[g.node].region == region][:16]
        if best_pipeline(cluster, model, gpus) is not None:
            return
    raise ValueError(f"model {model.name} fits nowhere on this cluster (no region's GPUs hold "
                     "its weights and one full-length sequence's KV cache)")


def _progress(label: str) -> Any:
    t0 = time.monotonic()

    def cb(gen: int, best: float) -> None:
        print(f"[hetero {label}] generation {gen + 1}: best SLO attainment {best:.3f} "
              f"({time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)
    return cb


def run_search(cluster: Cluster, model: ModelSpec, rate: float, deadline_s: float,
               cfg: GAConfig, label: str = "search") -> tuple[SearchResult, float, Evaluator]:
    ev = Evaluator(cluster, model, Workload(rate=rate), deadline_s)
    t0 = time.monotonic()
    res = search(ev, cfg, progress=_progress(label))
    return res, time.monotonic() - t0, ev


def vllm_args(p: Placement) -> dict[str, Any]:
    """vLLM arguments for one replica, or what vLLM cannot express and the nearest layout."""
    tps = {s.tp for s in p.stages}
    layers = [s.layers for s in p.stages]
    pp = len(p.stages)
    even = max(layers) - min(layers) <= 1
    if len(tps) == 1 and even:
        return {"expressible": True, "args": ["--tensor-parallel-size", str(tps.pop()),
                                              "--pipeline-parallel-size", str(pp)]}
    why = []
    if len(tps) > 1:
        why.append(f"different TP per stage {[s.tp for s in p.stages]} (vLLM: one "
                   "--tensor-parallel-size for all stages)")
    if not even:
        why.append(f"uneven layer split {layers} (vLLM splits layers evenly unless "
                   "VLLM_PP_LAYER_PARTITION is set)")
    return {"expressible": False, "why": why}


def nearest_symmetric(cluster: Cluster, p: Placement) -> tuple[Placement, float] | None:
    """The fastest uniform (tp, pp, even layers) layout on the same GPUs that fits."""
    gpus = list(p.gpus)
    best: tuple[Placement, float] | None = None
    for tp in (1, 2, 4, 8):
        if len(gpus) % tp or not p.model.valid_tp(tp):
            continue
        pp = len(gpus) // tp
        q = uniform_placement(p.model, gpus, tp, pp)
        if placement_fits(cluster, q):
            t = placement_latency_s(cluster, q)
            if best is None or t < best[1]:
                best = (q, t)
    return best


def plan_json(cluster: Cluster, res: SearchResult, search_s: float) -> dict[str, Any]:
    pipes = []
    for p in res.placements:
        start = 0
        stages = []
        for s in p.stages:
            stages.append({"gpus": [f"node{g.node}:{g.local}" for g in s.gpus],
                           "device": cluster.device(s.gpus[0]).name,
                           "region": cluster.nodes[s.gpus[0].node].region,
                           "tp": s.tp, "layers": [start, start + s.layers]})
            start += s.layers
        entry: dict[str, Any] = {"stages": stages,
                                 "predicted_latency_s": placement_latency_s(cluster, p),
                                 "vllm": vllm_args(p)}
        if not entry["vllm"]["expressible"]:
            near = nearest_symmetric(cluster, p)
            entry["vllm"]["instead"] = (
                {"tp": near[0].stages[0].tp, "pp": len(near[0].stages),
                 "args": ["--tensor-parallel-size", str(near[0].stages[0].tp),
                          "--pipeline-parallel-size", str(len(near[0].stages))],
                 "predicted_latency_s": near[1]}
                if near else "no even layout of these GPUs fits; Hermes runs the asymmetric "
                "layout only in its simulator")
        pipes.append(entry)
    return {"pipelines": pipes, "slo_attainment": res.slo_attainment,
            "search_s": round(search_s, 2), "price_per_hour": round(price_per_hour(cluster), 2)}


def _max_rate(cluster: Cluster, placements: list[Placement], deadline_s: float) -> float:
    lo, hi = 0.05, 64.0
    for _ in range(12):
        mid = (lo * hi) ** 0.5
        lat = latencies(cluster, placements, Workload(rate=mid, n_requests=1000))
        if np.mean(lat <= deadline_s) >= TARGET:
            lo = mid
        else:
            hi = mid
    return lo


def compare(cluster: Cluster, model: ModelSpec, rate: float, deadline_s: float,
            cfg: GAConfig) -> list[tuple[str, str, str, str]]:
    """Rows (comparison, ours, baseline, paper)."""
    rows = []
    res, secs, ev = run_search(cluster, model, rate, deadline_s, cfg, "hexgen")
    w = Workload(rate=rate)
    asym = list(res.placements)
    sym = [q for q in (nearest_symmetric(cluster, p) for p in asym) if q is not None]
    d_asym = deadline_at(latencies(cluster, asym, w), TARGET)
    d_sym = deadline_at(latencies(cluster, [q[0] for q in sym], w), TARGET) if sym else float("inf")
    rows.append(("deadline@90% asym vs symmetric (s)", f"{d_asym:.2f}", f"{d_sym:.2f}",
                 "asymmetric needed (Fig. 1: 2x, 19x)"))
    homo = PRESETS["homogeneous-16xA100-40"]
    hres, _, _ = run_search(homo, model, rate, deadline_s, cfg, "homogeneous")
    d_h = deadline_at(latencies(homo, list(hres.placements), w), TARGET)
    rows.append(("deadline@90% hetero vs homogeneous (s)", f"{d_asym:.2f}", f"{d_h:.2f}",
                 "up to 2.3x lower"))
    # the rate comparison holds a tight deadline: twice the homogeneous deadline@90% at ``rate``
    tight = 2 * d_h
    r_het = _max_rate(cluster, asym, tight)
    r_hom = _max_rate(homo, list(hres.placements), tight)
    rows.append((f"max rate@90% within {tight:.2f} s (req/s)", f"{r_het:.2f}", f"{r_hom:.2f}",
                 "up to 4x higher"))
    rres, rsecs, _ = run_search(cluster, model, rate, deadline_s, replace(cfg, mutation="random"),
                                "random")
    d_r = deadline_at(latencies(cluster, list(rres.placements), w), TARGET)
    rows.append(("GA ops vs random mutation: attainment", f"{res.slo_attainment:.3f}",
                 f"{rres.slo_attainment:.3f}", "ops converge faster"))
    rows.append(("GA ops vs random mutation: deadline@90% (s)", f"{d_asym:.2f}", f"{d_r:.2f}", ""))
    rows.append(("search time (s)", f"{secs:.1f}", f"{rsecs:.1f}", "90-126 (1.5-2.1 min)"))
    return rows


def cmd_hetero(args: argparse.Namespace) -> int:
    try:
        if (args.cluster is None) == (args.preset is None):
            raise ValueError("give exactly one of --cluster FILE or --preset NAME")
        cluster = load_cluster(args.cluster) if args.cluster else PRESETS[args.preset]
        model = get_model(args.model)
        if not args.rate > 0:
            raise ValueError(f"--rate must be > 0, got {args.rate}")
        check_model_fits(cluster, model)
        cfg = GAConfig(population=args.population, generations=args.generations, seed=args.seed)
        if args.compare:
            rows = compare(cluster, model, args.rate, args.deadline, cfg)
            print(f"{'comparison':46} {'ours':>10} {'baseline':>10}  paper")
            for r in rows:
                print(f"{r[0]:46} {r[1]:>10} {r[2]:>10}  {r[3]}")
            return 0
        res, secs, _ = run_search(cluster, model, args.rate, args.deadline, cfg)
    except ValueError as e:
        print(f"hermes plan hetero: error: {e}", file=sys.stderr)
        return 2
    out = plan_json(cluster, res, secs)
    for i, p in enumerate(out["pipelines"]):
        print(f"pipeline {i}: " + " | ".join(f"{s['device']}x{s['tp']} layers {s['layers'][0]}-"
                                              f"{s['layers'][1]}" for s in p["stages"]))
    print(f"SLO attainment {out['slo_attainment']:.3f} at {args.rate:g} req/s, deadline "
          f"{args.deadline:g} s; search {out['search_s']} s; ${out['price_per_hour']}/h")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


def add_hetero_parser(psub: Any) -> None:
    s = psub.add_parser("hetero", help="HexGen: asymmetric pipelines on heterogeneous GPUs")
    s.add_argument("--cluster", metavar="FILE", help="cluster JSON (hermes.plan.hetero doc)")
    s.add_argument("--preset", choices=sorted(PRESETS))
    s.add_argument("--model", default="llama-2-70b")
    s.add_argument("--rate", type=float, default=1.0, help="requests per second")
    s.add_argument("--deadline", type=float, default=30.0, help="SLO latency deadline (s)")
    s.add_argument("--population", type=int, default=GAConfig.population)
    s.add_argument("--generations", type=int, default=GAConfig.generations)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--json", metavar="FILE")
    s.add_argument("--compare", action="store_true", help="print the baseline table")
    s.set_defaults(func=cmd_hetero)

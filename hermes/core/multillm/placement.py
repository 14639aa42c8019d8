"""GPU groups and SeaLLM's two-stage placement (§4.1).

Stage 1 (group partition): the cluster is cut into equal groups of ``tp`` GPUs, ``tp`` a power
of two not above the node size (the paper's two heuristics). Stage 2 (service allocation):
repeatedly (services not yet placed first: an unplaced service with no recent requests would
otherwise score zero), the service with the largest unsatisfaction index
``UI_s = #(requests over SLO) + α·L_N^s`` (an unplaced service has all its requests unserved)
goes to the group with the lowest request rate that does not hold it yet, holds fewer than
``max_per_group`` services and has memory for it; a service may be placed on several groups
(replicas). Each ``tp`` ends with a plan, scored by the same evaluation; the best plan wins
("TP by simulation"). The evaluation is a callable (the simulator), so this module has no
I/O and no clock.

Re-placing is not free (the groups that change pause, and their requests lose their KV and
recompute), and the search's score of a plan is an estimate on a few seconds of requests, so
two near-equal plans swap back and forth on noise. With ``current`` (the plan in force) and
``min_gain`` > 0 (ours; the paper re-places whenever the search's plan differs), the search's
plan replaces ``current`` only when it scores at least ``min_gain`` (a fraction) better on the
same evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Group:
    """One sharing group: GPU indices, its TP size (= len(gpus)) and its services."""

    gpus: tuple[int, ...]
    services: tuple[str, ...] = ()

    @property
    def tp(self) -> int:
        return len(self.gpus)


@dataclass(frozen=True)
class PlacementPlan:
    """A set of sharing groups."""

    groups: tuple[Group, ...]

    def replicas(self, service: str) -> list[int]:
        """Indices of the groups serving ``service``."""
        return [i for i, g in enumerate(self.groups) if service in g.services]

    def describe(self) -> str:
        return " | ".join(f"tp{g.tp}:{'+'.join(g.services) or '-'}" for g in self.groups)


@dataclass(frozen=True)
class ServiceScore:
    """A service's evaluation: requests over SLO, sum of normalised latencies, request count."""

    unserved: float
    sum_norm: float
    n: int

    @property
    def l_n(self) -> float:
        return self.sum_norm / self.n if self.n else 0.0


def mean_scores(runs: Sequence[Mapping[str, ServiceScore]]) -> dict[str, ServiceScore]:
    """Per service, the mean of several evaluations of one plan (one per sampled request set):
    scoring candidate plans on the mean over draws, not on one draw, keeps the search from
    choosing (and re-placing) on one sample's noise."""
    if not runs:
        raise ValueError("mean_scores needs at least one evaluation")
    k = len(runs)
    return {s: ServiceScore(sum(r[s].unserved for r in runs) / k,
                            sum(r[s].sum_norm for r in runs) / k,
                            round(sum(r[s].n for r in runs) / k))
            for s in runs[0]}


Evaluate = Callable[[PlacementPlan], Mapping[str, ServiceScore]]
Fits = Callable[[tuple[str, ...], int], bool]


def partition(n_gpus: int, tp: int) -> list[tuple[int, ...]]:
    """``n_gpus`` cut into groups of ``tp`` consecutive GPUs."""
    if tp < 1 or tp & (tp - 1) or n_gpus % tp:
        raise ValueError(f"tp must be a power of two dividing the GPU count (tp={tp}, gpus={n_gpus})")
    return [tuple(range(i, i + tp)) for i in range(0, n_gpus, tp)]


def even_split(services: Sequence[str], n_gpus: int, tp: int = 1) -> PlacementPlan:
    """vLLM's setup: GPUs split evenly, one service per group, groups dealt round-robin."""
    parts = partition(n_gpus, tp)
    if len(parts) < len(services):
        raise ValueError(f"{len(services)} services need at least {len(services)} groups of {tp} GPUs")
    return PlacementPlan(tuple(Group(p, (services[i % len(services)],)) for i, p in enumerate(parts)))


def plan_score(scores: Mapping[str, ServiceScore], alpha: float) -> float:
    """Total unserved requests plus ``alpha`` times the overall normalised latency."""
    n = sum(s.n for s in scores.values())
    l_n = sum(s.sum_norm for s in scores.values()) / n if n else 0.0
    return sum(s.unserved for s in scores.values()) + alpha * l_n


def allocate(services: Sequence[str], rates: Mapping[str, float], parts: Sequence[tuple[int, ...]],
             fits: Fits, evaluate: Evaluate, *, alpha: float = 1e-4,
             max_per_group: int = 2) -> PlacementPlan:
    """Stage 2 on one partition: greedy by unsatisfaction index, lowest-rate group first."""
    members: list[list[str]] = [[] for _ in parts]

    def plan() -> PlacementPlan:
        return PlacementPlan(tuple(Group(p, tuple(m)) for p, m in zip(parts, members, strict=True)))

    def group_rate(i: int) -> float:
        return sum(rates.get(s, 0.0) / sum(s in m for m in members) for s in members[i])

    for _ in range(len(parts) * max_per_group):
        scores = evaluate(plan())
        ui = {s: scores[s].unserved + alpha * scores[s].l_n for s in services}
        placed = False
        for s in sorted(services, key=lambda s: (any(s in m for m in members), -ui[s], s)):
            cands = [i for i, m in enumerate(members)
                     if s not in m and len(m) < max_per_group
                     and fits((*m, s), len(parts[i]))]
            if not cands:
                continue
            best = min(cands, key=lambda i: (group_rate(i), len(members[i]), i))
            members[best].append(s)
            placed = True
            break
        if not placed:
            break
    return plan()


def usable_tps(tps: Sequence[int], n_gpus: int, node_gpus: int = 8) -> list[int]:
    """The TP sizes of ``tps`` a group can have on ``n_gpus`` GPUs: powers of two that divide
    the GPU count and fit one node (the paper's two heuristics)."""
    return [t for t in tps if 1 <= t <= min(n_gpus, node_gpus) and n_gpus % t == 0
            and not t & (t - 1)]


def seallm_place(services: Sequence[str], rates: Mapping[str, float], n_gpus: int, fits: Fits,
                 evaluate: Evaluate, *, tps: Sequence[int] = (1, 2, 4, 8), node_gpus: int = 8,
                 alpha: float = 1e-4, max_per_group: int = 2,
                 current: PlacementPlan | None = None,
                 min_gain: float = 0.0) -> tuple[PlacementPlan, float]:
    """The best plan over TP sizes and its score (:func:`plan_score`), or ``current`` and its
    score when the best is not ``min_gain`` better (module doc; a ``current`` that leaves a
    service unplaced or holds one not in ``services`` is always replaced). Raises
    ``ValueError`` when no TP size places every service."""
    if not 0.0 <= min_gain < 1.0:
        raise ValueError(f"min_gain must be in [0, 1), got {min_gain}")
    best: tuple[float, PlacementPlan] | None = None
    for tp in usable_tps(tps, n_gpus, node_gpus):
        if (n_gpus // tp) * max_per_group < len(services):
            continue
        p = allocate(services, rates, partition(n_gpus, tp), fits, evaluate, alpha=alpha,
                     max_per_group=max_per_group)
        if any(not p.replicas(s) for s in services):
            continue
        score = plan_score(evaluate(p), alpha)
        if best is None or score < best[0]:
            best = (score, p)
    if best is None:
        raise ValueError(f"no TP size in {tuple(tps)} places all of {list(services)} on {n_gpus} GPUs")
    if (current is not None and min_gain > 0 and current != best[1]
            and {s for g in current.groups for s in g.services} == set(services)):
        kept = plan_score(evaluate(current), alpha)
        # kept unless the best is strictly min_gain better: a tie (both 0.0, e.g. a light
        # forecast whose streams no plan serves late) is no gain, and re-placing costs
        if best[0] >= (1.0 - min_gain) * kept:
            return current, kept
    return best[1], best[0]

"""HexGen's genetic search over GPU groupings (section 4.2), fitness by simulation.

An individual is a partition of the cluster's GPUs into groups; each group becomes one
pipeline through :func:`.layout.best_pipeline` (groups that cannot hold the model serve
nothing). Fitness is SLO attainment from :mod:`.fitness` (ties broken by the 90th-percentile
latency).

Initialisation: nodes are clustered hierarchically (``scipy.cluster.hierarchy``, average
linkage) on a distance of link latency plus 1 MB transfer time between nodes; cutting the
dendrogram at every level gives the seed groupings; each is repaired by splitting groups of
more than ``max_group`` GPUs along node order.

Mutations (the paper's three): *merge* two groups, *split* a group in two (at a node
boundary, else half-way), *swap* a GPU between two groups. The baseline ``random`` mutation
reassigns a random 25% of GPUs to random groups.

Constants the paper leaves open, chosen here: population 12, generations 15, tournament
selection of size 3, 2 elites kept, one mutation per child, ``max_group`` 16 GPUs, seed 0.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage  # type: ignore[import-untyped]
from scipy.spatial.distance import squareform  # type: ignore[import-untyped]

from hermes.core.cluster.cost import Placement
from hermes.core.cluster.models import ModelSpec
from hermes.core.cluster.topology import Cluster, GpuId
from hermes.core.hexgen.fitness import PipelineTimer, Workload, attainment, latencies
from hermes.core.hexgen.layout import best_pipeline

Grouping = tuple[tuple[GpuId, ...], ...]


@dataclass(frozen=True)
class GAConfig:
    """The genetic search's constants (module doc)."""

    population: int = 12
    generations: int = 15
    tournament: int = 3
    elites: int = 2
    max_group: int = 16
    mutation: str = "hexgen"  # or "random"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mutation not in MUTATIONS:
            raise ValueError(f"unknown mutation {self.mutation!r}; known: {', '.join(MUTATIONS)}")


def _norm(groups: Sequence[Sequence[GpuId]]) -> Grouping:
    return tuple(sorted(tuple(sorted(g, key=lambda x: (x.node, x.local))) for g in groups if g))


def node_distance(cluster: Cluster) -> np.ndarray:
    """Pairwise node distance: link latency + time to move 1 MB."""
    n = len(cluster.nodes)
    d = np.zeros((n, n))
    for a in range(n):
        for b in range(a + 1, n):
            lk = cluster.link(GpuId(a, 0), GpuId(b, 0))
            d[a, b] = d[b, a] = lk.send_recv_s(1 << 20)
    return d


def _split_big(groups: list[list[GpuId]], max_group: int) -> list[list[GpuId]]:
    out = []
    for g in groups:
        while len(g) > max_group:
            out.append(g[:max_group])
            g = g[max_group:]
        out.append(g)
    return out


def initial_population(cluster: Cluster, cfg: GAConfig, rng: random.Random) -> list[Grouping]:
    """Groupings from cutting the node dendrogram at each level, then random variants."""
    n = len(cluster.nodes)
    by_node = [[g for g in cluster.gpus() if g.node == i] for i in range(n)]
    seeds: list[Grouping] = []
    if n == 1:
        seeds.append(_norm(_split_big([by_node[0]], cfg.max_group)))
    else:
        z = linkage(squareform(node_distance(cluster)), method="average")
        for k in range(1, n + 1):
            labels = fcluster(z, k, criterion="maxclust")
            groups = [[g for i in range(n) if labels[i] == lab for g in by_node[i]]
                      for lab in sorted(set(labels))]
            seeds.append(_norm(_split_big(groups, cfg.max_group)))
    pop = list(dict.fromkeys(seeds))
    while len(pop) < cfg.population:
        pop.append(MUTATIONS["hexgen"](rng.choice(seeds), rng, cfg))
    return pop[:cfg.population] if len(pop) > cfg.population else pop


def merge(ind: Grouping, rng: random.Random, cfg: GAConfig) -> Grouping:
    if len(ind) < 2:
        return ind
    a, b = rng.sample(range(len(ind)), 2)
    if len(ind[a]) + len(ind[b]) > cfg.max_group:
        return ind
    rest = [g for i, g in enumerate(ind) if i not in (a, b)]
    return _norm(rest + [ind[a] + ind[b]])


def split(ind: Grouping, rng: random.Random, cfg: GAConfig) -> Grouping:
    cands = [i for i, g in enumerate(ind) if len(g) > 1]
    if not cands:
        return ind
    i = rng.choice(cands)
    g = ind[i]
    cuts = [k for k in range(1, len(g)) if g[k].node != g[k - 1].node]
    k = rng.choice(cuts) if cuts else len(g) // 2
    return _norm([x for j, x in enumerate(ind) if j != i] + [g[:k], g[k:]])


def swap(ind: Grouping, rng: random.Random, cfg: GAConfig) -> Grouping:
    if len(ind) < 2:
        return ind
    a, b = rng.sample(range(len(ind)), 2)
    ga, gb = list(ind[a]), list(ind[b])
    x, y = rng.randrange(len(ga)), rng.randrange(len(gb))
    ga[x], gb[y] = gb[y], ga[x]
    return _norm([g for i, g in enumerate(ind) if i not in (a, b)] + [ga, gb])


def hexgen_mutation(ind: Grouping, rng: random.Random, cfg: GAConfig) -> Grouping:
    return rng.choice((merge, split, swap))(ind, rng, cfg)


def random_mutation(ind: Grouping, rng: random.Random, cfg: GAConfig) -> Grouping:
    groups = [list(g) for g in ind]
    flat = [(i, j) for i, g in enumerate(groups) for j in range(len(g))]
    moved = [groups[i][j] for i, j in rng.sample(flat, max(1, len(flat) // 4))]
    groups = [[x for x in g if x not in moved] for g in groups]
    groups.append([])
    for x in moved:
        rng.choice(groups).append(x)
    return _norm(_split_big([g for g in groups if g], cfg.max_group))


MUTATIONS: dict[str, Callable[[Grouping, random.Random, GAConfig], Grouping]] = {
    "hexgen": hexgen_mutation, "random": random_mutation}


@dataclass
class Evaluator:
    """Memoised grouping -> (placements, fitness)."""

    cluster: Cluster
    model: ModelSpec
    workload: Workload
    deadline_s: float
    layouts: dict[tuple[GpuId, ...], Placement | None] = field(default_factory=dict)
    timers: dict[Placement, PipelineTimer] = field(default_factory=dict)
    scores: dict[Grouping, tuple[float, float]] = field(default_factory=dict)

    def placements(self, ind: Grouping) -> list[Placement]:
        out = []
        for g in ind:
            if g not in self.layouts:
                r = best_pipeline(self.cluster, self.model, g)
                self.layouts[g] = r[0] if r else None
            p = self.layouts[g]
            if p is not None:
                out.append(p)
        return out

    def fitness(self, ind: Grouping) -> tuple[float, float]:
        if ind not in self.scores:
            lat = latencies(self.cluster, self.placements(ind), self.workload, self.timers)
            p90 = float(np.quantile(lat, 0.9, method="higher"))
            self.scores[ind] = (attainment(lat, self.deadline_s), -p90)
        return self.scores[ind]


@dataclass(frozen=True, slots=True)
class SearchResult:
    grouping: Grouping
    placements: tuple[Placement, ...]
    slo_attainment: float
    history: tuple[float, ...]  # best attainment after each generation


def search(ev: Evaluator, cfg: GAConfig = GAConfig(),
           progress: Callable[[int, float], None] | None = None) -> SearchResult:
    """Run the genetic search; ``progress(generation, best)`` after each generation."""
    rng = random.Random(cfg.seed)
    mutate = MUTATIONS[cfg.mutation]
    pop = initial_population(ev.cluster, cfg, rng)
    history = []
    for gen in range(cfg.generations):
        ranked = sorted(pop, key=ev.fitness, reverse=True)
        history.append(ev.fitness(ranked[0])[0])
        if progress is not None:
            progress(gen, history[-1])
        nxt = ranked[:cfg.elites]
        while len(nxt) < cfg.population:
            parent = max(rng.sample(pop, min(cfg.tournament, len(pop))), key=ev.fitness)
            nxt.append(mutate(parent, rng, cfg))
        pop = nxt
    best = max(pop, key=ev.fitness)
    if not ev.placements(best):
        raise ValueError(f"{ev.model.name} fits on no GPU group of this cluster")
    return SearchResult(best, tuple(ev.placements(best)), ev.fitness(best)[0], tuple(history))

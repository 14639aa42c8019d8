"""HexGen core: the DP against brute force, Fig. 1's layout ordering, the search."""

from __future__ import annotations

import itertools

import pytest

from hermes.core.cluster.cost import Placement, StageSpec
from hermes.core.cluster.devices import DeviceType, get_device
from hermes.core.cluster.models import get_model
from hermes.core.cluster.topology import Cluster, Link, Node
from hermes.core.hexgen.fitness import Workload, attainment, latencies
from hermes.core.hexgen.layout import best_pipeline, placement_fits, placement_latency_s
from hermes.core.hexgen.search import Evaluator, GAConfig, merge, search, split, swap

A4000 = DeviceType("A4000", 16, 448e9, 76.7e12, "a40")
SLOW = Link("slow", 2e-3, 5e9 / 8, 4e-3, 5e9 / 8)


def fig1_cluster() -> Cluster:
    """HexGen Fig. 1: 4xA6000, 2xA5000, 2xA4000 on three machines."""
    return Cluster((Node(get_device("A6000"), 4, "pcie"), Node(get_device("A5000"), 2, "pcie"),
                    Node(A4000, 2, "pcie")), inter_node=SLOW)


def brute_force(cluster, model, gpus, unit):
    best = None
    n, units = len(gpus), model.layers // unit
    for k in range(1, n + 1):
        for tps in itertools.product((1, 2, 4, 8), repeat=k):
            if sum(tps) != n or not all(model.valid_tp(t) for t in tps):
                continue
            for cuts in itertools.combinations(range(1, units), k - 1):
                bounds = (0, *cuts, units)
                start, stages = 0, []
                for t, a, b in zip(tps, bounds, bounds[1:], strict=False):
                    stages.append(StageSpec(tuple(gpus[start:start + t]), (b - a) * unit))
                    start += t
                p = Placement(model, tuple(stages))
                if not placement_fits(cluster, p):
                    continue
                t_ = placement_latency_s(cluster, p)
                if best is None or t_ < best[1]:
                    best = (p, t_)
    return best


@pytest.mark.parametrize("devs", [("A6000", "A5000"), ("A5000", "A40"), ("RTX3090Ti", "A6000")])
def test_dp_matches_brute_force(devs):
    model = get_model("llama-2-13b")
    c = Cluster((Node(get_device(devs[0]), 2, "pcie"), Node(get_device(devs[1]), 2, "pcie")),
                inter_node=SLOW)
    dp = best_pipeline(c, model, c.gpus(), layer_unit=8)
    bf = brute_force(c, model, c.gpus(), 8)
    assert (dp is None) == (bf is None)
    assert dp is not None and bf is not None
    assert dp[1] == pytest.approx(bf[1])
    assert dp[1] == pytest.approx(placement_latency_s(c, dp[0]))


def test_fig1_asymmetric_beats_symmetric_layouts():
    c = fig1_cluster()
    m = get_model("llama-2-70b")
    g = c.gpus()
    hexgen = Placement(m, (StageSpec(tuple(g[0:4]), 48), StageSpec(tuple(g[4:6]), 20),
                           StageSpec(tuple(g[6:8]), 12)))
    assert placement_fits(c, hexgen)
    # pure PP with even layers: an A4000 cannot hold 10 layers
    even_pp = Placement(m, tuple(StageSpec((x,), 10) for x in g))
    assert not placement_fits(c, even_pp)
    # pure TP over all 8 GPUs: the A4000 shard does not fit
    assert not placement_fits(c, Placement(m, (StageSpec(tuple(g), 80),)))
    # PP 2 x TP 4 with 56/24 layers crosses machines inside a TP group: slower
    pp2 = Placement(m, (StageSpec(tuple(g[0:4]), 56), StageSpec(tuple(g[4:8]), 24)))
    assert placement_fits(c, pp2)
    assert placement_latency_s(c, hexgen) < placement_latency_s(c, pp2)
    dp = best_pipeline(c, m, g)
    assert dp is not None and dp[1] <= placement_latency_s(c, hexgen) + 1e-9


def test_dp_rejects_group_that_cannot_hold_model():
    c = Cluster((Node(A4000, 2, "pcie"),))
    assert best_pipeline(c, get_model("llama-2-70b"), c.gpus()) is None


def test_search_raises_when_model_fits_nowhere():
    c = Cluster((Node(A4000, 2, "pcie"),))
    ev = Evaluator(c, get_model("llama-2-70b"), Workload(rate=1.0, n_requests=20), 30.0)
    with pytest.raises(ValueError, match="fits on no GPU group"):
        search(ev, GAConfig(population=2, generations=1))


def test_mutations_keep_every_gpu_once():
    import random

    c = fig1_cluster()
    ind = ((*c.gpus()[:4],), (*c.gpus()[4:],))
    rng = random.Random(1)
    cfg = GAConfig()
    for op in (merge, split, swap):
        out = op(ind, rng, cfg)
        assert sorted(x for g in out for x in g) == sorted(c.gpus())
    assert len(merge(ind, rng, cfg)) == 1
    assert len(split(ind, rng, cfg)) == 3


def test_attainment_falls_with_rate():
    c = fig1_cluster()
    p = best_pipeline(c, get_model("llama-2-70b"), c.gpus())
    assert p is not None
    low = attainment(latencies(c, [p[0]], Workload(rate=0.05, n_requests=100)), 15.0)
    high = attainment(latencies(c, [p[0]], Workload(rate=20.0, n_requests=100)), 15.0)
    assert low > 0.9 > high


def test_bad_workload():
    with pytest.raises(ValueError, match="rate"):
        Workload(rate=0)
    with pytest.raises(ValueError, match="mutation"):
        GAConfig(mutation="nope")

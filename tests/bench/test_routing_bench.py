"""``hermes bench routing``: the routers on several simulated engines, one row per router and
seed, and a clear error for what it does not know."""

from __future__ import annotations

import json

import pytest

from hermes.bench.routing import bench_routing
from hermes.cli import main


def test_bench_routing_rows(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "rt.json"
    assert main(["bench", "routing", "--engines", "2", "--seeds", "0,1", "--apps", "30",
                 "--window", "1", "--routers", "least-loaded,prefix", "--workers", "1",
                 "--json", str(out), "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    assert [(r["router"], r["seed"]) for r in rows] == [
        ("least-loaded", 0), ("prefix", 0), ("least-loaded", 1), ("prefix", 1)]
    for r in rows:
        assert r["engines"] == 2 and r["apps"] == 30
        assert 0.0 < r["prefix_hit_ratio"] <= 1.0
        assert 0.0 < r["mean_act_s"] <= r["p95_act_s"]
        assert 1.0 <= r["imbalance"] <= 2.0  # the busiest engine's share over the mean
    # the same arrivals per seed: the least-loaded router spreads, prefix routing
    # concentrates an app's shared prompts on the engine that holds them
    for seed in (0, 1):
        ll, px = (next(r for r in rows if r["seed"] == seed and r["router"] == name)
                  for name in ("least-loaded", "prefix"))
        assert px["imbalance"] >= ll["imbalance"]


def test_bench_routing_refuses_unknown_routers_and_workloads() -> None:
    with pytest.raises(ValueError, match="least-loaded, prefix, session, hermes"):
        bench_routing(["random"], [0], progress=False)
    with pytest.raises(ValueError, match="paper, agents"):
        bench_routing(["prefix"], [0], workload="mixed", progress=False)


def test_bench_routing_agents_retention_rows() -> None:
    """On agent loops each run's history is its own prefix key: the cache finds the previous
    turn's KV, and the retention rules act at tool hand-overs (hermes: keep/offload/drop)."""
    rows = bench_routing(["least-loaded"], [0], engines=2, window_min=1.0, apps=6,
                         workload="agents", retention=["lru", "hermes"], cache_gb=16.0,
                         cpu_cache_gb=64.0, workers=1, progress=False)
    assert [(r["router"], r["retention"]) for r in rows] == [
        ("least-loaded", "lru"), ("least-loaded", "hermes")]
    lru, her = rows
    assert set(lru["decisions"]) == {"none"}
    assert sum(n for a, n in her["decisions"].items() if a != "none") > 0
    assert set(her["decisions"]) <= {"keep", "offload", "drop", "none"}
    for r in rows:
        # history reuse: later turns find most of their prompt cached on some tier
        assert 0.2 < r["prefix_hit_ratio"] + r["cpu_hit_ratio"] <= 1.0
    with pytest.raises(ValueError, match="--retention must list lru, ttl, hermes"):
        bench_routing(["prefix"], [0], workload="agents", retention=["fifo"], progress=False)

"""Prewarming in the simulator: warm sandboxes, prefix cache and the waste accounting."""

from __future__ import annotations

import numpy as np

from hermes.bench.prewarm import WarmJob, simulate
from hermes.sim.simulator import Arrival


def _cg_arrivals(n: int, gap_s: float) -> tuple[Arrival, ...]:
    rng = np.random.default_rng(3)
    return tuple(Arrival(i * gap_s, "code_generation", int(rng.integers(1 << 30)),
                         run_id=f"cg-{i}") for i in range(n))


def test_planner_hides_sandbox_cold_starts_of_cg():
    arr = _cg_arrivals(12, 40.0)  # light load: one run at a time, mostly
    _, acts_lru, st_lru, _ = simulate(WarmJob(("lru",), "lru", arr, cache_gb=8))
    _, acts_h, st_h, _ = simulate(WarmJob(("h",), "hermes", arr, cache_gb=8))
    assert st_lru["tool_hit_ratio"] == 0.0  # single-use sandboxes, nothing prewarmed
    assert st_h["tool_hit_ratio"] > 0.3
    assert st_h["prewarm_used"] >= st_h["tool_warm_hits"] > 0
    # every warm hit saves up to the 1 s cold start on the run's critical path
    saved = acts_lru.sum() - acts_h.sum()
    assert 0.3 * st_h["tool_warm_hits"] < saved < 1.5 * st_h["prewarm_started"] + 1.0


def test_waste_is_counted_and_none_disables_prefix_caching():
    arr = _cg_arrivals(8, 20.0)
    _, _, st_low, _ = simulate(WarmJob(("a",), "hermes", arr, k=0.1, cache_gb=8))
    _, _, st_high, _ = simulate(WarmJob(("b",), "hermes", arr, k=0.9, cache_gb=8))
    # a low K prewarms unlikely branches too (fix_code after execute_code, ...): more waste
    assert st_low["prewarm_planned"] > st_high["prewarm_planned"]
    assert st_low["prewarm_wasted_backend_s"] > st_high["prewarm_wasted_backend_s"]
    assert st_low["prewarm_wasted"] >= 1
    _, _, st_none, _ = simulate(WarmJob(("c",), "none", arr, cache_gb=8))
    assert st_none["kv_hits"] == 0 and st_none["kv_lookups"] > 0
    _, _, st_lru, _ = simulate(WarmJob(("d",), "lru", arr, cache_gb=8))
    assert st_lru["kv_hits"] > 0

"""`hermes bench knob` on a small workload: rows per (timing, K), seeds added up, and the
"late" timing's knob monotone in what it starts."""

from __future__ import annotations

import pytest

from hermes.bench.prewarm import bench_knob


def test_knob_rows_per_timing_and_k_over_seeds() -> None:
    rows = bench_knob(["CG"], [0.2, 0.8], apps=16, window_min=1.0, timings=["ready", "late"],
                      seeds=[0, 1], walks=50, workers=1, progress=False)
    assert [(r["timing"], r["k"]) for r in rows] == [("ready", 0.2), ("ready", 0.8),
                                                      ("late", 0.2), ("late", 0.8)]
    one = bench_knob(["CG"], [0.2], apps=16, window_min=1.0, timings=["late"], seeds=[0],
                     walks=50, workers=1, progress=False)[0]
    assert one["prewarm_planned"] < rows[2]["prewarm_planned"]  # two seeds add up
    ready = {r["k"]: r for r in rows if r["timing"] == "ready"}
    late = {r["k"]: r for r in rows if r["timing"] == "late"}
    # the timing reaches the planner: at low K "late" starts earlier, so more warm-ups begin
    # before their unit overtakes them; at high K it starts later than "ready"
    assert late[0.2]["prewarm_started"] > ready[0.2]["prewarm_started"]
    assert late[0.8]["prewarm_started"] < ready[0.8]["prewarm_started"]
    # lower K: more branches admitted (p_s >= K) and every warm-up planned earlier
    assert late[0.2]["prewarm_planned"] >= late[0.8]["prewarm_planned"]
    assert late[0.2]["prewarm_started"] > late[0.8]["prewarm_started"]
    assert late[0.2]["wasted_backend_s"] >= late[0.8]["wasted_backend_s"]
    for r in rows:
        assert r["lru_mean_act_s"] > 0 and 0 <= r["prewarm_used"] <= r["prewarm_started"]
    with pytest.raises(ValueError, match="--timing must be among ready, late"):
        bench_knob(["CG"], [0.5], apps=4, timings=["soon"], workers=1, progress=False)

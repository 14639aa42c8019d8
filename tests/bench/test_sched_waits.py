"""``bench sched`` rows carry the runs' engine-queue waits (the wait guard's figures)."""

from __future__ import annotations

from hermes.bench import sched as B


def test_sched_rows_report_waits() -> None:
    rows, acts = B.bench_sched(12, windows=(1,), policies=("vllm",), seed=0, workers=1,
                               progress=False)
    by = {r["policy"]: r for r in rows}
    run = by["vllm"]
    assert 0 <= run["mean_wait_s"] <= run["p99_wait_s"] <= run["max_wait_s"]
    assert run["max_wait_s"] > 0  # 12 runs in a minute on one engine: someone queued
    # a unit waits before it is served: no run waits longer than it takes
    assert run["max_wait_s"] < float(acts[(1, "vllm")].max())
    assert by["isolated"]["max_wait_s"] == 0.0

"""Scheduling benchmarks on a small workload (baseline policies; no PDGraphs needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hermes.bench import sched as B
from hermes.bench.cli import add_bench_parsers


def test_sched_rows_and_outputs(tmp_path, capsys):
    rows, acts = B.bench_sched(12, windows=(1, 2), policies=("vllm", "parrot"), seed=0,
                               workers=1, progress=False)
    assert [(r["window_min"], r["policy"]) for r in rows] == [
        (1, "vllm"), (1, "parrot"), (1, "isolated"), (2, "vllm"), (2, "parrot"), (2, "isolated")]
    for r in rows:
        assert r["runs"] == 12
        assert 0 < r["p50_act_s"] <= r["p95_act_s"] <= r["p99_act_s"]
        assert r["mean_act_s"] == pytest.approx(acts[(r["window_min"], r["policy"])].mean())
    for w in (1, 2):  # a run alone on the engine is never slower than under contention
        assert (acts[(w, "isolated")] <= acts[(w, "vllm")] * 1.0001 + 1e-6).all()
    ratios = B.ratio_rows(rows, ref="parrot")
    assert {r["vs"] for r in ratios} == {"vllm"}
    assert all(0 < r["best_mean_ratio"] <= 1.0001 for r in ratios)
    B.write_json(tmp_path / "rows.json", rows)
    assert json.loads((tmp_path / "rows.json").read_text()) == rows
    B.plot_act_cdf(acts, tmp_path / "cdf.png")
    assert (tmp_path / "cdf.png").stat().st_size > 1000
    B.print_table(rows, title="t")
    assert "parrot" in capsys.readouterr().out


def test_same_arrivals_for_every_policy_and_seeded():
    a1, _ = B.build_arrivals(20, 5, seed=3)
    a2, _ = B.build_arrivals(20, 5, seed=3)
    a3, _ = B.build_arrivals(20, 5, seed=4)
    assert a1 == a2 and a1 != a3
    assert all(0 <= a.time <= 300 for a in a1)


def test_deadlines_scale_isolated_time():
    arr, classes = B.build_arrivals(30, 5, seed=1, deadlines=True)
    assert set(classes) <= set(B.DEADLINE_FACTORS) and len(set(classes)) > 1
    assert all(a.deadline is not None and a.deadline > a.time for a in arr)
    rows = B.bench_ddl(30, 5, policies=("parrot",), seed=1, workers=1, progress=False)
    (row,) = rows
    assert 0 <= row["dsr"] <= 1
    # looser deadlines are met at least as often as tight ones on the same schedule
    assert np.isnan(row["dsr_loose"]) or row["dsr_loose"] >= row["dsr_tight"]


def test_cli_parsers_are_wired():
    import argparse

    p = argparse.ArgumentParser()
    add_bench_parsers(p.add_subparsers(dest="bench"))
    args = p.parse_args(["sched", "--apps", "5", "--window", "1,2", "--policies", "vllm"])
    assert args.func.__name__ == "cmd_sched" and args.window == "1,2"
    args = p.parse_args(["overhead", "--active-runs", "10", "--buckets", "5"])
    assert args.active_runs == "10"

"""Scheduling benchmarks on a small workload (baseline policies; no PDGraphs needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hermes.bench import sched as B
from hermes.cli.bench import add_bench_parsers


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


def test_stratified_mix_has_the_papers_exact_class_counts():
    from collections import Counter

    from hermes.workloads.registry import stratified_mix

    small = {"factool_math", "react_fever", "factool_code", "react_alfw", "factool_kbqa"}
    for seed in range(5):
        arr, _ = B.build_arrivals(300, 10, seed=seed, mix="stratified")
        c = Counter(a.app for a in arr)
        assert sum(c[a] for a in small) == 216  # 72%
        assert c["code_generation"] + c["plan_execute"] == 78  # 26%
        assert c["got_docmerge"] == c["langchain_mapreduce"] == 3  # 2%, DM and MRS evenly
        assert c["code_generation"] == c["plan_execute"] == 39
        assert all(43 <= c[a] <= 44 for a in small)  # 216 over 5 apps
    # the random mix draws each app: its DM count differs from seed to seed
    dm = {Counter(a.app for a in B.build_arrivals(300, 10, seed=s)[0])["got_docmerge"]
          for s in range(5)}
    assert len(dm) > 1
    # any n: class counts by largest remainders, the order shuffled, seeded
    names = stratified_mix(np.random.default_rng(7), 150)
    c = Counter(names)
    assert sum(c[a] for a in small) == 108 and c["got_docmerge"] + c["langchain_mapreduce"] == 3
    assert names == stratified_mix(np.random.default_rng(7), 150)
    assert names != sorted(names)
    # the same apps and seeds in every window (the isolated bound is computed once per seed)
    a10, _ = B.build_arrivals(50, 10, seed=2, mix="stratified")
    a30, _ = B.build_arrivals(50, 30, seed=2, mix="stratified")
    assert [(a.app, a.seed) for a in a10] == [(a.app, a.seed) for a in a30]


def test_sched_one_row_per_policy_window_and_seed(tmp_path):
    rows, acts = B.bench_sched(10, windows=(1, 2), policies=("vllm", "autellix-atlas"),
                               seeds=(0, 1, 2), workers=1, progress=False)
    cells = [(r["window_min"], r["policy"], r["seed"]) for r in rows]
    assert len(cells) == len(set(cells)) == 2 * 3 * 3
    assert {c[2] for c in cells} == {0, 1, 2}
    assert all({"policy", "window_min", "seed", "mean_act_s", "p95_act_s"} <= r.keys()
               for r in rows)
    assert acts[(1, "vllm")].size == 30  # the three seeds' runs, pooled for the CDF
    one, _ = B.bench_sched(10, windows=(1,), policies=("vllm",), seed=1, workers=1,
                           progress=False)
    same = [r for r in rows if (r["window_min"], r["policy"], r["seed"]) == (1, "vllm", 1)]
    assert same == [r for r in one if r["policy"] == "vllm"]  # a seed is the same alone
    summary = B.seed_summary(rows, ("window_min",), "policy", ("mean_act_s",))
    assert [s["window_min"] for s in summary] == [1, 2] and summary[0]["seeds"] == 3
    m = [r["mean_act_s"] for r in rows if r["window_min"] == 1 and r["policy"] == "vllm"]
    assert summary[0]["vllm"] == f"{np.mean(m):.1f} ({min(m):.1f}-{max(m):.1f})"
    ratios = B.ratio_rows(rows, ref="vllm")
    assert {(r["window_min"], r["seed"]) for r in ratios} == {(w, s) for w in (1, 2)
                                                             for s in (0, 1, 2)}
    ddl = B.bench_ddl(10, 2, policies=("parrot",), seeds=(0, 1), workers=1, progress=False)
    assert [(r["policy"], r["seed"]) for r in ddl] == [("parrot", 0), ("parrot", 1)]
    abl = B.bench_ablation(10, 2, policies=("parrot", "vllm"), seeds=(0, 1), workers=1,
                           progress=False)
    assert [r["normalized"] for r in abl if r["policy"] == "parrot"] == [1.0, 1.0]


def test_cli_parsers_are_wired():
    import argparse

    p = argparse.ArgumentParser()
    add_bench_parsers(p.add_subparsers(dest="bench"))
    args = p.parse_args(["sched", "--apps", "5", "--window", "1,2", "--policies", "vllm"])
    assert args.func.__name__ == "cmd_sched" and args.window == [1.0, 2.0]
    assert args.mix == "stratified" and args.seeds is None and args.seed is None
    args = p.parse_args(["sched", "--seeds", "0,1,2,3,4", "--mix", "random"])
    assert args.seeds == [0, 1, 2, 3, 4] and args.mix == "random"
    for sub in ("ddl", "ablation"):
        args = p.parse_args([sub, "--seeds", "3,4", "--mix", "stratified"])
        assert args.seeds == [3, 4]
    args = p.parse_args(["overhead", "--active-runs", "10", "--buckets", "5"])
    assert args.active_runs == [10] and args.buckets == [5]


def test_tool_capacity_override_changes_only_the_tool_queues():
    """``--tool-instances``: with one container and one replica per DNN model, the runs that
    call tools queue for them (mean ACT up); the runs without tools are unaffected in the
    isolated bound; bad kinds and counts are refused before anything runs."""
    kw = dict(windows=(1,), policies=("vllm",), seed=0, workers=1, progress=False)
    base, acts = B.bench_sched(40, **kw)
    tight, acts_t = B.bench_sched(40, tool_instances={"docker": 1, "dnn": 1}, **kw)
    assert tight[0]["mean_act_s"] > base[0]["mean_act_s"] * 1.05
    assert np.array_equal(acts_t[(1, "isolated")], acts[(1, "isolated")])
    with pytest.raises(ValueError, match="unknown tool kind 'gpu'"):
        B.bench_sched(5, tool_instances={"gpu": 1}, **kw)
    with pytest.raises(ValueError, match="must be >= 1"):
        B.bench_sched(5, tool_instances={"dnn": 0}, **kw)

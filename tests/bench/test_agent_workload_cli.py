"""``--workload`` and ``--mode`` of ``hermes bench sched`` (and ``routing --workload``): the
agent workload produces the interface's rows; a mode is the setup's ``@MODE`` suffix."""

from __future__ import annotations

import json

import pytest

from hermes.bench import sched as B
from hermes.cli import main
from hermes.workloads.registry import AGENT_APPS, APPS


def test_sched_agents_workload_rows(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "rows.json"
    assert main(["bench", "sched", "--workload", "agents", "--mode", "vllm-0.4", "--apps", "6",
                 "--window", "1", "--seeds", "0,1", "--policies", "vllm,srpt", "--workers", "1",
                 "--json", str(out), "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    assert sorted((r["policy"], r["seed"]) for r in rows) == [
        ("isolated", 0), ("isolated", 1), ("srpt", 0), ("srpt", 1), ("vllm", 0), ("vllm", 1)]
    for r in rows:
        assert r["window_min"] == 1 and r["runs"] == 6
        assert 0 < r["mean_act_s"] and 0 < r["p50_act_s"] <= r["p95_act_s"]


def test_workloads_draw_their_apps() -> None:
    agents, _ = B.build_arrivals(10, 1, seed=0, workload="agents")
    assert {a.app for a in agents} == set(AGENT_APPS)
    mixed, _ = B.build_arrivals(10, 1, seed=0, workload="mixed")
    assert sum(a.app in AGENT_APPS for a in mixed) == 5
    assert sum(a.app in APPS for a in mixed) == 5
    paper, _ = B.build_arrivals(10, 1, seed=0)
    assert all(a.app in APPS for a in paper)
    # srpt / hermes find PDGraphs for the agent apps next to the knowledge base's
    assert set(AGENT_APPS) <= set(B.load_graphs())


def test_mode_is_the_setup_suffix(capsys) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit, match="already names a mode"):
        main(["bench", "sched", "--setup", "llama2-7b-a100@vllm-v1", "--mode", "vllm-0.4",
              "--apps", "2", "--window", "1", "--seeds", "0", "--policies", "vllm"])
    with pytest.raises(SystemExit):
        main(["bench", "sched", "--workload", "everything"])
    assert "invalid choice: 'everything'" in capsys.readouterr().err


def test_routing_agents_workload(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "rt.json"
    assert main(["bench", "routing", "--workload", "agents", "--engines", "2", "--seeds", "0",
                 "--apps", "6", "--window", "1", "--routers", "least-loaded", "--workers", "1",
                 "--json", str(out), "--no-progress"]) == 0
    (row,) = json.loads(out.read_text())
    assert row["apps"] == 6 and 0 < row["mean_act_s"] <= row["p95_act_s"]


def test_kv_gate_removes_the_agents_preemption_thrash() -> None:
    """``bench sched --kv-gate``: 24 agent runs in one minute on one A100-40GB: vLLM's
    first-chunk admission preempts long histories again and again; behind the gate the
    same arrivals see (almost) no preemption and finish sooner. Rows say which."""
    kw = dict(windows=(1,), policies=("vllm",), seeds=(0,), setup="llama2-7b-a100-cal",
              workload="agents", workers=1, progress=False)
    off, _ = B.bench_sched(24, **kw)
    on, _ = B.bench_sched(24, kv_gate=True, **kw)
    (a,), (b,) = ([r for r in rows if r["policy"] == "vllm"] for rows in (off, on))
    assert (a["kv_gate"], b["kv_gate"]) == (False, True)
    assert a["preemptions"] > 20 * max(b["preemptions"], 1)
    assert b["mean_act_s"] < 0.95 * a["mean_act_s"]


def test_kv_gate_both_runs_the_same_arrivals_without_and_with_it(tmp_path, capsys) -> None:  # noqa: ANN001
    """``--kv-gate both``: one command, rows of both gates for the same runs (the isolated
    bound equal), a table with a ``kv_gate`` column and the on/off ratio per policy."""
    out = tmp_path / "rows.json"
    assert main(["bench", "sched", "--workload", "agents", "--setup", "llama2-7b-a100-cal",
                 "--apps", "24", "--window", "1", "--seeds", "0", "--policies", "vllm",
                 "--workers", "1", "--kv-gate", "both", "--json", str(out),
                 "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    by = {(r["policy"], r["kv_gate"]): r for r in rows}
    assert set(by) == {("vllm", False), ("vllm", True), ("isolated", False), ("isolated", True)}
    assert by[("isolated", False)]["mean_act_s"] == by[("isolated", True)]["mean_act_s"]
    off, on = by[("vllm", False)], by[("vllm", True)]
    assert off["preemptions"] > on["preemptions"]
    printed = capsys.readouterr().out
    assert "KV gate off and on" in printed and "kv_gate" in printed
    ratio = on["mean_act_s"] / off["mean_act_s"]
    assert "with the KV gate / without it" in printed and f"{ratio:.3f}" in printed
    # --kv-gate alone is still "on", its absence "off"; anything else is refused naming the
    # choices
    from hermes.cli import build_parser

    assert build_parser().parse_args(["bench", "sched", "--kv-gate"]).kv_gate == "on"
    assert build_parser().parse_args(["bench", "sched"]).kv_gate == "off"
    with pytest.raises(SystemExit):
        main(["bench", "sched", "--kv-gate", "sometimes"])
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err

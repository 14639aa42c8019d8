"""``hermes bench gateway``: real engine server and gateway processes, direct vs gateway."""

from __future__ import annotations

import json

import pytest

from hermes.cli import main

pytestmark = pytest.mark.timeout(180)


def test_bench_gateway_measures_both_paths_in_one_run(tmp_path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "gw.json"
    assert main(["bench", "gateway", "--requests", "150", "--warmup", "20", "--concurrency", "8",
                 "--policies", "vllm", "--json", str(out), "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    assert [(r["path"], r["policy"]) for r in rows] == [("direct", "-"), ("gateway", "vllm")]
    direct, gw = rows
    assert direct["requests"] == gw["requests"] == 150 and gw["errors"] == 0
    assert direct["added_p50_ms"] == 0.0
    assert gw["added_p50_ms"] == pytest.approx(gw["p50_ms"] - direct["p50_ms"])
    # the gateway does strictly more work per request than the engine server alone
    assert gw["p50_ms"] > direct["p50_ms"] and gw["req_per_s"] > 0
    assert "added_p50_ms" in capsys.readouterr().out


def test_bench_gateway_levels_and_cpu_columns(tmp_path) -> None:  # noqa: ANN001
    """Several concurrency levels: one direct row each, gateway rows against their own level;
    every process's CPU per request is measured (the gateway does more than the engine)."""
    out = tmp_path / "gw.json"
    assert main(["bench", "gateway", "--requests", "120", "--warmup", "10", "--concurrency",
                 "1,6", "--policies", "hermes", "--json", str(out), "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    assert [(r["path"], r["concurrency"]) for r in rows] == [
        ("direct", 1), ("direct", 6), ("gateway", 1), ("gateway", 6)]
    by = {(r["path"], r["concurrency"]): r for r in rows}
    for c in (1, 6):
        gw, d = by[("gateway", c)], by[("direct", c)]
        assert gw["errors"] == 0 and gw["requests"] == 120
        assert gw["added_p50_ms"] == pytest.approx(gw["p50_ms"] - d["p50_ms"])
        assert d["gateway_cpu_ms"] == 0.0 and d["engine_cpu_ms"] > 0 and d["client_cpu_ms"] > 0
        # CPU from /proc: the gateway parses, schedules, dispatches and records every request
        assert gw["gateway_cpu_ms"] > gw["engine_cpu_ms"] > 0

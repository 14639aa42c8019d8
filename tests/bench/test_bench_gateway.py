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

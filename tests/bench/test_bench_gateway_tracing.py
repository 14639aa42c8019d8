"""``hermes bench gateway --tracing off,on --baseline-src DIR``: one gateway per tracing mode,
and one from another source tree, measured in the same run (slow tier: three gateways)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]


def test_tracing_modes_and_a_baseline_in_one_run(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "gw.json"
    # 1,000 requests a phase: with 200 the export process's CPU (its spans are batched and
    # sent on the SDK's schedule, the bench strips OTEL_* settings) read 0, under one 10 ms
    # clock tick, in two runs of three on a fast machine, this version and the one before
    assert main(["bench", "gateway", "--requests", "1000", "--warmup", "20", "--concurrency", "8",
                 "--policies", "hermes", "--fill-history", "0", "--tracing", "off,on",
                 "--baseline-src", str(REPO), "--json", str(out), "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    assert [(r["path"], r["tracing"]) for r in rows] == [
        ("direct", "-"), ("gateway", "base"), ("gateway", "off"), ("gateway", "on")]
    for r in rows:
        assert r["errors"] == 0 and r["requests"] == 1000
    by = {r["tracing"]: r for r in rows}
    # the export process (tracing on) makes and sends the spans: its CPU is its own column
    assert by["on"]["export_cpu_ms"] > 0
    assert by["off"]["export_cpu_ms"] == by["base"]["export_cpu_ms"] == 0.0
    assert by["on"]["gateway_cpu_ms"] > 0 and by["off"]["gateway_cpu_ms"] > 0


def test_bad_tracing_flags_are_refused(tmp_path, capsys) -> None:  # noqa: ANN001
    assert main(["bench", "gateway", "--tracing", "off,maybe", "--no-progress"]) != 0
    assert "--tracing must list off | on" in capsys.readouterr().err
    assert main(["bench", "gateway", "--baseline-src", str(tmp_path), "--no-progress"]) != 0
    assert "not a Hermes source tree" in capsys.readouterr().err

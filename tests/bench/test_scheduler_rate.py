"""``hermes bench ha --scale``'s synthetic rows (:func:`hermes.bench.ha.run_scheduler_rate`):
the active scheduler alone, driven by a synthetic edge and node over the real wire, with the
shared store a deployment of several edges runs (``[cluster] store``): each call is
dispatched, each one-turn run closed, and the row says what was measured."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hermes.bench.ha import run_scheduler_rate

pytestmark = pytest.mark.slow


def test_the_scheduler_alone_keeps_up_with_one_turn_runs_and_a_shared_store(
        tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        if os.environ.get("HERMES_REQUIRE_REDIS") == "1":
            pytest.fail("redis-server not on PATH (HERMES_REQUIRE_REDIS=1)")
        pytest.skip("redis-server not on PATH")
    rows = run_scheduler_rate(tmp_path, rates=[400], seconds=3.0, inferred_turns=1,
                              shared_store=True)
    [row] = rows
    assert row["shared_store"] is True and row["calls"] == "inferred runs of 1"
    assert row["req_per_s"] >= 0.9 * 400
    assert row["dispatched_per_s"] >= 0.9 * row["req_per_s"]  # every call reached the node
    assert 0 < row["scheduler_cpu_ms_per_req"] < 50

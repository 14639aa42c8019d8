"""Slow tier: ``hermes bench ha``, reduced (one repeat of each scenario, fewer runs), on real
Redis, haproxy, two elected gateways and two HermesLets: nothing accepted is lost or run
twice, a killed or paused leader is replaced within 3 s, and the woken ex-leader stops
(exit 75) with what it refused to send counted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from gw_procs import need_tools

from hermes.bench.ha import EXIT_DEPOSED, SCENARIOS, Cluster, run_ha

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_failover_scenarios_lose_nothing(tmp_path: Path) -> None:
    need_tools("redis-server", "haproxy")
    cl = Cluster(tmp_path, time_scale=3.0, ttl_s=1.0)  # [ha] lease_ttl_s = 1.0
    try:
        cl.start()
        rows = asyncio.run(run_ha(cl, list(SCENARIOS), 1, runs=160, app="llm_reasoning",
                                  agents=4, turns=4, streams=4, min_inflight=120))
    finally:
        cl.stop()
    by = {r["scenario"]: r for r in rows}
    assert set(by) == set(SCENARIOS)
    for r in rows:
        assert r["in_flight_at_fault"] >= 120, r
        assert r["runs_accepted"] == 160, r
        assert r["runs_lost"] == 0 and r["runs_duplicated"] == 0, r
        assert r["agent_loops_done"] == r["agent_loops"], r
    for sc in ("scheduler-kill", "leader-pause"):
        assert by[sc]["failover_s"] is not None and by[sc]["failover_s"] <= 3.0, by[sc]
    for sc in ("edge-kill", "node-kill"):
        assert by[sc]["failover_s"] is None, by[sc]
    pause = by["leader-pause"]
    assert pause["ex_leader_exit"] == EXIT_DEPOSED, pause  # it stopped itself on waking
    assert pause["fenced_sends"] is not None, pause  # ... and said what it refused to send
    assert pause["stale_rejected_by_nodes"] is not None, pause

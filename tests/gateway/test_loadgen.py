"""``hermes load`` against a real gateway: the benchmark apps as OpenAI-SDK HTTP clients."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from hermes.bench.sched import build_arrivals
from hermes.cli import main
from hermes.cli.load import load
from hermes.gateway.server import gateway_state
from hermes.workloads.registry import get_app

pytestmark = pytest.mark.timeout(240)


def test_load_runs_every_app_step_through_the_gateway(make_gateway) -> None:  # noqa: ANN001
    srv = make_gateway(time_scale=20.0)
    row, arrivals, outcomes = asyncio.run(load(srv.url, apps=8, window_min=0.5, seed=3,
                                               time_scale=20.0, progress=False))
    assert row["runs"] == 8 and row["failed"] == 0, [o.error for o in outcomes]
    assert row["policy"] == "hermes"
    for a, o in zip(arrivals, outcomes, strict=True):
        steps = list(get_app(a.app).steps(np.random.default_rng(a.seed)))
        calls = [c for s in steps if s.is_llm for c in s.requests]
        # the engine's usage, through the OpenAI SDK: every request and token of the app model
        assert o.units == [s.unit for s in steps]
        assert o.llm_requests == len(calls)
        assert o.output_tokens == sum(max(1, c.output_tokens) for c in calls)
        assert o.input_tokens >= sum(c.input_tokens for c in calls) * 0.9
        # ACT in model seconds: at least the client-side time the app spends outside LLMs
        floor = sum(s.gap_s for s in steps) + sum(s.duration_s or 0 for s in steps if not s.is_llm)
        assert o.act_s >= floor * 0.99
        # the gateway's ACT spans create to finish: inside the client's outer interval, around
        # its inner one (create response to finish request), whatever the HTTP latency of a
        # loaded machine; and it saw every gap and tool the app spent outside LLMs
        eps = 1e-3 * 20.0
        assert o.inner_act_s - eps <= o.server_act_s <= o.act_s + eps, o
        assert o.server_act_s >= floor * 0.99
    sched = gateway_state(srv).scheduler
    assert sched.stats["runs_finished"] == 8
    finished = {r.state.run_id: r for r in sched.recent_runs(lambda r: r.status == "finished",
                                                             len(sched.finished))}
    assert {finished[o.run_id].app for o in outcomes} == {a.app for a in arrivals}
    assert row["mean_act_s"] == pytest.approx(np.mean([o.act_s for o in outcomes]))


def test_load_cli_writes_rows(make_gateway, tmp_path, capsys) -> None:  # noqa: ANN001
    srv = make_gateway(time_scale=50.0, policy="vllm")
    out = tmp_path / "load.json"
    assert main(["load", "--url", srv.url, "--apps", "3", "--window", "0.2", "--seed", "1",
                 "--time-scale", "50", "--json", str(out), "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    assert [r["policy"] for r in rows] == ["vllm"] and rows[0]["runs"] == 3
    assert "mean_act_s" in capsys.readouterr().out
    arrivals, _ = build_arrivals(3, 0.2, seed=1)
    assert len(arrivals) == 3


def test_load_rejects_bad_arguments_and_unreachable_gateways(capsys) -> None:  # noqa: ANN001
    assert main(["load", "--url", "http://127.0.0.1:9", "--apps", "2", "--no-progress"]) == 2
    assert "not reachable" in capsys.readouterr().err
    assert main(["load", "--apps", "0", "--no-progress"]) == 2
    assert "--apps" in capsys.readouterr().err

"""``hermes bench gateway``: real engine server and gateway processes, direct vs gateway."""

from __future__ import annotations

import json
import os

import pytest

from hermes.cli import main

pytestmark = pytest.mark.timeout(180)


def test_bench_gateway_measures_both_paths_in_one_run(tmp_path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "gw.json"
    assert main(["bench", "gateway", "--requests", "150", "--warmup", "20", "--concurrency", "8",
                 "--policies", "vllm", "--fill-history", "0", "--json", str(out),
                 "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    assert [(r["path"], r["policy"]) for r in rows] == [("direct", "-"), ("gateway", "vllm")]
    direct, gw = rows
    assert direct["requests"] == gw["requests"] == 150 and gw["errors"] == 0
    assert direct["added_p50_ms"] == 0.0
    assert gw["added_p50_ms"] == pytest.approx(gw["p50_ms"] - direct["p50_ms"])
    # the gateway does strictly more work per request than the engine server alone
    assert gw["p50_ms"] > direct["p50_ms"] and gw["req_per_s"] > 0
    # the tail: the slowest request, and the gateway's longest event-loop stall in the row
    for r in rows:
        assert r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
    assert direct["max_pause_ms"] == direct["max_gc_ms"] == 0.0  # no gateway on that path
    assert 0.0 < gw["max_pause_ms"] < 60_000.0 and gw["max_gc_ms"] >= 0.0
    # the loop ran some work between two wake-ups of the monitor
    assert 0.0 < gw["max_busy_ms"] and gw["max_pause_cpu_ms"] >= 0.0
    assert gw["history"] == 20  # the warmup's runs are kept when the row starts
    out_text = capsys.readouterr().out
    assert "added_p50_ms" in out_text and "max_pause" in out_text


def test_bench_gateway_levels_and_cpu_columns(tmp_path) -> None:  # noqa: ANN001
    """Several concurrency levels: one direct row each, gateway rows against their own level;
    every process's CPU per request is measured (the gateway does more than the engine)."""
    out = tmp_path / "gw.json"
    assert main(["bench", "gateway", "--requests", "120", "--warmup", "10", "--concurrency",
                 "1,6", "--policies", "hermes", "--fill-history", "0", "--json", str(out),
                 "--no-progress"]) == 0
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
        # its event loop's thread: a share of it (the learner's thread has the rest)
        # (/proc rounds the thread's and the process's times apart: one clock tick each)
        tick_ms = 2 * 1000 / os.sysconf("SC_CLK_TCK") / gw["requests"]
        assert 0.0 < gw["gateway_loop_cpu_ms"] <= gw["gateway_cpu_ms"] + tick_ms
        assert d["gateway_loop_cpu_ms"] == 0.0


def test_bench_gateway_row_with_a_full_finished_run_history(tmp_path) -> None:  # noqa: ANN001
    """``--fill-history N``: one more row at the highest level, measured once the gateway
    (``keep_finished_runs = N``) keeps N finished runs; its tail and pause are reported."""
    out = tmp_path / "gw.json"
    assert main(["bench", "gateway", "--requests", "100", "--warmup", "10", "--concurrency",
                 "1,4", "--policies", "vllm", "--fill-history", "400", "--json", str(out),
                 "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    assert [(r["path"], r["concurrency"], r["history"]) for r in rows] == [
        ("direct", 1, 0), ("direct", 4, 0), ("gateway", 1, 10), ("gateway", 4, 120),
        ("gateway", 4, 400)]
    full = rows[-1]
    assert full["errors"] == 0 and full["requests"] == 100
    assert full["p50_ms"] <= full["p99_ms"] <= full["max_ms"]
    assert 0.0 < full["max_pause_ms"] < 60_000.0
    assert full["added_p99_ms"] == pytest.approx(full["p99_ms"] - rows[1]["p99_ms"])


def test_bench_gateway_identity_modes_measure_the_run_resolver(tmp_path) -> None:  # noqa: ANN001
    """``--identity none,infer --messages 20``: 20-message chats, one-request runs then runs the
    resolver infers, alternating in the same gateway: the resolver's cost is their
    difference. Every request is answered in both modes."""
    out = tmp_path / "gw.json"
    assert main(["bench", "gateway", "--requests", "80", "--warmup", "10", "--concurrency",
                 "4", "--policies", "hermes", "--fill-history", "0", "--identity", "none,infer",
                 "--messages", "20", "--json", str(out), "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    assert [(r["path"], r["identity"]) for r in rows] == [
        ("direct", "-"), ("gateway", "none"), ("gateway", "infer")]
    for r in rows:
        assert r["errors"] == 0 and r["requests"] == 80
    assert rows[1]["history"] == 10 and rows[2]["history"] == 90  # inferred runs stay open
    assert main(["bench", "gateway", "--requests", "5", "--identity", "sometimes",
                 "--no-progress"]) == 2


def test_bench_gateway_floor_rows_measure_the_stack_without_hermes(tmp_path) -> None:  # noqa: ANN001
    """``--floor``: the same requests through the floor proxy (the gateway's HTTP stack and
    engine client, nothing of Hermes), at every level, between the direct and gateway rows;
    the proxy's CPU is its ``gateway_cpu_ms``, below the gateway's own at one client."""
    out, png = tmp_path / "gw.json", tmp_path / "gw.png"
    assert main(["bench", "gateway", "--requests", "100", "--warmup", "10", "--concurrency",
                 "1,4", "--policies", "vllm", "--fill-history", "0", "--floor", "--json",
                 str(out), "--plot", str(png), "--no-progress"]) == 0
    rows = json.loads(out.read_text())
    assert [(r["path"], r["concurrency"]) for r in rows] == [
        ("direct", 1), ("direct", 4), ("floor", 1), ("floor", 4), ("gateway", 1),
        ("gateway", 4)]
    by = {(r["path"], r["concurrency"]): r for r in rows}
    for c in (1, 4):
        floor, d = by[("floor", c)], by[("direct", c)]
        assert floor["errors"] == 0 and floor["requests"] == 100
        assert floor["policy"] == floor["identity"] == floor["tracing"] == "-"
        assert floor["gateway_cpu_ms"] > 0 and floor["engine_cpu_ms"] > 0
        assert floor["added_p50_ms"] == pytest.approx(floor["p50_ms"] - d["p50_ms"])
    # the gateway authenticates, infers nothing here, but creates, ranks, dispatches through
    # its node and records a run per request: more CPU than forwarding it
    assert by[("gateway", 1)]["gateway_cpu_ms"] > by[("floor", 1)]["gateway_cpu_ms"]
    # each gateway row's CPU over its level's floor (a figure the machine's speed does not
    # move); nothing for the rows that are not the gateway's
    for c in (1, 4):
        assert by[("gateway", c)]["cpu_over_floor"] == pytest.approx(
            by[("gateway", c)]["gateway_cpu_ms"] / by[("floor", c)]["gateway_cpu_ms"])
        assert by[("floor", c)]["cpu_over_floor"] is None
        assert by[("direct", c)]["cpu_over_floor"] is None
    assert by[("gateway", 1)]["cpu_over_floor"] > 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the bar chart of the CPU


def test_cpu_over_floor_divides_by_the_floor_of_the_same_level_and_traffic() -> None:
    from hermes.bench.gateway import over_floor

    floors = {(1, "finished"): 0.25, (1, "inferred"): 0.5, (32, "inferred"): 0.2}
    row = {"path": "gateway", "concurrency": 1, "history_kind": "inferred", "gateway_cpu_ms": 1.0}
    assert over_floor(row, floors) == 2.0
    assert over_floor({**row, "history_kind": "finished"}, floors) == 4.0
    assert over_floor({**row, "concurrency": 32}, floors) == 5.0
    assert over_floor({**row, "concurrency": 4}, floors) is None  # no floor at that level
    assert over_floor({**row, "path": "direct"}, floors) is None


def test_the_charts_title_names_the_floor_only_when_it_is_drawn() -> None:
    from hermes.bench.gateway import plot_title

    gw = {"path": "gateway", "concurrency": 1}
    assert "floor" in plot_title([{"path": "floor", "concurrency": 1}, gw])
    assert "floor" not in plot_title([gw])


def test_row_labels_name_what_each_row_measured() -> None:
    from hermes.bench.gateway import row_label

    base = {"path": "gateway", "policy": "hermes", "identity": "infer", "tracing": "off",
            "history_kind": "inferred", "history": 50000}
    assert row_label(base) == "hermes infer agents after 50000"
    assert row_label({**base, "history": 0}) == "hermes infer agents fresh"
    assert row_label({**base, "history_kind": "finished", "identity": "none"}) == "hermes none"
    assert row_label({**base, "tracing": "base", "history_kind": "finished"}) == \
        "hermes infer tracing base"
    assert row_label({**base, "path": "floor"}) == "floor agents"
    assert row_label({**base, "path": "floor", "history_kind": "finished"}) == "floor"


def test_the_floor_proxy_refuses_a_body_that_is_not_json() -> None:
    from fastapi.testclient import TestClient

    from hermes.bench.floor import floor_app

    with TestClient(floor_app("http://127.0.0.1:9")) as client:  # no engine is reached
        r = client.post("/v1/chat/completions", content=b"{bad")
        assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
        assert client.get("/health").json() == {"ok": True}


def test_plot_without_matplotlib_is_refused_before_the_run(monkeypatch, capsys) -> None:  # noqa: ANN001
    """``--plot`` needs the plot extra: without it every command that draws one says so and
    runs nothing (the figures of a run are not lost to a missing extra at its end)."""
    import sys

    import hermes.bench.gateway as bg

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(bg, "bench_gateway", no_run)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    # (the other commands with --plot, at their defaults: refused before they start)
    for argv in (["bench", "gateway", "--requests", "5", "--no-progress"],
                 ["bench", "sched"], ["bench", "knob"], ["bench", "soak"], ["bench", "seallm"]):
        assert main([*argv, "--plot", "x.png"]) == 2, argv
        assert "pip install 'hermes-gateway[plot]'" in capsys.readouterr().err

"""``hermes bench seallm`` end to end on a tiny load: rows, JSON fields, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hermes.bench.seallm import _demand_errors, forecast_at, main, make_workload, runs_at
from hermes.core.multillm.forecast import forecast_demand


def test_bench_seallm_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    rows = main([0], systems=["vllm", "alpaserve", "hermes"], rate=0.5, duration_s=30.0, n_gpus=8,
                json_path=str(out), workers=1)
    assert [r["system"] for r in rows] == ["vllm", "alpaserve", "hermes"]
    saved = json.loads(out.read_text())
    for r in saved:
        assert {"system", "seed", "l_n", "p99_s", "slo_attainment"} <= set(r)
        assert r["l_n"] >= 0.9 and 0.0 <= r["slo_attainment"] <= 1.0
    assert "paper L_N" in capsys.readouterr().out


def test_apps_workload_follows_the_app_tables() -> None:
    wl = make_workload(0, rate=1.0, duration_s=60.0)
    names = [s.name for s in wl.services]
    assert len(wl.run) == len(wl.svc) and np.all(np.diff(wl.arrival) >= 0)
    seen: dict[int, str] = {}
    for i in range(len(wl.svc)):
        r, unit = int(wl.run[i]), names[int(wl.svc[i])]
        table = wl.tables[wl.run_app[r]]
        if r in seen:  # every step is an edge of the app's table
            assert table.next[seen[r]].get(unit, 0.0) > 0
        else:
            assert table.entry.get(unit, 0.0) > 0
        seen[r] = unit
    # the independent workload (the earlier one) has no runs
    assert np.all(make_workload(0, rate=1.0, duration_s=60.0, kind="independent").run == -1)


def test_forecast_sees_runs_in_flight() -> None:
    wl = make_workload(1, rate=2.0, duration_s=120.0)
    order = np.argsort(wl.arrival, kind="stable")
    runs, rates, learned = runs_at(wl, order, 60.0, 30.0)
    assert runs and all(r.elapsed_s > 0 for r in runs)
    assert sum(rates.values()) == pytest.approx(
        len({int(r) for r in wl.run[(wl.arrival >= 30.0) & (wl.arrival < 60.0)]}
            - {int(r) for r in wl.run[wl.arrival < 30.0]}) / 30.0)
    fc = forecast_at(wl, order, 60.0, 30.0)
    rates_only = forecast_demand(learned, [], rates, 30.0)
    assert sum(fc.calls.values()) > sum(rates_only.calls.values())
    assert forecast_at(wl, order, 60.0, 30.0, "forecast-norun") == rates_only
    # learned from a minute of runs: the chat loops on its one unit, as in the generator
    assert set(learned["chat"].next["c0-13b"]) <= {"c0-13b", ""}
    rate_err, fc_err = _demand_errors(wl, 60.0, 30.0, 30.0, fc)
    assert rate_err > 0 and fc_err > 0
    # the look-ahead upper bound has no error; a 60 s horizon is scaled to calls per 30 s
    perfect = forecast_at(wl, order, 60.0, 30.0, "forecast-perfect", 60.0)
    assert _demand_errors(wl, 60.0, 30.0, 60.0, perfect)[1] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="mode"):
        forecast_at(wl, order, 60.0, 30.0, "psychic")


def test_hermes_row_replaces_from_the_forecast() -> None:
    rows = main([0], systems=["hermes"], rate=1.0, duration_s=90.0, n_gpus=8, json_path=None,
                workers=1)
    (r,) = rows
    assert float(r["replacements"]) >= 1  # type: ignore[arg-type]
    assert {"rate_err", "forecast_err"} <= set(r)
    assert 0 <= float(r["switches"]) <= float(r["replacements"])  # type: ignore[arg-type]


def test_bench_seallm_cli_rejects_unknown_system() -> None:
    from hermes.cli import main as cli_main

    with pytest.raises(SystemExit, match="unknown systems"):
        cli_main(["bench", "seallm", "--systems", "vllm,nope"])


def test_rate_sweep_rows_ratios_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "rates.png"
    rows = main([0], systems=["vllm", "seallm"], rate=[0.5, 2.0], duration_s=30.0, n_gpus=8,
                json_path=None, workers=1, workload="independent", plot_path=str(png))
    assert [(r["rate"], r["system"]) for r in rows] == [
        (0.5, "vllm"), (0.5, "seallm"), (2.0, "vllm"), (2.0, "seallm")]
    out = capsys.readouterr()
    assert "0.5 req/s" in out.out and "2 req/s" in out.out
    assert out.out.count("L_N ratio to seallm: vllm") == 2
    assert "[4/4 runs" in out.err  # progress
    assert png.stat().st_size > 10_000


def test_ratio_line_is_the_ratio_of_means() -> None:
    from hermes.bench.seallm import ratio_line

    rows: list[dict[str, object]] = [
        {"system": "seallm", "l_n": 1.0}, {"system": "seallm", "l_n": 3.0},
        {"system": "vllm", "l_n": 8.0}, {"system": "vllm", "l_n": 4.0}]
    assert ratio_line(rows) == "L_N ratio to seallm: vllm 3.00x (paper 8.2x, half 4.1x)"
    assert ratio_line([r for r in rows if r["system"] == "vllm"]) == ""


def test_bench_seallm_cli_rejects_too_few_gpus() -> None:
    from hermes.cli import main as cli_main

    with pytest.raises(SystemExit, match="vllm .* needs at least 6 GPUs for the 6 services"):
        cli_main(["bench", "seallm", "--gpus", "3"])
    with pytest.raises(SystemExit, match="6 services need at least 3 GPUs"):
        cli_main(["bench", "seallm", "--gpus", "2", "--systems", "seallm"])

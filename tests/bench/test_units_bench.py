"""``python -m hermes.bench.units``: the per-unit microbenchmark drives a real scheduler's
inferred runs to a learned app and reports CPU per call."""

from __future__ import annotations

import json

import pytest

from hermes.bench import units


def test_the_timed_calls_are_of_a_learned_app_and_reported(tmp_path, capsys) -> None:
    out = units.run(warm=800, calls=400, turns=4, apart=50, workdir=str(tmp_path))
    assert out["calls"] == 400 and out["warm_calls"] == 800
    assert 0 < out["cpu_us_per_call"] < 100_000
    assert units.main(["--warm", "400", "--calls", "50", "--turns", "2"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["turns"] == 2 and row["calls"] == 50


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        units.run(warm=0, calls=10)

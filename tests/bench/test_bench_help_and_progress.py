"""``hermes bench`` says its defaults in ``--help`` (overhead, routing and knob showed none),
``bench overhead`` shows progress from its start (it printed nothing for minutes while it drew
walks), and ``bench soak``'s table has no ``nan`` (its ``all`` row had three)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from hermes.bench.sched import bench_overhead
from hermes.bench.soak import SoakResult, summarize


def _help(*words: str) -> str:
    env = {**os.environ, "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-m", "hermes.cli", "bench", *words, "--help"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize(("command", "shown"), [
    ("overhead", ["--active-runs ACTIVE_RUNS  default: 100,1000,5000", "--repeats REPEATS  "
                  "default: 20", "--seed SEED  default: 0"]),
    ("routing", ["--engines ENGINES  default: 4", "(default: lru)"]),
    ("knob", ["--k K  default: 0.1,0.3,0.5,0.7,0.9", "--runs RUNS  default: 100"]),
])
def test_bench_help_shows_the_defaults(command: str, shown: list[str]) -> None:
    text = " ".join(_help(command).split())
    for s in shown:
        assert " ".join(s.split()) in text, (s, text)
    assert "(default: (default" not in text and "default %(default)" not in text


def test_bench_overhead_progress_moves_with_the_runs(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    rows = bench_overhead((6,), (2, 4), repeats=2, progress=True)
    err = capsys.readouterr().err
    assert len(rows) == 2
    assert "overhead" in err and "18/18" in err  # 6 runs x (walks + 2 bucket settings)


def test_soak_rows_have_no_nan() -> None:
    res = SoakResult()
    res.latencies["completion"] = [0.010, 0.020, 0.030]
    rows = {r["row"]: r for r in summarize(res, minutes=1.0, rate=1.0)}
    every = rows["all"]
    assert every["p50_ms"] == pytest.approx(20.0) and every["max_ms"] == pytest.approx(30.0)
    assert every["p99_ms"] == pytest.approx(29.8)
    for r in rows.values():
        assert not any(isinstance(v, float) and np.isnan(v) for v in r.values()), r

"""``hermes bench soak``: a short, real run against a self-started loopback gateway."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_short_soak_reports_errors_latency_and_memory(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, "-m", "hermes.cli", "bench", "soak", "--minutes", "0.1",
                        "--rate", "10", "--json", str(out), "--no-progress"],
                       capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    rows = {row["row"]: row for row in data if row["row"] != "rss"}
    assert set(rows) == {"completion", "stream", "hosted", "all", "memory"}
    assert sum(1 for row in data if row["row"] == "rss") == rows["memory"]["samples"]
    assert rows["all"]["errors"] == 0 and rows["all"]["ok"] == 60
    assert all(rows[k]["ok"] == 20 and 0 < rows[k]["p99_ms"] < 10_000
               for k in ("completion", "stream", "hosted"))
    assert rows["memory"]["samples"] >= 2 and rows["memory"]["end_mib"] > 10
    assert "p99_ms" in r.stdout  # the table


def test_soak_refuses_non_loopback_and_unbounded() -> None:
    for argv, msg in ((["--url", "http://10.0.0.1:8000"], "loopback only"),
                      (["--minutes", "1000"], "--minutes"), (["--rate", "1e6"], "--rate")):
        base = {"--minutes": "1", "--rate": "1"}
        args = []
        for k, v in base.items():
            if k not in argv:
                args += [k, v]
        r = subprocess.run([sys.executable, "-m", "hermes.cli", "bench", "soak", *args, *argv],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and msg in r.stderr, (argv, r.stderr)



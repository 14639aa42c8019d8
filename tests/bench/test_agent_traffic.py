"""Header-less agent traffic (``hermes.bench.agents``) and what reads it: the warm-history rows
of ``hermes bench gateway`` and ``hermes bench soak --agents``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hermes.bench.agents import AgentMix, Conversations, system_prompt
from hermes.bench.soak import parse_sizes, size_rows, summarize_agents


def test_programs_are_distinct_word_prompts_and_bad_mixes_are_refused() -> None:
    prompts = {system_prompt(i) for i in range(200)}
    assert len(prompts) == 200 and not any(re.search(r"\d", p) for p in prompts)
    for bad, name in (({"apps": 0}, "apps"), ({"apps": 201}, "apps"),
                      ({"max_turns": 0}, "max_turns"), ({"continue_p": 1.5}, "continue_p")):
        with pytest.raises(ValueError, match=name):
            AgentMix(**bad)  # type: ignore[arg-type]
    plans = [Conversations(AgentMix(apps=5, seed=3)).next() for _ in range(2)]
    assert plans[0] == plans[1]  # seeded
    src = Conversations(AgentMix(apps=5, max_turns=4))
    turns = [src.next()[1] for _ in range(300)]
    assert min(turns) == 1 and max(turns) == 4  # new and continuing conversations


def test_agent_soak_summary_reads_the_last_half() -> None:
    samples = [{"row": "rss", "requests": r, "t_s": r / 100, "mib": m}
               for r, m in ((0, 100.0), (50, 180.0), (100, 200.0), (150, 210.0), (200, 220.0))]
    rows = summarize_agents(samples, [0.001, 0.002, 0.003], 1, 200)
    mem = rows[1]
    assert rows[0]["errors"] == 1 and rows[0]["ok"] == 3
    assert mem["half_mib"] == 200.0 and mem["end_mib"] == 220.0
    assert mem["last_half_max_over_min"] == pytest.approx(1.1)
    assert mem["slope_mib_per_10k"] == pytest.approx(2000.0)  # 10 MiB per 50 requests


def test_agent_soak_tells_which_structures_levelled_off_and_when() -> None:
    index = (10.0, 40.0, 50.0, 50.0, 50.5)  # within 2% of its end from 100 requests on
    learner = (0.0, 100.0, 200.0, 300.0, 400.0)  # still filling at the end
    samples = [{"row": "rss", "requests": r, "t_s": 0.0, "mib": 1.0,
                "sizes": {"index_entries": i, "learner_values": v}}
               for r, i, v in zip((0, 50, 100, 150, 200), index, learner, strict=True)]
    samples[2]["sizes"].pop("learner_values")  # a sample without it counts as off
    got = {r["structure"]: r for r in size_rows(samples, 200)}
    assert set(got) == {"index_entries", "learner_values"}
    assert got["index_entries"] == {"row": "size", "structure": "index_entries",
                                    "half": 50.0, "end": 50.5, "levelled_at": 100}
    assert got["learner_values"]["levelled_at"] == 200 and np.isnan(got["learner_values"]["half"])
    assert size_rows([{"row": "rss", "requests": 0, "mib": 1.0, "sizes": {}}], 10) == []


def test_agent_soak_reads_the_sizes_from_a_metrics_page() -> None:
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    reg = CollectorRegistry()
    ids = Gauge("hermes_identity_size", "sizes", ["structure"], registry=reg)
    ids.labels("index_entries").set(50000)
    ids.labels("apps").set(50)  # not one the soak follows
    Gauge("hermes_learner_size", "sizes", ["structure"], registry=reg).labels(
        "held_samples").set(123)
    Gauge("hermes_sample_cache_bytes", "bytes", registry=reg).set(5e7)
    assert parse_sizes(generate_latest(reg).decode()) == {
        "index_entries": 50000.0, "learner_values": 123.0, "sample_cache_bytes": 5e7}


def test_agent_soak_refuses_unbounded_runs() -> None:
    for argv, msg in ((["--agents", "2000000"], "--agents"),
                      (["--agents", "10", "--concurrency", "1000"], "--concurrency")):
        r = subprocess.run([sys.executable, "-m", "hermes.cli", "bench", "soak", *argv],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and msg in r.stderr, (argv, r.stderr)


@pytest.mark.slow
def test_short_agent_soak_samples_memory(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, "-m", "hermes.cli", "bench", "soak", "--agents", "300",
                        "--apps", "5", "--concurrency", "4", "--sample-every", "100", "--dataflow-ttl", "60",
                        "--no-progress", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())
    mem = next(row for row in rows if row["row"] == "memory")
    assert mem["samples"] == 4 and mem["end_mib"] > 10
    sizes = {row["structure"]: row for row in rows if row["row"] == "size"}
    # the index gains an entry per answer, far under its cap: still growing at the end
    assert 0 < sizes["index_entries"]["half"] < sizes["index_entries"]["end"]
    assert sizes["index_entries"]["levelled_at"] == 300
    # every structure is read, learned or not yet (a run this short may still be open)
    assert set(sizes) == {"index_entries", "passage_entries", "open_runs", "recently_closed",
                          "learned_apps", "learner_values", "sample_cache_bytes"}
    assert next(row for row in rows if row["row"] == "agents")["ok"] == 300


@pytest.mark.slow
def test_warm_history_rows_beside_the_fresh_ones(monkeypatch) -> None:
    import hermes.bench.gateway as bg

    monkeypatch.setattr(bg, "WARM_SETTLE_S", 1.0)
    sent = []
    drive = bg.drive_agents

    def counted(url, n, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        sent.append(n)
        return drive(url, n, *a, **k)

    monkeypatch.setattr(bg, "drive_agents", counted)
    rows = bg.bench_gateway(requests=40, concurrency=(1, 4), policies=("hermes",), warmup=5,
                            progress=False, warm_history=(100, 200))
    inferred = [r for r in rows if r["history_kind"] == "inferred" and r["path"] == "gateway"]
    assert sorted((r["concurrency"], r["history"]) for r in inferred) == [
        (1, 0), (1, 100), (1, 200), (4, 0), (4, 100), (4, 200)]
    assert [r["history"] for r in inferred] == [0, 0, 100, 100, 200, 200]  # in that order
    # the warm requests (the others are the rows' warm-ups of 5 and measures of 40): the
    # history grows from one mark to the next
    assert [n for n in sent if n not in (5, 40)] == [100, 100]
    for r in inferred:
        assert r["errors"] == 0 and r["requests"] == 40 and r["identity"] == "infer"
        assert r["gateway_cpu_ms"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        # (/proc rounds the thread's and the process's times apart: one clock tick each;
        # two ticks exactly is within, whatever the float sum rounds to)
        assert 0 < r["gateway_loop_cpu_ms"] <= (r["gateway_cpu_ms"]
                                                + 2 * 1000 / os.sysconf("SC_CLK_TCK") / 40
                                                + 1e-9)
        assert "added_p50_ms" in r
    assert {r["history_kind"] for r in rows if r["path"] == "direct"} == {"finished", "inferred"}
    with pytest.raises(ValueError, match="--warm-history"):
        bg.bench_gateway(warm_history=-1, progress=False)


def test_warm_history_marks_are_increasing_histories() -> None:
    from hermes.bench.gateway import warm_marks

    assert warm_marks(0) == () and warm_marks([]) == () and warm_marks([0]) == ()
    assert warm_marks(500) == (500,) and warm_marks([10, 20, 50]) == (10, 20, 50)
    for bad in ([20, 10], [10, 10], [-1], [10, -5]):
        with pytest.raises(ValueError, match="--warm-history"):
            warm_marks(bad)

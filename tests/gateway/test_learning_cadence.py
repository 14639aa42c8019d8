"""The learner after a long history: versions ever rarer, built off the event loop, the new
estimator's hot states drawn ahead, a bounded number of apps in memory."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

from hermes.core.costmodel import get_cost_model
from hermes.core.estimator import EstimatorPool
from hermes.core.profiler import Profiler
from hermes.core.records import RequestRecord, RunRecord, UnitRecord
from hermes.core.state import RunProgress, RunState
from hermes.gateway.config import GatewayConfig
from hermes.gateway.context import SchedulerClock, SchedulerContext, startup_policy
from hermes.gateway.learning import Learner
from hermes.gateway.state import LiveRun, UnitInvocation


def learner(tmp_path: Path, **stores: object) -> Learner:
    config = GatewayConfig.model_validate({"stores": {"kb": "", **stores},
                                           "scheduler": {"policy": "hermes", "n_walks": 100}})
    cost = get_cost_model("llama2-7b-a100")
    pool = EstimatorPool({}, cost, n_walks=100)
    ctx = SchedulerContext(config, SchedulerClock(), cost, startup_policy(config, pool), pool)
    return Learner(ctx, None, tmp_path / "records.jsonl")


def record(app: str, k: int) -> RunRecord:
    t = float(k)
    return RunRecord(app=app, run_id=f"{app}-{k}", submitted=t, finished=t + 2.0, units=[
        UnitRecord(unit="ask", backend="llm:m", started=t, finished=t + 1.0,
                   requests=[RequestRecord(input_tokens=200 + 7 * k % 90, output_tokens=40)]),
        UnitRecord(unit="answer", backend="llm:m", started=t + 1.0, finished=t + 2.0,
                   requests=[RequestRecord(input_tokens=300 + 5 * k % 70, output_tokens=60)]),
    ])


def test_versions_grow_rarer_and_are_built_off_the_event_loop(tmp_path: Path, monkeypatch) -> None:
    lr = learner(tmp_path, learn_every_run_below=4, learn_growth=0.5)
    threads = set()
    real = Profiler._build

    def build(self):  # where the PDGraph rebuilds run
        threads.add(threading.current_thread() is threading.main_thread())
        return real(self)

    monkeypatch.setattr(Profiler, "_build", build)
    versions = []

    async def go() -> None:
        for k in range(1, 16):
            lr.learn(record("app", k))
            if await lr.refresh_off_loop():
                versions.append(k)

    asyncio.run(go())
    # every run below 4, then once the new runs reach half of those built from
    assert versions == [1, 2, 3, 4, 6, 9, 14]
    assert threads == {False}  # never on the event loop's thread
    assert lr.ctx.pool.get("app") is not None
    lr.close()


def test_a_new_version_arrives_with_its_hot_states_drawn(tmp_path: Path) -> None:
    lr = learner(tmp_path)
    memo = lr.ctx.policy.estimators

    async def go() -> None:
        lr.learn(record("app", 1))
        await lr.refresh_off_loop()
        first = memo.get("app")
        first.sample(RunProgress(current="ask"))  # a state the policy served
        lr.learn(record("app", 2))
        assert await lr.refresh_off_loop()
        second = memo.get("app")
        assert second is not first and second.inner is lr.ctx.pool.get("app")
        second.sample(RunProgress(current="ask"))
        assert (second.hits, second.misses) == (1, 0)  # drawn ahead, in the worker

    asyncio.run(go())
    lr.close()


def test_apps_in_memory_are_bounded(tmp_path: Path) -> None:
    lr = learner(tmp_path, max_learned_apps=2)
    for app in ("a1", "a2", "a3"):
        lr.learn(record(app, 1))
    lr.flush()
    assert list(lr.profilers) == ["a2", "a3"]
    assert lr.ctx.pool.get("a1") is None and lr.ctx.pool.get("a3") is not None
    assert "a1" not in lr.profiled_runs
    lr.close()


def test_records_between_versions_join_their_profiler_not_a_backlog(tmp_path: Path) -> None:
    """A long-lived app rebuilds rarely, but its records never pile up waiting for it:
    each learning pass gives them to the profiler (whose sample lists are bounded)."""
    lr = learner(tmp_path, learn_every_run_below=1, learn_growth=10.0)

    async def go() -> None:
        for k in range(1, 6):
            lr.learn(record("app", k))
            await lr.refresh_off_loop()
            assert not lr._pending  # nothing waits past a pass
        assert lr._built_runs["app"] == 1  # one version: the cadence asks for 10 new runs

    asyncio.run(go())
    assert lr.profilers["app"].runs == 5
    lr.close()


def test_the_request_path_never_builds_a_graph(tmp_path: Path) -> None:
    lr = learner(tmp_path)
    lr.learn(record("app", 1))
    assert lr.serving_graph("app") is None  # learned, not built yet: no build here
    assert lr.profilers["app"]._cached is None
    assert asyncio.run(lr.refresh_off_loop())
    assert lr.serving_graph("app") is lr.app_graph("app") is not None
    lr.close()


def finished_run(app: str, k: int) -> LiveRun:
    """A finished run of one closed tool-like unit (what :meth:`Learner.record` reads)."""
    t = float(k)
    run = LiveRun(state=RunState(run_id=f"{app}-{k}", app=app, submitted=t), status="finished")
    run.state.finished = t + 1.0
    run.units.append(UnitInvocation(unit="step", backend="tool:x", started=t, explicit=True,
                                    finished=t + 1.0, duration_s=1.0, closed=True))
    return run


def run_ends(lr: Learner, app: str, rate: float, seconds: float, start: int = 0,
             at: float = 0.0) -> list[bool]:
    """End ``rate`` runs of ``app`` a (fake wall) second for ``seconds`` from ``at``; which
    of them were learned (recorded)."""
    now = [at]
    lr._clock = lambda: now[0]
    learned = []
    for i in range(int(rate * seconds)):
        now[0] = at + i / rate
        before = lr.profiled_runs.get(app, 0)
        lr.run_ended(finished_run(app, start + i))
        learned.append(lr.profiled_runs.get(app, 0) == before + 1)
    return learned


def test_a_busy_app_is_learned_from_a_sample_of_its_runs(tmp_path: Path, caplog) -> None:
    lr = learner(tmp_path, learn_sample_after=100, learn_runs_per_s=50.0)
    with caplog.at_level(logging.INFO, logger="hermes.gateway.learning"):
        got = run_ends(lr, "busy", rate=1000.0, seconds=4.0)
    # the operator is told once, naming the setting
    told = [r.getMessage() for r in caplog.records if "sample of its runs" in r.getMessage()]
    assert len(told) == 1 and "busy" in told[0] and "stores.learn_runs_per_s" in told[0]
    # every run until 100 were learned (t = 0.1 s), then every run of the first window of
    # 1 s (no rate measured yet), then ~50 a second
    assert all(got[:1100])
    assert sum(got[1101:2101]) < 100
    for second in (2, 3):
        kept = sum(got[1000 * second:1000 * (second + 1)])
        assert 30 <= kept <= 75, (second, kept)
    learned = sum(got)
    assert lr.profiled_runs["busy"] == learned
    assert lr.ctx.stats["runs_sampled_out"] == len(got) - learned
    assert lr.ctx.stats["records_written"] == learned
    lr.close()
    # the records log holds the learned runs only
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == learned


def test_a_quiet_app_and_a_zero_rate_learn_every_run(tmp_path: Path) -> None:
    lr = learner(tmp_path, learn_sample_after=10, learn_runs_per_s=50.0)
    assert all(run_ends(lr, "quiet", rate=40.0, seconds=5.0))  # below 50 a second
    lr.close()
    (tmp_path / "zero").mkdir()
    lr = learner(tmp_path / "zero", learn_sample_after=10, learn_runs_per_s=0.0)
    assert all(run_ends(lr, "busy", rate=1000.0, seconds=3.0))
    assert lr.ctx.stats.get("runs_sampled_out", 0) == 0
    lr.close()


def test_stats_show_what_the_learner_holds_level_off_at_the_caps(tmp_path: Path) -> None:
    """``hermes_learner_size``: the values held grow with an app's runs up to its profiler's
    caps (1000 per list) and then stay; an app forgotten past ``max_learned_apps`` takes its
    share with it; records count as pending until a learning pass gives them away."""
    lr = learner(tmp_path, max_learned_apps=2, learn_runs_per_s=0)
    held = []

    async def go() -> None:
        for k in range(1, 2001):
            lr.learn(record("a", k))
            if k in (10, 1000, 1500, 2000):
                assert lr.stats()["pending_records"] > 0
                await lr.refresh_off_loop()
                assert lr.stats()["pending_records"] == 0
                held.append(lr.stats()["held_samples"])

    asyncio.run(go())
    assert 0 < held[0] < held[1] == held[2] == held[3]  # 10 runs < the caps, reached at 1000
    assert lr.stats()["apps"] == 1 and lr.stats()["graphs"] == 1
    for app in ("b", "c"):  # a third app: the least recently learned ("a") is forgotten
        lr.learn(record(app, 1))
        asyncio.run(lr.refresh_off_loop())
    got = lr.stats()
    assert got["apps"] == 2
    assert got["held_samples"] == sum(p.held_samples() for p in lr.profilers.values())
    assert got["held_samples"] < held[0]
    lr.close()

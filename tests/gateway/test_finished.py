"""The compact store of finished runs (issue 16): what it keeps, in what order, how it reads
back, and that it adds nothing for the garbage collector to walk."""

from __future__ import annotations

import gc
import math

import pytest

from hermes.gateway.finished import FinishedRun, FinishedRuns


def _doc(i: int, *, app: str = "a", tenant: str = "t", state: str = "finished",
         hosted: bool = False) -> dict:
    return {"run_id": f"run-{i}", "app": app, "tenant": tenant, "state": state,
            "hosted": hosted, "submitted": 100.0 + i, "finished": 101.5 + i,
            "deadline": None, "k": 0.3, "act_s": 1.5, "rank": None, "attained_s": 0.25,
            "attained_tokens": 40, "current_unit": None, "pending_requests": 0,
            "units": [{"unit": "u", "requests": [{"request_id": f"r{i}", "state": "done"}]}],
            "input": {"seed": i}, "result": {"answer": [1, 2.5, "x"]}, "error": None}


def test_add_get_roundtrip_and_the_live_run_surface() -> None:
    store = FinishedRuns(keep=10)
    doc = _doc(1, app="chat", tenant="acme", hosted=True)
    store.add(doc, units_done=["plan", "act"], idempotency={"key": "k1", "body": "h"})
    assert len(store) == 1 and "run-1" in store and "run-2" not in store
    run = store.get("run-1")
    assert isinstance(run, FinishedRun)
    assert run.to_json(999.0) == doc  # the document as it was when the run ended
    assert run.to_json() is not run.to_json()  # a fresh dict per call: callers may mutate
    # what the HTTP layers read of a LiveRun
    assert (run.run_id, run.app, run.status, run.hosted) == ("run-1", "chat", "finished", True)
    assert run.state is run and run.state.tenant == "acme" and run.state.submitted == 101.0
    assert run.act_s(1e9) == 1.5 and run.finished == 102.5 and run.k == 0.3
    assert run.rank == math.inf and run.attained_s == 0.25 and run.attained_tokens == 40
    assert run.result == {"answer": [1, 2.5, "x"]} and run.error is None
    assert len(run.pending) == 0 and run.progress.current is None
    assert run.progress.finished == ("plan", "act")
    assert run.idempotency == {"key": "k1", "body": "h"}
    assert store.get("nope") is None


def test_oldest_dropped_past_keep_and_re_adding_makes_newest() -> None:
    store = FinishedRuns(keep=3)
    for i in range(5):
        store.add(_doc(i))
    assert list(store) == ["run-2", "run-3", "run-4"] and len(store) == 3
    assert store.get("run-1") is None
    store.add(_doc(2, state="failed"))  # replaced, now the newest
    assert list(store) == ["run-3", "run-4", "run-2"]
    assert store.get("run-2").status == "failed"
    store.discard("run-3")
    assert list(store) == ["run-4", "run-2"]
    with pytest.raises(ValueError):
        FinishedRuns(keep=0)


def test_recent_newest_first_filtered_and_limited() -> None:
    store = FinishedRuns(keep=100)
    for i in range(10):
        store.add(_doc(i, app="even" if i % 2 == 0 else "odd",
                       state="cancelled" if i == 7 else "finished"))
    assert [r.run_id for r in store.recent(limit=3)] == ["run-9", "run-8", "run-7"]
    evens = store.recent(lambda r: r.app == "even", 2)
    assert [r.run_id for r in evens] == ["run-8", "run-6"]
    assert [r.run_id for r in store.recent(lambda r: r.status == "cancelled", 5)] == ["run-7"]
    assert [r.run_id for r in store.recent(lambda r: r.state.tenant == "t", 100)][-1] == "run-0"
    assert store.recent(lambda r: False, 5) == [] and store.recent(limit=0) == []


def test_add_run_takes_a_live_run() -> None:
    """``add_run``: the document, units done and idempotency key of a run that has just
    ended, read off the LiveRun."""
    from hermes.core.state import RunState, UnitObservation
    from hermes.gateway.scheduler import LiveRun

    state = RunState(run_id="run-x", app="agent", submitted=10.0, tenant="bob")
    state.end_unit(UnitObservation(unit="search"))
    state.finished = 12.0
    run = LiveRun(state=state, status="finished", input={"q": 1}, result="ok")
    run.idempotency = {"key": "K", "body": "B"}  # type: ignore[attr-defined]
    store = FinishedRuns(keep=5)
    store.add_run(run, now=50.0)
    got = store.get("run-x")
    assert got.to_json() == run.to_json(50.0)
    assert got.progress.finished == ("search",) and got.idempotency == {"key": "K", "body": "B"}
    assert got.act_s() == pytest.approx(2.0) and got.state.tenant == "bob"


def test_kept_runs_are_nothing_for_the_collector_to_walk() -> None:
    """10,000 finished runs: after one collection, no tracked object per run (the point of
    the store: full collections do not grow with the history)."""
    store = FinishedRuns(keep=10_000)
    for i in range(10_000):
        store.add(_doc(i), units_done=["u"], idempotency={"key": str(i), "body": "b"})
    gc.collect()
    entries = store._runs  # noqa: SLF001 - the representation is what this test is about
    assert sum(gc.is_tracked(e) for e in entries.values()) == 0
    assert all(not gc.is_tracked(b) for e in list(entries.values())[:100] for b in e)


def test_a_kept_run_moves_between_stores_as_its_bytes() -> None:
    """:meth:`FinishedRuns.encoded` and :meth:`FinishedRuns.add_encoded` (a run's history
    entry in the durable store, read back by a new leader): the same bytes, the same
    answer and extras, with the document decoded by the caller or here; the newest kept;
    a damaged entry named and refused."""
    import json

    first = FinishedRuns(keep=2)
    first.add(_doc(1, app="chat", tenant="acme"), units_done=["plan"],
              idempotency={"key": "k1", "body": "h"})
    first.add(_doc(2))
    doc, extra = first.encoded("run-1") or (b"", None)
    assert first.encoded("run-9") is None
    for parsed in (None, json.loads(doc)):
        second = FinishedRuns(keep=2)
        second.add(_doc(3))
        assert second.add_encoded(doc, extra, parsed=parsed) == "run-1"
        assert second.encoded("run-1") == (doc, extra)
        run = second.get("run-1")
        assert run is not None and run.to_json() == first.get("run-1").to_json()  # type: ignore[union-attr]
        assert (run.app, run.tenant, run.status) == ("chat", "acme", "finished")
        assert run.progress.finished == ("plan",) and run.idempotency == {"key": "k1", "body": "h"}
        second.add(_doc(4))
        assert list(second) == ["run-1", "run-4"]  # restored as the newest, then aged out
    with pytest.raises(ValueError, match="not a finished run's document"):
        FinishedRuns(keep=2).add_encoded(b'{"run_id": "x"}')
    with pytest.raises(ValueError, match="not a finished run's document"):
        FinishedRuns(keep=2).add_encoded(b"{no")

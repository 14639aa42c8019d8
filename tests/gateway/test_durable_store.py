"""Durable run state across a gateway restart, on both stores (SQLite in the state directory,
a real redis-server): ended runs answer as before, client-driven runs keep their units and
stay usable, and the knowledge base keeps what it learned."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import redis
from gw_redis import redis_url  # noqa: F401  (fixture)

from hermes.gateway.run_store import HISTORY, HISTORY_PARSED, RedisRunStore, SqliteRunStore
from hermes.gateway.server import gateway_state


def _restartable(kind: str, tmp_path: Path, request: pytest.FixtureRequest,
                 **extra: object) -> dict[str, object]:
    """Gateway options whose runs and knowledge survive a restart: state and KB under
    ``tmp_path``, durable state in SQLite or (``kind == "redis"``) an emptied real Redis."""
    opts: dict[str, object] = {"state_dir": str(tmp_path / "state"), "kb": str(tmp_path / "kb"),
                               "recovery_grace_s": 0.5, **extra}
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        redis.Redis.from_url(url).flushdb()
        opts["state_redis"] = url
    return opts


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_store_round_trip(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    store = (SqliteRunStore(tmp_path / "s.db") if kind == "sqlite"
             else RedisRunStore(request.getfixturevalue("redis_url"), prefix=f"t{time.time()}:"))
    store.put_run("a", "queued", {"run_id": "a", "submitted": 1.0, "status": "queued"})
    store.put_run("b", "queued", {"run_id": "b", "submitted": 2.0, "status": "queued"})
    store.put_run("a", "finished", {"run_id": "a", "submitted": 1.0, "status": "finished"})
    store.put_call("b", 0, {"state": "sent"})
    store.put_call("b", 0, {"state": "done"})
    store.put_call("b", 1, {"state": "sent"})
    assert [(d["run_id"], d["status"]) for d in store.runs()] == [("a", "finished"), ("b", "queued")]
    assert store.calls("b") == {0: {"state": "done"}, 1: {"state": "sent"}}
    assert store.calls("a") == {}
    store.drop_calls("b")
    assert store.calls("b") == {}
    for i in range(5):
        store.put_run(f"e{i}", "failed", {"run_id": f"e{i}", "submitted": 3.0 + i, "status": "failed"})
    assert store.prune_ended(2) == 4  # a, e0, e1, e2
    assert [d["run_id"] for d in store.runs()] == ["b", "e3", "e4"]
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_pruning_keeps_the_newest_ended_runs_and_every_active_one(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Active runs (some among the oldest) are never pruned, the newest ``keep`` ended ones
    stay, over more than one of Redis' read chunks; Redis finds them from its order and
    active index, without reading a run document (that cost O(stored runs) a prune)."""
    store = (SqliteRunStore(tmp_path / "s.db") if kind == "sqlite"
             else RedisRunStore(request.getfixturevalue("redis_url"), prefix=f"p{time.time()}:"))
    ids = [f"r{i:04d}" for i in range(400)]
    active = {r for i, r in enumerate(ids) if i % 7 == 0}
    store.put_runs([(r, "running" if r in active else "finished",
                     {"run_id": r, "submitted": float(i)}, {0: {"unit": "u"}})
                    for i, r in enumerate(ids)])
    if kind == "redis":
        def no_docs(*a, **k):  # noqa: ANN002, ANN003, ANN202
            raise AssertionError("prune read run documents")
        store._docs = no_docs  # type: ignore[method-assign]
    ended = [r for r in ids if r not in active]
    assert store.prune_ended(100) == len(ended) - 100
    assert store.prune_ended(100) == 0
    if kind == "redis":
        del store._docs
    left = [d["run_id"] for d in store.runs()]
    assert left == [r for r in ids if r in active or r in ended[-100:]]
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_an_ended_runs_units_join_those_stored_while_it_ran(kind: str, tmp_path: Path,
                                                            request: pytest.FixtureRequest) -> None:
    """The units a run's end writes (Redis: in one hash for the whole batch) are read back
    with those written while it ran, a later document of an index replacing the earlier one;
    two writes of one ended run in a batch keep both's units; a batch mixing a run still
    going and one ending stores each where it belongs."""
    store = (SqliteRunStore(tmp_path / "s.db") if kind == "sqlite"
             else RedisRunStore(request.getfixturevalue("redis_url"), prefix=f"e{time.time()}:"))
    store.put_run("a", "running", {"run_id": "a", "status": "running", "submitted": 1.0,
                                   "n_units": 2},
                  {0: {"unit": "u0", "v": 1}, 1: {"unit": "u1", "v": 1}})
    store.put_runs([
        ("b", "running", {"run_id": "b", "status": "running", "submitted": 2.0, "n_units": 1},
         {0: {"unit": "w"}}),
        ("a", "finished", {"run_id": "a", "status": "finished", "submitted": 1.0, "n_units": 4},
         {1: {"unit": "u1", "v": 2}, 2: {"unit": "u2"}}),
        ("a", "finished", {"run_id": "a", "status": "finished", "submitted": 1.0, "n_units": 4},
         {3: {"unit": "u3"}}),
    ])
    docs = {d["run_id"]: d for d in store.runs()}
    assert docs["a"]["units"] == [{"unit": "u0", "v": 1}, {"unit": "u1", "v": 2},
                                  {"unit": "u2"}, {"unit": "u3"}]
    assert docs["b"]["units"] == [{"unit": "w"}]
    if kind == "redis":
        assert [d["run_id"] for d in store.active_runs()] == ["b"]
        assert [d["run_id"] for c in store.ended_runs_chunks() for d in c] == ["a"]
    store.close()


def test_redis_prunes_a_backlog_in_several_script_runs(
        request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis prunes inside a script of at most PRUNE_CHUNK runs dropped (it runs alone):
    a backlog larger than that is dropped in several, the count is their sum, the unit
    documents go with their runs, and a second prune finds nothing."""
    import hermes.gateway.run_store as rs
    monkeypatch.setattr(rs, "PRUNE_CHUNK", 7)
    store = RedisRunStore(request.getfixturevalue("redis_url"), prefix=f"b{time.time()}:")
    ids = [f"r{i:03d}" for i in range(60)]
    store.put_runs([(r, "finished" if i % 5 else "queued", {"run_id": r, "submitted": float(i)},
                     {0: {"unit": "u"}}) for i, r in enumerate(ids)])
    ended = [r for i, r in enumerate(ids) if i % 5]
    assert store.prune_ended(10) == len(ended) - 10
    assert store.prune_ended(10) == 0
    left = [d["run_id"] for d in store.runs()]
    assert left == [r for i, r in enumerate(ids) if i % 5 == 0 or r in ended[-10:]]
    # the units of a run still going are in its own hash, those an end wrote in one hash for
    # all: a dropped run leaves neither behind
    units = {k.split(":")[-1] for k in store.r.scan_iter(store.p + "units:*")}
    at_end = set(store.r.hkeys(store.p + "end_units"))
    assert units == {r for i, r in enumerate(ids) if i % 5 == 0}
    assert at_end == set(ended[-10:]) and units | at_end == set(left)
    assert all(d["units"] == [{"unit": "u"}] for d in store.runs())
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_runs_and_knowledge_survive_a_restart(kind: str, make_gateway, tmp_path: Path,  # noqa: ANN001
                                              request: pytest.FixtureRequest) -> None:
    opts = _restartable(kind, tmp_path, request, learn_interval_s=0.1)
    srv = make_gateway(**opts)
    body = {"model": "llama-2-7b", "prompt": "x" * 40, "max_tokens": 3, "ignore_eos": True}
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        done = http.post("/v1/runs", json={"app": "factool_math", "input": {"seed": 3}})
        done_id = done.json()["run_id"]
        client_id = http.post("/v1/runs", json={"app": "myagent"}).json()["run_id"]
        for unit in ("plan", "act"):
            r = http.post("/v1/completions", json=body,
                          headers={"X-Hermes-Run": client_id, "X-Hermes-Unit": unit})
            assert r.status_code == 200
        learn_id = http.post("/v1/runs", json={"app": "myagent"}).json()["run_id"]
        http.post("/v1/completions", json=body, headers={"X-Hermes-Run": learn_id,
                                                         "X-Hermes-Unit": "plan"})
        assert http.post(f"/v1/runs/{learn_id}/finish").json()["state"] == "finished"
        deadline = time.monotonic() + 30
        while http.get(f"/v1/runs/{done_id}").json()["state"] != "finished":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        result = http.get(f"/v1/runs/{done_id}").json()["result"]
    gateway_state(srv).scheduler.flush_learning()
    srv.stop()

    srv2 = make_gateway(**opts)
    with httpx.Client(base_url=srv2.url, timeout=30) as http:
        r = http.get(f"/v1/runs/{done_id}").json()
        assert r["state"] == "finished" and r["result"] == result  # not run again
        r = http.get(f"/v1/runs/{client_id}").json()
        assert r["state"] == "running" and [u["unit"] for u in r["units"]] == ["plan", "act"]
        assert [u["requests"][0]["output_tokens"] for u in r["units"]] == [3, 3]
        # the client carries on with the same run after the restart
        r = http.post("/v1/completions", json=body,
                      headers={"X-Hermes-Run": client_id, "X-Hermes-Unit": "answer"})
        assert r.status_code == 200
        r = http.post(f"/v1/runs/{client_id}/finish").json()
        assert r["state"] == "finished" and [u["unit"] for u in r["units"]] == ["plan", "act", "answer"]
        # the knowledge base kept what it learned from the runs before the restart
        g = http.get("/v1/apps/myagent").json()["pdgraph"]
        assert g is not None and "plan" in g["units"]


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_long_run_stores_each_unit_once(kind: str, make_gateway, tmp_path: Path,  # noqa: ANN001
                                          request: pytest.FixtureRequest) -> None:
    """An agent loop of many LLM calls: each closing unit adds its own document (O(1) per
    unit, not a rewrite of the run's history), and a restart restores them all in order."""
    opts = _restartable(kind, tmp_path, request, time_scale=50.0)
    srv = make_gateway(**opts)
    store = gateway_state(srv).scheduler.durable.store
    written: list[int] = []
    put_run = store.put_run

    def counting_put_run(run_id, status, doc, units=None):  # noqa: ANN001, ANN202
        written.append(len(units or {}))
        assert "units" not in doc  # the history is not in the run document
        return put_run(run_id, status, doc, units)

    store.put_run = counting_put_run
    n = 120
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        rid = http.post("/v1/runs", json={"app": "looper"}).json()["run_id"]
        for i in range(n):
            r = http.post("/v1/completions", headers={"X-Hermes-Run": rid,
                                                     "X-Hermes-Unit": f"step{i % 3}"},
                          json={"model": "llama-2-7b", "prompt": "go", "max_tokens": 1 + i % 4, "ignore_eos": True})
            assert r.status_code == 200
    srv.stop()
    assert written[0] == 0 and sum(written) == n and max(written) == 1, written

    srv2 = make_gateway(**opts)
    with httpx.Client(base_url=srv2.url, timeout=30) as http:
        r = http.get(f"/v1/runs/{rid}").json()
    assert r["state"] == "running"
    assert [u["unit"] for u in r["units"]] == [f"step{i % 3}" for i in range(n)]
    assert [u["requests"][0]["output_tokens"] for u in r["units"]] == [1 + i % 4 for i in range(n)]


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_one_request_runs_end_after_their_answer_in_batched_writes(
        kind: str, make_gateway, tmp_path: Path, request: pytest.FixtureRequest) -> None:  # noqa: ANN001
    """Opted-out completions (``X-Hermes-Run: none``: one-request runs) are finished right
    after their answer: a
    GET sent after the answer sees the run finished; their documents are written together,
    several runs per write under concurrency, and a restart restores every one of them."""
    import concurrent.futures

    opts = _restartable(kind, tmp_path, request, time_scale=200.0)
    srv = make_gateway(**opts)
    store = gateway_state(srv).scheduler.durable.store
    batches: list[list[str]] = []
    put_runs = store.put_runs

    def counting_put_runs(batch):  # noqa: ANN001, ANN202
        batches.append([w[0] for w in batch])
        return put_runs(batch)

    store.put_runs = counting_put_runs
    body = {"model": "llama-2-7b", "prompt": "x" * 40, "max_tokens": 2, "ignore_eos": True}

    def one(http: httpx.Client) -> str:
        r = http.post("/v1/completions", json=body, headers={"X-Hermes-Run": "none"})
        assert r.status_code == 200
        rid = r.headers["X-Hermes-Run"]
        got = http.get(f"/v1/runs/{rid}").json()
        assert got["state"] == "finished" and got["units"][0]["requests"][0]["output_tokens"] == 2
        # the unit was closed with the run, after the answer; it ended with its result
        unit, req = got["units"][0], got["units"][0]["requests"][0]
        assert unit["started"] <= unit["finished"] == req["finished"] <= got["finished"]
        return rid

    with httpx.Client(base_url=srv.url, timeout=30,
                      limits=httpx.Limits(max_connections=16)) as http:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            ids = list(pool.map(lambda _: one(http), range(96)))
    srv.stop()
    written = [rid for b in batches for rid in b]
    assert sorted(written) == sorted(ids)  # each run written once, when it ended
    assert len(batches) < len(ids)  # concurrent ends shared a write
    srv2 = make_gateway(**opts)
    with httpx.Client(base_url=srv2.url, timeout=30) as http:
        for rid in ids[::8]:
            r = http.get(f"/v1/runs/{rid}").json()
            assert r["state"] == "finished" and r["app"] == "default"


def test_writes_nobody_waits_on_are_gathered_over_the_batch_window(
        make_gateway, tmp_path: Path, request: pytest.FixtureRequest) -> None:  # noqa: ANN001
    """One client, one request at a time: the ended one-request runs are written together
    once ``durability.batch_s`` has passed since the first of them ended (not one write per
    request, as batching by loop iteration gave at one client); nothing is written before
    the window closes, all of it after, and a restart finds every run. So does the creation
    of an inferred run (a header-less request's): its answer does not wait for the write,
    which comes with the window (its end too, in the same write), and a restart finds it:
    never stored while it ran, it is written as the finished document the gateway keeps (a
    history entry), with its one unit."""
    opts = _restartable("sqlite", tmp_path, request, time_scale=200.0, batch_s=1.0)
    srv = make_gateway(**opts)
    store = gateway_state(srv).scheduler.durable.store
    batches: list[tuple[float, list[str]]] = []
    put_runs = store.put_runs

    def counting_put_runs(batch, history=()):  # noqa: ANN001, ANN202
        batches.append((time.monotonic(), [w[0] for w in batch] + [h[0] for h in history]))
        return put_runs(batch, history=history)

    store.put_runs = counting_put_runs
    body = {"model": "llama-2-7b", "prompt": "x" * 40, "max_tokens": 2, "ignore_eos": True}
    ids: list[str] = []
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        t0 = time.monotonic()
        for _ in range(5):
            r = http.post("/v1/completions", json=body, headers={"X-Hermes-Run": "none"})
            assert r.status_code == 200
            ids.append(r.headers["X-Hermes-Run"])
        answered = time.monotonic()
        assert answered - t0 < 0.9, "five requests took the whole window: nothing to show"
        assert batches == []  # the window is still open
        deadline = time.monotonic() + 10
        while sum(len(b) for _, b in batches) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [rid for _, b in batches for rid in b] == ids
    assert len(batches) == 1 and batches[0][0] - t0 >= 1.0
    # a header-less request's inferred run is written with the window too (after a crash
    # its next turn starts a new run whether or not it was stored: the resolver's index is
    # saved at a clean stop only; what a crash in the window loses is its history entry)
    batches.clear()
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        chat = {"model": "llama-2-7b", "max_tokens": 2, "ignore_eos": True,
                "messages": [{"role": "user", "content": "plan a trip, step by step"}]}
        t0 = time.monotonic()
        r = http.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200 and time.monotonic() - t0 < 0.9
        inferred = r.headers["X-Hermes-Run"]
    assert inferred not in [d["run_id"] for d in store.runs()]  # the window is open
    deadline = time.monotonic() + 10
    while not batches and time.monotonic() < deadline:
        time.sleep(0.05)
    # one write of it, though it was created and (one turn: the resolver saw its end) ended
    # in the window: not stored at its creation, it ends as the history entry of its kept
    # finished document
    assert [b for _, b in batches] == [[inferred]] and batches[0][0] - t0 >= 1.0
    stored = {d["run_id"]: d for d in store.runs()}
    assert stored[inferred]["status"] == "finished" and HISTORY in stored[inferred]
    assert len(stored[inferred][HISTORY_PARSED]["units"]) == 1
    srv.stop()
    srv2 = make_gateway(**opts)
    with httpx.Client(base_url=srv2.url, timeout=30) as http:
        for rid in ids:
            assert http.get(f"/v1/runs/{rid}").json()["state"] == "finished"
        assert http.get(f"/v1/runs/{inferred}").json()["state"] == "finished"


def _recorded(state: Path) -> list[str]:
    path = state / "records.jsonl"
    return [json.loads(x)["run_id"] for x in path.read_text().splitlines()] if path.exists() else []


def test_a_run_is_recorded_before_its_end_is_stored_and_once_across_a_restart(
        make_gateway, tmp_path: Path, request: pytest.FixtureRequest) -> None:  # noqa: ANN001
    """finish_run writes the record before the durable end, so a kill between the two leaves
    a run that resumes rather than a finished run without a record; the resumed run finds its
    record at the end of records.jsonl and is not recorded twice."""
    opts = _restartable("sqlite", tmp_path, request)
    state = tmp_path / "state"
    body = {"model": "llama-2-7b", "prompt": "x" * 40, "max_tokens": 3}
    srv = make_gateway(**opts)
    sched = gateway_state(srv).scheduler
    seen_at_end: dict[str, bool] = {}
    run_ended = sched.durable.run_ended

    def checked(run):  # noqa: ANN001, ANN202
        seen_at_end[run.run_id] = run.run_id in _recorded(state)
        return run_ended(run)

    sched.durable.run_ended = checked
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        ids = [http.post("/v1/runs", json={"app": "myagent"}).json()["run_id"] for _ in range(3)]
        for rid in ids:
            r = http.post("/v1/completions", json=body,
                          headers={"X-Hermes-Run": rid, "X-Hermes-Unit": "plan"})
            assert r.status_code == 200
        assert http.post(f"/v1/runs/{ids[0]}/finish").json()["state"] == "finished"
    assert seen_at_end == {ids[0]: True}
    srv.stop()
    # the state a kill between record and durable end leaves: ids[1]'s record is written, its
    # stored document still says running
    rec = json.loads((state / "records.jsonl").read_text().splitlines()[0])
    with (state / "records.jsonl").open("a") as fh:
        fh.write(json.dumps({**rec, "run_id": ids[1]}) + "\n")

    srv2 = make_gateway(**opts)
    with httpx.Client(base_url=srv2.url, timeout=30) as http:
        for rid in ids[1:]:
            assert http.get(f"/v1/runs/{rid}").json()["state"] == "running"
            assert http.post(f"/v1/runs/{rid}/finish").json()["state"] == "finished"
    assert sorted(_recorded(state)) == sorted(ids)  # each once


def test_an_inferred_run_is_written_every_16_units_and_on_a_clean_stop(
        make_gateway, tmp_path: Path, request: pytest.FixtureRequest) -> None:  # noqa: ANN001
    """A header-less agent of 40 turns (one inferred run): its documents are written after 16
    and 32 closed invocations (batched, off the request), not at each of its 40 requests nor
    at its start (this gateway's own evidence index: after a crash its next turn would start
    a new run, so a stored start had nothing to lead to); the rest when it ends (idle: fast
    at this time scale) or on a clean stop, and a restart restores all 40 units in order."""
    opts = _restartable("sqlite", tmp_path, request, time_scale=50.0)
    srv = make_gateway(**opts)
    store = gateway_state(srv).scheduler.durable.store
    writes: list[tuple[str, int]] = []
    put_runs = store.put_runs

    def counting_put_runs(batch):  # noqa: ANN001, ANN202
        writes.extend((w[0], len(w[3])) for w in batch)
        return put_runs(batch)

    store.put_runs = counting_put_runs
    msgs = [{"role": "system", "content": "You are a careful planner of long trips."},
            {"role": "user", "content": "Plan the first leg."}]
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        for i in range(40):
            r = http.post("/v1/chat/completions",
                          json={"model": "llama-2-7b", "max_tokens": 3, "messages": msgs})
            assert r.status_code == 200, r.text
            if i == 0:
                rid = r.headers["X-Hermes-Run"]
            assert r.headers["X-Hermes-Run"] == rid
            msgs += [r.json()["choices"][0]["message"],
                     {"role": "user", "content": f"And leg {i + 2}?"}]
    srv.stop()
    mine = [n for run, n in writes if run == rid]
    # 16, 16, then the last 8 at its end or on the stop
    assert mine == [16, 16, 8], mine
    srv2 = make_gateway(**opts)
    with httpx.Client(base_url=srv2.url, timeout=30) as http:
        got = http.get(f"/v1/runs/{rid}").json()
    assert got["inferred"] is True and len(got["units"]) == 40
    assert all(u["requests"][0]["output_tokens"] >= 1 for u in got["units"])


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_batch_leaves_what_its_writes_one_by_one_leave(kind: str, tmp_path: Path,
                                                          request: pytest.FixtureRequest) -> None:
    """A batch (the Redis store writes it in a few commands for all its runs) ends in the
    state of its writes in order: a run written twice keeps its last document and status,
    its unit documents from both, its first acceptance order."""
    store = (SqliteRunStore(tmp_path / "s.db") if kind == "sqlite"
             else RedisRunStore(request.getfixturevalue("redis_url"), prefix=f"b{time.time()}:"))
    store.put_run("old", "running", {"run_id": "old", "submitted": 0.5, "status": "running"})
    store.put_runs([
        ("a", "running", {"run_id": "a", "submitted": 1.0, "status": "running", "n_units": 1},
         {0: {"unit": "u0", "closed": True}}),
        ("b", "finished", {"run_id": "b", "submitted": 2.0, "status": "finished", "n_units": 0},
         {}),
        ("a", "finished", {"run_id": "a", "submitted": 1.0, "status": "finished", "n_units": 2,
                           "result": "é"}, {1: {"unit": "u1", "closed": True}}),
        ("old", "failed", {"run_id": "old", "submitted": 0.5, "status": "failed"}, {}),
        ("c", "running", {"run_id": "c", "submitted": 3.0, "status": "running", "n_units": 0},
         {}),
    ])
    runs = {d["run_id"]: d for d in store.runs()}
    assert list(runs) == ["old", "a", "b", "c"]  # acceptance order
    assert runs["a"]["status"] == "finished" and runs["a"]["result"] == "é"
    assert [u["unit"] for u in runs["a"]["units"]] == ["u0", "u1"]
    assert runs["old"]["status"] == "failed" and runs["b"]["status"] == "finished"
    if isinstance(store, RedisRunStore):
        assert store.r.smembers(store.p + "active") == {"c"}
        assert [d["run_id"] for d in store.active_runs()] == ["c"]
    store.put_runs([])  # nothing: no write
    store.close()


def test_a_run_written_at_once_supersedes_its_batched_write(tmp_path: Path) -> None:
    """An inferred run's creation waits in the batch; a write of it that does not wait (a
    clean stop's ``save_active``) takes its place, with its units: the batch's flush after
    it must not put the older document back."""
    import asyncio

    from hermes.gateway.config import load_config
    from hermes.gateway.durable import DurableState
    from hermes.gateway.scheduler import LiveScheduler

    cfg = load_config(None, environ={}, port=0, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"), log_level="warning")
    sched = LiveScheduler(cfg)
    store = SqliteRunStore(tmp_path / "runs.sqlite3")
    durable = DurableState(store, sched.ctx)

    async def go() -> None:
        run = sched.registry.create_run("app", tenant="t", inferred=True)
        durable.run_created(run)  # batched: waits for the window
        assert store.runs() == []
        inv = sched.registry.unit_for_request(run, "chat", "llm:m")
        inv.closed = True
        run.status = "running"
        durable.save_active([run])  # at once, the newer document
        durable.flush()  # the window's end: nothing of the creation is left to write
        (doc,) = store.runs()
        assert doc["status"] == "running" and doc["n_units"] == 1

    asyncio.run(go())
    store.close()


def test_an_inferred_runs_creation_waits_for_the_window_only_without_a_shared_index(
        tmp_path: Path) -> None:
    """Without ``[cluster] store`` the resolver's index dies with the process, so a stored
    inferred run would not be joined after a crash: its creation waits for the batch window.
    With it the index survives in Redis: the creation is written on the next loop iteration,
    before the first answer can leave, so that the next turn joins it after a crash."""
    import asyncio
    from types import SimpleNamespace

    from hermes.gateway.config import load_config
    from hermes.gateway.durable import DurableState
    from hermes.gateway.scheduler import LiveScheduler

    cfg = load_config(None, environ={}, port=0, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"), log_level="warning")
    sched = LiveScheduler(cfg)
    shared = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(
        update={"store": "redis://127.0.0.1:1/0"})})
    written = {}
    for name, config in (("local", cfg), ("shared", shared)):
        store = SqliteRunStore(tmp_path / f"{name}.sqlite3")
        durable = DurableState(store, SimpleNamespace(config=config))  # type: ignore[arg-type]

        async def go(durable: DurableState = durable, store: SqliteRunStore = store) -> list:
            run = sched.registry.create_run("app", tenant="t", inferred=True)
            durable.run_created(run)
            await asyncio.sleep(0)  # the next loop iteration (the window is 10 ms)
            await asyncio.sleep(0)
            now = [d["run_id"] for d in store.runs()]
            await asyncio.sleep(0.05)
            assert [d["run_id"] for d in store.runs()] == [run.run_id]
            return now

        written[name] = asyncio.run(go())
        store.close()
    assert written["local"] == [] and len(written["shared"]) == 1


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_history_entries_read_back_as_written_and_are_pruned_with_the_ended_runs(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A history entry (a run that ended without ever being stored: its finished document
    and extras as the scheduler keeps them) is read back byte for byte, in order among the
    run documents, replaces a document an earlier leader stored of the same run,
    counts as an ended run for pruning, and survives reopening the store."""
    from hermes.gateway.run_store import HISTORY

    prefix = f"h{time.time()}:"
    url = request.getfixturevalue("redis_url") if kind == "redis" else ""

    def open_store() -> SqliteRunStore | RedisRunStore:
        return (SqliteRunStore(tmp_path / "s.db") if kind == "sqlite"
                else RedisRunStore(url, prefix=prefix))

    def doc(rid: str, submitted: float, **kw: object) -> bytes:
        return json.dumps({"run_id": rid, "app": "a", "tenant": "acme", "state": "finished",
                           "submitted": submitted, "finished": submitted + 1.0,
                           "hosted": False, "units": [], **kw}, separators=(",", ":")).encode()

    store = open_store()
    # "h1": stored while it ran by an earlier leader, then ended here as a history entry
    store.put_run("h1", "running", {"run_id": "h1", "status": "running", "submitted": 1.0,
                                    "n_units": 1}, {0: {"unit": "u"}})
    store.put_run("r2", "running", {"run_id": "r2", "status": "running", "submitted": 2.0})
    h1 = doc("h1", 1.0, note="caf\u00e9 \\n")
    h3 = doc("h3", 3.0)
    extra = b'{"units_done":["u"]}'
    store.put_runs([("r4", "finished", {"run_id": "r4", "status": "finished",
                                         "submitted": 4.0}, {})],
                   history=[("h1", 1.0, h1, extra), ("h3", 3.0, h3, None)])
    for _ in range(2):  # and once more after reopening
        got = store.runs()
        # Redis orders by acceptance, SQLite by first write (a history entry's is its end)
        assert [d["run_id"] for d in got] == (["h1", "r2", "h3", "r4"] if kind == "redis"
                                              else ["r2", "r4", "h1", "h3"])
        by = {d["run_id"]: d for d in got}
        assert by["h1"][HISTORY] == (h1, extra) and by["h3"][HISTORY] == (h3, None)
        assert (by["h1"]["status"], by["h1"]["submitted"], by["h1"]["finished"],
                by["h1"]["tenant"]) == ("finished", 1.0, 2.0, "acme")
        assert HISTORY not in by["r2"] and HISTORY not in by["r4"]
        if kind == "redis":
            assert isinstance(store, RedisRunStore)
            assert [d["run_id"] for d in store.active_runs()] == ["r2"]
            assert [d["run_id"] for c in store.ended_runs_chunks() for d in c] == \
                ["h1", "h3", "r4"]
        store.close()
        store = open_store()
    assert store.prune_ended(1) == 2  # the two oldest ended (r2 is active), in that order
    assert [d["run_id"] for d in store.runs()] == (["r2", "r4"] if kind == "redis"
                                                   else ["r2", "h3"])
    if kind == "redis":  # the pruned entries themselves are gone, not only their order
        assert redis.Redis.from_url(url).hlen(prefix + "history") == 0
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_damaged_history_entry_is_skipped_and_named(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest,
        caplog: pytest.LogCaptureFixture) -> None:
    """One damaged history entry (not JSON, or a document without its run's fields) is
    left out and logged by name; every other run still reads back."""
    store = (SqliteRunStore(tmp_path / "s.db") if kind == "sqlite"
             else RedisRunStore(request.getfixturevalue("redis_url"), prefix=f"d{time.time()}:"))
    good = b'{"run_id":"ok","app":"a","state":"finished","submitted":2.0}'
    store.put_runs([("r", "running", {"run_id": "r", "status": "running", "submitted": 0.5},
                     {})],
                   history=[("bad", 1.0, b"{not json", None), ("ok", 2.0, good, None),
                          ("noapp", 3.0, b'{"run_id":"noapp","state":"finished",'
                                         b'"submitted":3.0}', None)])
    with caplog.at_level("WARNING", logger="hermes.gateway.run_store"):
        got = store.runs()
    assert sorted(d["run_id"] for d in got) == ["ok", "r"]
    assert "run bad skipped" in caplog.text and "run noapp skipped" in caplog.text
    store.close()

"""Split roles, runs inferred at the edge (:mod:`hermes.gateway.edge.infer`): the edge's
resolver, the wire fields it adds, and the scheduler's side (the inferred run found or
created, closed on an edge's word unless it was active since). The processes (two edges, a
shared index in Redis): tests/gateway/test_edge_split.py (slow tier)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from gw_redis import redis_url  # noqa: F401  (fixture)

from hermes.gateway.config import IdentityConfig, load_config
from hermes.gateway.edge import wire
from hermes.gateway.edge.infer import EdgeRuns, close_due, run_headers

SYSTEM = {"role": "system", "content": "You are a careful research agent."}


def _body(messages: list[dict]) -> dict:
    return {"model": "m", "messages": messages, "max_tokens": 8}


def _call(**kw: object) -> wire.Call:
    base: dict = dict(rid="edge-0123456789abcdef", reply_to="tcp://10.0.0.7:7001", model="m",
                      endpoint="chat", prompt_tokens=12,
                      body={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
    return wire.Call(**{**base, **kw})  # type: ignore[arg-type]


def test_an_inferred_call_and_a_closed_message_are_compact_and_round_trip() -> None:
    plain = _call()
    inferred = _call(run="run-0123456789abcdef", app="default.app-3f2a1c", unit="u-7c1e02",
                     inferred=True, new=True)
    back = wire.decode_edge(wire.encode(inferred))
    assert back == inferred and back.inferred and back.new and not back.direct
    assert not wire.decode_edge(wire.encode(plain)).inferred  # defaults are not sent
    extra = len(wire.encode(inferred)) - len(wire.encode(plain))
    # run id, app, unit and two flags: the ids themselves and ~30 bytes of field names
    assert extra <= 110, extra
    closed = wire.Closed(runs=[wire.ClosedRun(f"run-{i:016x}", 12.5) for i in range(100)])
    frame = wire.encode(closed)
    assert wire.decode_edge(frame) == closed
    assert len(frame) < 100 * 32  # one array of [id, idle] per run, one message per sweep


def test_close_due() -> None:
    assert close_due(12.0, 12.1, 0)  # idle as long here as at the edge: end it
    assert close_due(12.0, 11.9, 0)  # within the slack (the message's transit)
    assert not close_due(12.0, 3.0, 0)  # a call through another edge since: it closes later
    assert not close_due(12.0, 12.0, 1)  # a request in flight


def test_the_edge_resolver_joins_turns_and_closes_idle_runs() -> None:
    runs = EdgeRuns(IdentityConfig(close_prior_s=10.0, close_min_s=5.0))
    assert runs.enabled
    msgs = [SYSTEM, {"role": "user", "content": "Find the capital of France."}]
    t = 1000.0
    first = runs.resolve("acme", _body(msgs), {}, t)
    assert first is not None and first.new_run and first.run.startswith("run-")
    assert first.app.startswith("acme.")
    reply = {"role": "assistant", "content": "Paris."}
    runs.answered(first, [reply], t + 0.5)
    msgs2 = [*msgs, reply, {"role": "user", "content": "And of Spain?"}]
    second = runs.resolve("acme", _body(msgs2), {}, t + 2.0)
    assert second is not None and second.run == first.run and not second.new_run
    assert second.evidence == "continuation"
    runs.answered(second, [{"role": "assistant", "content": "Madrid."}], t + 2.5)
    h = run_headers(second)
    assert h == {"X-Hermes-Run": first.run, "X-Hermes-Unit": second.unit,
                 "X-Hermes-App": second.app}
    # another tenant's identical conversation is another run
    other = runs.resolve("globex", _body(msgs2), {}, t + 2.6)
    assert other is not None and other.run != first.run
    runs.abandoned(other, t + 2.7)
    # not in an inferred run: a named run, an opt-out
    assert runs.resolve("acme", _body(msgs), {"X-Hermes-Run": "run-x"}, t + 3) is None
    assert runs.resolve("acme", _body(msgs), {"X-Hermes-Run": "none"}, t + 3) is None
    # idle: closed after its app's figure (the prior, 10 s), told once
    assert runs.sweep(t + 6.0) == []
    closed = runs.sweep(t + 30.0)
    got = {c.run: c.idle_s for c in closed}
    assert got[first.run] == 27.5 and other.run in got
    assert runs.sweep(t + 31.0) == closed  # not told yet: kept for the next sweep
    runs.told()
    assert runs.sweep(t + 32.0) == [] and runs.closed == 2
    # a continuation after the close starts a new run
    late = runs.resolve("acme", _body([*msgs2, {"role": "assistant", "content": "Madrid."},
                                       {"role": "user", "content": "Italy?"}]), {}, t + 40)
    assert late is not None and late.new_run and late.run != first.run


def test_inference_off_leaves_calls_to_the_fast_path() -> None:
    runs = EdgeRuns(IdentityConfig(infer=False))
    assert not runs.enabled


def test_the_scheduler_joins_creates_and_closes_an_edges_inferred_runs(tmp_path: Path) -> None:
    from hermes.gateway.edge.link import EdgeLink, InferredRunEnded
    from hermes.gateway.scheduler import LiveScheduler

    cfg = load_config(None, environ={}, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"))

    async def main() -> None:
        sched = LiveScheduler(cfg)
        link = EdgeLink(sched, "inproc://unused")
        reg = sched.registry
        c = _call(run="run-aaaa", app="acme.agent", unit="plan", tenant="acme",
                  inferred=True, new=True)
        run = link._inferred_run(c)
        assert run.run_id == "run-aaaa" and run.inferred and run.app == "acme.agent"
        assert run.state.tenant == "acme" and run.lazy_store
        assert link._inferred_run(_call(run="run-aaaa", app="acme.agent", inferred=True)) is run
        # activity here since the edge's last: not closed (another edge's call)
        run.last_activity = time.monotonic()
        assert link.close_inferred([wire.ClosedRun("run-aaaa", 30.0)]) == 0
        assert run.status in ("queued", "running")
        # idle here as long as at the edge: finished, at its last activity
        run.last_activity = time.monotonic() - 30.0 / cfg.scheduler.time_scale
        assert link.close_inferred([wire.ClosedRun("run-aaaa", 30.0),
                                    wire.ClosedRun("run-unknown", 1.0)]) == 1
        assert reg.get_run("run-aaaa").status == "finished" and link.closed_runs == 1
        # a call of it from an edge that still tracked it: refused (the edge resolves it
        # again, so that its answer names the run it joins), no run made under another id
        with pytest.raises(InferredRunEnded) as refused:
            link._inferred_run(_call(run="run-aaaa", app="acme.agent", tenant="acme",
                                     inferred=True))
        assert refused.value.code == wire.RUN_ENDED and refused.value.status == 409
        assert len(reg.runs) == 0

    asyncio.run(main())


def test_a_closed_run_that_waited_in_the_queue_ends_as_at_receipt(tmp_path: Path) -> None:
    """An edge's ``closed`` message is finished a slice at a time: a run that waited in
    the queue is judged by its idleness when the message came (activity after it: not due)
    and ends at its last activity, not later by the wait."""
    from hermes.gateway.edge.link import EdgeLink
    from hermes.gateway.scheduler import LiveScheduler

    cfg = load_config(None, environ={}, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"))

    async def main() -> None:
        sched = LiveScheduler(cfg)
        link = EdgeLink(sched, "inproc://unused")
        scale = cfg.scheduler.time_scale
        runs = [link._inferred_run(_call(run=f"run-{i}", app="acme.agent", unit="plan",
                                         tenant="acme", inferred=True, new=True))
                for i in range(2)]
        received = time.monotonic()
        for r in runs:
            r.last_activity = received - 30.0 / scale
        last_seen = sched.ctx.now() - 30.0
        waited = 2.0  # wall seconds in the queue
        # run-1 came back to life after the message (a call through another edge)
        runs[1].last_activity = received + 1.0
        assert link._close_one((wire.ClosedRun("run-0", 30.0), received - waited)) is False
        assert link._close_one((wire.ClosedRun("run-1", 30.0), received)) is False
        assert runs[1].status in ("queued", "running")
        # (received - waited: it was told 2 s ago, when it had been idle 28 s here)
        runs[0].last_activity = received - waited - 28.0 / scale
        assert link._close_one((wire.ClosedRun("run-0", 28.0), received - waited)) is True
        ended = sched.registry.get_run("run-0").state.finished
        assert ended == pytest.approx(last_seen, abs=0.5 * scale)

    asyncio.run(main())


def test_run_parameters_travel_only_when_set() -> None:
    plain = wire.encode(_call())
    assert len(wire.encode(_call(k=None, deadline_s=None, authed=False))) == len(plain)
    back = wire.decode_edge(wire.encode(_call(k=0.3, deadline_s=30.0, authed=True)))
    assert isinstance(back, wire.Call) and (back.k, back.deadline_s, back.authed) == \
        (0.3, 30.0, True)
    failed = wire.CallFailed(rid="r", epoch=1, status=404, code="model_not_found",
                             message="m", param="model")
    assert wire.decode_scheduler(wire.encode(failed)) == failed


def test_an_edges_resolver_state_is_saved_and_handed_over(tmp_path: Path) -> None:
    from hermes.gateway.edge.infer import HandedRuns

    runs = EdgeRuns(IdentityConfig(close_prior_s=10.0, close_min_s=5.0))
    first = runs.resolve("acme", _body([SYSTEM, {"role": "user", "content": "Go."}]), {}, 100.0)
    assert first is not None
    reply = {"role": "assistant", "content": "Done."}
    runs.answered(first, [reply], 101.0)
    held = runs.held(104.0)
    assert [(h.run, h.idle_s, h.close_after_s) for h in held] == [(first.run, 3.0, 10.0)]
    path = tmp_path / "edge-identity-e0.json"
    assert runs.save(path) == 1
    again = EdgeRuns(IdentityConfig(close_prior_s=10.0, close_min_s=5.0))
    assert again.load(path) == 1 and not path.exists()  # read once
    nxt = again.resolve("acme", _body([SYSTEM, {"role": "user", "content": "Go."}, reply,
                                       {"role": "user", "content": "More."}]), {}, 105.0)
    assert nxt is not None and nxt.run == first.run and not nxt.new_run
    # the run ended at the scheduler: forgotten, the call resolved again is a new run
    again.ended(nxt, 106.0)
    redo = again.resolve("acme", _body([SYSTEM, {"role": "user", "content": "Go."}, reply,
                                        {"role": "user", "content": "More."}]), {}, 106.0)
    assert redo is not None and redo.new_run and redo.run != first.run

    class Run:  # what HandedRuns reads of a LiveRun
        def __init__(self, last: float) -> None:
            self.status, self.last_activity, self.pending = "running", last, {}

    handed = HandedRuns()
    live = {"a": Run(0.0), "b": Run(0.0), "d": Run(0.1)}
    # (at 0.1 s, time scale 50: a and b idle 5 model s here as at the edge; c unknown
    # here; d active here since the edge saw it: another edge holds it)
    handed.take([wire.HeldRun("a", 5.0, 10.0), wire.HeldRun("b", 5.0, 10.0),
                 wire.HeldRun("c", 5.0, 10.0), wire.HeldRun("d", 5.0, 10.0)], live, 0.1, 50.0)
    assert len(handed) == 2
    assert handed.due(live, 0.1, 50.0) == [] and len(handed) == 2  # 5 model s idle
    live["b"].pending = {"req": 1}  # in flight: waits
    handed.pop("a")  # a call of a came (an edge holds it)
    assert handed.due(live, 0.3, 50.0) == [] and len(handed) == 1
    live["b"].pending = {}
    assert handed.due(live, 0.3, 50.0) == [wire.ClosedRun("b", 15.0)] and not handed


def test_app_names_travel_in_pongs_only_when_an_edge_lacks_them(tmp_path: Path) -> None:
    """The scheduler's side of the app names (module doc of ``infer``, "App names"): a
    new run's first call makes its app known there (listed, renamed, merged); a pong carries
    the mapping only to an edge whose ping names another digest; an elected standby on the
    same knowledge base reads the mapping the leader changed since it started."""
    from hermes.gateway.edge.link import EdgeLink
    from hermes.gateway.scheduler import LiveScheduler

    cfg = load_config(None, environ={}, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"))
    runs = EdgeRuns(IdentityConfig())
    ident = runs.resolve("acme", _body([SYSTEM, {"role": "user", "content": "Go."}]), {}, 1.0)
    assert ident is not None and ident.new_run and ident.app.startswith("acme.")

    async def main() -> None:
        sched, standby = LiveScheduler(cfg), LiveScheduler(cfg)
        link = EdgeLink(sched, "inproc://unused")
        ids = sched.identities
        sent: list[wire.SchedulerMessage] = []
        link._send = lambda _who, msg: sent.append(msg)  # type: ignore[method-assign]

        def pong(digest: str) -> wire.Pong:
            link.handle(b"e0", wire.decode_edge(wire.encode(wire.Ping(edge="e0",
                                                                      names=digest))))
            msg = sent.pop()
            assert isinstance(msg, wire.Pong)
            return msg

        first = pong("")  # a new edge: the mapping (empty), with its digest
        assert first.names is not None and first.names.renames == {} and \
            first.names.digest == ids.names_digest
        runs.follow_names(first.names)
        assert pong(runs.names_digest).names is None  # followed: nothing more
        small = wire.encode(wire.Pong(epoch=3))
        assert len(small) < 20 and wire.decode_scheduler(small) == wire.Pong(epoch=3)
        assert len(wire.encode(wire.Ping(edge="edge-7", names=runs.names_digest))) < 50
        # the edge's new run makes its app known; renamed there, the edge is told
        link._inferred_run(_call(run=ident.run, app=ident.app, unit=ident.unit,
                                 tenant="acme", inferred=True, new=True,
                                 app_id=ident.app_id))
        assert [a.name for a in ids.apps()] == [ident.app]
        sched.rename_app(ident.app, "acme.researcher")
        told = pong(runs.names_digest).names
        assert told is not None and told.renames == {ident.app_id: "acme.researcher"}
        runs.follow_names(told)
        again = runs.resolve("acme", _body([SYSTEM, {"role": "user", "content": "No."}]), {},
                             2.0)
        assert again is not None and again.app == "acme.researcher"  # the next new run
        # a standby elected later reads what the leader stored since it started
        assert standby.identities.names_digest != ids.names_digest
        assert standby.identities.reload_names()
        assert standby.identities.names_digest == ids.names_digest
        assert not standby.identities.reload_names()  # unchanged: nothing to do

    asyncio.run(main())


def test_the_served_models_travel_in_pongs_only_when_they_change(tmp_path: Path) -> None:
    """The scheduler's served-model set (``count_tokens`` at the edges): in the pong to an
    edge whose ping names another digest only; a node's hello changes it (and its digest),
    and the edge's answer from it is the scheduler's own (:func:`resolve_served`)."""
    from hermes import protocol as P
    from hermes.gateway.edge.link import EdgeLink
    from hermes.gateway.errors import ModelNotFound, WrongTask
    from hermes.gateway.scheduler import LiveScheduler
    from hermes.gateway.served import resolve_served

    cfg = load_config(None, environ={}, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"))

    async def main() -> None:
        sched = LiveScheduler(cfg)
        link = EdgeLink(sched, "inproc://unused")
        sent: list[wire.SchedulerMessage] = []
        link._send = lambda _who, msg: sent.append(msg)  # type: ignore[method-assign]

        def pong(digest: str) -> wire.Pong:
            link.handle(b"e0", wire.decode_edge(wire.encode(wire.Ping(edge="e0",
                                                                      models=digest))))
            msg = wire.decode_scheduler(wire.encode(sent.pop()))
            assert isinstance(msg, wire.Pong)
            return msg

        empty = pong("").models
        assert empty is not None and empty.nodes == 0 and empty.models(None) == []
        assert pong(empty.digest).models is None  # held: nothing more
        hello = P.Hello(node="n1", engines=[
            P.EngineInfo(name="a", model="m-chat", kind="sim", max_inflight=4,
                         loras=["m-lora"]),
            P.EngineInfo(name="b", model="m-embed", kind="sim", max_inflight=4,
                         task="embed")])
        sched.node_table.observe(b"n1", hello)
        got = pong(empty.digest).models
        assert got is not None and got.digest != empty.digest and got.nodes == 1
        assert got.served == {"generate": ["m-chat", "m-lora"], "embed": ["m-embed"]}
        assert pong(got.digest).models is None
        sched.node_table.observe(b"n1", hello)  # the same engines again: the same set
        assert pong(got.digest).models is None
        for model in ("m-chat", "m-lora", "m-embed", "nope", ""):
            for task in ("generate", "embed"):
                outcomes = []
                for resolve in (
                        lambda m, t: sched.resolve_model(m, strict=True, task=t),
                        lambda m, t: resolve_served(
                            m, strict=True, task=t, served=got.models,
                            default_model=got.default_model, route_unknown=got.route_unknown)):
                    try:
                        outcomes.append(resolve(model, task))
                    except (ModelNotFound, WrongTask) as e:
                        outcomes.append(f"{type(e).__name__}: {e}")
                assert outcomes[0] == outcomes[1], (model, task, outcomes)

    asyncio.run(main())


def test_a_new_leader_lists_the_apps_the_edges_report(tmp_path: Path) -> None:
    """An edge tells a newly elected scheduler the apps its resolver knows (one ``apps``
    message): listed there at once (their runs counted over the edges), renamed through
    it, and the edge follows the rename; the scheduler notes nothing per call for it."""
    from hermes.gateway.edge.link import EdgeLink
    from hermes.gateway.scheduler import LiveScheduler

    cfg = load_config(None, environ={}, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"))
    e0, e1 = EdgeRuns(IdentityConfig()), EdgeRuns(IdentityConfig())
    tool = {"type": "function", "function": {"name": "search", "parameters": {}}}
    a = e0.resolve("acme", {**_body([SYSTEM, {"role": "user", "content": "Go."}]),
                            "tools": [tool]}, {}, 10.0)
    b = e1.resolve("acme", {**_body([SYSTEM, {"role": "user", "content": "Again."}]),
                            "tools": [tool]}, {}, 12.0)
    other = e1.resolve("acme", _body([{"role": "system", "content": "You sum numbers."},
                                      {"role": "user", "content": "1+1"}]), {}, 13.0)
    assert a is not None and b is not None and other is not None
    assert a.app == b.app != other.app  # the same app at both edges, one run each

    async def main() -> None:
        sched = LiveScheduler(cfg)
        link = EdgeLink(sched, "inproc://unused")
        sent: list[wire.SchedulerMessage] = []
        link._send = lambda _who, msg: sent.append(msg)  # type: ignore[method-assign]
        assert sched.identities.apps() == []
        for i, runs in enumerate((e0, e1)):
            msg = wire.Apps(apps=runs.apps_seen(20.0))
            link.handle(f"e{i}".encode(), wire.decode_edge(wire.encode(msg)))
        listed = {x.name: x for x in sched.identities.apps()}
        assert set(listed) == {a.app, other.app}
        assert listed[a.app].runs == 2 and listed[other.app].runs == 1
        assert listed[a.app].tools == ["search"] and listed[a.app].app_id == a.app_id
        assert listed[a.app].instructions.startswith("You are a careful")
        sched.rename_app(a.app, "acme.searcher")
        link.handle(b"e0", wire.decode_edge(wire.encode(
            wire.Ping(edge="e0", names=e0.names_digest))))
        told = sent.pop()
        assert isinstance(told, wire.Pong) and told.names is not None
        e0.follow_names(told.names)
        nxt = e0.resolve("acme", {**_body([SYSTEM, {"role": "user", "content": "More."}]),
                                  "tools": [tool]}, {}, 30.0)
        assert nxt is not None and nxt.new_run and nxt.app == "acme.searcher"

    asyncio.run(main())


def test_an_all_in_one_leader_stores_its_inferred_apps_for_the_next(tmp_path: Path) -> None:
    """Elected all-in-one gateways have no edges to tell a new leader their apps: the leader
    stores the apps its resolver inferred in the knowledge base they share (once some were
    added), and the gateway elected next lists them, with their tools, instructions and
    runs, before their next run. A damaged document is logged and ignored."""
    from hermes.gateway.identity import APPS_DOC
    from hermes.gateway.scheduler import LiveScheduler

    cfg = load_config(None, environ={}, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"))
    tool = {"type": "function", "function": {"name": "search", "parameters": {}}}

    async def main() -> None:
        leader, standby = LiveScheduler(cfg), LiveScheduler(cfg)
        ids = leader.identities
        assert ids.take_apps_doc() is None  # nothing inferred: nothing to store
        for text in ("Go.", "Again."):  # two runs of one app (no continuation)
            run, ident = ids.bind("acme", {**_body([SYSTEM, {"role": "user", "content": text}]),
                                           "tools": [tool]}, {})
            assert run.inferred and ident.new_run
        doc = ids.take_apps_doc()
        assert doc is not None and ids.take_apps_doc() is None  # no app added since
        ids.store_apps(doc)
        assert standby.identities.apps() == []
        rows = standby.identities.stored_apps()
        assert standby.identities.learned_stored(rows) == 1
        (app,) = standby.identities.apps()
        assert app.name == ident.app and app.app_id == ident.app_id and app.runs == 2
        assert app.tools == ["search"] and app.instructions.startswith("You are a careful")
        standby.rename_app(ident.app, "acme.searcher")  # found by its name there
        # an app added later makes a new document; a write that failed is made again
        ids.bind("acme", _body([{"role": "system", "content": "You sum numbers."},
                                {"role": "user", "content": "1+1"}]), {})
        assert ids.take_apps_doc() is not None and ids.take_apps_doc() is None
        ids.apps_doc_not_stored()
        again = ids.take_apps_doc()
        assert again is not None and len(json.loads(again)["apps"]) == 2
        leader.kb.put_doc(APPS_DOC, "{not json")
        assert standby.identities.stored_apps() == []
        for s in (leader, standby):
            s.durable.close()

    asyncio.run(main())


def test_the_scheduler_forgets_the_runs_it_closes_in_one_round_trip(
        tmp_path: Path, redis_url: str) -> None:  # noqa: F811
    """With a shared evidence index (``[cluster] store``) the scheduler drops each run it
    ends on an edge's close from the index, so that no edge adopts it any more. The runs a
    slice of closes ends leave together at the end of the loop iteration, one round trip
    (a blocking round trip per run held its event loop a third of the time at 2,000
    one-turn calls/s); the runs not closed stay."""
    import uuid

    from hermes.gateway.edge.link import EdgeLink
    from hermes.gateway.scheduler import LiveScheduler
    from hermes.gateway.shared import SharedStore
    from hermes.gateway.shared.evidence import RedisKeyIndex

    cfg = load_config(None, environ={}, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"))
    store = SharedStore(redis_url, prefix=f"t{uuid.uuid4().hex[:8]}:")
    index = RedisKeyIndex(store, max_per_tenant=1000, ttl_s=600)
    trips: list[list[tuple[str, str]]] = []
    real = index.forget_runs

    def counted(runs: list[tuple[str, str]]) -> None:
        trips.append(list(runs))
        real(runs)

    index.forget_runs = counted  # type: ignore[method-assign]

    async def main() -> None:
        sched = LiveScheduler(cfg)
        sched.identities.shared_index = index
        link = EdgeLink(sched, "inproc://unused")
        runs = [("acme", "run-a1"), ("acme", "run-a2"), ("beta", "run-b1"), ("beta", "run-b2")]
        for tenant, rid in runs:
            run = link._inferred_run(_call(run=rid, app=f"{tenant}.agent", tenant=tenant,
                                           inferred=True, new=True))
            run.last_activity = time.monotonic() - 60.0 / cfg.scheduler.time_scale
            index.remember_run(tenant, rid, f"{tenant}.agent", "id-" + rid)
        closed = [wire.ClosedRun(rid, 30.0) for _, rid in runs[:3]]
        assert link.close_inferred(closed) == 3
        assert all(index.run_info(t, r) is not None for t, r in runs)  # not yet: this iteration
        dels = deletes()
        await asyncio.sleep(0)
        assert trips == [runs[:3]]  # one round trip for the three, both tenants
        assert deletes() - dels == 2  # one DEL per tenant, not per run
        assert [index.run_info(t, r) for t, r in runs[:3]] == [None, None, None]
        assert index.run_info("beta", "run-b2") == ("beta.agent", "id-run-b2")  # still open
        # one tenant's runs: one DEL, no pipeline
        for rid in ("run-c1", "run-c2", "run-c3"):
            index.remember_run("gamma", rid, "gamma.agent", "id-" + rid)
        dels = deletes()
        index.forget_runs([("gamma", "run-c1"), ("gamma", "run-c2")])
        assert deletes() - dels == 1
        assert index.run_info("gamma", "run-c1") is None is index.run_info("gamma", "run-c2")
        assert index.run_info("gamma", "run-c3") == ("gamma.agent", "id-run-c3")

    def deletes() -> int:
        stats = store.client.info("commandstats")
        return int(stats.get("cmdstat_del", {}).get("calls", 0))

    try:
        asyncio.run(main())
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_an_edges_run_that_ends_unstored_is_kept_as_its_finished_document(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """An edge's inferred run never written while it ran is stored at its end as the
    finished document the scheduler keeps (bytes shared, no run or unit document written
    again), and a scheduler started on that store answers for it as the first did, and
    refuses a late call of it; a run stored while it ran (not lazily) ends as before."""
    import redis

    from hermes.gateway.edge.link import EdgeLink, InferredRunEnded
    from hermes.gateway.run_store import HISTORY
    from hermes.gateway.scheduler import LiveScheduler

    extra: dict[str, object] = {}
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        redis.Redis.from_url(url).flushdb()
        extra["state_redis"] = url
    cfg = load_config(None, environ={}, bind="", kb=str(tmp_path / "kb"),
                      state_dir=str(tmp_path / "state"), **extra)  # type: ignore[arg-type]

    async def first() -> dict:
        sched = LiveScheduler(cfg)
        link = EdgeLink(sched, "inproc://unused")
        reg = sched.registry
        run = link._inferred_run(_call(run="run-aaaa", app="acme.agent", unit="plan",
                                       tenant="acme", inferred=True, new=True))
        inv = sched.unit_for_request(run, "plan", "llm:m")
        reg.close_unit(run, inv, sched.ctx.now())
        # an inferred run stored at its creation (a gateway's with a shared evidence index)
        other = reg.create_run("acme.agent", tenant="acme", inferred=True)
        run.last_activity = time.monotonic() - 30.0 / cfg.scheduler.time_scale
        assert link.close_inferred([wire.ClosedRun("run-aaaa", 30.0)]) == 1
        reg.finish_run(other.run_id)
        sched.durable.flush()
        assert sched.durable.store is not None
        stored = {d["run_id"]: d for d in sched.durable.store.runs()}
        assert stored["run-aaaa"][HISTORY] == reg.finished.encoded("run-aaaa")
        assert HISTORY not in stored[other.run_id]  # written as a run, with its units
        doc = reg.get_run("run-aaaa").to_json()
        assert doc["units"][0]["unit"] == "plan" and doc["state"] == "finished"
        sched.durable.close()
        return doc

    async def second(doc: dict) -> None:
        sched = LiveScheduler(cfg)
        sched.recovery.recover(lambda app: None, lambda *a: None)
        await asyncio.wait_for(sched.recovery.ended_ready.wait(), 5.0)
        back = sched.registry.get_run("run-aaaa")
        assert back.to_json() == doc and back.state.tenant == "acme"
        assert back.progress.finished == ("plan",)
        with pytest.raises(InferredRunEnded):
            EdgeLink(sched, "inproc://unused")._inferred_run(
                _call(run="run-aaaa", app="acme.agent", tenant="acme", inferred=True))
        sched.durable.close()

    asyncio.run(second(asyncio.run(first())))

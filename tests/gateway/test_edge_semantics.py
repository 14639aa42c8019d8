"""An edge (``hermes serve --role edge``) answers the completion calls it serves as the
all-in-one gateway does: the run headers checked and applied (``X-Hermes-K``,
``X-Hermes-Deadline-S``), other tenants' apps and runs refused, a refusal with its HTTP
status also for a stream, the answer naming the run the call was really counted in when its
inferred run ended at the scheduler meanwhile, the active-run quota counting the same runs,
and the inferred runs an edge holds handed over on a clean stop (saved for the edge started
in its place; closed on time by the scheduler otherwise).

Real parts in one test process (``edge_inproc``): Redis (the lease, the durable runs, the
shared store), a ``--role scheduler`` gateway, a HermesLet with the built-in engine, edges;
the all-in-one gateway beside them for the same requests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from edge_inproc import MODEL, Split, wait_for
from gw_redis import redis_url  # noqa: F401  (fixture)

from hermes import protocol as P
from hermes.gateway.keys import FileKeyStore
from hermes.gateway.server import BackgroundServer
from tests.sandbox import post_then_leave, processes_running, require_tool_sandbox

pytestmark = pytest.mark.timeout(120)

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
AGENT = [{"role": "system", "content": "You are a careful research agent."},
         {"role": "user", "content": "Find the capital of France."}]


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    auth = tmp_path / "auth.json"
    store = FileKeyStore(auth)
    return auth, {t: store.create(t) for t in ("alice", "bob")}


def _hermes(r: httpx.Response) -> dict[str, str]:
    return {k.lower(): v for k, v in r.headers.items() if k.lower().startswith("x-hermes-")}


def _post(base: str, headers: dict[str, str], body: dict[str, Any] = CHAT) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=30)


def _stream(base: str, headers: dict[str, str], body: dict[str, Any] = CHAT
            ) -> tuple[httpx.Response, str]:
    with httpx.stream("POST", f"{base}/v1/chat/completions", json={**body, "stream": True},
                      headers=headers, timeout=30) as r:
        return r, r.read().decode()


def test_run_headers_and_owners_are_checked_as_at_the_all_in_one(
        split: Callable[..., Split], make_gateway: Callable[..., BackgroundServer],
        keys: tuple[Path, dict[str, str]]) -> None:
    auth, key = keys
    sp = split(auth_file=str(auth))
    edge = sp.edge()
    aio = make_gateway(auth_file=str(auth))
    A = {"Authorization": f"Bearer {key['alice']}"}
    B = {"Authorization": f"Bearer {key['bob']}"}
    refusals = [
        ({**A, "X-Hermes-K": "2"}, 400),  # inferred call
        ({**A, "X-Hermes-Deadline-S": "-1"}, 400),
        ({**A, "X-Hermes-Run": "none", "X-Hermes-K": "zz"}, 400),  # the fast path's
        ({**A, "X-Hermes-App": "bob.agent"}, 403),  # another tenant's own app
        ({**A, "X-Hermes-Run": "none", "X-Hermes-App": "bob.agent"}, 403),
        ({**A, "X-Hermes-Tenant": "bob"}, 403),  # not the key's tenant
    ]
    for headers, status in refusals:
        want = _post(aio.url, headers)
        got = _post(edge.url, headers)
        assert want.status_code == status, (headers, want.text)
        assert (got.status_code, got.json()) == (status, want.json()), headers
        # a stream is refused the same way, before it starts
        r, text = _stream(edge.url, headers)
        assert (r.status_code, json.loads(text)) == (status, want.json()), headers
    # another tenant's run is not found; an ended run is not active: stream or not
    for base in (aio.url, edge.url):
        run = httpx.post(f"{base}/v1/runs", json={"app": "x"}, headers=B).json()["run_id"]
        r = _post(base, {**A, "X-Hermes-Run": run})
        assert r.status_code == 404 and r.json()["error"]["code"] == "run_not_found", r.text
        r, text = _stream(base, {**A, "X-Hermes-Run": run})
        assert r.status_code == 404 and json.loads(text)["error"]["code"] == "run_not_found"
        assert httpx.post(f"{base}/v1/runs/{run}/finish", headers=B).status_code == 200
        r, text = _stream(base, {**B, "X-Hermes-Run": run})
        assert r.status_code == 409, text
        assert json.loads(text)["error"]["code"] == "run_not_active"
        r, text = _stream(base, B, {**CHAT, "model": "nope"})
        assert r.status_code == 404 and json.loads(text)["error"]["param"] == "model"
    # good values are applied to the run the call creates
    for base in (aio.url, edge.url):
        r = _post(base, {**A, "X-Hermes-K": "0.3", "X-Hermes-Deadline-S": "30"},
                  {**CHAT, "messages": [*AGENT, {"role": "user", "content": base}]})
        assert r.status_code == 200, r.text
        run = httpx.get(f"{base}/v1/runs/{r.headers['X-Hermes-Run']}", headers=A).json()
        assert run["inferred"] and run["k"] == 0.3, run
        assert run["deadline"] == pytest.approx(run["submitted"] + 30, abs=1.0)


def test_a_call_of_an_ended_inferred_run_is_answered_under_the_run_it_joined(
        split: Callable[..., Split]) -> None:
    sp = split()
    edge = sp.edge()
    msgs = list(AGENT)
    seen: list[str] = []
    for turn, stream in enumerate((False, False, True, True)):
        if stream:
            r, text = _stream(edge.url, {}, {**CHAT, "messages": msgs})
            reply = "".join(json.loads(e[6:])["choices"][0]["delta"].get("content") or ""
                            for e in text.splitlines()
                            if e.startswith("data: {") and json.loads(e[6:])["choices"])
        else:
            r = _post(edge.url, {}, {**CHAT, "messages": msgs})
            reply = r.json()["choices"][0]["message"]["content"]
        assert r.status_code == 200
        run = r.headers["X-Hermes-Run"]
        seen.append(run)
        # the run the answer names is the scheduler's run of this call
        info = httpx.get(f"{edge.url}/v1/runs/{run}").json()
        assert info["state"] in ("queued", "running") and info["inferred"], (turn, info)
        if turn % 2 == 0:  # the scheduler ends it (as another edge's close, or the API)
            assert httpx.post(f"{edge.url}/v1/runs/{run}/finish").status_code == 200
        msgs = [*msgs, {"role": "assistant", "content": reply},
                {"role": "user", "content": f"Next step {turn}."}]
    # turn 1 continued turn 0's ended run: a new run; turn 2 joined turn 1's (open) run
    assert seen[1] != seen[0] and seen[2] == seen[1] and seen[3] != seen[2]
    assert all(sp.sched.registry.get_run(run) for run in seen)  # each is the scheduler's


def test_the_active_run_quota_counts_the_same_runs_as_at_the_all_in_one(
        split: Callable[..., Split], make_gateway: Callable[..., BackgroundServer],
        keys: tuple[Path, dict[str, str]]) -> None:
    """``tenant_max_active_runs`` counts the runs a tenant starts (``POST /v1/runs``), not
    the gateway's bookkeeping of plain traffic (one-request calls, on an edge the fast
    path, and inferred runs): at the quota, plain calls are served and a new run is 429,
    through an edge as at the all-in-one gateway."""
    auth, key = keys
    A = {"Authorization": f"Bearer {key['alice']}"}
    sp = split(auth_file=str(auth), tenant_max_active_runs=1)
    edge = sp.edge()
    aio = make_gateway(auth_file=str(auth), tenant_max_active_runs=1)
    for base in (aio.url, edge.url):
        assert httpx.post(f"{base}/v1/runs", json={"app": "x"}, headers=A).status_code == 201
        again = httpx.post(f"{base}/v1/runs", json={"app": "x"}, headers=A)
        assert again.status_code == 429 and again.json()["error"]["code"] == "run_quota"
        for h in ({}, {"X-Hermes-Run": "none"}, {"X-Hermes-Run": "none", "X-Hermes-App": "x"}):
            assert _post(base, {**A, **h}).status_code == 200, h


def _agent_turn(base: str, msgs: list[dict[str, str]]) -> tuple[str, list[dict[str, str]]]:
    r = _post(base, {}, {**CHAT, "messages": msgs})
    assert r.status_code == 200, r.text
    reply = r.json()["choices"][0]["message"]["content"]
    return r.headers["X-Hermes-Run"], [*msgs, {"role": "assistant", "content": reply},
                                       {"role": "user", "content": "Go on."}]


def test_an_edge_stopped_cleanly_hands_its_runs_over(split: Callable[..., Split],
                                                     redis_url: str) -> None:  # noqa: F811
    # its own index: the edge started in its place (same member, same state directory)
    # joins the next turn to the run
    sp = split()
    e0 = sp.edge("edge0")
    run, msgs = _agent_turn(e0.url, AGENT)
    e0.stop()
    e0 = sp.edge("edge0")
    assert httpx.get(e0.url + "/readyz").json()["inferred_open"] == 1
    again, msgs = _agent_turn(e0.url, msgs)
    assert again == run
    assert sp.sched.registry.runs[run].status in ("queued", "running")


def test_a_stopped_edges_runs_are_closed_on_time_by_the_scheduler(
        split: Callable[..., Split], redis_url: str) -> None:  # noqa: F811
    # a shared index: the next turn joins through any edge; a run no turn comes for is
    # closed by the scheduler at its app's idle figure (100 model s here: 2 s), not left to
    # the idle reaping (600 s)
    sp = split(cluster={"store": redis_url},
               identity={"close_prior_s": 100.0, "close_min_s": 50.0})
    e0, e1 = sp.edge("edge0"), sp.edge("edge1")
    kept, kmsgs = _agent_turn(e0.url, AGENT)
    left, _ = _agent_turn(e0.url, [AGENT[0], {"role": "user", "content": "Another task."}])
    e0.stop()
    joined, _ = _agent_turn(e1.url, kmsgs)  # through the other edge, at once: its run
    assert joined == kept
    # (the registry is the scheduler thread's: wait for the run among the finished ones)
    wait_for(lambda: left in sp.sched.registry.finished, timeout=10, what="handover close")
    assert sp.sched.registry.get_run(left).status == "finished"
    assert len(sp.scheduler_state.edge_link.handed) == 0  # kept: taken over by edge1's call


#: the bound within which a rename or merge reaches every edge (the ping period, 0.2 s, and
#: a round trip; generous for a loaded 2-core machine)
NAMES_BOUND_S = 1.0


def test_edges_follow_the_operators_app_renames_and_merges_as_the_all_in_one(
        split: Callable[..., Split], make_gateway: Callable[..., BackgroundServer]) -> None:
    """``hermes apps rename|merge`` (the admin API, which the CLI calls; through an edge it
    is proxied to the active scheduler) change the app of the next new conversations
    through every edge, within :data:`NAMES_BOUND_S`, as at the all-in-one gateway for the
    same steps; an edge started later starts with the current mapping."""
    sp = split()
    e0 = sp.edge("edge0")
    aio = make_gateway()
    research = "You are a careful research agent."
    translate = "You translate legal contracts into French."

    def app_of(base: str, system: str, text: str) -> str:
        r = _post(base, {}, {**CHAT, "messages": [{"role": "system", "content": system},
                                                  {"role": "user", "content": text}]})
        assert r.status_code == 200, r.text
        run = httpx.get(f"{base}/v1/runs/{r.headers['X-Hermes-Run']}").json()
        assert run["inferred"] and run["app"] == r.headers["X-Hermes-App"], run
        return r.headers["X-Hermes-App"]

    def names(base: str) -> str | None:
        return httpx.get(f"{base}/readyz").json().get("app_names")

    def admin(via: str, followers: list[str], name: str, op: str, arg: dict[str, str]
              ) -> float:
        """An admin call through ``via``; the time until every edge of ``followers``
        follows the new mapping (0 for none)."""
        before = {e: names(e) for e in followers}
        r = httpx.post(f"{via}/admin/apps/{name}/{op}", json=arg, timeout=30)
        assert r.status_code == 200, r.text
        t0 = time.monotonic()
        for e in followers:
            wait_for(lambda e=e: names(e) != before[e], timeout=5, what=f"{op} at {e}")
        return time.monotonic() - t0

    seen: dict[str, list[str]] = {}
    took: list[float] = []
    for base, edges in ((aio.url, []), (e0.url, [e0.url])):
        x = app_of(base, research, "Find the capital of France.")
        y = app_of(base, translate, "Translate the lease.")
        took.append(admin(base, edges, x, "rename", {"to": "researcher"}))
        renamed = app_of(base, research, "Find the capital of Peru.")
        took.append(admin(base, edges, y, "merge", {"into": "researcher"}))
        merged = app_of(base, translate, "Translate the deed.")
        seen[base] = [x, y, renamed, merged]
    assert seen[e0.url] == seen[aio.url], seen  # the same apps, step by step
    assert seen[e0.url][2:] == ["researcher", "researcher"], seen
    assert max(took) < NAMES_BOUND_S, took
    # an edge started now has the mapping before it serves (ready: the pong that brought it)
    e1 = sp.edge("edge1")
    assert names(e1.url) == names(e0.url)
    assert app_of(e1.url, translate, "Translate the will.") == "researcher"  # never saw it
    assert app_of(e1.url, research, "Find the capital of Chad.") == "researcher"
    # a rename through one edge reaches every edge
    took.append(admin(e1.url, [e0.url, e1.url], "researcher", "rename", {"to": "scholar"}))
    assert max(took) < NAMES_BOUND_S, took
    assert app_of(e0.url, research, "Find the capital of Mali.") == "scholar"
    assert app_of(e0.url, translate, "Translate the bill.") == "scholar"
    listed = {a["name"]: a for a in httpx.get(f"{e0.url}/admin/apps").json()["apps"]}
    assert listed["scholar"]["inferred"], listed


@pytest.mark.parametrize("router", ["least-loaded", "prefix"])
def test_the_scheduler_forwards_an_edges_body_without_decoding_it(
        split: Callable[..., Split], router: str) -> None:
    """A call's body leaves the edge as JSON text, once; the scheduler sends those bytes to
    the node as they came (per-byte work stays off it: a long agent conversation is not
    decoded and re-encoded per call) and reads only what the edge took from it: the unit's
    shared prefix (KV prewarming) and ``max_tokens``. A router that reads prompts gets the
    body decoded. Either way the node gets the whole body: the engine counts its prompt."""
    sp = split(scheduler={"router": router})
    e0 = sp.edge()
    sent: list[tuple[bool, int | None]] = []  # (still encoded, prompt tokens) per submit
    table = sp.sched.node_table
    real_send = table.send

    def spy(node: Any, msg: Any) -> None:
        if isinstance(msg, P.Submit):
            sent.append((msg.encoded_body is not None, msg.prompt_tokens))
        real_send(node, msg)

    table.send = spy
    long_task = "Summarise every line of this log. " * 200
    msgs = [AGENT[0], {"role": "user", "content": long_task}]
    r = _post(e0.url, {}, {**CHAT, "messages": msgs, "max_tokens": 5})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > len(long_task) // 5  # the node got it all
    named = _post(e0.url, {"X-Hermes-Run": "none", "X-Hermes-App": "x"},
                  {**CHAT, "messages": msgs})
    assert named.status_code == 200, named.text
    direct = _post(e0.url, {"X-Hermes-Run": "none"}, {**CHAT, "messages": msgs})  # fast path
    assert direct.status_code == 200, direct.text
    assert len(sent) == 3 and all(tokens and tokens > 100 for _, tokens in sent)
    assert all(encoded == (router == "least-loaded") for encoded, _ in sent), sent
    app = r.headers["X-Hermes-App"]
    prefixes = sp.sched.prewarm.prefixes
    assert prefixes[("default", app, r.headers["X-Hermes-Unit"])] == AGENT[0]["content"]
    assert prefixes[("default", "x", "default")] == AGENT[0]["content"]


def test_a_client_gone_before_its_answer_has_the_call_cancelled_through_the_edge(
        split: Callable[..., Split]) -> None:
    """A client of an edge that goes away while its call (not streamed) waits for the engine
    has the call cancelled at its node, as at the all-in-one gateway; the edge serves on."""
    sp = split()
    e0 = sp.edge()
    slot = sp.node.agent.slots["sim"]
    long = {**CHAT, "max_tokens": 30_000, "ignore_eos": True}  # ~10 s at this time scale
    seen: list[int] = []
    watch = threading.Timer(0.7, lambda: seen.append(len(slot.inflight)))
    watch.start()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{e0.url}/v1/chat/completions", json=long, headers={"X-Hermes-Run": "none"},
                   timeout=httpx.Timeout(30, read=1.0))
    watch.join()
    assert seen == [1]  # it was at its engine when its client went away
    wait_for(lambda: not slot.inflight, timeout=5, what="the call cancelled at its node")
    assert e0.server.config.app.edge.stats["answered"] == 0  # type: ignore[attr-defined]
    r = _post(e0.url, {"X-Hermes-Run": "none"})
    assert r.status_code == 200, r.text


def test_a_client_gone_before_its_tool_call_ends_has_it_killed_through_the_edge(
        split: Callable[..., Split]) -> None:
    """An edge forwards a run's tool call to the scheduler; its client gone before the answer
    has the forwarding cancelled, and so the call at its node: the process is killed then."""
    require_tool_sandbox()
    sp = split()
    e0 = sp.edge()
    rid = httpx.post(f"{e0.url}/v1/runs", json={"app": "tooly"}, timeout=30).json()["run_id"]
    argv = ("sleep", "97.5")
    post_then_leave(f"{e0.url}/v1/runs/{rid}/tools", {
        "unit": "exec", "backend": "docker:python:3.10-slim", "command": list(argv),
        "timeout_s": 120}, argv)
    wait_for(lambda: not processes_running(*argv) and not sp.sched.requests, timeout=10,
             what="the tool call killed at its node")


def test_a_call_past_the_request_timeout_is_answered_504_and_cancelled(
        split: Callable[..., Split]) -> None:
    """An edge's call whose answer does not come within ``request_timeout_s`` is answered 504
    naming the timeout and cancelled at its node; an answer in time is unaffected."""
    sp = split()
    e0 = sp.edge(request_timeout_s=1.0)
    slot = sp.node.agent.slots["sim"]
    long = {**CHAT, "max_tokens": 30_000, "ignore_eos": True}  # ~10 s at this time scale
    t0 = time.monotonic()
    r = _post(e0.url, {"X-Hermes-Run": "none"}, long)
    assert 0.9 < time.monotonic() - t0 < 5
    assert r.status_code == 504 and "timed out after 1 s" in r.json()["error"]["message"], r.text
    wait_for(lambda: not slot.inflight, timeout=5, what="the call cancelled at its node")
    ok = _post(e0.url, {"X-Hermes-Run": "none"})
    assert ok.status_code == 200, ok.text

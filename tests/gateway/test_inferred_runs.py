"""Runs inferred from plain OpenAI traffic (issue 17): a real gateway with the built-in engine,
clients that send no Hermes headers, and what ``GET /v1/runs/{id}`` then shows."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

MODEL = "llama-2-7b"
SYSTEM = "You are a careful travel agent. Today is 2026-11-23."
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def _client(gw: Any, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0,
                         default_headers=headers or None)


def _run(gw: Any, run_id: str) -> dict[str, Any]:
    r = httpx.get(f"{gw.url}/v1/runs/{run_id}")
    assert r.status_code == 200, r.text
    return r.json()


def _chat(client: openai.OpenAI, messages: list[dict[str, Any]], **kw: Any
          ) -> tuple[dict[str, Any], dict[str, str]]:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=kw.pop("max_tokens", 6), **kw)
    c = raw.parse()
    return c.choices[0].message.model_dump(exclude_none=True), dict(raw.headers)


def _agent_loop(client: openai.OpenAI, task: str, *, stream: bool = False,
                max_turns: int = 6) -> list[str]:
    """A tool loop as agent frameworks write it; returns the X-Hermes-Run of every turn."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": task}]
    runs: list[str] = []
    for _ in range(max_turns):
        if stream:
            with client.chat.completions.with_streaming_response.create(
                    model=MODEL, messages=messages, tools=TOOLS, max_tokens=40,
                    stream=True) as resp:
                runs.append(resp.headers["x-hermes-run"])
                text, calls = "", {}
                for line in resp.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = openai.types.chat.ChatCompletionChunk.model_validate_json(line[6:])
                    for ch in chunk.choices:
                        text += ch.delta.content or ""
                        for tc in ch.delta.tool_calls or ():
                            slot = calls.setdefault(tc.index, {"id": "", "name": "", "args": ""})
                            slot["id"] = tc.id or slot["id"]
                            if tc.function:
                                slot["name"] += tc.function.name or ""
                                slot["args"] += tc.function.arguments or ""
            msg: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["name"], "arguments": c["args"]}}
                                     for _, c in sorted(calls.items())]
        else:
            msg, headers = _chat(client, messages, tools=TOOLS, max_tokens=40)
            runs.append(headers["x-hermes-run"])
        messages.append(msg)
        if not msg.get("tool_calls"):
            break
        for call in msg["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": f"Sunny, 21 C in {len(messages)} places"})
    return runs


@pytest.fixture
def gw(make_gateway):  # noqa: ANN001, ANN201
    return make_gateway()


@pytest.mark.parametrize("stream", [False, True])
def test_a_header_less_tool_loop_is_one_inferred_run(gw, stream: bool) -> None:  # noqa: ANN001
    client = _client(gw)
    runs_a = _agent_loop(client, "Plan a weekend in Lisbon for order 1123", stream=stream)
    runs_b = _agent_loop(client, "Plan a weekend in Oslo for order 2291", stream=stream)
    assert len(runs_a) >= 2 and len(runs_b) >= 2  # the engine called tools at least once
    assert len(set(runs_a)) == 1 and len(set(runs_b)) == 1, (runs_a, runs_b)
    assert runs_a[0] != runs_b[0]
    a, b = _run(gw, runs_a[0]), _run(gw, runs_b[0])
    assert a["inferred"] is True and a["state"] in ("queued", "running")
    assert a["app"] == b["app"] and a["app"].startswith("careful-travel")
    assert "get_weather" in a["app"]
    assert len(a["units"]) == len(runs_a)
    names = [u["unit"] for u in a["units"]]
    assert names[0].endswith(".input")  # the first turn: the user's task
    assert all(n.endswith(".tool") for n in names[1:])  # then tool results
    assert len(set(names)) == 2


def test_opt_out_and_named_runs_are_not_inferred(gw) -> None:  # noqa: ANN001
    client = _client(gw)
    msgs = [{"role": "user", "content": "hello there"}]
    _, h = _chat(_client(gw, **{"X-Hermes-Run": "none"}), msgs)
    run = _run(gw, h["x-hermes-run"])
    deadline = time.monotonic() + 5
    while run["state"] != "finished" and time.monotonic() < deadline:
        time.sleep(0.05)
        run = _run(gw, h["x-hermes-run"])
    assert run["state"] == "finished" and run["inferred"] is False and run["app"] == "default"
    created = httpx.post(f"{gw.url}/v1/runs", json={"app": "mine"}).json()["run_id"]
    _, h = _chat(_client(gw, **{"X-Hermes-Run": created, "X-Hermes-Unit": "u1"}), msgs)
    assert h["x-hermes-run"] == created and h["x-hermes-unit"] == "u1"
    assert "x-hermes-app" not in h
    assert _run(gw, created)["inferred"] is False
    # a header-less first turn is a new inferred run, named in the answer
    _, h = _chat(client, msgs)
    assert h["x-hermes-run"] != created and _run(gw, h["x-hermes-run"])["inferred"] is True
    assert h["x-hermes-app"] == _run(gw, h["x-hermes-run"])["app"]


def test_tenants_with_identical_prompts_are_never_merged(gw) -> None:  # noqa: ANN001
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    reply_a, ha = _chat(_client(gw, **{"X-Hermes-Tenant": "acme"}), msgs)
    reply_b, hb = _chat(_client(gw, **{"X-Hermes-Tenant": "globex"}), msgs)
    assert ha["x-hermes-run"] != hb["x-hermes-run"]
    assert ha["x-hermes-app"] != hb["x-hermes-app"]
    # tenant globex continuing acme's conversation does not join acme's run
    follow = [*msgs, reply_a, {"role": "user", "content": "and then?"}]
    _, hc = _chat(_client(gw, **{"X-Hermes-Tenant": "globex"}), follow)
    assert hc["x-hermes-run"] not in (ha["x-hermes-run"], hb["x-hermes-run"])
    _, hd = _chat(_client(gw, **{"X-Hermes-Tenant": "acme"}), follow)
    assert hd["x-hermes-run"] == ha["x-hermes-run"]


def test_session_ids_and_responses_continuations_join_runs(gw) -> None:  # noqa: ANN001
    client = _client(gw)
    # a session header groups turns that share no history
    _, h1 = _chat(_client(gw, **{"x-session-id": "s-42"}), [{"role": "user", "content": "a"}])
    _, h2 = _chat(_client(gw, **{"x-session-id": "s-42"}), [{"role": "user", "content": "b"}])
    assert h1["x-hermes-run"] == h2["x-hermes-run"]
    # Responses: previous_response_id, then a stateless continuation (the output sent back)
    raw = client.responses.with_raw_response.create(model=MODEL, input="Pick a city",
                                                    instructions=SYSTEM, max_output_tokens=5)
    r1 = raw.parse()
    run = raw.headers["x-hermes-run"]
    raw2 = client.responses.with_raw_response.create(
        model=MODEL, previous_response_id=r1.id, input="Why?", instructions=SYSTEM,
        max_output_tokens=5)
    assert raw2.headers["x-hermes-run"] == run
    r2 = raw2.parse()
    items = [{"role": "user", "content": "Pick a city"},
             *[o.model_dump(exclude_none=True) for o in r1.output],
             {"role": "user", "content": "Why?"},
             *[o.model_dump(exclude_none=True) for o in r2.output],
             {"role": "user", "content": "Thanks, and a hotel?"}]
    raw3 = client.responses.with_raw_response.create(model=MODEL, input=items,
                                                     instructions=SYSTEM, max_output_tokens=5,
                                                     store=False)
    assert raw3.headers["x-hermes-run"] == run
    assert len(_run(gw, run)["units"]) == 3


def test_idle_inferred_runs_close_at_their_last_answer_and_learn(make_gateway) -> None:  # noqa: ANN001
    gw = make_gateway(identity={"close_prior_s": 3.0, "close_min_s": 1.0})
    client = _client(gw)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "go"}]
    reply, h = _chat(client, msgs)
    run_id = h["x-hermes-run"]
    msgs += [reply, {"role": "user", "content": "more"}]
    reply, h = _chat(client, msgs)
    assert h["x-hermes-run"] == run_id
    deadline = time.monotonic() + 10
    run = _run(gw, run_id)
    while run["state"] != "finished" and time.monotonic() < deadline:
        time.sleep(0.05)
        run = _run(gw, run_id)
    assert run["state"] == "finished" and run["inferred"] is True
    last_answer = max(u["finished"] for u in run["units"])
    assert run["finished"] == pytest.approx(last_answer, abs=0.5)  # not when it was closed
    assert run["act_s"] < 3.0  # model seconds: the two turns, not the 3 s idle wait
    # a late continuation starts a new run of the same app
    msgs += [reply, {"role": "user", "content": "late"}]
    _, h = _chat(client, msgs)
    assert h["x-hermes-run"] != run_id
    assert _run(gw, h["x-hermes-run"])["app"] == run["app"]


def test_finishing_an_inferred_run_starts_a_new_one_on_continuation(gw) -> None:  # noqa: ANN001
    client = _client(gw)
    msgs = [{"role": "user", "content": "start"}]
    reply, h = _chat(client, msgs)
    run_id = h["x-hermes-run"]
    assert httpx.post(f"{gw.url}/v1/runs/{run_id}/finish", json={}).status_code == 200
    _, h2 = _chat(client, [*msgs, reply, {"role": "user", "content": "next"}])
    assert h2["x-hermes-run"] != run_id
    assert _run(gw, h2["x-hermes-run"])["state"] in ("queued", "running")


def test_a_continuation_after_a_restart_joins_its_run(make_gateway, tmp_path) -> None:  # noqa: ANN001
    opts = {"kb": str(tmp_path / "kb"), "state_dir": str(tmp_path / "state")}
    gw = make_gateway(**opts)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "begin"}]
    reply, h = _chat(_client(gw), msgs)
    run_id = h["x-hermes-run"]
    gw.stop()
    gw2 = make_gateway(**opts)
    _, h2 = _chat(_client(gw2), [*msgs, reply, {"role": "user", "content": "resume"}])
    assert h2["x-hermes-run"] == run_id
    run = _run(gw2, run_id)
    assert run["inferred"] is True and len(run["units"]) == 2


def test_inference_off_gives_one_request_runs(make_gateway) -> None:  # noqa: ANN001
    gw = make_gateway(identity={"infer": False})
    client = _client(gw)
    msgs = [{"role": "user", "content": "start"}]
    reply, h = _chat(client, msgs)
    _, h2 = _chat(client, [*msgs, reply, {"role": "user", "content": "next"}])
    assert h["x-hermes-run"] != h2["x-hermes-run"]
    assert _run(gw, h2["x-hermes-run"])["app"] == "default"


def test_metrics_show_the_evidence_and_the_index_size(gw) -> None:  # noqa: ANN001
    from prometheus_client.parser import text_string_to_metric_families

    client = _client(gw)
    _agent_loop(client, "Plan a week in Rome")
    _chat(_client(gw, **{"X-Hermes-Run": "none"}), [{"role": "user", "content": "x"}])
    text = httpx.get(f"{gw.url}/metrics").text
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert got[("hermes_identity_requests_total", (("evidence", "new"),))] == 1
    assert got[("hermes_identity_requests_total", (("evidence", "continuation"),))] >= 1
    assert got[("hermes_identity_requests_total", (("evidence", "opt-out"),))] == 1
    assert got[("hermes_identity_size", (("structure", "open_runs"),))] == 1
    assert got[("hermes_identity_size", (("structure", "index_entries"),))] >= 2
    assert got[("hermes_identity_size", (("structure", "recently_closed"),))] == 0
    assert ("hermes_learner_size", (("structure", "held_samples"),)) in got


def test_the_second_hundred_runs_are_ranked_by_their_learned_app(make_gateway) -> None:  # noqa: ANN001
    """200 runs of an agent that sends nothing but a base URL: the first has no PDGraph (the
    policy falls back to least attained service: rank 0 for a new run); the gateway learns
    the inferred app's graph from the runs it closed, with the inferred units, and every run
    of the second hundred is queued with a Gittins rank from it."""
    import concurrent.futures

    # runs close 10-30 model s (0.1-0.3 s wall) after their last answer: well past a
    # loaded machine's client gaps, well before the second hundred starts
    gw = make_gateway(identity={"close_prior_s": 30.0, "close_min_s": 10.0},
                      time_scale=100.0)
    sched = gw.server.config.app.state.scheduler
    client = _client(gw)

    def one(i: int) -> tuple[str, float | None, bool]:
        msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": f"Plan trip {i}"}]
        reply, h = _chat(client, msgs, max_tokens=4)
        run_id = h["x-hermes-run"]
        modelled = sched.ctx.pool.get(h["x-hermes-app"]) is not None
        for turn in range(i % 3):  # then 0 to 2 more turns: remaining work varies
            msgs += [reply, {"role": "user", "content": f"and step {turn}?"}]
            reply, h = _chat(client, msgs, max_tokens=4 + 6 * turn)
            assert h["x-hermes-run"] == run_id
        # the rank the first request was queued with (its key's first element)
        rank = _run(gw, run_id)["units"][0]["requests"][0]["key"][0]
        return run_id, rank, modelled

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        first = [one(0)]  # alone: nothing learned yet
        first += pool.map(one, range(1, 100))
        # the runs close (0.1-0.3 s after their last answer), are learned from (every 1 s)
        # and the app's estimator is built: waited for, not slept (a loaded machine)
        app = _run(gw, first[0][0])["app"]
        deadline = time.monotonic() + 30
        while not (all(r not in sched.registry.runs for r, _, _ in first)
                   and sched.learner.profiled_runs.get(app, 0) >= 100
                   and sched.ctx.pool.get(app) is not None):
            assert time.monotonic() < deadline, "the first hundred runs were not learned"
            time.sleep(0.05)
        second = list(pool.map(one, range(100, 200)))
    assert len({r for r, _, _ in first + second}) == 200  # every agent run is one run
    assert {_run(gw, r)["app"] for r, _, _ in second[::10]} == {app}
    assert not first[0][2] and first[0][1] == 0.0  # no PDGraph yet: least attained service
    assert all(modelled for _, _, modelled in second), [m for _, _, m in second].count(False)
    graph = sched.app_graph(app)
    units = {u["unit"] for r, _, _ in second for u in _run(gw, r)["units"]}
    assert units and units <= set(graph.units), (units, graph.units)
    ranks = [rank for _, rank, _ in second]
    assert all(r is not None and r > 0 for r in ranks), ranks


def test_apps_list_rename_and_merge_inferred_apps(make_gateway, tmp_path) -> None:  # noqa: ANN001
    """``hermes apps list|rename|merge`` on inferred apps: the mapping applies to the next
    runs, the learned PDGraph follows a rename, and it is stored with the knowledge base
    (a restarted gateway on the same knowledge base keeps it)."""
    import subprocess
    import sys

    opts = {"kb": str(tmp_path / "kb"), "state_dir": str(tmp_path / "state"),
            "identity": {"close_prior_s": 1.0, "close_min_s": 1.0}}
    gw = make_gateway(**opts)
    sched = gw.server.config.app.state.scheduler

    def first_turn(system: str) -> dict[str, str]:
        return _chat(_client(gw), [{"role": "system", "content": system},
                                   {"role": "user", "content": "hi"}])[1]

    a = first_turn("You summarise legal contracts.")["x-hermes-app"]
    b = first_turn("You translate legal contracts into French.")["x-hermes-app"]
    assert a != b
    time.sleep(0.3)  # 1 model s at time scale 50: the runs close and are learned
    sched.flush_learning()
    assert sched.app_graph(a) is not None

    def hermes(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hermes.cli", *argv, "--url", gw.url],
                              capture_output=True, text=True, timeout=60)

    listed = json.loads(hermes("apps", "list", "--json").stdout)["apps"]
    row = next(r for r in listed if r["name"] == a)
    assert row["inferred"] is True and row["tenant"] == "default" and row["inferred_runs"] == 1
    assert row["model"] == MODEL and row["instructions"].startswith("You summarise")
    done = hermes("apps", "rename", a, "contract-summary")
    assert done.returncode == 0 and "contract-summary" in done.stdout, done.stderr
    assert sched.app_graph("contract-summary") is not None  # the learned graph followed
    assert first_turn("You summarise legal contracts.")["x-hermes-app"] == "contract-summary"
    assert hermes("apps", "merge", b, "contract-summary").returncode == 0
    assert first_turn("You translate legal contracts into French.")["x-hermes-app"] == \
        "contract-summary"
    bad = hermes("apps", "rename", "no-such-app", "x")
    assert bad.returncode != 0 and "404" in bad.stderr and "no-such-app" in bad.stderr
    r = httpx.post(f"{gw.url}/admin/apps/contract-summary/rename", json={"to": "a/b"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "to"
    gw.stop()
    gw2 = make_gateway(**opts)  # the same knowledge base: the mapping holds
    h = _chat(_client(gw2), [{"role": "system", "content": "You summarise legal contracts."},
                             {"role": "user", "content": "again"}])[1]
    assert h["x-hermes-app"] == "contract-summary"


def test_inferred_runs_never_take_the_tenants_active_run_quota(make_gateway) -> None:  # noqa: ANN001
    """Structured output through a forced tool call leaves inferred runs open until their
    app's idle close; they do not count against ``tenant_max_active_runs``, which still
    bounds the runs the tenant starts itself."""
    gw = make_gateway(tenant_max_active_runs=1)
    client = _client(gw)
    opened = []
    for city in ("Lima", "Oslo"):
        msg, h = _chat(client, [{"role": "user", "content": f"Weather in {city} as JSON"}],
                       tools=TOOLS, tool_choice="required", max_tokens=40)
        assert msg.get("tool_calls")
        opened.append(h["x-hermes-run"])
    assert len(set(opened)) == 2
    assert all(_run(gw, rid)["state"] in ("queued", "running") for rid in opened)
    first = httpx.post(f"{gw.url}/v1/runs", json={"app": "mine"})
    assert first.status_code == 201, first.text
    refused = httpx.post(f"{gw.url}/v1/runs", json={"app": "mine"})
    assert refused.status_code == 429 and "quota 1" in refused.json()["error"]["message"]

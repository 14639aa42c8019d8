"""An edge serves ``/v1/embeddings``, Anthropic's ``/v1/messages`` (and ``count_tokens``,
from the served-model set its scheduler gives it) and, with a shared store,
the Responses API itself (one call to the scheduler, the node's answer translated at the
edge), with the all-in-one gateway's answers and errors for the same requests; without a
shared store the Responses API is forwarded to the scheduler.

Each test makes the scheduler's HTTP unreachable from the edge (the leader's ``http_address``
the edge follows points at a closed port): what an edge forwards then fails (503), so every
answer below came from the edge itself. Real parts in one test process (``edge_inproc``):
Redis, a ``--role scheduler`` gateway, a HermesLet with the built-in engines, edges; the
all-in-one gateway beside them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from edge_inproc import EMBED_MODEL, MODEL, Split, wait_for
from gw_redis import redis_url  # noqa: F401  (fixture)
from threaded_node import ThreadedNode

from hermes.gateway.api.openai_bodies import MAX_EMBED_INPUTS
from hermes.gateway.config import load_config
from hermes.gateway.keys import FileKeyStore
from hermes.gateway.server import BackgroundServer, start_background
from hermes.procs import free_port, stop_group

pytestmark = pytest.mark.timeout(120)


def _cut_scheduler_http(edge: BackgroundServer) -> Any:
    """Point the edge at a closed port for the scheduler's HTTP: a forwarded request now
    fails (503 ``not_ready``), so whatever answers is the edge's own. Returns the edge app."""
    app = edge.server.config.app.edge  # type: ignore[attr-defined]
    assert app.link.leader is not None
    app.link.leader = {**app.link.leader, "http_address": f"127.0.0.1:{free_port()}"}
    r = httpx.get(f"{edge.url}/v1/models", timeout=10)  # forwarded: no scheduler HTTP now
    assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready", r.text
    return app


def _hermes(r: httpx.Response) -> dict[str, str]:
    return {k.lower(): v for k, v in r.headers.items() if k.lower().startswith("x-hermes-")}


def _post(base: str, path: str, body: Any, headers: dict[str, str] | None = None
          ) -> httpx.Response:
    kw: dict[str, Any] = ({"content": body} if isinstance(body, bytes) else {"json": body})
    return httpx.post(f"{base}{path}", headers=headers or {}, timeout=30, **kw)


def _refused_alike(aio: str, edge: str, path: str,
                   bad: list[tuple[Any, dict[str, str], int]]) -> list[dict[str, Any]]:
    """Each bad request of ``bad`` (body, headers, status) to ``path`` at the all-in-one
    gateway ``aio`` and at the edge ``edge``: refused with that status at the all-in-one,
    and with the same status and body at the edge. Returns the all-in-one's error bodies."""
    out = []
    for body, headers, status in bad:
        want = _post(aio, path, body, headers)
        got = _post(edge, path, body, headers)
        assert want.status_code == status, (body, want.text)
        assert (got.status_code, got.json()) == (status, want.json()), body
        out.append(want.json())
    return out


# ---------------------------------------------------------------------------- embeddings
def test_embeddings_are_served_by_the_edge_as_by_the_all_in_one(
        split: Callable[..., Split], make_gateway: Callable[..., BackgroundServer]) -> None:
    sp = split()
    edge = sp.edge()
    aio = make_gateway()
    app = _cut_scheduler_http(edge)
    calls_before = sp.scheduler_state.edge_link.calls
    ok = [{"model": EMBED_MODEL, "input": "hello world"},
          {"model": EMBED_MODEL, "input": ["a", "b c"], "dimensions": 8},
          {"model": EMBED_MODEL, "input": [[1, 2, 3], [4]], "encoding_format": "base64"},
          # the largest request the bounds admit: its ~4 MB answer comes from the node
          {"model": EMBED_MODEL, "input": [f"word{i}" for i in range(MAX_EMBED_INPUTS)],
           "dimensions": 512, "encoding_format": "base64"}]
    for body in ok:
        want, got = _post(aio.url, "/v1/embeddings", body), _post(edge.url, "/v1/embeddings", body)
        assert want.status_code == 200, want.text
        assert got.status_code == 200, got.text
        assert got.json() == want.json(), body
        assert got.headers["content-type"] == want.headers["content-type"]
    # a named run: the answer names it, as the all-in-one gateway's does
    for base in (aio.url, edge.url):
        run = httpx.post(f"{base}/v1/runs", json={"app": "x"}, timeout=10) \
            if base == aio.url else httpx.post(f"{sp.scheduler.url}/v1/runs", json={"app": "x"})
        rid = run.json()["run_id"]
        r = _post(base, "/v1/embeddings", ok[0], {"X-Hermes-Run": rid, "X-Hermes-Unit": "emb"})
        assert r.status_code == 200, r.text
        assert _hermes(r) == {"x-hermes-run": rid, "x-hermes-unit": "emb"}
    assert sp.scheduler_state.edge_link.calls - calls_before == len(ok) + 1  # one each
    # refusals: the same status and error body (the bounds on inputs and on the answer's size,
    # types, an unknown model, a model that does not embed, bad run headers, bad JSON)
    bad: list[tuple[Any, dict[str, str], int]] = [
        ({"model": EMBED_MODEL, "input": ["x"] * (MAX_EMBED_INPUTS + 1)}, {}, 400),
        ({"model": EMBED_MODEL, "input": ["x"] * 300, "dimensions": 8192}, {}, 400),
        ({"model": EMBED_MODEL, "input": [-1]}, {}, 400),
        ({"model": EMBED_MODEL, "input": []}, {}, 400),
        ({"model": EMBED_MODEL, "input": "x", "dimensions": True}, {}, 400),
        ({"model": EMBED_MODEL}, {}, 400),
        ({"model": "nope", "input": "x"}, {}, 404),
        ({"model": MODEL, "input": "x"}, {}, 400),
        ({"model": EMBED_MODEL, "input": "x"}, {"X-Hermes-K": "2"}, 400),
        (b'{"model": "sim-embed", "input": NaN}', {}, 400),
        (b"[1]", {}, 400),
    ]
    _refused_alike(aio.url, edge.url, "/v1/embeddings", bad)
    # an embedding model is refused for chat, as at the all-in-one gateway
    chat = {"model": EMBED_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    want = _post(aio.url, "/v1/chat/completions", chat)
    got = _post(edge.url, "/v1/chat/completions", chat)
    assert (got.status_code, got.json()) == (want.status_code, want.json()) and \
        want.status_code == 400
    assert app.stats["proxied"] == 1  # the /v1/models probe only


def test_embeddings_at_an_edge_need_the_keys_the_all_in_one_needs(
        split: Callable[..., Split], make_gateway: Callable[..., BackgroundServer],
        tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    key = FileKeyStore(auth).create("alice")
    sp = split(auth_file=str(auth))
    edge = sp.edge()
    aio = make_gateway(auth_file=str(auth))
    _cut_scheduler_http(edge)
    body = {"model": EMBED_MODEL, "input": "x"}
    for headers, status in [({}, 401), ({"Authorization": "Bearer nope"}, 401),
                            ({"Authorization": f"Bearer {key}", "X-Hermes-Tenant": "bob"}, 403),
                            ({"Authorization": f"Bearer {key}"}, 200)]:
        want = _post(aio.url, "/v1/embeddings", body, headers)
        got = _post(edge.url, "/v1/embeddings", body, headers)
        assert (got.status_code, got.json()) == (status, want.json()), headers
        assert want.status_code == status


# ---------------------------------------------------------------------------- messages
SEED = {"seed": 7}


def _same_message(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Equal but for the message id (each gateway's request id)."""
    assert got["id"].startswith("msg_") and want["id"].startswith("msg_")
    assert {**got, "id": ""} == {**want, "id": ""}


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def _without_ids(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for kind, data in events:
        if kind == "message_start":
            assert data["message"]["id"].startswith("msg_")
            data = {**data, "message": {**data["message"], "id": ""}}
        out.append((kind, data))
    return out


def test_messages_are_served_by_the_edge_with_the_anthropic_sdk(
        split: Callable[..., Split], make_gateway: Callable[..., BackgroundServer]) -> None:
    """The Anthropic SDK against an edge and the all-in-one gateway: the same messages,
    plain and streamed (events in Anthropic's order, equal but for the message id), a tool
    call, the run headers of an inferred run whose next turn joins it; the edge answered
    every one itself (one call each to the scheduler)."""
    sp = split()
    edge = sp.edge()
    aio = make_gateway()
    app = _cut_scheduler_http(edge)
    calls_before = sp.scheduler_state.edge_link.calls
    weather = {"name": "get_weather", "description": "Weather in a city.",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}}
    asks: list[dict[str, Any]] = [
        {"max_tokens": 16, "messages": [{"role": "user", "content": "Say something."}]},
        {"max_tokens": 64, "system": "Be brief.", "tools": [weather],
         "tool_choice": {"type": "tool", "name": "get_weather"},
         "messages": [{"role": "user", "content": "Weather in Paris?"}]},
        {"max_tokens": 32, "stop_sequences": [" the"],
         "messages": [{"role": "user", "content": "Tell me a story."}]},
    ]
    clients = {base: anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
               for base in (aio.url, edge.url)}
    answers = []
    for ask in asks:
        # (``seed``, passed on to the engine: the built-in engine's answer is then the
        # body's, not the request id's)
        got, want = (c.messages.create(model=MODEL, extra_body=SEED, **ask).model_dump()
                     for c in (clients[edge.url], clients[aio.url]))
        _same_message(got, want)
        answers.append(got)
        # streamed: the SDK assembles the same final message from the edge's events
        finals = []
        for base in (edge.url, aio.url):
            with clients[base].messages.stream(model=MODEL, extra_body=SEED, **ask) as s:
                kinds = [ev.type for ev in s]
                finals.append(s.get_final_message().model_dump())
            assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
        _same_message(*finals)
        _same_message(finals[0], got)
        # and the raw events are the same, in the same order
        raw = [_without_ids(_events(_post(base, "/v1/messages",
                                          {"model": MODEL, "stream": True, **SEED, **ask}
                                          ).text))
               for base in (edge.url, aio.url)]
        assert raw[0] == raw[1]
    assert answers[0]["content"][0]["type"] == "text"
    assert [b["type"] for b in answers[1]["content"]] == ["tool_use"], answers[1]
    assert answers[1]["stop_reason"] == "tool_use"
    assert answers[1]["content"][0]["input"].keys() == {"city"}
    # a conversation's next turn joins its inferred run, plain or streamed, as at the aio
    for base, c in clients.items():
        first = c.messages.with_raw_response.create(
            model=MODEL, max_tokens=8, system="You are a careful agent.",
            messages=[{"role": "user", "content": "Plan the trip."}])
        h = first.headers
        assert h["x-hermes-run"] and h["x-hermes-app"] and h["request-id"], dict(h)
        reply = first.parse().content
        turn2 = [{"role": "user", "content": "Plan the trip."},
                 {"role": "assistant", "content": [b.model_dump() for b in reply]},
                 {"role": "user", "content": "Now book it."}]
        with c.messages.with_streaming_response.create(
                model=MODEL, max_tokens=8, system="You are a careful agent.", stream=True,
                messages=turn2) as second:
            assert second.headers["x-hermes-run"] == h["x-hermes-run"], base
            assert second.headers["x-hermes-app"] == h["x-hermes-app"]
            second.read()
    assert sp.scheduler_state.edge_link.calls - calls_before == len(asks) * 3 + 2
    assert app.stats["proxied"] == 1  # the /v1/models probe only


def test_messages_errors_at_an_edge_take_anthropics_shape_as_at_the_all_in_one(
        split: Callable[..., Split], make_gateway: Callable[..., BackgroundServer],
        tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    key = FileKeyStore(auth).create("alice")
    sp = split(auth_file=str(auth), max_body_bytes=4096)
    edge = sp.edge()
    aio = make_gateway(auth_file=str(auth), max_body_bytes=4096)
    _cut_scheduler_http(edge)
    K = {"x-api-key": key}
    ask = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    cases: list[tuple[Any, dict[str, str], int]] = [
        (ask, {}, 401),
        (ask, {"x-api-key": key + "x"}, 401),
        ({**ask, "messages": [{"role": "user", "content": "x" * 5000}]}, K, 413),
        (ask, {**K, "anthropic-version": "latest"}, 400),
        ({**ask, "model": "nope"}, K, 404),
        ({**ask, "max_tokens": 0}, K, 400),
        ({**ask, "messages": []}, K, 400),
        ({**ask, "tools": [{"name": "x", "input_schema": {"type": "string"}}]}, K, 400),
        ({**ask, "tools": [{"type": "web_search_20250305", "name": "w"}]}, K, 400),
        ({**ask, "tool_choice": {"type": "any"}}, K, 400),
        (b'{"model": "llama-2-7b", "max_tokens": 8, "messages": NaN}', K, 400),
        (ask, {**K, "X-Hermes-K": "2"}, 400),
        (ask, {**K, "X-Hermes-App": "bob.agent"}, 403),
        (ask, {**K, "X-Hermes-Tenant": "bob"}, 403),
        ({"model": "sim-embed", "max_tokens": 8, "messages": ask["messages"]}, K, 400),
    ]
    for body, headers, status in cases:
        want = _post(aio.url, "/v1/messages", body, headers)
        got = _post(edge.url, "/v1/messages", body, headers)
        assert want.status_code == status, (body, headers, want.text)
        assert want.json()["type"] == "error", want.text
        assert (got.status_code, got.json()) == (status, want.json()), (body, headers)
        if isinstance(body, dict) and status not in (401, 413):  # a stream: refused first
            got = _post(edge.url, "/v1/messages", {**body, "stream": True}, headers)
            want = _post(aio.url, "/v1/messages", {**body, "stream": True}, headers)
            assert (got.status_code, got.json()) == (want.status_code, want.json())
    # the SDK raises its own error classes with the gateway's message
    c = anthropic.Anthropic(base_url=edge.url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.NotFoundError, match="nope"):
        c.messages.create(model="nope", max_tokens=8, messages=ask["messages"])
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        c.messages.create(model=MODEL, max_tokens=0, messages=ask["messages"])
    ok = c.messages.create(model=MODEL, max_tokens=8, messages=ask["messages"])
    assert ok.type == "message" and ok.content


NATIVE = "native-llm"


class _NativeNode(ThreadedNode):
    """A second node whose engine serves ``/v1/messages`` itself (an ``openai``-kind engine
    with ``messages_api = "native"`` over HTTP to a ``hermeslet sim-engine``)."""

    def __init__(self, address: str, url: str) -> None:
        self.url = url
        super().__init__(address)

    def make(self, address: str) -> Any:
        from hermeslet.agent import HermesLet
        from hermeslet.engines import make_engine

        return HermesLet("n1", address, [make_engine(f"openai:{self.url}", name="up-native",
                                                     model=NATIVE, messages_api="native")],
                         heartbeat_s=0.1)


def _upstream_routes(url: str) -> dict[str, float]:
    """Requests the upstream engine server received, by route (its /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.labels["route"]: s.value
            for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text)
            for s in fam.samples if s.name == "hermes_sim_requests_total"}


def test_messages_to_an_engine_serving_them_natively_pass_through_the_edge(
        split: Callable[..., Split], make_gateway: Callable[..., BackgroundServer]) -> None:
    """The request as sent travels in the edge's call (``native``) to an engine that serves
    ``/v1/messages`` itself; its message and events come back untranslated, with the
    gateway's message id and the model asked for, as at the all-in-one gateway."""
    from tests.compat.conftest import start_sim_engine

    proc, url = start_sim_engine("--model", NATIVE)
    node: _NativeNode | None = None
    try:
        sp = split()
        node = _NativeNode(sp.scheduler_state.config.scheduler.bind, url)
        wait_for(lambda: NATIVE in sp.sched.served_models(), what="the native node")
        edge = sp.edge()
        aio = make_gateway(engines=[{"name": "up-native", "kind": "openai", "url": url,
                                     "model": NATIVE, "messages_api": "native"}])
        _cut_scheduler_http(edge)
        before = _upstream_routes(url)
        ask = {"model": NATIVE, "max_tokens": 16, **SEED,
               "messages": [{"role": "user", "content": "Say something."}]}
        got, want = (_post(base, "/v1/messages", ask) for base in (edge.url, aio.url))
        assert got.status_code == want.status_code == 200, (got.text, want.text)
        _same_message(got.json(), want.json())
        assert got.json()["id"] == f"msg_{got.headers['request-id']}"
        raw = [_without_ids(_events(_post(base, "/v1/messages", {**ask, "stream": True}).text))
               for base in (edge.url, aio.url)]
        assert raw[0] == raw[1] and raw[0][-1][0] == "message_stop"
        after = _upstream_routes(url)
        grew = {r: after[r] - before.get(r, 0) for r in after if after[r] > before.get(r, 0)}
        assert grew == {"/v1/messages": 4}, grew  # natively, both gateways, twice each
    finally:
        if node is not None:
            node.stop()
        stop_group(proc, grace_s=2)


# ---------------------------------------------------------------------------- responses
_IDS = frozenset({"id", "item_id", "created_at", "previous_response_id", "first_id",
                  "last_id"})


def _same_response(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Equal but for ids and times (each gateway's own)."""
    def norm(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: ("" if k in _IDS else norm(v)) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [norm(v) for v in x]
        return x

    assert norm(got) == norm(want)


def test_responses_are_served_by_edges_sharing_the_store(
        split: Callable[..., Split], make_gateway: Callable[..., BackgroundServer],
        redis_url: str) -> None:  # noqa: F811
    """With ``[cluster] store`` an edge answers ``POST /v1/responses`` itself, and a
    follow-up's ``previous_response_id`` works at the other edge (the shared store; the
    shared index joins its run), plain and streamed, as at the all-in-one gateway."""
    sp = split(store=redis_url)
    e0, e1 = sp.edge("edge0"), sp.edge("edge1")
    aio = make_gateway(store=redis_url, store_prefix="aio:")
    apps = [_cut_scheduler_http(e) for e in (e0, e1)]
    calls_before = sp.scheduler_state.edge_link.calls
    first = {"model": MODEL, "input": "Remember the word tangerine.", "max_output_tokens": 8,
             "instructions": "You are a careful agent.", **SEED}
    for stream in (False, True):
        got: dict[str, Any] = {}
        for name, (a, b) in {"aio": (aio.url, aio.url), "edges": (e0.url, e1.url)}.items():
            r1 = _post(a, "/v1/responses", {**first, "stream": stream})
            assert r1.status_code == 200, r1.text
            resp1 = (r1.json() if not stream else
                     _events(r1.text)[-1][1]["response"])
            assert resp1["status"] in ("completed", "incomplete") and resp1["output"], resp1
            follow = {"model": MODEL, "input": "Which word?", "max_output_tokens": 8,
                      "previous_response_id": resp1["id"], **SEED}
            r2 = _post(b, "/v1/responses", {**follow, "stream": stream})
            assert r2.status_code == 200, r2.text
            # the follow-up continued the conversation in the same run, whichever edge
            assert _hermes(r2)["x-hermes-run"] == _hermes(r1)["x-hermes-run"], name
            got[name] = {"first": r1.json() if not stream else _events(r1.text),
                         "follow": r2.json() if not stream else _events(r2.text),
                         "headers": sorted(_hermes(r1))}
        _same_response(got["edges"], got["aio"])
    # refusals: the same status and error body
    bad: list[Any] = [
        {"model": MODEL, "input": "x", "previous_response_id": "resp_nope"},
        {"model": MODEL, "input": "x", "max_output_tokens": 0},
        {"model": MODEL, "input": [{"type": "nope"}]},
        {"model": "nope", "input": "x"},
        {"model": MODEL},
        b'{"model": "llama-2-7b", "input": NaN}',
    ]
    for body in bad:
        want, got_r = _post(aio.url, "/v1/responses", body), _post(e0.url, "/v1/responses", body)
        assert want.status_code in (400, 404), want.text
        assert (got_r.status_code, got_r.json()) == (want.status_code, want.json()), body
    # the stored responses' routes, at either edge: the shared store, the all-in-one's answers
    ids = {name: [got_name["first"][-1][1]["response"]["id"],
                  got_name["follow"][-1][1]["response"]["id"]]
           for name, got_name in got.items()}
    for suffix in ("", "/input_items", "/input_items?order=asc&limit=1",
                   "/input_items?limit=abc", "/input_items?limit=0", "/input_items?order=x",
                   "/input_items?after=zz", "/input_items?limit=1.5&limit=2"):
        for i, edge in ((0, e1), (1, e0)):
            want = httpx.get(f"{aio.url}/v1/responses/{ids['aio'][i]}{suffix}", timeout=10)
            got_r = httpx.get(f"{edge.url}/v1/responses/{ids['edges'][i]}{suffix}", timeout=10)
            assert got_r.status_code == want.status_code, (suffix, got_r.text, want.text)
            _same_response(got_r.json(), want.json())
    assert httpx.get(f"{e0.url}/v1/responses/{ids['edges'][0]}/input_items?limit=abc"
                     ).status_code == 422
    for base, rid in ((aio.url, ids["aio"][0]), (e0.url, ids["edges"][0])):
        assert httpx.delete(f"{base}/v1/responses/{rid}").json()["deleted"] is True
    for path in (f"/v1/responses/{ids['edges'][0]}", "/v1/responses/resp_nope",
                 "/v1/responses/resp_nope/input_items"):
        want = httpx.get(aio.url + path.replace(ids["edges"][0], ids["aio"][0]))
        got_r = httpx.get(e1.url + path)  # deleted through the other edge: gone everywhere
        assert (got_r.status_code, got_r.json()) == (404, want.json() | {
            "error": {**want.json()["error"], "message": got_r.json()["error"]["message"]}})
        assert want.status_code == 404
    want = httpx.delete(f"{aio.url}/v1/responses/resp_nope")
    assert httpx.delete(f"{e1.url}/v1/responses/resp_nope").json() == want.json()
    # one call each (4 answered, the unknown model refused by the scheduler)
    assert sp.scheduler_state.edge_link.calls - calls_before == 5
    # what an edge stored is in the shared store: the scheduler's HTTP reads it
    stored = got["edges"]["follow"][-1][1]["response"]
    r = httpx.get(f"{sp.scheduler.url}/v1/responses/{stored['id']}", timeout=10)
    assert r.status_code == 200 and r.json() == stored, r.text
    assert [a.stats["proxied"] for a in apps] == [1, 1]  # the /v1/models probes only


def test_responses_without_a_shared_store_are_forwarded_to_the_scheduler(
        split: Callable[..., Split]) -> None:
    """Without ``[cluster] store`` the scheduler's response store is the one every edge
    reaches: the edge forwards ``/v1/responses``, and a follow-up through another edge finds
    the response there."""
    sp = split()
    e0, e1 = sp.edge("edge0"), sp.edge("edge1")
    r1 = _post(e0.url, "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 4})
    assert r1.status_code == 200, r1.text
    r2 = _post(e1.url, "/v1/responses", {"model": MODEL, "input": "again",
                                         "max_output_tokens": 4,
                                         "previous_response_id": r1.json()["id"]})
    assert r2.status_code == 200, r2.text
    assert [e.server.config.app.edge.stats["proxied"] for e in (e0, e1)] == [1, 1]  # type: ignore[attr-defined]


def test_stored_responses_at_edges_are_the_key_tenants_own(
        split: Callable[..., Split], tmp_path: Path, redis_url: str) -> None:  # noqa: F811
    auth = tmp_path / "auth.json"
    keys = FileKeyStore(auth)
    A = {"Authorization": f"Bearer {keys.create('alice')}"}
    B = {"Authorization": f"Bearer {keys.create('bob')}"}
    sp = split(store=redis_url, auth_file=str(auth))
    e0, e1 = sp.edge("edge0"), sp.edge("edge1")
    for e in (e0, e1):
        _cut_scheduler_http(e)
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 4}
    assert _post(e0.url, "/v1/responses", body).status_code == 401
    rid = _post(e0.url, "/v1/responses", body, A).json()["id"]
    assert httpx.get(f"{e1.url}/v1/responses/{rid}", headers=A).status_code == 200
    assert httpx.get(f"{e1.url}/v1/responses/{rid}").status_code == 401
    for r in (httpx.get(f"{e1.url}/v1/responses/{rid}", headers=B),
              httpx.get(f"{e1.url}/v1/responses/{rid}/input_items", headers=B),
              httpx.delete(f"{e1.url}/v1/responses/{rid}", headers=B),
              _post(e1.url, "/v1/responses", {**body, "previous_response_id": rid}, B)):
        assert r.status_code == 404, r.text  # another tenant's id: not found
    r = _post(e1.url, "/v1/responses", {**body, "previous_response_id": rid}, A)
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------------------- count_tokens
COUNT = {"model": MODEL, "messages": [{"role": "user", "content": "How many tokens is this?"}]}


def test_count_tokens_is_answered_by_the_edge_as_by_the_all_in_one(
        split: Callable[..., Split], make_gateway: Callable[..., BackgroundServer]) -> None:
    """``POST /v1/messages/count_tokens`` at an edge whose scheduler's HTTP is unreachable:
    the Anthropic SDK gets the all-in-one gateway's counts, and every refusal (a bad body or
    version, an unknown model, a model that does not generate) its status and error body;
    nothing reached the scheduler (no call, nothing forwarded)."""
    sp = split()
    edge = sp.edge()
    aio = make_gateway()
    app = _cut_scheduler_http(edge)
    calls_before = sp.scheduler_state.edge_link.calls
    weather = {"name": "get_weather", "description": "Weather in a city.",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
    asks: list[dict[str, Any]] = [
        {"messages": COUNT["messages"]},
        {"system": "Be brief.", "tools": [weather],
         "messages": [{"role": "user", "content": "Weather in Paris?"},
                      {"role": "assistant", "content": [
                          {"type": "tool_use", "id": "t1", "name": "get_weather",
                           "input": {"city": "Paris"}}]},
                      {"role": "user", "content": [
                          {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"}]}]},
    ]
    clients = {base: anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
               for base in (aio.url, edge.url)}
    counts = []
    for ask in asks:
        got, want = (clients[b].messages.count_tokens(model=MODEL, **ask).model_dump()
                     for b in (edge.url, aio.url))
        assert got == want and got["input_tokens"] > 0, (got, want)
        counts.append(got["input_tokens"])
    assert counts[1] > counts[0]
    bad: list[tuple[Any, dict[str, str], int]] = [
        ({**COUNT, "model": "nope"}, {}, 404),
        ({**COUNT, "model": EMBED_MODEL}, {}, 400),  # an embedding model
        ({"model": MODEL}, {}, 400),
        ({**COUNT, "messages": []}, {}, 400),
        ({**COUNT, "tools": [{"name": "x", "input_schema": {"type": "string"}}]}, {}, 400),
        (COUNT, {"anthropic-version": "latest"}, 400),
        (b'{"model": "llama-2-7b", "messages": NaN}', {}, 400),
        (b"[1]", {}, 400),
        (b"not json", {}, 400),
    ]
    errors = _refused_alike(aio.url, edge.url, "/v1/messages/count_tokens", bad)
    assert all(e["type"] == "error" for e in errors), errors  # Anthropic's error shape
    with pytest.raises(anthropic.NotFoundError, match="nope"):
        clients[edge.url].messages.count_tokens(model="nope", messages=COUNT["messages"])
    assert sp.scheduler_state.edge_link.calls == calls_before  # nothing reached it
    assert app.stats["proxied"] == 1  # the /v1/models probe only
    assert app.stats["counted"] == len(asks)  # (refusals are not counted)


def test_count_tokens_at_an_edge_needs_the_keys_the_all_in_one_needs(
        split: Callable[..., Split], make_gateway: Callable[..., BackgroundServer],
        tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    keys = FileKeyStore(auth)
    key, gone = keys.create("alice"), keys.create("alice")
    sp = split(auth_file=str(auth))
    edge = sp.edge()
    aio = make_gateway(auth_file=str(auth))
    _cut_scheduler_http(edge)
    cases = [({}, 401), ({"x-api-key": "nope"}, 401), ({"x-api-key": key + "x"}, 401),
             ({"x-api-key": key}, 200), ({"Authorization": f"Bearer {gone}"}, 200)]
    for headers, status in cases:
        want = _post(aio.url, "/v1/messages/count_tokens", COUNT, headers)
        got = _post(edge.url, "/v1/messages/count_tokens", COUNT, headers)
        assert want.status_code == status, (headers, want.text)
        assert (got.status_code, got.json()) == (status, want.json()), headers
    assert FileKeyStore(auth).revoke(gone.split(".")[0][3:])  # revoked: refused at once
    for base in (aio.url, edge.url):
        r = _post(base, "/v1/messages/count_tokens", COUNT, {"Authorization": f"Bearer {gone}"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", \
            r.text
    c = anthropic.Anthropic(base_url=edge.url, api_key=key, max_retries=0)
    assert c.messages.count_tokens(model=MODEL, messages=COUNT["messages"]).input_tokens > 0


LATE = "late-llm"


class _LateNode(ThreadedNode):
    """A node joining later, with a model nobody served before."""

    def make(self, address: str) -> Any:
        from hermeslet.agent import HermesLet
        from hermeslet.engines.sim_engine import SimEngine

        return HermesLet("n-late", address, [SimEngine(name="late", model=LATE)],
                         heartbeat_s=0.1)


def test_a_model_served_later_is_countable_at_the_edge_within_a_ping(
        split: Callable[..., Split], redis_url: str) -> None:  # noqa: F811
    """A node joining with a new model: the scheduler's pongs bring the edge the new set
    (its digest changed) and the model is countable there within a ping period and a round
    trip. An edge that has no pong of an active scheduler (so no served-model set) is not
    ready and answers 503 ``not_ready`` with ``Retry-After``, in Anthropic's shape (529)."""
    sp = split()
    edge = sp.edge()
    _cut_scheduler_http(edge)
    ask = {**COUNT, "model": LATE}
    r = _post(edge.url, "/v1/messages/count_tokens", ask)
    assert r.status_code == 404 and LATE in r.json()["error"]["message"], r.text
    # the set the edge has before the node exists (read after it, a pong may already have
    # brought the new one: the comparison below then failed on a busy machine)
    digest = httpx.get(edge.url + "/readyz").json()["models"]
    assert digest
    node = _LateNode(sp.scheduler_state.config.scheduler.bind)
    try:
        wait_for(lambda: LATE in sp.sched.served_models(), what="the late node")
        t0 = time.monotonic()
        while _post(edge.url, "/v1/messages/count_tokens", ask).status_code != 200:
            assert time.monotonic() - t0 < 5.0, "the edge never learnt the new model"
            time.sleep(0.01)
        took = time.monotonic() - t0
        assert took < 1.0, took  # a ping period (0.2 s) and a round trip, on a busy machine
        assert httpx.get(edge.url + "/readyz").json()["models"] not in ("", digest)
    finally:
        node.stop()
    # an edge following an election store where no scheduler leads: no pong, no set
    lone = start_background(load_config(None, environ={}, **{
        **sp.common, "role": "edge", "bind": f"tcp://127.0.0.1:{free_port()}",
        "election": redis_url.rsplit("/", 1)[0] + "/9", "member": "lone",
        "state_dir": str(sp.tmp / "lone"), "kb": str(sp.tmp / "lone" / "kb")}))
    try:
        assert httpx.get(lone.url + "/readyz").status_code == 503
        r = _post(lone.url, "/v1/messages/count_tokens", COUNT)
        assert r.status_code == 529 and r.headers["retry-after"] == "1", r.text
        assert r.json()["error"]["type"] == "overloaded_error"
        r = _post(lone.url, "/v1/messages/count_tokens", {"model": MODEL})  # checked first
        assert r.status_code == 400, r.text
    finally:
        lone.stop()

"""Regression tests for a black-box probe by a hostile tenant, each against a real gateway.

1. one embeddings request must not freeze the gateway: sizes are checked before any work,
   the largest request allowed leaves ``/healthz`` answering;
4. admin routes with authentication on need the admin token, loopback or not;
6. wrong secrets for a tenant's key id do not lock that tenant out; forwarding headers are
   trusted only from configured proxies;
9. a request body that trickles in is cut off;
11/12. garbage in numeric fields, token ids, ``guided_json`` and ``/v1/responses`` bodies is
   a 400 naming the field, and the keep-alive connection survives it;
13. ``/metrics`` needs a key (or its token) when authentication is on.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes.gateway.config import load_config
from hermes.gateway.keys import FileKeyStore
from hermes.gateway.server import BackgroundServer, gateway_state, start_background

EMBED = "sim-embed"


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class _Pinger(threading.Thread):
    """``GET /healthz`` in a loop on its own connection; the slowest answer is kept."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.worst, self.stop = url, 0.0, threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while not self.stop.is_set():
                t0 = time.monotonic()
                assert http.get("/healthz").status_code == 200
                self.worst = max(self.worst, time.monotonic() - t0)
                time.sleep(0.02)

    def __enter__(self) -> _Pinger:
        self.start()
        time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(60)


# ---------------------------------------------------------------------------------- 1
def test_oversized_embeddings_are_refused_before_any_work(gateway) -> None:  # noqa: ANN001
    with httpx.Client(base_url=gateway.url, timeout=120) as http, _Pinger(gateway.url) as ping:
        for body, param in (
                ({"input": ["x"] * 20_000, "dimensions": 8192, "encoding_format": "base64"},
                 "input"),
                ({"input": ["x"] * 100_000}, "input"),
                ({"input": ["x"] * 2000, "dimensions": 8192}, "dimensions"),
                ({"input": "x", "dimensions": 65_536}, "dimensions"),
                ({"input": "x", "dimensions": True}, "dimensions"),
                ({"input": [-1, 5]}, "input"),
                ({"input": [[1 << 40]]}, "input")):
            t0 = time.monotonic()
            r = http.post("/v1/embeddings", json={"model": EMBED, **body})
            took = time.monotonic() - t0
            assert r.status_code == 400, (param, r.text[:300])
            assert r.json()["error"]["param"] == param, r.text[:300]
            assert took < 2.0, (param, took)
    assert ping.worst < 1.0, ping.worst


def test_the_largest_embeddings_request_leaves_the_gateway_answering(gateway) -> None:  # noqa: ANN001
    with httpx.Client(base_url=gateway.url, timeout=120) as http, _Pinger(gateway.url) as ping:
        r = http.post("/v1/embeddings", json={
            "model": EMBED, "input": [f"word{i}" for i in range(2048)], "dimensions": 512,
            "encoding_format": "base64"})
        assert r.status_code == 200, r.text[:300]
        assert len(r.json()["data"]) == 2048
    assert ping.worst < 1.0, ping.worst


# ---------------------------------------------------------------------------------- 11, 12
def _post_raw(conn: Any, path: str, raw: bytes) -> tuple[int, dict[str, Any]]:
    conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, json.loads(r.read())


_CHAT = {"model": "llama-2-7b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
_GARBAGE: list[tuple[str, bytes, str | None]] = [
    ("/v1/chat/completions", json.dumps(_CHAT)[:-1].encode() + b', "temperature": NaN}',
     "temperature"),
    ("/v1/chat/completions", json.dumps(_CHAT)[:-1].encode() + b', "top_p": Infinity}', "top_p"),
    ("/v1/chat/completions", json.dumps(_CHAT)[:-1].encode() + b', "presence_penalty": 1e400}',
     "presence_penalty"),
    ("/v1/chat/completions", json.dumps({**_CHAT, "temperature": True}).encode(), "temperature"),
    ("/v1/chat/completions", json.dumps({**_CHAT, "n": True}).encode(), "n"),
    ("/v1/chat/completions", json.dumps({**_CHAT, "stream": 0}).encode(), "stream"),
    ("/v1/chat/completions", json.dumps({**_CHAT, "guided_json": '{"type": "ob\x00ject"}'}).encode(),
     "guided_json"),
    ("/v1/completions", json.dumps({"model": "llama-2-7b", "prompt": [-3, 7]}).encode(), "prompt"),
    ("/v1/completions", json.dumps({"model": "llama-2-7b", "prompt": [1 << 40]}).encode(),
     "prompt"),
    ("/v1/responses", b'{"model": "llama-2-7b", "input": "\\ud800"}', "input"),
    ("/v1/responses", b'{"model": "llama-2-7b", "input": "hi", "tools": [{"type": "function", '
     b'"name": "f", "parameters": {"type": "object", "properties": {"x": {"default": NaN}}}}]}',
     "tools.0.parameters.properties.x.default"),
    ("/v1/responses", b'{"model": "llama-2-7b", "input": "hi", "metadata": '
     + b'{"a": ' * 1000 + b"1" + b"}" * 1001, None),
    ("/v1/responses", b'{"model": "llama-2-7b", "input": "hi", "temperature": true}',
     "temperature"),
]


@pytest.fixture(scope="module")
def shared_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    """One gateway for the garbage cases (each case is one request and its follow-up)."""
    tmp = tmp_path_factory.mktemp("garbage")
    srv = start_background(load_config(None, environ={}, port=0, bind="", kb=str(tmp / "kb"),
                                       state_dir=str(tmp / "st"), time_scale=50.0,
                                       log_level="warning"))
    yield srv
    srv.stop()


@pytest.mark.parametrize("path,raw,param", _GARBAGE,
                         ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(_GARBAGE)])
def test_garbage_is_400_naming_the_field_and_keeps_the_connection(
        shared_gateway, path, raw, param) -> None:  # noqa: ANN001
    import http.client

    host, port = shared_gateway.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        status, body = _post_raw(conn, path, raw)
        assert status == 400, (status, body)
        if param is not None:
            assert body["error"]["param"] == param, body
        else:
            assert "nested" in body["error"]["message"], body
        sock = conn.sock
        assert sock is not None
        status, body = _post_raw(conn, "/v1/chat/completions", json.dumps(_CHAT).encode())
        assert status == 200, body
        assert conn.sock is sock  # the same keep-alive connection answered
    finally:
        conn.close()


# ---------------------------------------------------------------------------------- 4, 13
def _authed(make_gateway, tmp_path: Path, **kw: Any) -> tuple[Any, str, str]:  # noqa: ANN001
    auth = tmp_path / "auth.json"
    store = FileKeyStore(auth)
    a, b = store.create("tenant-a"), store.create("tenant-b")
    return make_gateway(auth_file=str(auth), **kw), a, b


def test_admin_routes_need_the_admin_token_when_auth_is_on(make_gateway, tmp_path) -> None:  # noqa: ANN001
    srv, a, b = _authed(make_gateway, tmp_path)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        rid = http.post("/v1/runs", json={"app": "demo"}, headers=_bearer(a)).json()["run_id"]
        for headers in ({}, _bearer(b), _bearer(a)):  # loopback, a tenant key: neither is admin
            r = http.get("/admin/runs", headers=headers)
            assert r.status_code in (401, 403) and rid not in r.text, r.text
            r = http.put("/admin/policy", json={"policy": "fcfs"}, headers=headers)
            assert r.status_code in (401, 403), r.text
        assert "admin_loopback" in http.get("/admin/runs").json()["error"]["message"]
    gateway_state(srv).admin_token = "s3cret"
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.get("/admin/runs", headers=_bearer(b)).status_code == 403
        r = http.get("/admin/runs", headers=_bearer("s3cret"))
        assert r.status_code == 200 and rid in r.text


def test_the_loopback_exception_is_the_operators_choice(make_gateway, tmp_path) -> None:  # noqa: ANN001
    srv, _, _ = _authed(make_gateway, tmp_path, security={"admin_loopback": True})
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.get("/admin/runs").status_code == 200


def test_metrics_need_a_token_and_hide_tenants_when_auth_is_on(make_gateway, tmp_path) -> None:  # noqa: ANN001
    srv, a, _ = _authed(make_gateway, tmp_path)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        http.post("/v1/runs", json={"app": "demo"}, headers=_bearer(a))
        assert http.get("/metrics").status_code == 403
        assert http.get("/metrics", headers=_bearer(a)).status_code == 403
        gateway_state(srv).admin_token = "s3cret"
        r = http.get("/metrics", headers=_bearer("s3cret"))
        assert r.status_code == 200 and "tenant-a" not in r.text, r.text[:500]


# ---------------------------------------------------------------------------------- 6
def _wrong(key: str, i: int) -> str:
    return key[:-6] + f"{i:06d}"


def test_wrong_secrets_with_a_tenants_key_id_do_not_lock_it_out(make_gateway, tmp_path) -> None:  # noqa: ANN001
    srv, a, b = _authed(make_gateway, tmp_path)
    authn = gateway_state(srv).security.authenticator
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.get("/v1/models", headers=_bearer(a)).status_code == 200
        authn._cache.clear()  # A's next request is verified again (its cache entry expired)
        # the attacker knows A's key id: many different wrong secrets, from A's address too
        codes = [http.get("/v1/models", headers=_bearer(_wrong(a, i))).status_code
                 for i in range(12)]
        assert set(codes) <= {401, 429}, codes
        assert http.get("/v1/models", headers=_bearer(a)).status_code == 200
        # 25+ unknown-id guesses from the address A and B share lock out neither
        for i in range(40):
            http.get("/v1/models", headers=_bearer(f"hk-{i:08x}.nope"))
        authn._cache.clear()
        assert http.get("/v1/models", headers=_bearer(a)).status_code == 200
        assert http.get("/v1/models", headers=_bearer(b)).status_code == 200


def test_forwarded_for_is_trusted_only_from_configured_proxies(make_gateway, tmp_path) -> None:  # noqa: ANN001
    srv, a, _ = _authed(make_gateway, tmp_path)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        # a loopback client cannot escape the address throttle by naming other addresses
        codes = [http.get("/v1/models", headers={
            **_bearer(f"hk-{i:08x}.nope"), "X-Forwarded-For": f"10.0.{i // 256}.{i % 256}"}
        ).status_code for i in range(60)]
    assert 429 in codes, codes
    srv2, _, _ = _authed(make_gateway, tmp_path / "p",
                         server={"trusted_proxies": ["127.0.0.1"]}) \
        if (tmp_path / "p").mkdir() is None else (None, None, None)
    with httpx.Client(base_url=srv2.url, timeout=30) as http:
        codes = [http.get("/v1/models", headers={
            **_bearer(f"hk-{i:08x}.nope"), "X-Forwarded-For": f"10.0.{i // 256}.{i % 256}"}
        ).status_code for i in range(60)]
    assert set(codes) == {401}, codes  # behind a trusted proxy: each client its own budget


# ---------------------------------------------------------------------------------- 9
def test_slow_bodies_are_cut_off_and_do_not_starve_other_tenants(make_gateway, tmp_path) -> None:  # noqa: ANN001
    srv, a, b = _authed(make_gateway, tmp_path, server={"body_timeout_s": 1.0},
                        security={"tenant_max_uploads": 8})
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.get("/v1/models", headers=_bearer(b)).status_code == 200  # B's key cached
        assert http.get("/v1/models", headers=_bearer(a)).status_code == 200
    socks: list[socket.socket] = []
    try:
        for _ in range(30):  # B: bodies that trickle (the headers promise 1000 bytes)
            s = socket.create_connection((host, int(port)))
            s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: "
                      f"Bearer {b}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: 1000\r\n\r\n{{".encode())
            socks.append(s)
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            t0 = time.monotonic()
            r = http.post("/v1/chat/completions", headers=_bearer(a), json=_CHAT)
            assert r.status_code == 200 and time.monotonic() - t0 < 2.0, r.text
        t0 = time.monotonic()
        answers = []
        for s in socks:
            s.settimeout(5)
            try:
                answers.append(s.recv(200).split(b"\r\n")[0])
            except (TimeoutError, ConnectionError):
                answers.append(b"")
        assert time.monotonic() - t0 < 4.0
        # past the per-tenant cap: 429 at once; the others: 408 after the body timeout
        assert {x.split()[1] for x in answers if x} == {b"408", b"429"}, answers
    finally:
        for s in socks:
            s.close()


# ---------------------------------------------------------------------------------- 5, 8
def _chat_as(http: httpx.Client, key: str, system: str, **headers: str) -> httpx.Response:
    return http.post("/v1/chat/completions", headers={**_bearer(key), **headers}, json={
        "model": "llama-2-7b", "max_tokens": 2,
        "messages": [{"role": "system", "content": system},
                     {"role": "user", "content": "hello there"}]})


def test_inferred_apps_belong_to_their_tenant(make_gateway, tmp_path) -> None:  # noqa: ANN001
    srv, a, b = _authed(make_gateway, tmp_path)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        r = _chat_as(http, a, "You are the secret payroll assistant of Acme.")
        assert r.status_code == 200, r.text
        app = r.headers["X-Hermes-App"]
        assert app.startswith("tenant-a."), app
        # B's identical prompt is B's own app
        rb = _chat_as(http, b, "You are the secret payroll assistant of Acme.")
        assert rb.headers["X-Hermes-App"].startswith("tenant-b."), rb.headers
        # B cannot run A's app, by header or by POST /v1/runs
        r = _chat_as(http, b, "anything", **{"X-Hermes-App": app})
        assert r.status_code == 403 and r.json()["error"]["code"] == "app_not_owned", r.text
        r = http.post("/v1/runs", json={"app": app}, headers=_bearer(b))
        assert r.status_code == 403, r.text
    learner = gateway_state(srv).scheduler.learner
    assert learner.learns_from(app, "tenant-a") and not learner.learns_from(app, "tenant-b")
    # shared apps learn from no tenant's runs unless the admin opted in
    assert not learner.learns_from("factool_kbqa", "tenant-b")
    assert learner.learns_from("factool_kbqa", "default")


def test_learned_apps_are_bounded_and_listings_paginated(make_gateway, tmp_path) -> None:  # noqa: ANN001
    srv = make_gateway(identity={"max_apps": 16})
    state = gateway_state(srv)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        for i in range(24):
            rid = http.post("/v1/runs", json={"app": f"flood{i:03d}"}).json()["run_id"]
            r = http.post("/v1/chat/completions", headers={"X-Hermes-Run": rid}, json={
                "model": "llama-2-7b", "max_tokens": 2,
                "messages": [{"role": "user", "content": f"x{i}"}]})
            assert r.status_code == 200, r.text
            assert http.post(f"/v1/runs/{rid}/finish").status_code == 200
        state.scheduler.learner.flush()
        names = state.scheduler.app_names()
        flood = sorted(n for n in names if n.startswith("flood"))
        assert len(flood) <= 16 and "flood023" in flood, flood
        page = http.get("/v1/apps", params={"limit": 5}).json()
        assert len(page["apps"]) == 5 and page["has_more"] is True
        nxt = http.get("/v1/apps", params={"limit": 5, "after": page["last"]}).json()
        assert nxt["apps"][0]["name"] > page["last"]
        assert http.get("/v1/apps", params={"limit": 100_000}).status_code == 400
    graphs = [f for f in tmp_path.rglob("flood*.json") if f.is_file()]
    logs = [f for f in tmp_path.rglob("flood*.jsonl") if f.is_file()]
    assert 0 < len(graphs) <= 16 and len(logs) <= 16, (graphs, logs)


# ---------------------------------------------------------------------------------- 13
@pytest.mark.slow
def test_a_huge_n_does_not_stall_the_gateway(gateway) -> None:  # noqa: ANN001
    def big() -> None:
        with httpx.Client(base_url=gateway.url, timeout=4) as http:
            try:
                http.post("/v1/chat/completions", json={**_CHAT, "n": 128, "max_tokens": 8000,
                                                        "ignore_eos": True})
            except httpx.TimeoutException:
                pass  # the answer takes long: only the loop's responsiveness is measured

    with _Pinger(gateway.url) as ping:
        t = threading.Thread(target=big)
        t.start()
        t.join(30)
    assert ping.worst < 1.0, ping.worst

"""Regression tests for the security findings of issue 15, each against a real gateway.

1. tool calls without a sandbox are refused (no silent plain-subprocess fallback); the unsafe
   opt-in is loopback only; the bubblewrap sandbox never sees the gateway's secrets;
2. wrong secrets do not stall the event loop; failures are throttled (429 + Retry-After);
3. metric label values from client input are bounded; ``/metrics`` can be protected;
4. malformed PDGraph uploads are 4xx and leave the stored graph as it was;
5. tenant keys cannot overwrite shared apps;
6. ``POST /v1/runs`` validates its input completely before it creates anything;
7. rate-limit changes reach a running gateway;
8. ``Idempotency-Key`` on ``POST /v1/runs`` (also across a restart);
9. loose ends: ownership before validation on ``/tools``, knob names, header-read timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gw_redis import redis_url  # noqa: F401  (fixture)

from hermes.gateway.auth import check_exposure
from hermes.gateway.config import load_config
from hermes.gateway.keys import AuthError, FileKeyStore
from hermes.gateway.server import gateway_state


def _key(auth: Path, tenant: str) -> str:
    return FileKeyStore(auth).create(tenant)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _no_bwrap_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH on which bubblewrap cannot be found (the sandbox looks it up there)."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))


def _bwrap_usable() -> bool:
    from hermeslet.tools import SubprocessSandbox

    return SubprocessSandbox().sandboxed


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A directory outside /tmp (the sandbox's /tmp is a fresh tmpfs anyway): where an
    operator keeps the auth file, the state directory and the certificates."""
    d = Path(tempfile.mkdtemp(prefix="hermes-secrets-", dir="/var/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------- 1
def test_tool_calls_are_refused_without_a_sandbox(make_gateway, monkeypatch, caplog) -> None:  # noqa: ANN001
    _no_bwrap_path(monkeypatch)
    caplog.set_level(logging.WARNING)
    srv = make_gateway()
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        rid = http.post("/v1/runs", json={"app": "coder"}).json()["run_id"]
        r = http.post(f"/v1/runs/{rid}/tools", json={
            "unit": "execute_code", "backend": "docker:python:3.10-slim",
            "code": "import os; print(os.getuid())"})
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "tool_sandbox_unavailable"
        assert "bubblewrap" in err["message"] and "unsafe" in err["message"]
        assert http.get(f"/v1/runs/{rid}").json()["units"] == []  # nothing started
    lines = [r.getMessage() for r in caplog.records if "sandbox" in r.getMessage()]
    assert any("refused" in m for m in lines), lines


def test_hosted_tool_calls_without_a_sandbox_fail_the_run_with_the_reason(
        make_gateway, monkeypatch) -> None:  # noqa: ANN001
    _no_bwrap_path(monkeypatch)
    srv = make_gateway(docker_steps="runner", time_scale=200.0)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        rid = http.post("/v1/runs", json={"app": "code_generation",
                                          "input": {"seed": 1}}).json()["run_id"]
        deadline = time.monotonic() + 30
        while (run := http.get(f"/v1/runs/{rid}").json())["state"] in ("queued", "running"):
            assert time.monotonic() < deadline, run
            time.sleep(0.1)
    assert run["state"] == "failed" and "no connected node has a tool sandbox" in run["error"], run


def test_unsafe_unsandboxed_tools_is_an_explicit_loopback_only_opt_in(
        make_gateway, monkeypatch, caplog, tmp_path) -> None:  # noqa: ANN001
    _no_bwrap_path(monkeypatch)
    caplog.set_level(logging.WARNING)
    srv = make_gateway(tools={"unsafe_unsandboxed": True})
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        rid = http.post("/v1/runs", json={"app": "coder"}).json()["run_id"]
        r = http.post(f"/v1/runs/{rid}/tools", json={
            "unit": "execute_code", "backend": "docker:python:3.10-slim", "code": "print(6 * 7)"})
        assert r.status_code == 200 and r.json()["stdout"] == "42\n", r.text
    assert any("UNSANDBOXED" in r.getMessage() for r in caplog.records)
    auth = tmp_path / "auth.json"
    _key(auth, "acme")
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        cfg = load_config(None, environ={}, host=host, auth_file=str(auth),
                          tools={"unsafe_unsandboxed": True})
        with pytest.raises(AuthError, match="unsafe"):
            check_exposure(cfg)
    check_exposure(load_config(None, environ={}, host="127.0.0.1",
                               tools={"unsafe_unsandboxed": True}))
    from hermes.cli import main

    assert main(["serve", "--host", "0.0.0.0", "--port", "0", "--auth-file", str(auth),
                 "--unsafe-unsandboxed-tools"]) == 2


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bwrap not installed")
def test_the_sandbox_never_sees_the_gateways_secrets(make_gateway, outside_tmp) -> None:  # noqa: ANN001
    if not _bwrap_usable():
        pytest.skip("bwrap unusable on this host (no user namespaces)")
    auth = outside_tmp / "auth.json"
    key = _key(auth, "acme")
    state = outside_tmp / "state"
    certs = outside_tmp / "certs"
    certs.mkdir()
    (certs / "server.key_secret").write_text("secret-key")
    os.chmod(certs / "server.key_secret", 0o600)
    srv = make_gateway(auth_file=str(auth), state_dir=str(state))
    code = ("import os\n"
            "for p in " + repr([str(auth), str(state), str(certs / "server.key_secret"),
                                 "/etc/shadow", str(Path.home())]) + ":\n"
            "    try:\n"
            "        print(p, 'LEAK', os.listdir(p) if os.path.isdir(p) else open(p).read()[:20])\n"
            "    except OSError as e:\n"
            "        print(p, 'denied', e.errno)\n")
    with httpx.Client(base_url=srv.url, timeout=30, headers=_bearer(key)) as http:
        rid = http.post("/v1/runs", json={"app": "coder"}).json()["run_id"]
        r = http.post(f"/v1/runs/{rid}/tools", json={
            "unit": "execute_code", "backend": "docker:python:3.10-slim", "code": code})
        assert r.status_code == 200, r.text
        out = r.json()
    assert out["exit_code"] == 0, out["stderr"]
    assert "LEAK" not in out["stdout"], out["stdout"]
    assert out["stdout"].count("denied") == 5


# ---------------------------------------------------------------------------------- 2
def test_wrong_secrets_do_not_stall_the_gateway(make_gateway, tmp_path) -> None:  # noqa: ANN001
    auth = tmp_path / "auth.json"
    key = _key(auth, "acme")
    wrong = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    srv = make_gateway(auth_file=str(auth))
    stop = threading.Event()
    codes: list[int] = []

    def hammer() -> None:  # bounded: 3 clients, one request at a time each
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            while not stop.is_set():
                codes.append(c.get("/v1/models", headers=_bearer(wrong)).status_code)

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    lat: list[float] = []
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            time.sleep(0.3)
            for _ in range(40):
                t0 = time.perf_counter()
                assert http.get("/healthz").status_code == 200
                lat.append(time.perf_counter() - t0)
                time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join()
    p50 = statistics.median(lat)
    assert p50 < 0.05, f"/healthz p50 {p50 * 1000:.1f} ms while wrong secrets hammer"
    assert set(codes) <= {401, 429} and 429 in codes, sorted(set(codes))


def test_repeated_wrong_secrets_are_throttled_with_retry_after(make_gateway, tmp_path) -> None:  # noqa: ANN001
    auth = tmp_path / "auth.json"
    key = _key(auth, "acme")
    other = _key(auth, "bob")
    wrong = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    srv = make_gateway(auth_file=str(auth))
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.get("/v1/models", headers=_bearer(other)).status_code == 200  # cached now
        codes = [http.get("/v1/models", headers=_bearer(wrong)).status_code for _ in range(15)]
        assert codes[0] == 401 and codes[-1] == 429, codes
        n = codes.index(429)
        assert 3 <= n <= 10 and set(codes[n:]) == {429}, codes
        r = http.get("/v1/models", headers=_bearer(wrong))
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "auth_throttled"
        # a key verified a moment ago still works (from the cache, without a verification)
        assert http.get("/v1/models", headers=_bearer(other)).status_code == 200


def test_verified_keys_are_cached_briefly_and_revocation_is_immediate(
        make_gateway, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    from hermes.gateway import auth as auth_mod

    calls: list[str] = []
    real = auth_mod.verify_secret

    def counting(secret: str, stored: str) -> bool:
        calls.append(threading.current_thread().name)
        return real(secret, stored)

    monkeypatch.setattr(auth_mod, "verify_secret", counting)
    auth = tmp_path / "auth.json"
    key = _key(auth, "acme")
    srv = make_gateway(auth_file=str(auth))
    with httpx.Client(base_url=srv.url, timeout=30, headers=_bearer(key)) as http:
        for _ in range(5):
            assert http.get("/v1/models").status_code == 200
        assert len(calls) == 1
        assert calls[0] != "hermes-gateway"  # verified off the event loop's thread
        authn = gateway_state(srv).security.authenticator
        authn.cache_ttl_s = 0.2
        time.sleep(0.3)
        assert http.get("/v1/models").status_code == 200
        assert len(calls) == 2  # the cached verification expired
        FileKeyStore(auth).revoke(key.split(".")[0][3:])
        assert http.get("/v1/models").status_code == 401


# ---------------------------------------------------------------------------------- 3
def _series(text: str, metric: str, label: str) -> set[str]:
    out = set()
    for line in text.splitlines():
        if line.startswith(metric + "{"):
            for part in line[len(metric) + 1:].split("}")[0].split('",'):
                k, _, v = part.partition('="')
                if k == label:
                    out.add(v.rstrip('"'))
    return out


def test_metric_labels_from_client_input_are_bounded(make_gateway) -> None:  # noqa: ANN001
    srv = make_gateway()
    gateway_state(srv).metrics.max_tenants = 20
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        base = len(http.get("/metrics").content)
        for i in range(120):
            assert http.post("/v1/runs", json={"app": f"junk{i}",
                                               "tenant": f"t{i}"}).status_code == 201
        assert http.post("/v1/runs", json={"app": "factool_kbqa", "tenant": "t0"}).status_code == 201
        r = http.post("/v1/completions", headers={"X-Hermes-App": "junk-header"},
                      json={"model": "llama-2-7b", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
        text = http.get("/metrics").text
    apps = _series(text, "hermes_runs_started_total", "app")
    tenants = _series(text, "hermes_runs_started_total", "tenant")
    assert "factool_kbqa" in apps and "other" in apps and not any(a.startswith("junk") for a in apps)
    assert len(tenants) <= 21 and "other" in tenants, len(tenants)
    assert len(text) < base + 60_000, (base, len(text))


def test_metrics_can_be_protected_by_a_bearer_token(make_gateway) -> None:  # noqa: ANN001
    srv = make_gateway(metrics_token="m-s3cret")
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        r = http.get("/metrics")
        assert r.status_code == 401 and r.json()["error"]["code"] == "metrics_denied"
        assert http.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 403
        r = http.get("/metrics", headers={"Authorization": "Bearer m-s3cret"})
        assert r.status_code == 200 and "hermes_runs_started_total" in r.text


# ---------------------------------------------------------------------------------- 4
def _graph_json(app: str, unit: str = "a") -> str:
    return json.dumps({"version": 1, "app": app, "entry": {unit: 1.0},
                       "units": {unit: {"backend": "llm:m", "next": {"": 1.0}}}})


@pytest.mark.parametrize("prefix", ["/v1/apps", "/admin/apps"])
def test_malformed_pdgraph_uploads_are_4xx_and_keep_the_stored_graph(make_gateway, prefix) -> None:  # noqa: ANN001
    srv = make_gateway(kb="")  # no knowledge base: only the scheduler holds the graph
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.put(f"{prefix}/up", content=_graph_json("up")).status_code == 200
        surrogate = _graph_json("up", unit="SURR").replace("SURR", "\\ud800")
        bad = {
            "lone surrogate unit": (surrogate, "units"),
            "unit name charset": (_graph_json("up", unit="a b<-c"), "units"),
            "unit name length": (_graph_json("up", unit="u" * 300), "units"),
            "deep nesting": ("[" * 100_000 + "]" * 100_000, None),
            "non-UTF-8": (b"\xff\xfe{\"version\": 1}", None),
            "NaN": (_graph_json("up").replace('"next": {"": 1.0}', '"next": {"": NaN}'), None),
            "huge number": (_graph_json("up").replace(
                '"backend": "llm:m"', '"backend": "llm:m", "consumption": {"duration_s": [1e400]}'),
                None),
        }
        for what, (body, field) in bad.items():
            r = http.put(f"{prefix}/up", content=body)
            assert 400 <= r.status_code < 500, (what, r.status_code, r.text)
            err = r.json()["error"]
            if field:
                assert field in err["message"], (what, err)
            g = http.get("/v1/apps/up")
            assert g.status_code == 200, (what, g.text)
            assert set(g.json()["pdgraph"]["units"]) == {"a"}, what
        r = http.put(f"{prefix}/bad%20name", content=_graph_json("bad name"))
        assert r.status_code in (400, 404, 422) and r.json()["error"]["param"] == "name"


# ---------------------------------------------------------------------------------- 5
def test_tenant_keys_cannot_overwrite_shared_apps(make_gateway, tmp_path) -> None:  # noqa: ANN001
    auth = tmp_path / "auth.json"
    alice, bob = _key(auth, "alice"), _key(auth, "bob")
    srv = make_gateway(auth_file=str(auth))
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        before = http.get("/v1/apps/factool_kbqa", headers=_bearer(alice)).json()["pdgraph"]
        r = http.put("/v1/apps/factool_kbqa", content=_graph_json("factool_kbqa"),
                     headers=_bearer(alice))
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "app_not_owned"
        assert "alice." in r.json()["error"]["message"]
        assert http.get("/v1/apps/factool_kbqa", headers=_bearer(bob)).json()["pdgraph"] == before
        # a tenant's own apps: TENANT.NAME
        r = http.put("/v1/apps/alice.agent", content=_graph_json("alice.agent"),
                     headers=_bearer(alice))
        assert r.status_code == 200, r.text
        assert http.put("/v1/apps/alice.agent", content=_graph_json("alice.agent"),
                        headers=_bearer(bob)).status_code == 403
        assert http.put("/v1/apps/alice.x.agent", content=_graph_json("alice.x.agent"),
                        headers=_bearer(alice)).status_code == 403  # tenant "alice.x"'s
        assert http.get("/v1/apps/alice.agent", headers=_bearer(bob)).status_code == 404
        assert http.get("/v1/apps/alice.agent", headers=_bearer(alice)).status_code == 200
        names = [a["name"] for a in http.get("/v1/apps", headers=_bearer(bob)).json()["apps"]]
        assert "alice.agent" not in names and "factool_kbqa" in names
        r = http.post("/v1/runs", json={"app": "alice.agent"}, headers=_bearer(bob))
        assert r.status_code == 403 and r.json()["error"]["code"] == "app_not_owned"
        # the admin owns shared apps (with authentication on: the admin token, always)
        assert http.put("/admin/apps/factool_kbqa", content=_graph_json("factool_kbqa")
                        ).status_code == 403
        gateway_state(srv).admin_token = "adm1n"
        assert http.put("/admin/apps/factool_kbqa", content=_graph_json("factool_kbqa"),
                        headers=_bearer("adm1n")).status_code == 200


# ---------------------------------------------------------------------------------- 6
@pytest.mark.parametrize("body,param", [
    ('{"app": "factool_kbqa", "input": {"seed": 1e400}}', "input"),
    ('{"app": "factool_kbqa", "input": {"seed": NaN}}', "input"),
    ('{"app": "factool_kbqa", "input": "\\ud800"}', "input"),
    ('{"app": "factool_kbqa", "input": {"\\udfff": 1}}', "input"),
    ('{"app": "x", "tenant": "\\ud800"}', "tenant"),
    ('{"app": "x", "tenant": "a/b"}', "tenant"),
    ('{"app": "x", "input": ' + "[" * 5000 + "]" * 5000 + "}", None),
    (b'{"app": "x", "input": "\xff"}', None),
])
def test_create_run_validates_everything_before_creating(make_gateway, body, param) -> None:  # noqa: ANN001
    srv = make_gateway()
    sched = gateway_state(srv).scheduler
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        r = http.post("/v1/runs", content=body, headers={"Content-Type": "application/json"})
        assert 400 <= r.status_code < 500, (r.status_code, r.text)
        assert "error" in r.json()
        if param:
            assert r.json()["error"]["param"] == param, r.text
        assert len(sched.runs) == 0
        assert http.get("/v1/runs").json()["runs"] == []


# ---------------------------------------------------------------------------------- 7
def _burst(http: httpx.Client, key: str, n: int) -> list[int]:
    return [http.get("/v1/runs", headers=_bearer(key)).status_code for _ in range(n)]


@pytest.mark.parametrize("where", ["file", "redis"])
def test_rate_limit_changes_reach_a_running_gateway(make_gateway, tmp_path, where, request) -> None:  # noqa: ANN001
    if where == "file":
        auth = tmp_path / "auth.json"
        key = _key(auth, "alice")
        store: Any = FileKeyStore(auth)
        srv_opts = {"auth_file": str(auth)}
    else:
        from hermes.gateway.keys import RedisKeyStore

        url = request.getfixturevalue("redis_url")
        store = RedisKeyStore(url)
        key = store.create("alice")
        srv_opts = {"auth_redis": url}
    store.set_limits("alice", {"rate": 100, "burst": 100})
    srv = make_gateway(**srv_opts)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        assert set(_burst(http, key, 3)) == {200}
        store.set_limits("alice", {"rate": 1, "burst": 1})  # lowered
        time.sleep(1.2)  # limits are re-read at most once a second
        codes = _burst(http, key, 20)
        assert codes.count(429) >= 17, codes
        store.set_limits("alice", {"rate": 1000, "burst": 1000})  # raised
        time.sleep(1.2)
        codes = _burst(http, key, 20)
        assert codes == [200] * 20, codes
        store.set_limits("alice", {"rate": 2, "burst": 2})
        time.sleep(1.2)
        assert _burst(http, key, 10).count(429) >= 7
        store.set_limits("alice", {"max_concurrent": 5})  # no rate limit any more
        time.sleep(1.2)
        assert _burst(http, key, 30) == [200] * 30


# ---------------------------------------------------------------------------------- 8
def test_idempotency_key_returns_the_same_run_and_survives_a_restart(make_gateway, tmp_path) -> None:  # noqa: ANN001
    state = tmp_path / "state-idem"
    body = {"app": "factool_kbqa", "input": {"seed": 3}}
    srv = make_gateway(state_dir=str(state))
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        h = {"Idempotency-Key": "order-42"}
        r1 = http.post("/v1/runs", json=body, headers=h)
        assert r1.status_code == 201, r1.text
        rid = r1.json()["run_id"]
        r2 = http.post("/v1/runs", json=body, headers=h)
        assert r2.status_code in (200, 201) and r2.json()["run_id"] == rid
        assert r2.headers.get("idempotent-replayed") == "true"
        r3 = http.post("/v1/runs", json={**body, "input": {"seed": 4}}, headers=h)
        assert r3.status_code in (409, 422) and r3.json()["error"]["code"] == "idempotency_key_reused"
        # keys are per tenant: another tenant's "order-42" is its own
        r4 = http.post("/v1/runs", json={**body, "tenant": "other"}, headers=h)
        assert r4.status_code == 201 and r4.json()["run_id"] != rid
        r5 = http.post("/v1/runs", json=body)  # no key: a new run
        assert r5.json()["run_id"] != rid
        bad = http.post("/v1/runs", json=body, headers={"Idempotency-Key": "x" * 300})
        assert bad.status_code == 422 and bad.json()["error"]["param"] == "Idempotency-Key"
        sched = gateway_state(srv).scheduler
        n_runs = len(sched.runs) + len(sched.finished)
    srv.stop()
    srv2 = make_gateway(state_dir=str(state))
    with httpx.Client(base_url=srv2.url, timeout=30) as http:
        r = http.post("/v1/runs", json=body, headers={"Idempotency-Key": "order-42"})
        assert r.status_code in (200, 201) and r.json()["run_id"] == rid, r.text
        r = http.post("/v1/runs", json={**body, "input": {"seed": 9}},
                      headers={"Idempotency-Key": "order-42"})
        assert r.status_code in (409, 422)
        sched2 = gateway_state(srv2).scheduler
        assert len(sched2.runs) + len(sched2.finished) == n_runs


# ---------------------------------------------------------------------------------- 9
def test_tools_checks_ownership_before_the_body(make_gateway, tmp_path) -> None:  # noqa: ANN001
    auth = tmp_path / "auth.json"
    alice, bob = _key(auth, "alice"), _key(auth, "bob")
    srv = make_gateway(auth_file=str(auth))
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        rid = http.post("/v1/runs", json={"app": "x"}, headers=_bearer(alice)).json()["run_id"]
        for body in ({}, {"unit": "t", "backend": "docker:img"}, {"junk": 1}):
            r = http.post(f"/v1/runs/{rid}/tools", json=body, headers=_bearer(bob))
            assert r.status_code == 404, r.text
            r = http.post(f"/v1/runs/{rid}/tools", json=body, headers=_bearer(alice))
            assert r.status_code == 422, r.text
        r = http.post("/v1/runs/run-nope/tools", content=b"not json", headers=_bearer(alice))
        assert r.status_code == 404


def test_knob_names_are_validated(gateway) -> None:  # noqa: ANN001
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        for scope, name in (("app", "../../etc"), ("app", "a/b"), ("tenant", "x\ny"),
                            ("app", "a" * 200), ("tenant", ".hidden")):
            r = http.put("/admin/knobs", json={"scope": scope, "name": name, "k": 0.3})
            assert r.status_code == 422 and r.json()["error"]["param"] == "name", (name, r.text)
        r = http.put("/admin/knobs", json={"scope": "app", "name": "factool_kbqa", "k": 0.3})
        assert r.status_code == 200
        assert http.get("/admin/knobs").json()["knobs"]["app"] == {"factool_kbqa": 0.3}


def test_slow_headers_are_cut_off(make_gateway) -> None:  # noqa: ANN001
    srv = make_gateway(header_timeout_s=0.5)
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)

    def cut_after(payload: bytes) -> float:
        with socket.create_connection((host, int(port))) as s:
            s.settimeout(5)
            if payload:
                s.sendall(payload)
            t0 = time.monotonic()
            try:
                data = s.recv(1024)
            except TimeoutError:
                return 99.0
            assert data in (b"",) or data.startswith(b"HTTP/1.1 408"), data
            return time.monotonic() - t0

    assert cut_after(b"") < 2.0  # connected, sent nothing
    assert cut_after(b"GET /healthz HTTP/1.1\r\nHost: x\r\n") < 2.0  # headers never end
    # a normal request on a keep-alive connection is unaffected
    with httpx.Client(base_url=srv.url, timeout=5) as http:
        assert http.get("/healthz").status_code == 200
        time.sleep(0.8)
        assert http.get("/healthz").status_code == 200

    async def slow_but_complete() -> int:
        r, w = await asyncio.open_connection(host, int(port))
        w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        await asyncio.sleep(0.2)
        w.write(b"\r\n")
        line = await asyncio.wait_for(r.readline(), 5)
        w.close()
        return int(line.split()[1])

    assert asyncio.run(slow_but_complete()) == 200

    async def second_request_never_ends() -> float:
        """A keep-alive connection's next request whose headers never end is cut off too
        (its timer is armed by the bytes that began it, not by the connection)."""
        r, w = await asyncio.open_connection(host, int(port))
        w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(r.readline(), 5)).split()[1] == b"200"
        await asyncio.sleep(0.8)  # idle longer than the header timeout: not cut meanwhile
        w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        while await asyncio.wait_for(r.read(4096), 5):
            pass  # the rest of the first answer, then the end of the connection
        w.close()
        return time.monotonic() - t0

    assert 0.4 < asyncio.run(second_request_never_ends()) < 2.0

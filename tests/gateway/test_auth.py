"""Authentication and admission against a real gateway: API keys per tenant (stored hashed),
tenant isolation, rate limits and quotas (429 + Retry-After), body limits, the admin token."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis
from gw_redis import redis_url  # noqa: F401  (fixture)

from hermes.gateway.auth import build_security
from hermes.gateway.config import load_config
from hermes.gateway.keys import AuthError, FileKeyStore, hash_secret, verify_secret


def _create_key(auth_file: Path, tenant: str) -> str:
    out = subprocess.run([sys.executable, "-m", "hermes.cli", "keys", "create", "--tenant", tenant,
                          "--auth-file", str(auth_file)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_keys_create_prints_the_key_once_and_stores_only_its_hash(tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    key = _create_key(auth, "acme")
    assert key.startswith("hk-") and len(key) > 40
    text = auth.read_text()
    secret = key.split(".", 1)[1]
    assert secret not in text and key not in text  # only the hash is kept
    entry = json.loads(text)["keys"][0]
    assert entry["tenant"] == "acme" and entry["hash"].startswith("scrypt$")
    assert verify_secret(secret, entry["hash"]) and not verify_secret(secret + "x", entry["hash"])
    assert (auth.stat().st_mode & 0o777) == 0o600
    assert verify_secret("s", hash_secret("s")) and hash_secret("s") != hash_secret("s")  # salted


def test_wrong_or_missing_key_401_and_tenants_see_only_their_runs(make_gateway, tmp_path) -> None:  # noqa: ANN001
    auth = tmp_path / "auth.json"
    ka, kb = _create_key(auth, "alice"), _create_key(auth, "bob")
    srv = make_gateway(auth_file=str(auth))
    A = {"Authorization": f"Bearer {ka}"}
    B = {"X-API-Key": kb}
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.get("/healthz").status_code == 200  # public
        r = http.post("/v1/runs", json={"app": "x"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "invalid_api_key"
        for bad in ("Bearer nope", f"Bearer {ka}x", f"Bearer {ka[:-1]}", "Basic abc"):
            assert http.post("/v1/runs", json={"app": "x"},
                             headers={"Authorization": bad}).status_code == 401, bad
        assert http.get("/v1/models").status_code == 401
        r = http.post("/v1/runs", json={"app": "x"}, headers=A)
        assert r.status_code == 201, r.text
        run = r.json()
        assert run["tenant"] == "alice"
        rid = run["run_id"]
        assert http.get(f"/v1/runs/{rid}", headers=A).status_code == 200
        # bob: the run does not exist for him, whatever he tries
        for method, path in (("GET", f"/v1/runs/{rid}"), ("DELETE", f"/v1/runs/{rid}"),
                             ("POST", f"/v1/runs/{rid}/finish")):
            r = http.request(method, path, headers=B)
            assert r.status_code == 404, (method, r.text)
            assert rid in r.json()["error"]["message"]
        r = http.post("/v1/completions", headers={**B, "X-Hermes-Run": rid},
                      json={"model": "llama-2-7b", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 404
        assert http.get("/v1/runs", headers=B).json()["runs"] == []
        assert [x["run_id"] for x in http.get("/v1/runs", headers=A).json()["runs"]] == [rid]
        # a body naming another tenant is refused
        assert http.post("/v1/runs", json={"app": "x", "tenant": "alice"}, headers=B).status_code == 403
        r = http.post("/v1/completions", headers=B,
                      json={"model": "llama-2-7b", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert http.post(f"/v1/runs/{rid}/finish", headers=A).json()["state"] == "finished"
        # a revoked key stops working at once (the file is re-read)
        FileKeyStore(auth).revoke(ka.split(".")[0][3:])
        assert http.get(f"/v1/runs/{rid}", headers=A).status_code == 401


def test_rate_limit_and_quotas_answer_429_with_retry_after(make_gateway, tmp_path) -> None:  # noqa: ANN001
    auth = tmp_path / "auth.json"
    ka, kb = _create_key(auth, "alice"), _create_key(auth, "bob")
    store = FileKeyStore(auth)
    store.set_limits("alice", {"rate": 1, "burst": 3})
    store.set_limits("bob", {"max_concurrent": 1, "max_active_runs": 2})
    srv = make_gateway(auth_file=str(auth))
    A = {"Authorization": f"Bearer {ka}"}
    B = {"Authorization": f"Bearer {kb}"}
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        codes = [http.get("/v1/runs", headers=A).status_code for _ in range(5)]
        assert codes[:3] == [200, 200, 200] and 429 in codes[3:], codes
        r = http.get("/v1/runs", headers=A)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error" and "alice" in r.json()["error"]["message"]
        assert http.get("/v1/runs", headers=B).status_code == 200  # bob is not limited by alice
        # bob: two active runs at most
        ids = [http.post("/v1/runs", json={"app": "q"}, headers=B).json()["run_id"] for _ in range(2)]
        r = http.post("/v1/runs", json={"app": "q"}, headers=B)
        assert r.status_code == 429 and r.headers["retry-after"] and "quota" in r.text
        http.post(f"/v1/runs/{ids[0]}/finish", headers=B)
        assert http.post("/v1/runs", json={"app": "q"}, headers=B).status_code == 201

    async def concurrent() -> list[int]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            async def long() -> int:  # 4000 tokens at time scale 50: over a second in flight
                r = await client.post("/v1/completions", headers=B, json={
                    "model": "llama-2-7b", "prompt": "x" * 64, "max_tokens": 4000, "ignore_eos": True})
                return r.status_code

            first = asyncio.create_task(long())
            await asyncio.sleep(0.2)
            second = await client.get("/v1/runs", headers=B)
            assert second.status_code == 429 and second.headers["retry-after"] == "1"
            return [await first, second.status_code]

    assert asyncio.run(concurrent()) == [200, 429]


def test_request_body_limits_413(make_gateway) -> None:  # noqa: ANN001
    srv = make_gateway(max_body_bytes=4096)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        r = http.post("/v1/completions", json={"model": "llama-2-7b", "prompt": "x" * 10_000})
        assert r.status_code == 413 and "4096" in r.json()["error"]["message"]

        def chunks():  # no Content-Length: the limit is enforced while reading
            for _ in range(10):
                yield b" " * 1000

        r = http.post("/v1/runs", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        r = http.post("/v1/runs", json={"app": "small"})
        assert r.status_code == 201


def test_serving_off_loopback_without_auth_is_refused(tmp_path: Path) -> None:
    cfg = load_config(None, environ={}, host="0.0.0.0")
    with pytest.raises(AuthError, match="refusing to serve on 0.0.0.0 without authentication"):
        build_security(cfg)
    _create_key(tmp_path / "a.json", "t")
    assert build_security(load_config(None, environ={}, host="0.0.0.0",
                                      auth_file=str(tmp_path / "a.json"))).auth_on
    assert not build_security(load_config(None, environ={})).auth_on  # loopback: off by default
    # the CLI refuses before binding anything
    r = subprocess.run([sys.executable, "-m", "hermes.cli", "serve", "--host", "0.0.0.0",
                        "--port", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "refusing to serve on 0.0.0.0" in r.stderr


def test_redis_key_store(redis_url: str) -> None:  # noqa: F811
    from hermes.gateway.auth import Authenticator
    from hermes.gateway.keys import RedisKeyStore

    store = RedisKeyStore(redis_url, prefix=f"t{time.time()}:")
    key = store.create("acme")
    raw = "".join(redis.Redis.from_url(redis_url, decode_responses=True).hvals(store.prefix + "keys"))
    assert key.split(".", 1)[1] not in raw and "scrypt$" in raw
    auth = Authenticator(store)
    assert auth.tenant_of(key) == "acme" and auth.tenant_of(key + "x") is None
    store.set_limits("acme", {"rate": 5})
    assert store.tenant_limits()["acme"].rate == 5
    assert store.revoke(key.split(".")[0][3:])
    assert auth.tenant_of(key) is None  # revoked: cached or not

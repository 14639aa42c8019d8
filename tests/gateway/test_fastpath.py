"""The completion endpoints' direct ASGI route (hermes.gateway.api.fastpath) answers exactly as the
FastAPI routes it bypasses: security first, the app's exception handlers, the same schema."""

from __future__ import annotations

import httpx

from tests.gateway.test_auth import _create_key

BODY = {"model": "llama-2-7b", "prompt": "hi", "max_tokens": 2}


def test_fast_path_keeps_errors_security_and_schema(make_gateway, tmp_path) -> None:  # noqa: ANN001
    auth = tmp_path / "auth.json"
    key = _create_key(auth, "alice")
    srv = make_gateway(auth_file=str(auth), max_body_bytes=4096)
    A = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        # the security middleware still runs first: no key, no completion
        assert http.post("/v1/completions", json=BODY).status_code == 401
        r = http.post("/v1/completions", json=BODY, headers=A)
        assert r.status_code == 200 and r.json()["object"] == "text_completion"
        assert r.headers["X-Hermes-Run"].startswith("run-")
        # an HTTPException from the handler goes to the app's handler (OpenAI's error shape)
        r = http.post("/v1/chat/completions", headers={**A, "X-Hermes-Tenant": "bob"},
                      json={"model": "llama-2-7b", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 403 and "does not match" in r.json()["error"]["message"]
        # OpenAI-shaped validation errors come from the handler itself
        r = http.post("/v1/completions", content=b"{nope", headers=A)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        r = http.post("/v1/completions", json={**BODY, "max_tokens": 0}, headers=A)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"

        def chunks():  # no Content-Length: the limit trips while the handler reads the body
            for _ in range(10):
                yield b"x" * 1000

        r = http.post("/v1/completions", content=chunks(),
                      headers={**A, "content-type": "application/json"})
        assert r.status_code == 413
        # other methods and paths still go through FastAPI
        assert http.get("/v1/completions", headers=A).status_code == 405
        assert http.post("/v1/completionsX", json=BODY, headers=A).status_code == 404
        paths = http.get("/openapi.json").json()["paths"]
        assert "post" in paths["/v1/completions"] and "post" in paths["/v1/chat/completions"]

"""An edge serves ``/v1/embeddings`` and Anthropic's ``/v1/messages`` itself (one call to the
scheduler, the node's answer translated at the edge), with the all-in-one gateway's answers
and errors for the same requests.

Each test makes the scheduler's HTTP unreachable from the edge (the leader's ``http_address``
the edge follows points at a closed port): what an edge forwards then fails (503), so every
answer below came from the edge itself. Real parts in one test process (``edge_inproc``):
Redis, a ``--role scheduler`` gateway, a HermesLet with the built-in engines, edges; the
all-in-one gateway beside them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from edge_inproc import EMBED_MODEL, MODEL, Split, start_split
from gw_redis import redis_url  # noqa: F401  (fixture)

from hermes.gateway.api.openai_bodies import MAX_EMBED_INPUTS
from hermes.gateway.keys import FileKeyStore
from hermes.gateway.server import BackgroundServer
from hermes.procs import free_port

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def split(tmp_path: Path, redis_url: str) -> Iterator[Callable[..., Split]]:  # noqa: F811
    made: list[Split] = []

    def start(**overrides: Any) -> Split:
        redis.Redis.from_url(redis_url).flushdb()  # nothing of another test's cluster
        s = start_split(tmp_path, redis_url, **overrides)
        made.append(s)
        return s

    yield start
    for s in made:
        s.stop()


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
          {"model": EMBED_MODEL, "input": [[1, 2, 3], [4]], "encoding_format": "base64"}]
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
    for body, headers, status in bad:
        want = _post(aio.url, "/v1/embeddings", body, headers)
        got = _post(edge.url, "/v1/embeddings", body, headers)
        assert want.status_code == status, (body, want.text)
        assert (got.status_code, got.json()) == (status, want.json()), body
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

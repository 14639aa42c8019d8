"""Bad input: a schema-driven fuzz run (schemathesis, from the gateway's OpenAPI spec) and a
property-based one (hypothesis) on the OpenAI bodies, against a real gateway: over 1000 cases,
no 5xx, no crash. The admin and apps operations are fuzzed again with authentication on (an
API key, the admin token, a wrong key, none: each refused or served as it should be), and
PDGraph uploads with hostile documents (lone surrogates, odd unit names, NaN, deep nesting,
bytes that are not UTF-8) that must leave the stored graph alone. Plus the specific cases:
unknown ids named, malformed PDGraph uploads leave the stored graph alone, token limits."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes.gateway.config import load_config
from hermes.gateway.server import BackgroundServer, start_background
from hermes.kb import shipped_pdgraphs_dir

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402

CASES: dict[str, int] = {"schema": 0, "openai": 0, "auth": 0, "pdgraph": 0}
PER_OPERATION = 90  # x every operation
PER_AUTH_OPERATION = 60  # x the admin and apps operations, authentication on
ADMIN = "fuzz-admin-token"


@pytest.fixture(scope="module")
def fuzz_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    tmp = tmp_path_factory.mktemp("fuzz")
    srv = start_background(load_config(
        None, environ={}, port=0, bind="", kb=str(tmp / "kb"), state_dir=str(tmp / "state"),
        time_scale=200.0, log_level="error", max_body_bytes=65536))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def fuzz_auth_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BackgroundServer, str]]:
    """A gateway with authentication on (one tenant key) and an admin token."""
    from hermes.gateway.keys import FileKeyStore
    from hermes.gateway.server import gateway_state

    tmp = tmp_path_factory.mktemp("fuzz-auth")
    key = FileKeyStore(tmp / "auth.json").create("fuzz")
    srv = start_background(load_config(
        None, environ={}, port=0, bind="", kb=str(tmp / "kb"), state_dir=str(tmp / "state"),
        time_scale=200.0, log_level="error", max_body_bytes=65536,
        auth_file=str(tmp / "auth.json")))
    state = gateway_state(srv)
    state.admin_token = ADMIN
    state.security.authenticator.throttle.per_address = 10**9  # wrong keys: 401, not 429
    yield srv, key
    srv.stop()


def _operations(*prefixes: str) -> list:
    """The gateway's operations, from its OpenAPI spec (read without starting it); only the
    paths starting with one of ``prefixes`` when given."""
    from hermes.gateway.app import create_app

    spec = create_app(load_config(None, environ={})).openapi()
    ops = [r.ok() for r in schemathesis.openapi.from_dict(spec).get_all_operations()]
    return [op for op in ops if not prefixes or op.path.startswith(prefixes)]


# schemathesis' pytest plugin does not load under pytest 9: drive its strategies directly
@pytest.mark.slow
@pytest.mark.parametrize("operation", _operations(), ids=lambda op: f"{op.method.upper()} {op.path}")
def test_schema_fuzz_no_server_error(fuzz_gateway: BackgroundServer, operation) -> None:  # noqa: ANN001
    @given(case=operation.as_strategy())
    @settings(max_examples=PER_OPERATION, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case) -> None:  # noqa: ANN001
        CASES["schema"] += 1
        response = case.call(base_url=fuzz_gateway.url, timeout=30)
        case.validate_response(response, checks=[not_a_server_error])
        assert response.status_code < 500, (case.path, response.text)

    run()


_text = st.text(max_size=40)
_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                       st.floats(allow_nan=False, allow_infinity=False), _text)
_anything = st.recursive(_json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(_text, c, max_size=3),
                         max_leaves=6)
_max_tokens = st.one_of(st.integers(-3, 8), st.integers(131_073, 10**15), _anything)
_message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "robot"]),
                           "content": st.one_of(_text, st.none(), st.integers())}),
    _anything)
_chat = st.fixed_dictionaries(
    {}, optional={"model": st.one_of(st.just("llama-2-7b"), _anything),
                  "messages": st.one_of(st.lists(_message, max_size=3), _anything),
                  "max_tokens": _max_tokens, "stream": st.one_of(st.booleans(), _anything),
                  "temperature": st.one_of(st.floats(-5, 5), _anything), "n": _anything,
                  "stream_options": _anything})
_completion = st.fixed_dictionaries(
    {}, optional={"model": st.one_of(st.just("llama-2-7b"), _anything),
                  "prompt": st.one_of(_text, st.lists(st.integers(0, 50000), max_size=5), _anything),
                  "max_tokens": _max_tokens, "stream": st.one_of(st.booleans(), _anything),
                  "top_p": st.one_of(st.floats(-1, 2), _anything)})


@pytest.mark.slow
@given(endpoint=st.sampled_from(["chat/completions", "completions"]), data=st.data(),
       raw=st.one_of(st.none(), st.binary(max_size=64)), headers=st.dictionaries(
           st.sampled_from(["X-Hermes-Run", "X-Hermes-Unit", "X-Hermes-App", "X-Hermes-Tenant"]),
           st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=20)))
@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_openai_bodies_fuzz_no_server_error(fuzz_gateway: BackgroundServer, endpoint: str, data,  # noqa: ANN001
                                            raw: bytes | None, headers: dict[str, str]) -> None:
    CASES["openai"] += 1
    body = data.draw(_chat if endpoint == "chat/completions" else _completion)
    content = raw if raw is not None else json.dumps(body).encode()
    r = httpx.post(f"{fuzz_gateway.url}/v1/{endpoint}", content=content, timeout=30,
                   headers={"content-type": "application/json", **headers})
    assert r.status_code < 500, (body, r.status_code, r.text)
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["message"], r.text  # a message that says what was wrong


@pytest.mark.slow
@pytest.mark.parametrize("operation", _operations("/admin", "/v1/apps"),
                         ids=lambda op: f"{op.method.upper()} {op.path}")
def test_admin_and_apps_fuzz_with_auth_no_server_error(fuzz_auth_gateway, operation) -> None:  # noqa: ANN001
    srv, key = fuzz_auth_gateway
    creds = {"admin": {"Authorization": f"Bearer {ADMIN}"},
             "tenant": {"Authorization": f"Bearer {key}"},
             "wrong": {"Authorization": "Bearer hk-00000000.wrong"}, "none": {}}

    @given(case=operation.as_strategy(), who=st.sampled_from(sorted(creds)))
    @settings(max_examples=PER_AUTH_OPERATION, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case, who: str) -> None:  # noqa: ANN001
        CASES["auth"] += 1
        response = case.call(base_url=srv.url, headers=creds[who], timeout=30)
        assert response.status_code < 500, (case.path, who, response.text)
        if response.status_code >= 400:
            assert response.json()["error"]["message"], response.text  # OpenAI's shape
        if operation.path.startswith("/admin"):
            if who != "admin":  # the admin token, and nothing else
                assert response.status_code in (401, 403), (case.path, who, response.text)
        elif who in ("wrong", "none"):
            assert response.status_code == 401, (case.path, who, response.text)
        elif who == "tenant" and case.method.upper() == "PUT" and response.status_code < 400:
            name = case.path_parameters["name"]
            assert name.rpartition(".")[0] == "fuzz", name  # a tenant writes only its own

    run()


def _mutations() -> st.SearchStrategy:
    """Hostile variations of a valid PDGraph upload."""
    names = st.one_of(st.text(max_size=8), st.sampled_from(["\ud800", "a<-b", "u" * 200, "a b"]))
    numbers = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1", "0.5", "true"])
    return st.one_of(
        st.tuples(st.just("unit"), names),
        st.tuples(st.just("number"), numbers),
        st.tuples(st.just("nesting"), st.integers(10, 30_000)),
        st.tuples(st.just("bytes"), st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("app"), names))


@pytest.mark.slow
@given(mutation=_mutations(), who=st.sampled_from(["admin", "tenant"]))
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_pdgraph_upload_fuzz_with_auth_keeps_the_stored_graph(fuzz_auth_gateway, mutation, who) -> None:  # noqa: ANN001
    srv, key = fuzz_auth_gateway
    CASES["pdgraph"] += 1
    app = "fuzz.graph" if who == "tenant" else "shared_graph"
    path = f"/v1/apps/{app}" if who == "tenant" else f"/admin/apps/{app}"  # PUT and GET
    headers = {"Authorization": f"Bearer {key if who == 'tenant' else ADMIN}"}
    good = {"version": 1, "app": app, "entry": {"a": 1.0},
            "units": {"a": {"backend": "llm:m", "next": {"": 1.0},
                            "consumption": {"duration_s": [1.0]}}}}
    with httpx.Client(base_url=srv.url, timeout=30, headers=headers) as http:
        assert http.put(path, json=good).status_code == 200
        before = http.get(path).json()
        kind, value = mutation
        text = json.dumps(good)
        if kind == "unit":
            body = text.replace('"a"', json.dumps(value)).encode("utf-8", "surrogatepass")
        elif kind == "number":
            body = text.replace("[1.0]", f"[{value}]").encode()
        elif kind == "nesting":
            body = text.replace("[1.0]", "[" * value + "]" * value).encode()
        elif kind == "bytes":
            body = text.encode().replace(b'"llm:m"', b'"llm:m' + value + b'"')
        else:
            body = text.replace(f'"{app}"', json.dumps(value)).encode("utf-8", "surrogatepass")
        r = http.put(path, content=body)
        assert r.status_code < 500, (mutation, r.text)
        if r.status_code >= 400:
            assert r.json()["error"]["message"]
            after = http.get(path)
            assert after.status_code == 200 and after.json() == before, mutation


@pytest.mark.slow
def test_fuzz_ran_over_1000_cases_and_the_gateway_is_healthy(fuzz_gateway: BackgroundServer) -> None:
    total = sum(CASES.values())
    if CASES["schema"] == 0:
        pytest.skip("run with the fuzz tests (this checks their count)")
    assert total >= 1000, CASES
    r = httpx.get(fuzz_gateway.url + "/healthz", timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    r = httpx.post(fuzz_gateway.url + "/v1/completions", timeout=30,
                   json={"model": "llama-2-7b", "prompt": "still fine", "max_tokens": 2})
    assert r.status_code == 200


# ---------------------------------------------------------------------------------- specifics
def test_unknown_things_are_named(gateway: BackgroundServer) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        r = http.get("/v1/runs/run-nope")
        assert r.status_code == 404 and "run-nope" in r.json()["error"]["message"]
        r = http.post("/v1/runs", json={"app": "no_such_app", "input": {}})
        assert r.status_code == 404 and "no_such_app" in r.json()["error"]["message"]
        r = http.get("/v1/apps/no_such_app")
        assert r.status_code == 404 and "no_such_app" in r.json()["error"]["message"]
        rid = http.post("/v1/runs", json={"app": "a"}).json()["run_id"]
        r = http.post(f"/v1/runs/{rid}/events", json={"unit": "ghost", "event": "finish"})
        assert r.status_code in (404, 409) and "ghost" in r.json()["error"]["message"]
        r = http.post("/v1/runs", json={"app": "a", "deadline_s": "soon"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "deadline_s"
        r = http.post("/v1/completions", json={"model": "gpt-nope", "prompt": "x"})
        assert r.status_code == 404 and "gpt-nope" in r.json()["error"]["message"]
        r = http.post("/v1/completions", json={"model": "llama-2-7b", "prompt": "x",
                                               "max_tokens": 10**9})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_malformed_pdgraph_upload_leaves_the_stored_one(gateway: BackgroundServer, tmp_path: Path) -> None:
    shipped = shipped_pdgraphs_dir() / "factool_math.json"
    good = json.loads(shipped.read_text())
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        assert http.put("/v1/apps/factool_math", content=json.dumps(good)).status_code == 200
        before = http.get("/v1/apps/factool_math").json()["pdgraph"]
        unit = next(iter(good["units"]))
        broken = json.loads(json.dumps(good))
        broken["units"][unit]["next"] = {"nowhere": 2.0}
        for body in (b"{not json", b"[]", json.dumps({**good, "app": "other"}).encode(),
                     json.dumps(broken).encode(), json.dumps({"version": 1}).encode()):
            r = http.put("/v1/apps/factool_math", content=body)
            assert r.status_code == 400, (body[:40], r.text)
            assert r.json()["error"]["message"]
        assert http.get("/v1/apps/factool_math").json()["pdgraph"] == before

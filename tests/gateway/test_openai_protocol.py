"""The rest of the OpenAI surface: embeddings, one model, n > 1, and OpenAI's error object for
every error the gateway answers itself (SDKs read ``error.message``/``code``/``param``)."""

from __future__ import annotations

import base64
import struct

import httpx
import numpy as np
import openai
import pytest

MODEL = "llama-2-7b"
EMBED = "sim-embed"


@pytest.fixture
def client(gateway) -> openai.OpenAI:  # noqa: ANN001
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def test_embeddings_from_the_builtin_embedding_model(client: openai.OpenAI) -> None:
    texts = ["the cat sat on the mat", "the cat sat on a mat", "quarterly revenue grew"]
    r = client.embeddings.create(model=EMBED, input=texts)
    assert r.model == EMBED and [d.index for d in r.data] == [0, 1, 2]
    v = np.array([d.embedding for d in r.data])
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    sims = v @ v.T
    assert sims[0, 1] > sims[0, 2]  # similar texts are closer
    assert r.usage.prompt_tokens > 0
    again = client.embeddings.create(model=EMBED, input=texts[0], dimensions=64)
    assert len(again.data[0].embedding) == 64
    raw = client.embeddings.with_raw_response.create(model=EMBED, input="x y",
                                                      encoding_format="base64")
    b64 = raw.http_response.json()["data"][0]["embedding"]
    floats = struct.unpack(f"<{len(base64.b64decode(b64)) // 4}f", base64.b64decode(b64))
    assert abs(sum(f * f for f in floats) - 1.0) < 1e-4


def test_embeddings_of_a_chat_model_and_chat_of_an_embedding_model_are_400s(
        client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as ei:
        client.embeddings.create(model=MODEL, input="hello")
    err = ei.value.body
    assert err["param"] == "model" and err["code"] == "model_not_supported"
    assert MODEL in err["message"] and EMBED in err["message"]
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=EMBED, messages=[{"role": "user", "content": "x"}])
    assert ei.value.body["param"] == "model"


def test_embeddings_bad_input_names_the_field(gateway) -> None:  # noqa: ANN001
    r = httpx.post(gateway.url + "/v1/embeddings", json={"model": EMBED, "input": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    r = httpx.post(gateway.url + "/v1/embeddings", json={"model": EMBED, "input": "a",
                                                         "encoding_format": "hex"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "encoding_format"


def test_retrieve_one_model(client: openai.OpenAI) -> None:
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model"
    with pytest.raises(openai.NotFoundError) as ei:
        client.models.retrieve("no-such-model")
    assert ei.value.body["code"] == "model_not_found" and ei.value.body["param"] == "model"


def test_n_choices_reach_the_client(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, n=3, max_tokens=5,
                                       messages=[{"role": "user", "content": "hi"}])
    assert [c.index for c in r.choices] == [0, 1, 2]
    chunks = list(client.chat.completions.create(
        model=MODEL, n=2, max_tokens=5, stream=True,
        messages=[{"role": "user", "content": "hi"}]))
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v1/nothing-here", 404),
    ("POST", "/v2/chat/completions", 404),
    ("GET", "/v1/chat/completions", 405),
    ("DELETE", "/v1/models", 405),
])
def test_gateway_errors_use_openais_error_object(gateway, method: str, path: str,  # noqa: ANN001
                                                 status: int) -> None:
    r = httpx.request(method, gateway.url + path, json={})
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert path in err["message"]


def test_sdk_reports_unknown_route_as_not_found(gateway) -> None:  # noqa: ANN001
    c = openai.OpenAI(base_url=gateway.url + "/v9", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as ei:
        c.models.list()
    assert "unknown route" in ei.value.body["message"]

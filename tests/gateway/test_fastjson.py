"""Completion answers encoded with msgspec are what Starlette's JSONResponse wrote."""

from __future__ import annotations

import json

import pytest
from starlette.responses import JSONResponse

from hermes.gateway.api.fastjson import FastJSONResponse


def test_the_same_json_as_starlettes_and_non_finite_floats_refused() -> None:
    answer = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1764201600,
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": "héllo \u2603 \"q\"\n\U0001F600"}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
        "big": 10**30, "f": [0.1, 2.5, -0.0, 1e-7], "nested": [[{"a": True}], []],
    }
    fast = FastJSONResponse(answer, headers={"X-Hermes-Run": "r1"})
    slow = JSONResponse(answer, headers={"X-Hermes-Run": "r1"})
    assert json.loads(fast.body) == json.loads(slow.body) == answer
    assert fast.headers["content-type"] == slow.headers["content-type"]
    assert fast.headers["content-length"] == str(len(fast.body))
    assert b" " not in fast.body.replace(b"\\n", b"").split(b'"content":')[0]  # compact
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="not JSON compliant"):
            FastJSONResponse({"choices": [{"logprob": bad}]})
    assert FastJSONResponse({"text": "null"}).body == b'{"text":"null"}'

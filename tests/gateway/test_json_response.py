"""The answer's JSON (msgspec) reads back as what Starlette's encoder writes."""

from __future__ import annotations

import json

from starlette.responses import JSONResponse

from hermes.gateway.api.json_response import AnswerResponse


def test_an_answer_reads_back_as_starlettes_json_and_falls_back_for_other_values() -> None:
    answer = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1764300000,
              "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                           "message": {"role": "assistant", "content": "héllo \u2603 \"q\"\n",
                                       "tool_calls": [{"id": "c1", "type": "function",
                                                       "function": {"name": "f",
                                                                    "arguments": "{}"}}]}}],
              "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
              "x": [1e-05, 1e22, 0.1, -0.0, 123456789.123456789, 2**62]}
    fast, slow = AnswerResponse(answer).body, JSONResponse(answer).body
    assert json.loads(fast) == json.loads(slow) == answer
    assert list(json.loads(fast)) == list(answer)  # key order kept
    assert "héllo ☃".encode() in fast  # UTF-8 as is, like ensure_ascii=False
    assert fast.count(b" ") == slow.count(b" ")  # compact: spaces only inside strings
    # a set: msgspec writes it as the list json would refuse to write (the same JSON a list
    # gives); a key msgspec refuses (None) goes to Starlette's encoder, which writes "null"
    assert json.loads(AnswerResponse({"s": {1}}).body) == {"s": [1]}
    assert AnswerResponse({None: 1}).body == JSONResponse({None: 1}).body == b'{"null":1}'

"""``litellm`` as a client of the gateway (``openai/<model>`` with ``api_base``): completion,
streamed completion rebuilt by ``stream_chunk_builder``, and a tool loop, on both paths."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

from functools import partial  # noqa: E402
from typing import Any  # noqa: E402

import litellm  # noqa: E402
import pytest  # noqa: E402

from tests.compat.agents import (  # noqa: E402
    CHAT_MODEL,
    MAX_TOKENS,
    MAX_TURNS,
    ONE_ROUND,
    PROMPT,
    ToolLog,
    chat_tools,
)

litellm.telemetry = False
# its cost calculator counts a ``llama-2`` model's tokens with a tokenizer from the Hugging Face
# hub (a ~45 s retry loop offline): tiktoken's bundled encoding instead
litellm.disable_hf_tokenizer_download = True


@pytest.fixture
def completion(base_url: str) -> Any:
    return partial(litellm.completion, model=f"openai/{CHAT_MODEL}", api_base=base_url,
                   api_key="any", max_tokens=MAX_TOKENS, extra_body=ONE_ROUND, num_retries=0)


def test_completion(completion: Any) -> None:
    r = completion(messages=[{"role": "user", "content": "Say something."}])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content.strip()
    assert r.usage.completion_tokens > 0


def test_stream_chunk_builder(completion: Any) -> None:
    messages = [{"role": "user", "content": "Say something."}]
    chunks = list(completion(messages=messages, stream=True))
    assert len(chunks) > 1
    r = litellm.stream_chunk_builder(chunks, messages=messages)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content.strip()
    assert r.usage.completion_tokens > 0


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_tool_loop(completion: Any, stream: bool) -> None:
    log = ToolLog()
    messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
    for rounds in range(MAX_TURNS):  # noqa: B007
        r = completion(messages=messages, tools=chat_tools(), stream=stream)
        if stream:
            r = litellm.stream_chunk_builder(list(r), messages=messages)
        msg = r.choices[0].message
        if not msg.tool_calls:
            assert r.choices[0].finish_reason == "stop" and msg.content.strip()
            break
        assert r.choices[0].finish_reason == "tool_calls"
        messages.append(msg.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": tc.id,
                      "content": log.execute(tc.function.name, tc.function.arguments)}
                     for tc in msg.tool_calls]
    assert rounds == 1 and log.calls

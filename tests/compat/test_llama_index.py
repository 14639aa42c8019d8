"""llama-index (``FunctionAgent`` on ``OpenAILike``; ``structured_predict``) from its own venv
(``llama-index-llms-openai`` pins openai 2), on both paths; each agent run found as one run,
and a streamed agent loses none of a turn's parallel tool calls."""

from __future__ import annotations

import pytest

from tests.compat.runs import assert_runs
from tests.compat.venvs import run_client

pytestmark = [pytest.mark.slow, pytest.mark.compat]


def _no_call_lost(out: dict) -> None:
    for sent, asked, results in zip(out["sent"], out["asked"], out["results"], strict=True):
        assert sent, "the model called no tool"
        assert asked == sent, f"the agent lost tool calls: sent {sent}, asked {asked}"
        assert [r[0] for r in results] == sent and all(r[2] for r in results), results


def test_function_agent(base_url: str) -> None:
    out = run_client("llama-index", "llama_index_client.py", base_url, "agent")
    _no_call_lost(out)
    assert_runs(base_url, out["runs"], agent_runs=2)


def test_streamed_function_agent_loses_no_parallel_call(base_url: str) -> None:
    out = run_client("llama-index", "llama_index_client.py", base_url, "stream")
    assert out["parallel"] >= 1, "no turn called tools in parallel in 8 agent runs"
    _no_call_lost(out)
    assert_runs(base_url, out["runs"], agent_runs=len(out["runs"]))


def test_structured_predict(base_url: str) -> None:
    out = run_client("llama-index", "llama_index_client.py", base_url, "structured")
    assert set(out["report"]) == {"city", "temperature_c", "sunny"}
    assert_runs(base_url, out["runs"], agent_runs=1)

"""AutoGen AgentChat (``AssistantAgent`` on ``OpenAIChatCompletionClient``) from its own venv
(autogen-core pins protobuf 5), on both paths: a tool loop that reflects on the results, plain
and streamed, and structured output; each agent run found as one run."""

from __future__ import annotations

import pytest

from tests.compat.runs import assert_runs
from tests.compat.venvs import run_client

pytestmark = [pytest.mark.slow, pytest.mark.compat]


@pytest.mark.parametrize("mode", ["agent", "stream"])
def test_assistant_agent_tool_loop(base_url: str, mode: str) -> None:
    out = run_client("autogen", "autogen_client.py", base_url, mode)
    assert all(out["tools"]), out["tools"]  # every agent run executed tools
    assert out["final"] == ["TextMessage", "TextMessage"]  # then answered on their results
    assert all(len(r) == 2 for r in out["runs"])  # tool call, then the reflection
    assert_runs(base_url, out["runs"], agent_runs=2)


def test_structured_output(base_url: str) -> None:
    out = run_client("autogen", "autogen_client.py", base_url, "structured")
    assert out["final"] == ["StructuredMessage[CityReport]"]
    assert set(out["report"]) == {"city", "temperature_c", "sunny"}
    assert_runs(base_url, out["runs"], agent_runs=1)

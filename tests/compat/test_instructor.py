"""instructor (structured output) from its own venv (it pins openai 2), on both paths: TOOLS
mode plain, with a validation retry (the error goes back to the model: two calls, one run),
and streamed (``create_partial``), and JSON_SCHEMA mode; each found as one run."""

from __future__ import annotations

import pytest

from tests.compat.runs import assert_runs
from tests.compat.venvs import run_client

pytestmark = [pytest.mark.slow, pytest.mark.compat]


@pytest.mark.parametrize("mode", ["tools", "retry", "stream", "json_schema"])
def test_structured_output(base_url: str, mode: str) -> None:
    out = run_client("instructor", "instructor_client.py", base_url, mode)
    assert set(out["report"]) == {"city", "temperature_c", "sunny"}
    assert out["streamed"] == [mode == "stream"] * len(out["runs"][0])
    if mode == "retry":  # the rejected answer went back with its error: a second call
        assert len(out["rejected"]) == 1 and len(out["runs"][0]) == 2
    assert_runs(base_url, out["runs"], agent_runs=1)

"""Tests whose gateway runs tool calls on its embedded node need a tool sandbox: without a
usable bubblewrap the node refuses tool calls (never runs them unsandboxed), so such a test
skips with the reason instead of failing with "tool calls are refused"."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def tool_sandbox_missing() -> str:
    """Why the embedded node would refuse tool calls here ("" when bubblewrap works)."""
    from hermeslet.tools import SubprocessSandbox

    box = SubprocessSandbox()
    return "" if box.sandboxed else box.why_not


def require_tool_sandbox() -> None:
    """Skip the calling test, with the reason, when tool calls would be refused here."""
    why = tool_sandbox_missing()
    if why:
        pytest.skip(f"needs a tool sandbox: {why} (apt-get install bubblewrap)")

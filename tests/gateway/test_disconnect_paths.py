"""Which requests a client gone cancels (:func:`hermes.gateway.disconnect.cancels_on_disconnect`):
the LLM endpoints and a run's tool call, POSTed; nothing else (a handler not built to be
interrupted finishes its work)."""

from __future__ import annotations

import pytest

from hermes.gateway.disconnect import cancels_on_disconnect


@pytest.mark.parametrize(("method", "path", "cancels"), [
    ("POST", "/v1/chat/completions", True),
    ("POST", "/v1/messages", True),
    ("POST", "/v1/runs/run-1/tools", True),
    ("GET", "/v1/runs/run-1/tools", False),
    ("POST", "/v1/runs/run-1/finish", False),
    ("POST", "/v1/runs/run-1/events", False),
    ("POST", "/v1/runs", False),
    ("POST", "/v1/runs/run-1/x/tools", False),
    ("POST", "/v1/messages/count_tokens", False),
    ("GET", "/v1/models", False),
])
def test_what_a_client_gone_cancels(method: str, path: str, cancels: bool) -> None:
    assert cancels_on_disconnect({"type": "http", "method": method, "path": path}) is cancels


def test_a_websocket_is_never_cancelled_so() -> None:
    assert not cancels_on_disconnect({"type": "websocket", "path": "/v1/chat/completions"})

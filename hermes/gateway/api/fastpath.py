"""A direct ASGI route for the OpenAI completion endpoints, the gateway's hot path.

Every OpenAI request through the gateway would otherwise cross FastAPI's generic routing
(route matching over every router, dependency solving for a handler whose only parameter is
the request, per-request exit stacks) before
:func:`hermes.gateway.api.openai_api.handle_completion` runs:
on ``hermes bench gateway`` that machinery was about a fifth of the gateway's event-loop CPU
per request. :class:`OpenAIFastPath` sits inside the security middleware (body limits, API
keys, tenant admission all apply unchanged) and hands ``POST /v1/completions`` and
``POST /v1/chat/completions`` to the same handler directly. Exceptions are answered by the
app's own exception handlers (looked up by class, as Starlette does); anything without a
handler propagates to the server-error middleware as before. The routes stay registered on
the FastAPI router, so the OpenAPI schema and ``/docs`` are unchanged, and every other path
goes through FastAPI as usual.
"""

from __future__ import annotations

import inspect
from typing import Any

from starlette.requests import Request

from hermes.gateway.api.openai_api import handle_completion

_ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


class OpenAIFastPath:
    """Pure ASGI middleware: the two completion endpoints straight to their handler."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        endpoint = _ENDPOINTS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint is None or scope.get("method") != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await handle_completion(request, endpoint)  # type: ignore[arg-type]
        except Exception as exc:
            handler = _handler_for(scope["app"], exc)
            if handler is None:
                raise
            response = handler(request, exc)
            if inspect.isawaitable(response):
                response = await response
        await response(scope, receive, send)


def _handler_for(app: Any, exc: Exception) -> Any:
    """The app's exception handler for ``exc`` (by class, most specific first), or None."""
    handlers = getattr(app, "exception_handlers", {}) or {}
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None

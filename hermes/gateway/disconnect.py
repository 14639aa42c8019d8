"""A client that goes away before its answer stops the handler that waits for it.

uvicorn tells an application that its client went away only through ``receive()`` (an
``http.disconnect`` message), which a handler waiting for its engine's answer does not call:
the handler went on waiting, and the engine went on working, for an answer nobody would read
(a stream's client gone was seen already: its next write fails). Listening to ``receive()``
in every request would cost each a task. Instead the connection tells the handler itself:

- :class:`CancelOnDisconnect` wraps the ASGI app: a ``POST`` to one of the LLM endpoints
  (:data:`LLM_PATHS`) or to the runs API's tool call (``/v1/runs/{run_id}/tools``: a
  sandbox's work, up to its ``timeout_s``) leaves in its scope, under :data:`ON_DISCONNECT`,
  what cancels its task (:func:`cancels_on_disconnect`), and when it was that cancellation
  that ended the task, it ends quietly (there is nobody to answer, and nothing to log);
- :class:`CancelOnDisconnectProtocol`, a mixin of the gateway's httptools protocol (both
  roles: :mod:`hermes.gateway.server`), calls it when the connection is lost before the
  response started.

The handlers already treat their task's cancellation as the client gone: the request is
cancelled at its node (the engine's slot freed at once), its inferred run's identity is told
it was abandoned, a one-request run fails "client disconnected" (all-in-one:
:func:`hermes.gateway.api.binding.wait_call`; an edge: its ``cancel`` to the scheduler); a
tool call is cancelled at its node, which kills what runs it (its process group, its
container), and its run goes on. An edge forwards a tool call to the scheduler: its client
gone cancels the forwarding, whose connection closes, and the scheduler cancels the call.
Other endpoints are never cancelled so: a handler that is not built to be interrupted
(creating a run, writing a store) finishes its work whether or not its client still waits.
"""

from __future__ import annotations

import asyncio
from typing import Any

#: the scope key of the callable that cancels a request's handler (set for the requests
#: :func:`cancels_on_disconnect` names)
ON_DISCONNECT = "hermes.on_disconnect"

#: the endpoints whose handlers wait for an engine: chat, completions, embeddings, the
#: Responses API and Anthropic's Messages API
LLM_PATHS = frozenset(("/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                       "/v1/responses", "/v1/messages"))
_RUNS, _TOOLS = "/v1/runs/", "/tools"


def cancels_on_disconnect(scope: dict[str, Any]) -> bool:
    """Whether a request's handler is cancelled when its client goes away: a ``POST`` to an
    LLM endpoint (:data:`LLM_PATHS`) or to a run's tool call (``/v1/runs/{run_id}/tools``)."""
    if scope["type"] != "http" or scope.get("method") != "POST":
        return False
    path = scope.get("path", "")
    return path in LLM_PATHS or (path.startswith(_RUNS) and path.endswith(_TOOLS)
                                 and "/" not in path[len(_RUNS):-len(_TOOLS)])


class CancelOnDisconnect:
    """Pure ASGI middleware: ``app`` whose LLM requests' and tool calls' handlers are
    cancelled when their client goes away (see the module docstring); every other request
    goes to ``app`` as it came."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not cancels_on_disconnect(scope):
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        gone = False

        def client_gone() -> None:
            nonlocal gone
            if not gone and task is not None and not task.done():
                gone = True
                task.cancel()

        scope[ON_DISCONNECT] = client_gone
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            # cancelled for the client alone: done (the handler cleaned up as it unwound);
            # cancelled for another reason too (a shutdown): that cancellation goes on
            if not gone or task is None or task.uncancel() > 0:
                raise


class CancelOnDisconnectProtocol:
    """Mixin for uvicorn's httptools protocol: a connection lost before its response started
    calls what its request left under :data:`ON_DISCONNECT` (:class:`CancelOnDisconnect`)."""

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = getattr(self, "cycle", None)
        gone = None
        if cycle is not None and not cycle.response_started:
            gone = cycle.scope.get(ON_DISCONNECT)
        super().connection_lost(exc)  # type: ignore[misc]
        if gone is not None:
            gone()

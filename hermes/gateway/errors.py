"""The errors of the gateway's services, and the wire shapes gateway errors take.

Services (the run registry, dispatch, hosted apps) raise :class:`SchedulerError` subclasses;
each carries the HTTP ``status``, the OpenAI error ``code`` and the request field at fault
(``param``) that the edge answers with (:mod:`hermes.gateway.api.errors`). :func:`error_body`
is OpenAI's error object, ``{"error": {"message", "type", "param", "code"}}``: the edge and the
security middleware (which answers before any route runs) both build their errors with it, so
that an SDK reports what happened rather than a parse failure. On the routes of Anthropic's
Messages API (``/v1/messages...``) every error takes Anthropic's shape instead,
``{"type": "error", "error": {"type", "message"}}`` (:func:`wire_error` picks by path).

Pure: no FastAPI, no I/O; imports nothing of the gateway (Anthropic's error shape is
:mod:`hermes.anthropic_wire`'s).
"""

from __future__ import annotations

from typing import Any

from hermes import anthropic_wire

#: OpenAI's error ``type`` by HTTP status
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
    415: "invalid_request_error", 409: "conflict_error", 422: "invalid_request_error",
    429: "rate_limit_error", 499: "cancelled", 502: "api_error", 503: "service_unavailable",
    504: "timeout"}


def error_type(status: int) -> str:
    """OpenAI's error ``type`` of an HTTP status (``api_error`` for the others)."""
    return ERROR_TYPES.get(status, "api_error")


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None,
               type_: str | None = None) -> dict[str, Any]:
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_ or error_type(status), "param": param,
                      "code": code}}


#: the routes of Anthropic's Messages API: their errors take Anthropic's shape
ANTHROPIC_PATH = "/v1/messages"


def wire_error(path: str, status: int, message: str, *, param: str | None = None,
               code: str | None = None, type_: str | None = None) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` of an error answered on ``path``: Anthropic's shape on the Messages
    API's routes, OpenAI's everywhere else."""
    if path.startswith(ANTHROPIC_PATH):
        return anthropic_wire.status(status), anthropic_wire.error_body(status, message)
    return status, error_body(status, message, param=param, code=code, type_=type_)


class SchedulerError(Exception):
    """Base of the errors the HTTP layers turn into responses (``status``, ``code``, and
    ``param``: the request field at fault, when one is)."""

    status = 400
    code = "invalid_request"
    param: str | None = None


class RunNotFound(SchedulerError):
    status = 404
    code = "run_not_found"


class RunNotActive(SchedulerError):
    status = 409
    code = "run_not_active"


class ModelNotFound(SchedulerError):
    status = 404
    code = "model_not_found"
    param = "model"


class WrongTask(SchedulerError):
    """A model asked for what it does not do (embeddings of a chat model, or the reverse)."""

    status = 400
    code = "model_not_supported"
    param = "model"


class NoCapacity(SchedulerError):
    status = 503
    code = "no_engine"


class SharedStateUnavailable(SchedulerError):
    """The shared store (``cluster.store``) did not answer and the request needs it."""

    status = 503
    code = "store_unavailable"


class RequestFailed(SchedulerError):
    status = 502
    code = "engine_error"


class RunCancelled(SchedulerError):
    status = 409
    code = "run_cancelled"

"""Errors as the gateway answers them: OpenAI's JSON error shape on every endpoint.

``{"error": {"message", "type", "param", "code"}}`` (:func:`hermes.gateway.errors.
error_body`): :func:`error_response` builds one, :func:`scheduler_error` answers a service's
:class:`~hermes.gateway.errors.SchedulerError`, :func:`validation_error` and
:func:`body_error` a body that failed validation (``param`` names the field), and
:func:`install_error_handlers` makes the errors FastAPI and Starlette answer themselves
(unknown route 404, 405, 413, 422, and 500 for anything unhandled) take the same shape, so
that SDKs report what happened, not a parse failure; on the routes of Anthropic's Messages
API (``/v1/messages...``) they take Anthropic's shape (:func:`path_error`).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from hermes.gateway.errors import SchedulerError, error_body, wire_error

log = logging.getLogger("hermes.gateway")

#: OpenAI error ``code`` of the HTTP errors the gateway answers itself
HTTP_CODES = {403: "permission_denied", 404: "not_found", 405: "method_not_allowed",
              413: "body_too_large", 415: "unsupported_media_type"}


def error_response(status: int, message: str, *, param: str | None = None,
                   code: str | None = None, type_: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """An error in OpenAI's shape (used by every gateway endpoint)."""
    return JSONResponse(error_body(status, message, param=param, code=code, type_=type_),
                        status_code=status, headers=headers)


def path_error(request: Request, status: int, message: str, *, code: str | None = None,
               param: str | None = None, headers: dict[str, str] | None = None
               ) -> JSONResponse:
    """An error in the shape of the API ``request`` was sent to: Anthropic's on the Messages
    API's routes, OpenAI's elsewhere (:func:`hermes.gateway.errors.wire_error`)."""
    status, body = wire_error(request.url.path, status, message, param=param, code=code)
    return JSONResponse(body, status_code=status, headers=headers)


def scheduler_error(e: SchedulerError) -> JSONResponse:
    return error_response(e.status, str(e), code=e.code, param=e.param)


def validation_error(e: ValidationError, status: int = 400) -> JSONResponse:
    """The first validation error, with ``param`` naming the offending field."""
    err = e.errors()[0]
    param = ".".join(str(p) for p in err["loc"]) or None
    return error_response(status, f"{param}: {err['msg']}" if param else err["msg"],
                          param=param, code="invalid_value" if err["type"] != "missing" else "missing")


def body_error(e: ValidationError) -> JSONResponse:
    """The 400 for a body that failed validation: not JSON, not an object, or a field."""
    kind = e.errors()[0]
    if kind["type"] == "json_invalid":
        return error_response(400, "the request body is not valid JSON", code="invalid_json")
    if kind["type"] == "model_type" and not kind["loc"]:
        return error_response(400, "the request body must be a JSON object",
                              code="invalid_json")
    return validation_error(e, 400)


def install_error_handlers(app: FastAPI) -> None:
    """Answer the errors FastAPI and Starlette raise in OpenAI's shape, Anthropic's on the
    Messages API's routes (module doc)."""

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Every error the gateway answers itself (unknown route 404, 405, 403, 413, ...) in
        OpenAI's error shape, so that SDKs report what happened, not a parse failure."""
        code = HTTP_CODES.get(exc.status_code, "invalid_request")
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"unknown route: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return path_error(request, exc.status_code, message, code=code,
                          headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _server_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return path_error(
            request, 500, f"internal error ({type(exc).__name__}); the gateway logged it",
            code="internal_error")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        msg = f"{param}: {err.get('msg')}" if param else str(err.get("msg"))
        return path_error(request, 422, msg, param=param, code="invalid_value")

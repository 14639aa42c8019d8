"""JSON answers encoded with msgspec: every completion answer leaves through one.

Starlette's :class:`~starlette.responses.JSONResponse` encodes with :mod:`json` (``ensure_ascii``
off, compact separators, ``allow_nan`` off); :class:`FastJSONResponse` writes the same compact
UTF-8 JSON several times faster. What it encodes was parsed from strict JSON (the client's
body, an engine's answer: msgspec refuses ``NaN``) or built by the gateway, so the one
difference, that msgspec writes a non-finite float as ``null`` where :mod:`json` raised, is
checked here and refused as before (a ``ValueError``, the 500 it was)."""

from __future__ import annotations

import math
from typing import Any

import msgspec
from starlette.responses import JSONResponse


def _finite(obj: Any) -> Any:
    """msgspec's ``enc_hook`` is not called for floats: non-finite ones are found by a walk,
    only when the encoded body says ``null`` somewhere (rare: most answers have no null)."""
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"Out of range float values are not JSON compliant: {v!r}")
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return obj


class FastJSONResponse(JSONResponse):
    """:class:`JSONResponse` encoded with msgspec (see the module doc)."""

    def render(self, content: Any) -> bytes:
        body = msgspec.json.encode(content)
        if b"null" in body:
            _finite(content)
        return body

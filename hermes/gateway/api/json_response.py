"""The JSON response of a model call: the answer object, encoded by msgspec.

Starlette's ``JSONResponse`` encodes with :func:`json.dumps`, about a tenth of a header-less
request's CPU in the gateway's own Python once the answer is larger than a few fields
(measured: ~1.3% of a warm gateway's CPU at one client, the whole of ``json.dumps`` there).
:class:`AnswerResponse` writes the same JSON with msgspec, several times faster: the same
keys in the same order, UTF-8 as is (``ensure_ascii=False``), no spaces. What differs is
the spelling of some floats (``1e-05`` is ``0.00001``: the same number) and non-finite
floats, which json refuses (a 500) and msgspec writes as ``null``: an answer decoded from an
engine's JSON has none (msgspec decodes strictly). A value msgspec cannot encode (a set, a
custom object) goes to Starlette's encoder as before.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import JSONResponse

_ENCODER = msgspec.json.Encoder()


class AnswerResponse(JSONResponse):
    """``JSONResponse`` encoded by msgspec (module doc)."""

    def render(self, content: Any) -> bytes:
        try:
            return _ENCODER.encode(content)
        except (TypeError, msgspec.EncodeError):
            return super().render(content)

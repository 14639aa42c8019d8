"""Reading a streamed (server-sent events) completion in gateway tests."""

from __future__ import annotations

import json
from collections.abc import Iterable


def completion_events(lines: Iterable[str], texts: list[str], errors: list[str]) -> None:
    """Append each ``data:`` event's choice texts to ``texts`` and each error event's message
    to ``errors`` (``[DONE]`` and other lines skipped)."""
    for line in lines:
        if not line.startswith("data:") or line.strip() == "data: [DONE]":
            continue
        doc = json.loads(line[5:])
        if "error" in doc:
            errors.append(doc["error"]["message"])
        else:
            texts += [c["text"] for c in doc["choices"]]

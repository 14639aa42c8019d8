"""A client of a running gateway's admin API (``/admin/...``): what the ``hermes`` admin
commands (:mod:`hermes.cli.admin`) and ``hermes plan placement --from-gateway`` talk through.
"""

from __future__ import annotations

from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"


class AdminError(Exception):
    """A failed admin call; the message is what the operator sees."""


class AdminClient:
    """A thin client of ``/admin/...``; raises :class:`AdminError` with the gateway's message."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise AdminError(f"cannot reach the gateway at {self.url}: {e}") from None
        if r.status_code >= 400:
            try:
                msg = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = r.text.strip() or r.reason_phrase
            raise AdminError(f"{method} {path}: HTTP {r.status_code}: {msg}")
        ctype = r.headers.get("content-type", "")
        return r.json() if "json" in ctype else r.text

    def close(self) -> None:
        self.http.close()

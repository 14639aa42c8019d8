"""What the gateway's prewarm side remembers per (tenant, app, unit) stays bounded however
many inferred apps and units go by."""

from __future__ import annotations

from types import SimpleNamespace

import hermes.gateway.prewarm as gp


def test_unit_prefixes_are_a_bounded_lru(monkeypatch) -> None:
    monkeypatch.setattr(gp, "MAX_PREFIXES", 3)
    pw = gp.GatewayPrewarmer(SimpleNamespace(), None, None, SimpleNamespace())  # type: ignore[arg-type]
    body = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": "hi"}]}
    for i in range(5):
        pw.note_request(f"app{i}", "u", body)
    pw.note_request("app2", "u", body)  # used again: kept over older ones
    pw.note_request("app5", "u", body)
    assert list(pw.prefixes) == [("default", "app4", "u"), ("default", "app2", "u"),
                                 ("default", "app5", "u")]

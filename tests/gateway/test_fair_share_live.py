"""The probe's fairness scenario against a real gateway (slow tier): tenant B runs four
streams of 30,000 tokens that fill the built-in engine's KV (40,000 tokens); tenant A's
3-token chats stay quick (fair share on, the default), where without it one waited a minute."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from hermes.gateway.keys import FileKeyStore

pytestmark = pytest.mark.slow


async def _scenario(url: str, a: str, b: str, samples: int) -> list[float]:
    async def stream_b(i: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=600) as c, c.stream(
                "POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {b}"},
                json={"model": "llama-2-7b", "stream": True, "max_tokens": 30_000,
                      "ignore_eos": True,
                      "messages": [{"role": "user", "content": f"write forever {i}"}]}) as r:
            async for _ in r.aiter_raw():
                pass

    tasks = [asyncio.create_task(stream_b(i)) for i in range(4)]
    await asyncio.sleep(2.0)
    lat: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        for k in range(samples):
            t0 = time.monotonic()
            r = await c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {a}"},
                             json={"model": "llama-2-7b", "max_tokens": 3,
                                   "messages": [{"role": "user", "content": f"hi {k}"}]})
            lat.append(time.monotonic() - t0)
            assert r.status_code == 200, r.text
            await asyncio.sleep(0.5)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return sorted(lat)


def test_long_streams_of_one_tenant_do_not_hold_anothers_short_chat(make_gateway, tmp_path) -> None:  # noqa: ANN001
    auth = tmp_path / "auth.json"
    store = FileKeyStore(auth)
    a, b = store.create("tenant-a"), store.create("tenant-b")
    srv = make_gateway(auth_file=str(auth), time_scale=50.0)
    lat = asyncio.run(_scenario(srv.url, a, b, 30))
    p95 = lat[int(0.95 * (len(lat) - 1))]
    assert p95 < 2.0 and lat[-1] < 5.0, lat

"""The built-in engine with ``kv_cache_gb``: one KV block pool for running requests and cached
prompt prefixes, LRU eviction to a host-memory tier, and the swap-in back from it (issue 5:
"in the built-in engine, a prefix cache with KV capacity, eviction and CPU swap timing")."""

from __future__ import annotations

import pytest

from hermeslet.engines.base import EngineError, GenResult
from hermeslet.engines.sim_engine import SimEngine

pytestmark = pytest.mark.timeout(30)

#: a system prompt of 404 prefix tokens (1,600 chars / 4, plus 4 for the chat template)
PROMPT_CHARS = 1600


def system(i: int) -> str:
    return (f"prompt {i:03d} " + "x" * PROMPT_CHARS)[:PROMPT_CHARS]


async def ask(eng: SimEngine, i: int, rid: str) -> GenResult:
    body = {"messages": [{"role": "system", "content": system(i)},
                         {"role": "user", "content": "go"}], "max_tokens": 1}
    out = [o async for o in eng.generate("chat", body, False, request_id=rid)]
    assert isinstance(out[-1], GenResult)
    return out[-1]


async def run_sequence(eng: SimEngine) -> list[float]:
    """P0, P0 again, then P1..P5 (together more than the pool keeps), then P0: the prefix
    tokens hit after each step."""
    hits = []
    try:
        for n, i in enumerate([0, 0, 1, 2, 3, 4, 5, 0]):
            await ask(eng, i, f"r{n}")
            hits.append(eng.stats().extra["prefix_cache_hits"])
    finally:
        await eng.close()
    return hits


async def test_evicted_prefix_comes_back_from_host_memory_with_a_stall():
    # 1 GB of KV = 2,048 tokens: five 404-token prefixes fill it; 1 GB of host memory
    eng = SimEngine(time_scale=1000, kv_cache_gb=1.0, cpu_cache_gb=1.0)
    assert eng.core.kv_capacity == 2048
    hits = await run_sequence(eng)
    pool = eng.prefix_cache
    assert hits[0] == 0 and hits[1] == 404  # computed once, then found on the GPU
    assert hits[6] == hits[1]  # P1..P5 were each new
    assert pool.stats.evictions >= 1  # P0 left the pool for host memory ...
    assert hits[7] == hits[6] + 404  # ... and came back from there
    assert system(0) in pool.gpu and system(0) not in pool.cpu
    assert pool.stats.cpu_hits == 1 and eng.stats().extra["prefix_cache_cpu_hits"] == 1
    # the swap-in stalled its iteration: 404 tokens x 0.5 MiB at 16 GB/s
    assert pool.stats.stall_s == pytest.approx(404 * 524288 / 16e9, rel=1e-6)
    assert 0.0 <= eng.stats().kv_usage <= 1.0


async def test_without_a_host_tier_the_evicted_prefix_is_recomputed():
    eng = SimEngine(time_scale=1000, kv_cache_gb=1.0)
    hits = await run_sequence(eng)
    assert hits[1] == 404 and hits[7] == hits[6]  # P0 was evicted and computed again
    assert eng.prefix_cache.stats.cpu_hits == 0 and eng.prefix_cache.stats.evictions >= 1


async def test_default_lru_keeps_whole_prefixes_without_capacity():
    eng = SimEngine(time_scale=1000)  # the LRU of prefixes: no KV capacity behind it
    hits = await run_sequence(eng)
    assert hits[7] == hits[6] + 404


async def test_request_larger_than_the_pool_is_refused_by_name():
    eng = SimEngine(time_scale=1000, kv_cache_gb=0.5)  # 1,024 tokens
    body = {"prompt": "y" * 8000, "max_tokens": 4}  # 2,000 prompt tokens
    with pytest.raises(EngineError, match="KV tokens, more than the engine's capacity") as e:
        [o async for o in eng.generate("completions", body, False, request_id="big")]
    assert e.value.status == 400
    await eng.close()
    with pytest.raises(ValueError, match="kv_cache_gb"):
        SimEngine(kv_cache_gb=0.0)


def test_sim_engine_server_flags(capsys):
    """``hermeslet sim-engine --kv-cache-gb 1 --cpu-cache-gb 1`` serves with the block pool:
    the same sequence over HTTP hits P0 from host memory (vLLM's prefix counters say so);
    bad sizes are refused by flag name."""
    import httpx

    from hermeslet.cli import main
    from tests.hermeslet.conftest import running_sim

    with running_sim("--time-scale", "1000", "--kv-cache-gb", "1", "--cpu-cache-gb", "1") as url:
        # the default model name is the one the docs and the gateway's default engine use
        assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["llama-2-7b"]
        hits = []
        for i in [0, 0, 1, 2, 3, 4, 5, 0]:
            r = httpx.post(url + "/v1/chat/completions", timeout=10, json={
                "model": "llama-2-7b", "max_tokens": 1,
                "messages": [{"role": "system", "content": system(i)},
                             {"role": "user", "content": "go"}]})
            assert r.status_code == 200, r.text
            text = httpx.get(url + "/metrics", timeout=5).text
            hits.append(float(next(ln.split()[-1] for ln in text.splitlines()
                                   if ln.startswith("vllm:prefix_cache_hits_total"))))
        assert hits[1] - hits[0] == 404 and hits[7] - hits[6] == 404
    for bad in (["--kv-cache-gb", "0"], ["--cpu-cache-gb", "-1"]):
        with pytest.raises(SystemExit):
            main(["sim-engine", "--port", "1", *bad])
        assert bad[0] in capsys.readouterr().err


async def test_kv_prefix_prewarm_on_the_built_in_engine():
    """A node's KV prefix prewarm reaches the built-in engine through its adapter: the
    prefill-only request fills the block pool, and the unit's request then hits the whole
    prefix; an unknown model is refused, and nothing else was computed."""
    from hermeslet.prewarmers import build_node_prewarmer

    eng = SimEngine(time_scale=1000, kv_cache_gb=1.0)
    _, node = build_node_prewarmer([eng])
    assert set(node.prefixes) == {eng.model} and not node.loras
    try:
        ok, detail = await node.handle(f"kv:{eng.model}/app/verify", "start",
                                       {"prefix": system(7)})
        assert ok and float(detail.split("=")[1]) > 0, detail
        assert eng.stats().extra["prefix_cache_hits"] == 0  # the prewarm computed it
        await ask(eng, 7, "unit")
        assert eng.stats().extra["prefix_cache_hits"] == 404
        ok, detail = await node.handle("kv:other/app/verify", "start", {"prefix": system(8)})
        assert not ok and "no prewarmer" in detail
        assert node.prefixes[eng.model].counters.started == 1
    finally:
        await eng.close()

"""Engine choice (hermes.core.routing): the prefix index and each router, on hand-built
engine states."""

from __future__ import annotations

import pytest

from hermes.core.routing import (
    EngineState,
    HermesRouter,
    PrefixIndex,
    RouteRequest,
    SessionRouter,
    make_router,
    router_names,
)


def conv(*tokens: int) -> list[tuple[str, int]]:
    """Prefixes of a conversation: keys "m1", "m1m2", ... with their cumulative tokens."""
    out, key = [], ""
    for i, t in enumerate(tokens, 1):
        key += f"m{i}"
        out.append((key, t))
    return out


def test_prefix_index_longest_match_and_token_bounded_lru() -> None:
    idx = PrefixIndex(capacity_tokens=1000)
    idx.record("a", conv(100, 300, 600))
    assert idx.matched_tokens("a", conv(100, 300, 600, 900)) == 600  # the previous prompt
    assert idx.matched_tokens("a", conv(100)) == 100
    assert idx.matched_tokens("b", conv(100, 300)) == 0
    assert idx.size("a") == 600  # each prefix charged what it adds to its parent
    idx.record("a", [("x", 500)])  # 1100 > 1000: the least recently used go first
    assert idx.size("a") <= 1000
    assert idx.matched_tokens("a", [("x", 500)]) == 500
    assert idx.matched_tokens("a", conv(100)) == 0  # "m1" was the oldest
    idx.forget("a")
    assert idx.size("a") == 0 and idx.matched_tokens("a", [("x", 500)]) == 0


def test_make_router_names_and_errors() -> None:
    assert router_names() == ["least-loaded", "prefix", "session", "hermes"]
    with pytest.raises(ValueError, match="least-loaded, prefix, session, hermes"):
        make_router("random")


def test_least_loaded_ignores_prefixes() -> None:
    r = make_router("least-loaded")
    r.sent(RouteRequest("r1", conv(100, 2000)), "a", 0.0)
    engines = [EngineState("a", 0.5), EngineState("b", 0.25), EngineState("c", 0.25, queued=3)]
    assert r.pick(RouteRequest("r1", conv(100, 2000, 2100)), engines, 1.0).engine == "b"


def test_prefix_router_follows_the_cache_until_the_load_outweighs_it() -> None:
    r = make_router("prefix")
    r.sent(RouteRequest("r1", conv(100, 2000)), "a", 0.0)
    nxt = RouteRequest("r1", conv(100, 2000, 2100), input_tokens=2100)
    # a: 95% of the prompt cached, a quarter busy; b idle: 2 x 0.95 + 0.75 > 0 + 1
    assert r.pick(nxt, [EngineState("a", 0.25), EngineState("b", 0.0)], 1.0).engine == "a"
    # a full window and a full KV cache: 1.9 + 0 + 0 < 0 + 1 + 1
    busy = [EngineState("a", 1.0, kv_usage=1.0), EngineState("b", 0.0, kv_usage=0.0)]
    assert r.pick(nxt, busy, 1.0).engine == "b"
    # a conversation sharing only the first message (a system prompt): 2 x 0.2 + 0.75 > 1
    shared = RouteRequest("r2", conv(100, 500), input_tokens=500)
    assert r.pick(shared, [EngineState("a", 0.25), EngineState("b", 0.0)], 1.0).engine == "a"
    # one sharing nothing: the load decides
    fresh = RouteRequest("r3", [("n1", 100), ("n1n2", 500)], input_tokens=500)
    assert r.pick(fresh, [EngineState("a", 0.25), EngineState("b", 0.0)], 1.0).engine == "b"


def test_session_router_sticks_within_its_ttl_unless_saturated() -> None:
    r = SessionRouter(ttl_s=10.0)
    req = RouteRequest("r1")
    engines = [EngineState("a", 0.5), EngineState("b", 0.0)]
    r.sent(req, "a", 0.0)
    assert r.pick(req, engines, 5.0).engine == "a"  # sticky though b is idle
    assert r.pick(req, engines, 11.0).engine == "b"  # expired
    r.sent(req, "a", 20.0)
    assert r.pick(req, [EngineState("a", 1.0), EngineState("b", 0.5)], 21.0).engine == "b"
    assert r.pick(RouteRequest("other"), engines, 21.0).engine == "b"


def test_hermes_router_trades_a_hit_against_the_queue() -> None:
    r = HermesRouter(queue_tokens=4096.0)
    r.sent(RouteRequest("r1", conv(100, 3000)), "a", 0.0)
    nxt = RouteRequest("r1", conv(100, 3000, 3100), input_tokens=3100, next_llm_p=1.0)
    # a holds 3000 of 3100 tokens: cost 4096 x 0.25 + 2 x 100 = 1224 vs b idle: 2 x 3100 = 6200
    assert r.pick(nxt, [EngineState("a", 0.25), EngineState("b", 0.0)], 1.0).engine == "a"
    # a full: 4096 + 200 = 4296 < 6200: a still (a long prompt is worth a queue) ...
    assert r.pick(nxt, [EngineState("a", 1.0), EngineState("b", 0.0)], 1.0).engine == "a"
    # ... but not twice the window
    assert r.pick(nxt, [EngineState("a", 2.0), EngineState("b", 0.0)], 1.0).engine == "b"
    # a run that will not come back values its prefix once: 4096 x 1.25 + 100 > 3100
    once = RouteRequest("r1", conv(100, 3000, 3100), input_tokens=3100, next_llm_p=0.0)
    assert r.pick(once, [EngineState("a", 1.25), EngineState("b", 0.0)], 1.0).engine == "b"
    # prefix routing adds scores instead: the same state goes to b only past 1.9 + 0
    p = make_router("prefix", index=r.index)
    assert p.pick(nxt, [EngineState("a", 1.0), EngineState("b", 0.0)], 1.0).engine == "a"


def test_hermes_router_keeps_a_run_where_its_last_prompt_went_after_the_index_forgot() -> None:
    """An agent's tool call outlasts the approximate index's memory: other prompts pushed the
    run's prefix out, yet its next turn still goes where its previous prompt ran (affinity),
    until the affinity's TTL has passed; an engine that reports its cache exactly wins over
    the affinity."""
    r = HermesRouter(PrefixIndex(capacity_tokens=5000), queue_tokens=4096.0, ttl_s=300.0)
    first = RouteRequest("r1", conv(100, 3000), input_tokens=3000)
    r.sent(first, "a", 0.0)
    r.sent(RouteRequest("other", [("big", 5000)], input_tokens=5000), "a", 1.0)
    nxt = RouteRequest("r1", conv(100, 3000, 3100), input_tokens=3100, next_llm_p=1.0)
    assert r.index.matched_tokens("a", nxt.prefixes) == 0  # the index forgot r1
    engines = [EngineState("a", 0.5), EngineState("b", 0.0)]
    # affinity: a holds 3000: 4096 x 0.5 + 2 x 100 = 2248 < b's 2 x 3100 = 6200
    assert r.affinity(nxt, 60.0) == ("a", 3000)
    assert r.pick(nxt, engines, 60.0).engine == "a"
    # the same without affinity (TTL passed): b
    assert r.affinity(nxt, 400.0) is None
    assert r.pick(nxt, engines, 400.0).engine == "b"
    # a reports its cache exactly and holds nothing of r1 (evicted): b
    exact = [EngineState("a", 0.5, cached_tokens=0), EngineState("b", 0.0, cached_tokens=0)]
    assert r.pick(nxt, exact, 60.0).engine == "b"
    # sent() moves the affinity to the new engine with the new prompt's length
    r.sent(nxt, "b", 61.0)
    assert r.affinity(nxt, 62.0) == ("b", 3100)


def test_hermes_router_affinity_memory_is_bounded() -> None:
    r = HermesRouter(max_runs=3)
    for i in range(10):
        r.sent(RouteRequest(f"r{i}", [("k", 10)], input_tokens=10), "a", float(i))
    assert [r.affinity(RouteRequest(f"r{i}"), 10.0) is not None for i in range(10)] == \
        [False] * 7 + [True] * 3


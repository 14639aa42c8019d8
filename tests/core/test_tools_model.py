"""Tool servers: cold start then warm, capacity limits, queue ordered by key, idle expiry."""

from __future__ import annotations

import pytest

from hermes.core.tools_model import ToolCall, ToolKindConfig, ToolPool, ToolServer


def server(instances=1, cold=1.0, idle=10.0) -> ToolServer:
    return ToolServer("docker:python:3.10-slim", ToolKindConfig(instances, cold, idle))


def test_cold_start_then_warm_then_expired():
    s = server(cold=1.0, idle=10.0)
    (a,) = s.submit(ToolCall("a", "r", 2.0), now=0.0)
    assert a.cold_start_s == pytest.approx(1.0) and a.finish_at == pytest.approx(3.0)
    assert s.complete("a", 3.0) == []
    (b,) = s.submit(ToolCall("b", "r", 2.0), now=5.0)  # idle 2 s < 10 s: warm
    assert b.cold_start_s == 0.0 and b.finish_at == pytest.approx(7.0)
    s.complete("b", 7.0)
    (c,) = s.submit(ToolCall("c", "r", 1.0), now=30.0)  # idle 23 s > 10 s: cold again
    assert c.cold_start_s == pytest.approx(1.0)
    assert s.cold_starts == 2


def test_capacity_limit_and_queue_order_by_key():
    s = server(instances=2, cold=0.5)
    started = s.submit(ToolCall("a", "r1", 1.0, key=(5.0,)), 0.0)
    started += s.submit(ToolCall("b", "r2", 1.0, key=(5.0,)), 0.0)
    assert [x.call_id for x in started] == ["a", "b"]
    assert s.submit(ToolCall("c", "r3", 1.0, key=(3.0,)), 0.1) == []
    assert s.submit(ToolCall("d", "r4", 1.0, key=(1.0,)), 0.2) == []
    assert s.submit(ToolCall("e", "r5", 1.0, key=(2.0,)), 0.3) == []
    s.update_key("c", (0.5,))  # c's run got a better rank while waiting
    (nxt,) = s.complete("a", 1.5)
    assert nxt.call_id == "c" and nxt.cold_start_s == 0.0 and nxt.queued_s == pytest.approx(1.4)
    (nxt,) = s.complete("b", 1.6)
    assert nxt.call_id == "d"


def test_prewarm_hides_cold_start():
    s = server(cold=3.0)
    assert s.prewarm(0.0)
    assert not s.prewarm(0.5)  # one is already warming
    (a,) = s.submit(ToolCall("a", "r", 1.0), now=2.0)
    assert a.cold_start_s == pytest.approx(1.0)  # waits only for the rest of the warm-up
    assert s.cold_starts == 1


def test_pool_defaults_per_kind():
    pool = ToolPool()
    assert pool.server("dnn:resnet50").config.cold_start_s == 3.0
    assert pool.server("docker:python:3.10-slim").config.cold_start_s == 1.0
    assert pool.server("api:search").config.cold_start_s == 0.0
    with pytest.raises(ValueError):
        pool.server("llm:llama2-7b")


def test_single_use_instances_are_destroyed_after_their_call():
    from hermes.core.tools_model import ToolCall, ToolKindConfig, ToolServer

    srv = ToolServer("docker:x", ToolKindConfig(instances=2, cold_start_s=1.0,
                                                idle_timeout_s=100.0, single_use=True))
    (s,) = srv.submit(ToolCall("a", "r", 2.0), 0.0)
    assert s.cold_start_s == 1.0
    srv.complete("a", s.finish_at)
    assert srv.warm_idle(s.finish_at) == 0  # not reused
    (s2,) = srv.submit(ToolCall("b", "r", 2.0), s.finish_at)
    assert s2.cold_start_s == 1.0
    assert srv.prewarm(10.0)  # a prewarmed sandbox hides the next call's cold start
    (s3,) = srv.submit(ToolCall("c", "r", 2.0), 12.0)
    assert s3.cold_start_s == 0.0 and srv.warm_hits == 1


def test_client_side_pool_runs_every_call_at_once_and_warm():
    # the clients' own tools (hermes load --tools events): 100 concurrent code runs on one
    # image neither queue nor pay a cold start, unlike the node's shared default pool
    pool = ToolPool.client_side()
    srv = pool.server("docker:python:3.10-slim")
    starts = [x for i in range(100) for x in srv.submit(ToolCall(f"c{i}", f"r{i}", 2.0), 1.0)]
    assert len(starts) == 100
    assert all(x.cold_start_s == 0.0 and x.queued_s == 0.0 and x.finish_at == 3.0 for x in starts)
    shared = ToolPool().server("docker:python:3.10-slim")
    starts = [x for i in range(100) for x in shared.submit(ToolCall(f"c{i}", f"r{i}", 2.0), 1.0)]
    assert len(starts) == 16 and starts[0].cold_start_s == 1.0

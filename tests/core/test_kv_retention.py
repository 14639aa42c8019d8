"""KV retention through tool calls (issue 19 item 3): the decision rules of
``hermes.core.kv_retention`` on hand-built hand-overs, and the cache mechanisms that carry them
out (``RetainingPrefixCache``: TTL pins, offload, drop, a history that grows)."""

from __future__ import annotations

import pytest

from hermes.core.kv_retention import Handover, Retention, make_retention, retention_names
from hermes.core.warm_models import RetainingPrefixCache


def _h(**kw: object) -> Handover:
    base: dict[str, object] = dict(prefix_tokens=2000, next_llm_p=0.9,
                                   tool_durations_s=[1.0, 2.0, 3.0, 30.0], kv_pressure=0.8,
                                   load_s=0.5, has_cpu_tier=True)
    base.update(kw)
    return Handover(**base)  # type: ignore[arg-type]


def test_registry_and_unknown_name() -> None:
    assert retention_names() == ["lru", "ttl", "hermes"]
    with pytest.raises(ValueError, match="unknown retention 'fifo'.*lru, ttl, hermes"):
        make_retention("fifo")


def test_lru_never_acts() -> None:
    assert make_retention("lru").decide(_h()) == Retention()


def test_ttl_pins_for_the_tools_p90_capped() -> None:
    d = make_retention("ttl").decide(_h(tool_durations_s=[float(x) for x in range(1, 11)]))
    assert d.action == "keep" and d.ttl_s == pytest.approx(9.1)
    long = make_retention("ttl").decide(_h(tool_durations_s=[500.0] * 5))
    assert long.action == "keep" and long.ttl_s == 60.0
    # whatever follows the tool: ttl does not read the PDGraph
    assert make_retention("ttl").decide(_h(next_llm_p=0.0)).action == "keep"
    assert make_retention("ttl").decide(_h(tool_durations_s=[])) == Retention()


def test_hermes_drops_when_no_llm_unit_follows() -> None:
    assert make_retention("hermes").decide(_h(next_llm_p=0.05)).action == "drop"


def test_hermes_keeps_short_tools_and_on_an_idle_engine() -> None:
    pol = make_retention("hermes")
    # p90 1.9 s within 4 reloads of 0.5 s: cheap to keep even under pressure
    short = pol.decide(_h(tool_durations_s=[1.0, 1.5, 2.0], kv_pressure=0.95))
    assert short.action == "keep" and short.ttl_s == pytest.approx(1.9)
    idle = pol.decide(_h(tool_durations_s=[20.0, 40.0], kv_pressure=0.1))
    assert idle.action == "keep"


def test_hermes_offloads_long_tools_under_pressure_and_reloads() -> None:
    pol = make_retention("hermes")
    d = pol.decide(_h(tool_durations_s=[20.0, 40.0], kv_pressure=0.8))
    assert d == Retention("offload", reload=True)
    # without a host tier: keep below high pressure, else leave it to LRU
    assert pol.decide(_h(tool_durations_s=[20.0, 40.0], kv_pressure=0.8,
                         has_cpu_tier=False, load_s=0.0)).action == "keep"
    assert pol.decide(_h(tool_durations_s=[20.0, 40.0], kv_pressure=0.95,
                         has_cpu_tier=False, load_s=0.0)) == Retention()


def test_hermes_offloads_only_into_room_not_held_by_returning_runs() -> None:
    """The host tier holds other runs' KV that their tool calls will reload: offloading over
    it would evict a history that is coming back. Without that room hermes keeps (below high
    pressure) or leaves the KV to LRU."""
    pol = make_retention("hermes")
    long = dict(tool_durations_s=[20.0, 40.0], kv_pressure=0.8)
    assert pol.decide(_h(cpu_room_tokens=2000, **long)) == Retention("offload", reload=True)
    assert pol.decide(_h(cpu_room_tokens=1999, **long)).action == "keep"
    assert pol.decide(_h(cpu_room_tokens=0, tool_durations_s=[20.0, 40.0],
                         kv_pressure=0.95)) == Retention()


def test_sim_retention_counts_the_room_left_by_runs_awaiting_reload() -> None:
    from types import SimpleNamespace

    from hermes.sim.retention import SimRetention

    cache = RetainingPrefixCache(10_000, cpu_capacity_tokens=5_000)
    keeper = SimRetention(make_retention("hermes"), [cache])
    for rid, key, tokens in (("r1", "k1", 3_000), ("r2", "k2", 1_500)):
        cache.on_prefilled(key, tokens, 0.0)
        keeper.on_route(rid, key, 0)
        assert cache.offload(key)
    assert keeper.cpu_room(0) == 5_000  # offloaded, but neither waits for a reload
    keeper._reload.add("r1")  # r1's tool call is running: its 3,000 tokens come back
    assert keeper.cpu_room(0) == 2_000
    keeper.on_tool_done("r1", 1.0)  # reloaded: the room is free again
    assert keeper.cpu_room(0) == 5_000
    st = SimpleNamespace(run_id="r2", app="none")
    h = keeper.handover(st, SimpleNamespace(unit="tool"))  # type: ignore[arg-type]
    assert h is not None and h.cpu_room_tokens == 5_000 and h.prefix_tokens == 1_500


def test_handover_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="next_llm_p"):
        _h(next_llm_p=1.5)
    with pytest.raises(ValueError, match="prefix_tokens"):
        _h(prefix_tokens=-1)
    with pytest.raises(ValueError, match="tool_durations_s"):
        _h(tool_durations_s=[-1.0])


def _cache(cap: int = 1000, cpu: int = 1000) -> RetainingPrefixCache:
    return RetainingPrefixCache(cap, cpu_capacity_tokens=cpu, kv_bytes_per_token=16,
                                swap_bytes_per_s=16_000.0)  # 1 ms per token


def test_ttl_pin_survives_pressure_until_it_expires() -> None:
    c = _cache()
    c.on_prefilled("run-a", 400, 0.0)
    assert c.pin_until("run-a", 10.0)
    c.on_prefilled("b", 400, 1.0)
    c.on_prefilled("c", 400, 2.0)  # over capacity: b goes to the host tier, a is pinned
    assert c.where("run-a") == "gpu" and c.where("b") == "cpu"
    c.expire(10.0)
    c.on_prefilled("d", 400, 11.0)  # the pin expired: a is the LRU victim now
    assert c.where("run-a") == "cpu"


def test_pin_cap_refuses_over_half_the_tier() -> None:
    c = _cache()
    c.on_prefilled("a", 400, 0.0)
    c.on_prefilled("b", 400, 0.0)
    assert c.pin_until("a", 5.0)
    assert not c.pin_until("b", 5.0) and c.pins_refused == 1
    assert not c.pin_until("absent", 5.0)


def test_offload_then_prefetch_and_drop() -> None:
    c = _cache()
    c.on_prefilled("a", 300, 0.0)
    assert c.offload("a") and c.where("a") == "cpu" and c.gpu_used == 0
    ready = c.prefetch("a", 1.0)
    assert ready == pytest.approx(1.3) and c.where("a") == "gpu"
    # a request arriving before the reload is done waits for the rest (no full reload)
    assert c.cached_tokens("a", 300, 1.1) == 300
    assert c.take_stall_s() == pytest.approx(0.2)
    c.drop("a")
    assert c.where("a") == "none" and c.gpu_used == 0


def test_history_grows_under_one_key_and_counts_tiers() -> None:
    c = _cache()
    c.on_prefilled("run-a", 100, 0.0)
    c.on_prefilled("run-a", 250, 1.0)  # the next turn's prompt extends the history
    assert c.tokens("run-a") == 250 and c.gpu_used == 250
    assert c.cached_tokens("run-a", 400, 2.0) == 250
    c.offload("run-a")
    assert c.cached_tokens("run-a", 400, 3.0) == 250  # from host memory, loaded at admission
    assert c.queries == 800 and c.hits == 250 and c.cpu_hit_tokens == 250

"""One KV block pool (vLLM v1 BlockPool with prefix caching): cached prefixes and running
requests share the engine's capacity; running requests evict unreferenced cached prefixes in
LRU order; a held prefix is not evicted, but gives way before a running request is preempted;
requests sharing a cached prefix hold one copy of it."""

from __future__ import annotations

import numpy as np
import pytest

from hermes.core.costmodel import get_cost_model
from hermes.core.engine_model import EngineModel, EngineRequest
from hermes.core.pdgraph import PDGraph
from hermes.core.prewarm import HermesPrewarm
from hermes.core.state import RunState
from hermes.core.warm_models import UNCOUNTED, BlockPoolPrefixCache

COST = get_cost_model("llama2-7b-a100")


def engine(capacity: int, **kw: float) -> tuple[EngineModel, BlockPoolPrefixCache]:
    pool = BlockPoolPrefixCache(capacity, cpu_capacity_tokens=10_000, **kw)
    eng = EngineModel(COST, prefix_cache=pool)
    pool.engine_tokens = lambda: eng.kv_used
    return eng, pool


def req(rid: str, prompt: int, out: int, prefix: str | None = None, ptok: int = 0,
        key: float = 0.0) -> EngineRequest:
    return EngineRequest(rid, run_id=rid, input_tokens=prompt, output_tokens=out, key=(key,),
                         prefix=prefix, prefix_tokens=ptok)


def run_to_end(eng: EngineModel, now: float = 0.0) -> float:
    while eng.has_work:
        res = eng.step(now)
        assert not res.idle
        now += res.duration_s
    return now


def cache_prefix(eng: EngineModel, name: str, tokens: int, now: float) -> float:
    """A request computes ``name`` and finishes: the prefix stays cached, unreferenced."""
    eng.add(req(f"warm-{name}", tokens + 10, 1, name, tokens), now)
    return run_to_end(eng, now)


def test_engine_capacity_is_the_pool_and_a_computed_prefix_is_not_counted_twice():
    eng, pool = engine(1000)
    assert eng.kv_capacity == 1000
    with pytest.raises(ValueError, match="capacity \\(1000\\)"):
        eng.add(req("big", 900, 200), 0.0)
    eng.add(req("r", 310, 5, "a", 300), 0.0)
    eng.step(0.0)  # prefill: the request's first 300 tokens become the cached entry "a"
    r = eng.requests["r"]
    assert r.shared == 300 and pool.where("a") == "gpu"
    assert eng.kv_used + pool.gpu_used == r.computed  # one copy
    assert pool.lookup("a", 300) == ("gpu", 300, True)  # referenced by the running request
    run_to_end(eng, 0.1)
    assert eng.kv_used == 0 and pool.lookup("a", 300) == ("gpu", 300, False)


def test_running_requests_evict_cached_prefixes_least_recently_used_first():
    eng, pool = engine(1000)
    t = cache_prefix(eng, "a", 300, 0.0)
    t = cache_prefix(eng, "b", 300, t)
    assert pool.gpu_used == 600 and eng.kv_used == 0
    # 500 own tokens: 1000 - 600 cached leaves 400 free, so one cached prefix must go: a
    eng.add(req("r", 500, 3), t)
    eng.step(t)
    assert (pool.where("a"), pool.where("b")) == ("cpu", "gpu")
    assert eng.kv_used + pool.gpu_used <= 1000
    run_to_end(eng, t + 1)
    # a later request finds a in host memory (swapped in), b on the GPU
    eng.add(req("x", 320, 1, "b", 300), t + 10)
    eng.step(t + 10)
    assert pool.stats.hits == 1 and eng.requests["x"].shared == 300


def test_a_held_prefix_is_not_evicted_and_gives_way_before_a_preemption():
    eng, pool = engine(1000, max_held_fraction=0.5)
    t = cache_prefix(eng, "held", 300, 0.0)
    t = cache_prefix(eng, "other", 300, t)
    pool.pin("held")  # a prewarm holds it for a coming unit (it is the older one)
    eng.add(req("r", 500, 3), t)
    eng.step(t)
    assert (pool.where("held"), pool.where("other")) == ("gpu", "cpu")
    assert pool.locked_tokens() == 300
    run_to_end(eng, t + 1)
    # a running request that outgrows the free blocks: the hold goes before a preemption
    eng.add(req("big", 600, 200), t + 5)
    now = t + 5
    while eng.has_work:
        res = eng.step(now)
        assert not res.preempted
        now += res.duration_s
    assert pool.holds_dropped == 1 and pool.where("held") == "cpu"


def test_holds_are_capped_at_a_fraction_of_the_pool():
    eng, pool = engine(1000, max_held_fraction=0.25)
    t = cache_prefix(eng, "a", 200, 0.0)
    t = cache_prefix(eng, "b", 200, t)
    pool.pin("a")
    pool.pin("b")  # 400 > 250: refused, b stays an ordinary cached prefix
    assert pool.held_tokens == 200 and pool.pins_refused == 1
    pool.release("a")
    assert pool.held_tokens == 0 and pool.locked_tokens() == 0


def test_requests_sharing_a_cached_prefix_hold_one_copy():
    eng, pool = engine(2000)
    t = cache_prefix(eng, "p", 400, 0.0)
    for i in range(3):
        eng.add(req(f"r{i}", 450, 20, "p", 400), t)
    eng.step(t)
    assert all(eng.requests[f"r{i}"].shared == 400 for i in range(3))
    assert pool.refs["p"] == 3
    assert eng.kv_used == 3 * 50  # own tokens only; the 400 prefix tokens are the pool's
    run_to_end(eng, t + 1)
    assert "p" not in pool.refs and pool.stats.hits == 3


def test_prewarm_prefill_request_is_uncounted_and_held_until_released():
    eng, pool = engine(1000, max_held_fraction=0.5)
    pool.pin("n")  # the planner holds the prefix it is about to prefill
    eng.add(req("pw", 301, 1, UNCOUNTED + "n", 300), 0.0)
    t = run_to_end(eng, 0.0)
    assert pool.stats.lookups == 0  # a prewarm's own lookup is not a workload hit or miss
    assert pool.lookup("n", 300) == ("gpu", 300, True)  # held
    eng.add(req("r", 650, 2), t)  # 652 of the 700 unlocked blocks
    eng.step(t)
    assert pool.where("n") == "gpu"
    run_to_end(eng, t + 1)
    pool.release("n")
    assert pool.lookup("n", 300)[2] is False


def test_truncated_decode_run_restores_references():
    eng, pool = engine(5000)
    t = cache_prefix(eng, "p", 100, 0.0)
    eng.add(req("a", 120, 3, "p", 100), t)
    eng.add(req("b", 120, 50, "p", 100), t)
    eng.step(t)  # prefill both (hits)
    res = eng.step(t + 1, until=float("inf"))  # decode run: a finishes at its end
    assert res.iterations >= 2 and "a" in res.finished and pool.refs["p"] == 1
    eng.truncate(res, 1)
    assert pool.refs["p"] == 2 and eng.kv_used == sum(r.computed - r.shared for r in eng.running)


def test_stretch_applies_to_llm_units_only():
    """The planner stretches an LLM unit's remaining service by the learned queueing factor,
    not a tool call's duration."""
    g = PDGraph.from_dict({
        "version": 1, "app": "toy", "entry": {"t": 1.0},
        "units": {"t": {"backend": "docker:img", "next": {"b": 1.0}},
                  "b": {"backend": "llm:m", "next": {"": 1.0}}},
    })

    class Est:
        def sample(self, progress, n=None):  # noqa: ANN001, ANN202
            from hermes.core.estimator import DemandSamples

            tc = np.linspace(0.0, 10.0, 1001)
            z = np.zeros(tc.size)
            return DemandSamples(z, z, z, z, current_s=tc)

    p = HermesPrewarm(k=0.5, graphs={"toy": g}.get, estimators={"toy": Est()}.get,
                      resources=lambda run, app, unit, backend: (
                          ["kv:" + unit] if backend.startswith("llm") else []))
    p.stretch = 20.0  # LLM units take 20x their service under this load
    r = RunState(run_id="r", app="toy", submitted=0.0)
    r.begin_unit("t")
    p.on_unit_start(r, "t", "docker:img", 0.0, None)  # type: ignore[arg-type]
    assert p.next_due() == pytest.approx(5.0 - 0.1, abs=0.02)  # not 20 * 5 - 0.1

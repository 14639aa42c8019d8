"""The prewarm planner and its baselines on hand-built PDGraphs, and the warm-state models."""

from __future__ import annotations

import numpy as np
import pytest

from hermes.core.estimator import DemandSamples
from hermes.core.pdgraph import PDGraph
from hermes.core.prewarm import (
    HermesPrewarm,
    SortedTimes,
    WarmSet,
    WarmupLearner,
    make_prewarm,
    start_offset,
)
from hermes.core.state import RunState
from hermes.core.warm_models import LoraSlots, PrefixCacheModel, gb_to_tokens


def graph() -> PDGraph:
    """gen -> exec (p 0.8) | classify (p 0.2); exec -> end."""
    return PDGraph.from_dict({
        "version": 1,
        "app": "toy",
        "entry": {"gen": 1.0},
        "units": {
            "gen": {"backend": "llm:m", "next": {"exec": 0.8, "classify": 0.2}},
            "exec": {"backend": "docker:img", "next": {"": 1.0}},
            "classify": {"backend": "dnn:resnet", "next": {"": 1.0}},
        },
    })


class FixedEstimator:
    """Remaining time of the current unit: the given samples (a stand-in for the estimator's
    ``current_s``, whose own tests live in test_estimator.py)."""

    def __init__(self, tc: np.ndarray) -> None:
        self.tc = tc

    def sample(self, progress, n=None):  # noqa: ANN001, ANN201
        z = np.zeros(self.tc.size)
        return DemandSamples(z, z, z, z, current_s=self.tc)


TC = np.linspace(0.0, 10.0, 1001)  # uniform remaining time of `gen` in [0, 10] s


def planner(k: float = 0.5, **kw) -> HermesPrewarm:  # noqa: ANN003
    g = graph()
    est = FixedEstimator(TC)
    return HermesPrewarm(k=k, graphs={"toy": g}.get, estimators={"toy": est}.get,
                         resources=lambda run, app, unit, backend: _res(backend), **kw)


def _res(backend: str) -> list[str]:
    kind, _, name = backend.partition(":")
    return [backend] if kind in ("docker", "dnn") else []


def run(k: float | None = None, tenant: str = "toy") -> RunState:
    r = RunState(run_id="r1", app="toy", submitted=0.0, tenant=tenant, k=k)
    r.begin_unit("gen")
    return r


def test_start_offset_solves_the_k_equation():
    """The rule as first specified (timing 'ready'; the default is 'late')."""
    t_p = 1.0
    for p_s, k in [(1.0, 0.5), (0.8, 0.5), (0.9, 0.3), (1.0, 0.9)]:
        ts = start_offset(TC, p_s, k, t_p, timing="ready")
        assert ts is not None
        eff = p_s * float(np.mean(TC > ts + t_p))
        assert eff == pytest.approx(k, abs=0.01)
    assert start_offset(TC, 0.2, 0.5, t_p, timing="ready") is None  # p_s < K: no prewarm
    assert start_offset(TC, 1.0, 0.99, 20.0, timing="ready") == 0.0  # cannot be in time: start at once
    # higher K: start earlier (to be ready with a higher probability)
    offs = [start_offset(TC, 1.0, k, t_p, timing="ready") for k in (0.1, 0.3, 0.5, 0.7, 0.9)]
    assert all(a > b for a, b in zip(offs, offs[1:], strict=False))


def test_sorted_times_quantile_is_numpys_bit_for_bit():
    """The planner's quantiles of sorted shared samples equal ``np.quantile`` of the mapped
    array exactly (the simulator's prewarm figures must not move): ties, one sample, q at 0
    and 1, stretch and gap, and q landing exactly on a sample and on either side of 0.5."""
    rng = np.random.default_rng(7)
    for trial in range(3000):
        n = int(rng.integers(1, 1200))
        x = rng.lognormal(0.0, 1.5, n)
        if trial % 5 == 0:
            x = np.round(x, 1)  # ties
        scale = float(rng.choice([1.0, rng.uniform(0.2, 5.0)]))
        shift = float(rng.choice([0.0, rng.uniform(0.0, 30.0)]))
        t = SortedTimes(np.sort(x), scale, shift)
        for q in (0.0, 1.0, 0.5, float(rng.uniform()), (n // 3) / max(1, n - 1)):
            assert t.quantile(q) == float(np.quantile(x * scale + shift, q)), (n, q, scale)
    assert np.isnan(SortedTimes(np.sort(np.array([1.0, np.nan]))).quantile(0.3))
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        SortedTimes(np.arange(3.0)).quantile(1.5)
    with pytest.raises(ValueError, match="order-preserving"):
        SortedTimes(np.arange(3.0), scale=-1.0)
    tc = np.random.default_rng(1).exponential(10.0, 400)
    for timing in ("late", "ready"):
        for p_s, k in ((0.9, 0.3), (0.6, 0.55), (1.0, 0.99)):
            assert start_offset(SortedTimes(np.sort(tc), 1.3, 2.0), p_s, k, 1.5, timing) == \
                start_offset(tc * 1.3 + 2.0, p_s, k, 1.5, timing)


def test_late_timing_bounds_the_chance_of_a_late_warmup_and_starts_earlier_for_lower_k():
    t_p = 1.0
    for p_s, k in [(1.0, 0.5), (0.8, 0.5), (0.9, 0.3), (1.0, 0.1)]:
        ts = start_offset(TC, p_s, k, t_p, timing="late")
        assert ts is not None
        late = p_s * float(np.mean(TC <= ts + t_p))
        assert late == pytest.approx(k, abs=0.01)
    assert start_offset(TC, 0.2, 0.5, t_p, timing="late") is None  # the same p_s >= K gate
    # lower K: start earlier (a smaller chance of finding the backend still warming), the
    # opposite of the "ready" timing, and with the gate admitting more branches as well
    offs = [start_offset(TC, 1.0, k, t_p, timing="late") for k in (0.1, 0.3, 0.5, 0.7, 0.9)]
    assert all(a < b for a, b in zip(offs, offs[1:], strict=False))
    # p_s = 1, K = 0.5: both timings start at the median of t_c minus t_p
    assert start_offset(TC, 1.0, 0.5, t_p, timing="late") == pytest.approx(
        start_offset(TC, 1.0, 0.5, t_p), abs=1e-9)
    with pytest.raises(ValueError, match="timing must be one of ready, late"):
        start_offset(TC, 1.0, 0.5, t_p, timing="soon")
    with pytest.raises(ValueError, match="timing must be one of ready, late, not 'soon'"):
        planner(timing="soon")


def test_late_timing_planner_starts_a_likely_branch_earlier_at_lower_k():
    starts = {}
    for k in (0.3, 0.7):
        p = planner(k=k, timing="late")
        p.on_unit_start(run(), "gen", "llm:m", 10.0, WarmSet())
        (pw,) = [x for x in p.outstanding("r1") if x.unit == "exec"]  # p_s 0.8
        starts[k] = pw.start_at
    # P(tc <= ts + 1) = K / 0.8: ts = Q(0.375) - 1 = 2.75 at K 0.3, Q(0.875) - 1 = 7.75 at 0.7
    assert starts[0.3] == pytest.approx(12.75, abs=0.02)
    assert starts[0.7] == pytest.approx(17.75, abs=0.02)


def test_plan_start_use_and_no_prewarm_below_k():
    p = planner(k=0.5)
    warm = WarmSet()
    acts = p.on_unit_start(run(), "gen", "llm:m", 10.0, warm)
    assert acts == []  # planned for later
    (pw,) = p.outstanding("r1")  # only exec (p 0.8); classify (p 0.2) is below K
    assert pw.unit == "exec" and pw.resource == "docker:img"
    # default timing 'late': P(tc <= ts + 1) = 0.5 / 0.8 -> ts = Q(0.625) - 1 = 5.25 s after
    # the unit started ('ready': P(tc > ts + 1) = 0.5 / 0.8 -> Q(0.375) - 1 = 2.75 s)
    assert p.timing == "late"
    assert pw.start_at == pytest.approx(10.0 + 5.25, abs=0.02)
    q = planner(k=0.5, timing="ready")
    q.on_unit_start(run(), "gen", "llm:m", 10.0, warm)
    assert q.outstanding("r1")[0].start_at == pytest.approx(10.0 + 2.75, abs=0.02)
    assert p.next_due() == pytest.approx(pw.start_at)
    assert p.due(11.0) == []
    (start,) = p.due(pw.start_at)
    assert (start.action, start.resource) == ("start", "docker:img")
    (used,) = p.on_unit_start(run(), "exec", "docker:img", 20.0, warm)
    assert (used.action, used.used) == ("release", True)  # used: the unit has it now
    st = p.stats()
    assert (st["started"], st["used"], st["cancelled"], st["wasted"]) == (1, 1, 0, 0)
    # warm from start + t_p (13.75) until used (20): idle, counted as waste
    assert st["wasted_backend_s"] == pytest.approx(20.0 - pw.start_at - 1.0, abs=0.02)


def test_wrong_branch_is_cancelled_and_its_time_counted_as_waste():
    p = planner(k=0.1)  # low K: both branches are prewarmed
    warm = WarmSet()
    p.on_unit_start(run(), "gen", "llm:m", 0.0, warm)
    assert sorted(pw.unit for pw in p.outstanding("r1")) == ["classify", "exec"]
    started = p.due(100.0)  # both start
    assert len(started) == 2
    acts = p.on_unit_start(run(), "classify", "dnn:resnet", 103.0, warm)
    assert sorted((a.action, a.resource, a.used) for a in acts) == [
        ("release", "dnn:resnet", True), ("release", "docker:img", False)]
    st = p.stats()
    assert st["cancelled"] == 1 and st["used"] == 1 and st["wasted"] == 1
    assert st["wasted_backend_s"] >= 3.0  # the container ran 3 s for nothing


def test_pending_prewarm_of_a_branch_not_taken_costs_nothing():
    p = planner(k=0.5)
    p.on_unit_start(run(), "gen", "llm:m", 0.0, WarmSet())
    acts = p.on_unit_start(run(), "classify", "dnn:resnet", 1.0, WarmSet())  # before the start
    assert acts == []
    st = p.stats()
    assert st["dropped"] == 1 and st["started"] == 0 and st["wasted_backend_s"] == 0.0


def test_unclaimed_prewarm_released_after_idle_timeout():
    p = planner(k=0.5, idle_timeout_s=5.0)
    p.on_unit_start(run(), "gen", "llm:m", 0.0, WarmSet())
    (s,) = p.due(6.0)  # planned at 5.25 s
    ready = 6.0 + p.learner.estimate("docker:img")
    assert p.due(ready + 4.0) == []
    (rel,) = p.due(ready + 5.0)
    assert rel.action == "release"
    assert p.stats()["released_idle"] == 1


def test_warm_backend_is_not_prewarmed():
    p = planner(k=0.5)
    p.on_unit_start(run(), "gen", "llm:m", 0.0, WarmSet({"docker:img"}))
    assert p.outstanding("r1") == []


def test_k_precedence_and_validation():
    p = planner(k=0.5, k_by_app={"toy": 0.6}, k_by_tenant={"vip": 0.2})
    assert p.k_for(run()) == 0.6
    assert p.k_for(run(tenant="vip")) == 0.2
    assert p.k_for(run(k=0.9, tenant="vip")) == 0.9
    with pytest.raises(ValueError, match="k_by_app.toy"):
        planner(k_by_app={"toy": 1.5})
    # per-request K high enough disables the 0.8 branch too
    p2 = planner(k=0.5)
    p2.on_unit_start(run(k=0.9), "gen", "llm:m", 0.0, WarmSet())
    assert p2.outstanding("r1") == []


def test_learned_warmup_moves_the_start_earlier():
    p = planner(k=0.5)
    p.on_unit_start(run(), "gen", "llm:m", 0.0, WarmSet())
    first = p.outstanding("r1")[0].start_at
    learner = WarmupLearner()
    for _ in range(20):
        learner.observe("docker:img", 2.0)
    assert learner.estimate("docker:img") == pytest.approx(2.0, rel=1e-3)
    p2 = planner(k=0.5, learner=learner)
    p2.on_unit_start(run(), "gen", "llm:m", 0.0, WarmSet())
    assert p2.outstanding("r1")[0].start_at == pytest.approx(first - 1.0, abs=0.02)
    with pytest.raises(ValueError):
        learner.observe("docker:img", -1.0)


def test_baselines():
    warm = WarmSet({"docker:img"})
    lru = make_prewarm("lru")
    assert lru.on_unit_start(run(), "gen", "llm:m", 0.0, warm) == []
    assert lru.on_enqueue(run(), "exec", "docker:img", 0.0, warm) == []
    epwq = make_prewarm("epwq", resources=lambda r, a, u, b: _res(b))
    assert epwq.on_unit_start(run(), "gen", "llm:m", 0.0, warm) == []  # never plans ahead
    assert epwq.on_enqueue(run(), "exec", "docker:img", 0.0, warm) == []  # already warm
    (a,) = epwq.on_enqueue(run(), "classify", "dnn:resnet", 0.0, warm)
    assert (a.action, a.resource) == ("start", "dnn:resnet")
    assert make_prewarm("none").caches is False
    with pytest.raises(ValueError, match="unknown prewarm strategy 'nope'"):
        make_prewarm("nope")


# ---------------------------------------------------------------------------- warm models
def test_prefix_cache_lru_eviction_cpu_swap_and_prefetch():
    c = PrefixCacheModel(1000, cpu_capacity_tokens=1000, kv_bytes_per_token=1000,
                         swap_bytes_per_s=1e6)  # 1 ms per token swapped
    assert c.cached_tokens("a", 600, 0.0) == 0  # miss
    c.on_prefilled("a", 600, 0.0)
    c.on_prefilled("b", 300, 1.0)
    assert c.cached_tokens("a", 600, 2.0) == 600  # hit, a becomes most recent
    c.on_prefilled("c", 300, 3.0)  # 1200 > 1000: evict b (least recent) to the CPU tier
    assert c.where("b") == "cpu" and c.where("a") == "gpu"
    assert c.cached_tokens("b", 300, 4.0) == 300  # swapped in synchronously
    assert c.take_stall_s() == pytest.approx(0.3)
    assert c.where("a") == "cpu"  # made room for b
    ready = c.prefetch("a", 5.0)  # background swap-in: 0.6 s
    assert ready == pytest.approx(5.6)
    assert c.cached_tokens("a", 600, 5.2) == 600  # still warming: waits the rest
    assert c.take_stall_s() == pytest.approx(0.4)
    s = c.stats
    assert (s.lookups, s.hits, s.cpu_hits, s.warming_hits, s.misses) == (4, 1, 1, 1, 1)
    assert gb_to_tokens(8, 512 * 1024) == 16384


def test_lora_slots_hits_and_eviction():
    s = LoraSlots(2, 3, disk_load_s=0.5, cpu_load_s=0.05)
    assert s.admit("x", 0.0) == 0.5  # from disk
    assert s.admit("x", 1.0) == 0.0  # resident
    s.admit("y", 1.0)
    s.admit("z", 2.0)  # evicts x from the GPU (it stays in host memory)
    assert not s.is_warm("x")
    assert s.admit("x", 3.0) == pytest.approx(0.05)
    s.prefetch("q", 4.0)
    assert s.admit("q", 4.2) == pytest.approx(0.3)  # waits for the rest of the load
    assert s.stats.hits == 1 and s.stats.misses == 3
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LoraSlots(4, 2)


def test_warm_prefix_is_held_while_its_unit_is_coming():
    """A prefix that is cached now but evictable is planned like a cold one: at t_s it is held
    (pinned) if still cached, re-warmed if not, until the branch resolves."""
    g = PDGraph.from_dict({
        "version": 1, "app": "toy", "entry": {"a": 1.0},
        "units": {"a": {"backend": "llm:m", "next": {"b": 1.0}},
                  "b": {"backend": "llm:m", "next": {"": 1.0}}},
    })
    p = HermesPrewarm(k=0.5, graphs={"toy": g}.get, estimators={"toy": FixedEstimator(TC)}.get)
    r = RunState(run_id="r1", app="toy", submitted=0.0)
    r.begin_unit("a")
    assert p.on_unit_start(r, "a", "llm:m", 0.0, WarmSet({"kv:m/toy/b"})) == []
    t_s = float(np.median(TC)) - 0.1  # p_s = 1, K = 0.5, t_p = the kv default
    assert p.next_due() == pytest.approx(t_s, abs=0.02)
    acts = p.due(t_s + 0.02)
    assert [(a.action, a.resource) for a in acts] == [("start", "kv:m/toy/b")]  # hold now
    c = PrefixCacheModel(1000)
    c.on_prefilled("b", 600, 0.0)
    c.pin("b")
    c.on_prefilled("x", 600, 1.0)  # would evict b (least recent) were it not held
    assert c.where("b") == "gpu" and c.where("x") == "none"
    c.release("b")
    c.on_prefilled("y", 600, 2.0)
    assert c.where("b") == "none"


def test_head_adapters_takes_the_next_distinct_adapters_in_admission_order():
    from hermes.core.prewarm import head_adapters, lookahead_full

    queued = ["A", None, "B", "A", "R", "C", "D", "E"]
    asked: list[int] = []

    def head(n: int) -> list[str | None]:
        asked.append(n)
        return queued[:n]

    # 5 slots, R runs: room for 4, R is loaded already and no slot is spent on it
    assert head_adapters(head, {"R"}, 5) == ["A", "B", "C", "D"]
    assert asked == [4 * 4]  # LOOKAHEAD_SCAN requests per free slot
    assert head_adapters(head, {"R", "S", "T", "U", "V"}, 5) == []
    assert asked == [16]  # no free slot: the queue is not read
    assert head_adapters(lambda n: iter(["A", "A"]), set(), 4) == ["A"]
    # the head fills the room: a next unit's adapter waits for the lookahead, unless it is
    # needed at the head anyway
    got = head_adapters(head, {"R"}, 5)
    assert lookahead_full("X", got, {"R"}, 5) and not lookahead_full("C", got, {"R"}, 5)
    assert not lookahead_full("X", ["A"], {"R"}, 5)


def test_a_deferred_prewarm_is_not_started_and_costs_nothing():
    p = planner(k=0.5)
    p.on_unit_start(run(), "gen", "llm:m", 0.0, WarmSet())
    (start,) = p.due(100.0)
    p.defer(start.pid, 100.0)  # the driver left it to the queue lookahead
    assert p.outstanding("r1") == [] and p.next_due() is None
    assert p.on_unit_start(run(), "exec", "docker:img", 103.0, WarmSet()) == []  # no release
    st = p.stats()
    assert (st["started"], st["deferred"], st["used"], st["wasted"]) == (0, 1, 0, 0)
    assert st["wasted_backend_s"] == 0.0


def test_resource_model_names_the_engine_model_of_kv_and_lora_resources() -> None:
    from hermes.core.prewarm import default_resources, resource_model

    assert resource_model("kv:llama-2-7b/acme/rag/answer") == "llama-2-7b"
    assert resource_model("lora:llama-2-7b@sql-lora") == "llama-2-7b"
    # the resources the planner names for an adapter unit map back to its base model
    res = default_resources(None, "rag", "answer", "llm:llama-2-7b@sql-lora")
    assert [resource_model(r) for r in res] == ["llama-2-7b", "llama-2-7b"]
    assert resource_model("kv:m/a@b/u") == "m"  # an '@' after the model is not a LoRA split


def _scan_due(p: HermesPrewarm, now: float) -> tuple[list[tuple[str, int]], float | None]:
    """What due() reports and next_due() answers, by scanning every outstanding prewarm (the
    planner's first form): the oracle for its heaps."""
    starts = [pid for pid, pw in p._pending.items() if pw.start_at <= now + 1e-12]
    live = list(p._live.items()) + [(pid, p._pending[pid]) for pid in starts]
    rel = [pid for pid, pw in live
           if now >= (((now + pw.t_p) or now) if pid in starts
                      else (pw.ready_at or now)) + p.idle_timeout_s - 1e-9]
    times = [pw.start_at for pw in p._pending.values()]
    times += [(pw.ready_at or 0.0) + p.idle_timeout_s for pw in p._live.values()]
    return ([("start", pid) for pid in starts] + [("release", pid) for pid in rel],
            min(times) if times else None)


def test_due_and_next_due_agree_with_a_scan_of_every_prewarm():
    """The planner keeps when each prewarm starts and times out in heaps (a unit start must
    not scan every outstanding prewarm); over thousands of random unit starts, ends and
    clock steps its answers and their order are those of the plain scan."""
    rng = np.random.default_rng(7)
    p = planner(k=0.1, idle_timeout_s=3.0)
    warm = WarmSet()
    now, runs = 0.0, {}
    for step in range(3000):
        now += float(rng.exponential(0.4))
        rid = f"r{int(rng.integers(40))}"
        r = runs.get(rid)
        if r is None or rng.random() < 0.3:
            r = runs[rid] = RunState(run_id=rid, app="toy", submitted=now)
            r.begin_unit("gen")
            p.on_unit_start(r, "gen", "llm:m", now, warm)
        elif rng.random() < 0.5:
            p.on_unit_start(r, str(rng.choice(["exec", "classify"])), "docker:img", now, warm)
        else:
            p.on_run_finish(r, now)
            del runs[rid]
        want, want_next = _scan_due(p, now)
        assert p.next_due() == want_next
        got = [(a.action, a.pid) for a in p.due(now)]
        assert got == want, f"step {step}"
    st = p.stats()
    assert st["started"] > 100 and st["released_idle"] > 10 and st["cancelled"] > 10


def test_planning_keeps_no_old_graph_version_alive() -> None:
    """The planner memoizes the median client gap per graph version; a relearned graph
    replaces the app's entry and the old version can be freed (holding every version an app
    was planned with grew a gateway by ~2 MiB per 1,000 agent requests)."""
    import gc
    import weakref

    current = {"toy": graph()}
    p = HermesPrewarm(k=0.1, graphs=current.get, estimators={"toy": FixedEstimator(TC)}.get,
                      resources=lambda run, app, unit, backend: _res(backend))
    refs = []
    for v in range(20):
        g = current["toy"] = graph()  # version v
        refs.append(weakref.ref(g))
        r = RunState(run_id=f"r{v}", app="toy", submitted=0.0)
        r.begin_unit("gen")
        p.on_unit_start(r, "gen", "llm:m", float(v), WarmSet())
        p.on_run_finish(r, float(v) + 0.5)
        del g, r
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 1  # the current version only
    assert len(p._gap_median) <= 2  # exec and classify of the one app

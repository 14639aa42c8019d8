"""Prewarming in the simulator: warm sandboxes, prefix cache and the waste accounting."""

from __future__ import annotations

import numpy as np

from hermes.bench.prewarm import WarmJob, simulate
from hermes.sim.simulator import Arrival


def _cg_arrivals(n: int, gap_s: float) -> tuple[Arrival, ...]:
    rng = np.random.default_rng(3)
    return tuple(Arrival(i * gap_s, "code_generation", int(rng.integers(1 << 30)),
                         run_id=f"cg-{i}") for i in range(n))


def test_planner_hides_sandbox_cold_starts_of_cg():
    arr = _cg_arrivals(12, 40.0)  # light load: one run at a time, mostly
    _, acts_lru, st_lru, _ = simulate(WarmJob(("lru",), "lru", arr, cache_gb=8))
    _, acts_h, st_h, _ = simulate(WarmJob(("h",), "hermes", arr, cache_gb=8))
    assert st_lru["tool_hit_ratio"] == 0.0  # single-use sandboxes, nothing prewarmed
    assert st_h["tool_hit_ratio"] > 0.3
    assert st_h["prewarm_used"] >= st_h["tool_warm_hits"] > 0
    # every warm hit saves up to the 1 s cold start on the run's critical path
    saved = acts_lru.sum() - acts_h.sum()
    assert 0.3 * st_h["tool_warm_hits"] < saved < 1.5 * st_h["prewarm_started"] + 1.0


def test_waste_is_counted_and_none_disables_prefix_caching():
    arr = _cg_arrivals(8, 20.0)
    _, _, st_low, _ = simulate(WarmJob(("a",), "hermes", arr, k=0.1, cache_gb=8))
    _, _, st_high, _ = simulate(WarmJob(("b",), "hermes", arr, k=0.9, cache_gb=8))
    # a low K prewarms unlikely branches too (fix_code after execute_code, ...): more waste
    assert st_low["prewarm_planned"] > st_high["prewarm_planned"]
    assert st_low["prewarm_wasted_backend_s"] > st_high["prewarm_wasted_backend_s"]
    assert st_low["prewarm_wasted"] >= 1
    _, _, st_none, _ = simulate(WarmJob(("c",), "none", arr, cache_gb=8))
    assert st_none["kv_hits"] == 0 and st_none["kv_lookups"] > 0
    _, _, st_lru, _ = simulate(WarmJob(("d",), "lru", arr, cache_gb=8))
    assert st_lru["kv_hits"] > 0


def test_lora_batch_rule_and_holds_in_the_simulator():
    """With LoRA slots the simulated engine never runs more than max_loras adapters at once,
    requests of other adapters wait, and every hold of a prewarm ends (at its request's
    admission or its run's end)."""
    from hermes.bench.prewarm import _adapter_fn, lora_adapters, with_tenants
    from hermes.bench.sched import load_graphs, make_sim_policy
    from hermes.core.estimator import EstimatorPool
    from hermes.core.prewarm import make_prewarm
    from hermes.sim.simulator import Simulator, setup_engines
    from hermes.sim.warm import SimWarmState

    arr = tuple(with_tenants(_cg_arrivals(30, 2.0), 6, 0))
    table = lora_adapters(arr, 40)
    job = WarmJob(("l",), "hermes", arr, max_loras=2, max_cpu_loras=4, adapters=table,
                  walks=50)
    cost, n = setup_engines(job.setup)
    graphs = load_graphs()
    strategy = make_prewarm("hermes", k=0.5, graphs=graphs.get,
                            estimators=EstimatorPool(graphs, cost, n_walks=50).get, n_walks=50)
    warm = SimWarmState(strategy, cost, n_engines=n, max_loras=2, max_cpu_loras=4,
                        adapter=_adapter_fn(job))
    sim = Simulator(make_sim_policy("vllm", job.setup), cost=cost, n_engines=n, record=False,
                    warm=warm)
    eng = sim.engines[0]
    seen = {"max": 0, "blocked": 0}
    step = eng.step

    def checked(now, until=None):  # noqa: ANN001, ANN202
        res = step(now, until)
        seen["max"] = max(seen["max"], len(eng.running_loras))
        seen["blocked"] += sum(1 for r in eng.waiting.items() if eng.lora_blocked(r))
        return res

    eng.step = checked
    res = sim.run(list(arr))
    assert len(res.runs) == len(arr)
    assert seen["max"] == 2 and seen["blocked"] > 0
    assert not warm._handover and not warm.loras[0].pins
    assert res.warm["lora_lookups"] > 0 and res.warm["prewarm_used"] > 0


def test_prefix_prewarm_queues_like_a_request_and_holds_end():
    """A prewarm's prefill-only request does not jump the engine's queue (under `vllm`, FCFS
    from its submission, as a real engine treats it), its hold starts when it is admitted and
    every hold ends; the strategies share one KV pool whose capacity is the cache size."""
    from hermes.bench.sched import load_graphs, make_sim_policy
    from hermes.core.estimator import EstimatorPool
    from hermes.core.prewarm import make_prewarm
    from hermes.core.warm_models import gb_to_tokens
    from hermes.sim.simulator import Simulator, setup_engines
    from hermes.sim.warm import PREWARM_RUN, SimWarmState

    arr = _cg_arrivals(20, 3.0)  # loaded: requests queue
    cost, n = setup_engines("llama2-7b-a100")
    graphs = load_graphs()
    strategy = make_prewarm("hermes", k=0.5, graphs=graphs.get,
                            estimators=EstimatorPool(graphs, cost, n_walks=50).get, n_walks=50)
    warm = SimWarmState(strategy, cost, n_engines=n, cache_gb=2.0)
    sim = Simulator(make_sim_policy("vllm", "llama2-7b-a100"), cost=cost, n_engines=n,
                    record=False, warm=warm)
    eng = sim.engines[0]
    assert eng.kv_capacity == gb_to_tokens(2.0, cost.kv_bytes_per_token)
    add = eng.add
    seen = {"prewarms": 0, "behind": 0}

    def checked(req, now):  # noqa: ANN001, ANN202
        if req.run_id == PREWARM_RUN:
            seen["prewarms"] += 1
            waiting = list(eng.waiting.items())
            assert all(w.key <= req.key for w in waiting)  # no queue jumping
            seen["behind"] += bool(waiting)
        add(req, now)

    eng.add = checked
    res = sim.run(list(arr))
    assert len(res.runs) == len(arr)
    assert seen["prewarms"] > 0 and seen["behind"] > 0
    cache = warm.caches[0]
    assert not warm._handover and not warm._held and cache.held_tokens == 0
    assert not cache.refs and eng.kv_used == 0
    assert res.warm["kv_prewarm_prefill_tokens"] > 0


def test_lora_lookahead_beats_fetch_on_enqueue_when_requests_queue():
    """Under a long queue more adapters wait than the host slots hold: epwq's fetch on enqueue
    is evicted before admission, hermes' queue lookahead loads each adapter shortly before its
    request reaches the head (and defers next-unit loads to it while the head fills the
    slots), so more requests find their adapter loaded and fewer iterations stall."""
    from hermes.bench.prewarm import lora_adapters, with_tenants
    from hermes.bench.sched import build_arrivals

    arr, _ = build_arrivals(150, 2.0, seed=0)
    arr = tuple(with_tenants(arr, 8, 0))
    table = lora_adapters(arr, 200)
    res = {}
    for s in ("hermes", "epwq"):
        _, acts, st, _ = simulate(WarmJob((s,), s, arr, max_loras=4, max_cpu_loras=8,
                                          adapters=table, walks=50))
        res[s] = (st, float(acts.mean()))
    (h, h_act), (e, e_act) = res["hermes"], res["epwq"]
    assert min(h["lora_lookups"], e["lora_lookups"]) > 500  # (re-admissions differ a little)
    assert h["lora_resident_hit_ratio"] > 1.5 * e["lora_resident_hit_ratio"]
    assert h["lora_stall_s"] < e["lora_stall_s"] and h_act < e_act
    assert h["prewarm_deferred"] > 0 and h["prewarm_started"] > 0


def test_kv_bound_row_hits_more_and_runs_faster_than_lru():
    """``bench prewarm --bound``: lru with an unlimited host tier that swaps in at no cost.
    Evicted prefixes come back from the host tier instead of being recomputed, so it hits
    more often and, under load (here requests queue), is faster than lru with the 4 GB tier."""
    from hermes.bench.prewarm import bench_prewarm_kv

    rows = bench_prewarm_kv(200, 4.0, (8,), ("lru",), tenants=8, cpu_cache_gb=4, bound=True,
                            workers=1, progress=False, walks=50)
    by = {r["strategy"]: r for r in rows}
    assert set(by) == {"lru", "bound"}
    lru, bound = by["lru"], by["bound"]
    assert bound["kv_hit_ratio"] > lru["kv_hit_ratio"]
    assert bound["mean_act_s"] < 0.95 * lru["mean_act_s"]
    assert bound["prewarm_started"] == 0  # no prewarm: only the cache differs
    assert bound["kv_cpu_hits"] > 0  # evicted prefixes came back from the host tier


def test_a_wrong_branch_prewarm_still_queued_is_taken_out_before_it_is_computed():
    """As the HermesLet does live: when the planner releases a KV prewarm unused (the branch
    was not taken) while its prefill request still waits at the engine, the request is
    removed, so the wrong branch costs the engine no prefill."""
    from hermes.bench.prewarm import with_tenants
    from hermes.bench.sched import build_arrivals, load_graphs, make_sim_policy
    from hermes.core.estimator import EstimatorPool
    from hermes.core.prewarm import make_prewarm
    from hermes.sim.simulator import Simulator, setup_engines
    from hermes.sim.warm import PREWARM_RUN, SimWarmState

    arrivals, _ = build_arrivals(120, 2.0, seed=1)
    arrivals = with_tenants(arrivals, 4, 1)
    cost, n = setup_engines("llama2-7b-a100")
    graphs = load_graphs()
    strategy = make_prewarm("hermes", k=0.5, graphs=graphs.get,
                            estimators=EstimatorPool(graphs, cost, n_walks=50).get, n_walks=50)
    warm = SimWarmState(strategy, cost, n_engines=n, cache_gb=8.0, cpu_cache_gb=4.0)
    sim = Simulator(make_sim_policy("vllm", "llama2-7b-a100"), cost=cost, n_engines=n,
                    record=False, warm=warm)
    eng = sim.engines[0]
    added: list[str] = []
    aborted: list[str] = []
    add, abort, on_admit = eng.add, eng.abort, warm.on_admit
    admitted: list[str] = []

    def rec_add(req, now):  # noqa: ANN001, ANN202
        if req.run_id == PREWARM_RUN:
            added.append(req.request_id)
        add(req, now)

    def rec_abort(rid):  # noqa: ANN001, ANN202
        assert rid in eng.waiting  # never one being prefilled
        aborted.append(rid)
        return abort(rid)

    def rec_admit(req, now):  # noqa: ANN001, ANN202
        if req.run_id == PREWARM_RUN:
            admitted.append(req.request_id)
        return on_admit(req, now)

    eng.add, eng.abort, warm.on_admit = rec_add, rec_abort, rec_admit
    res = sim.run(list(arrivals))
    assert len(res.runs) == len(arrivals)
    assert aborted and not set(aborted) & set(admitted)
    # each one either ran (admitted, maybe again after a preemption) or was removed
    assert set(aborted) | set(admitted) == set(added) and len(set(aborted)) == len(aborted)
    assert res.warm["prewarm_wasted"] >= len(aborted) == res.warm["kv_prewarm_dequeued"]
    assert not warm._held and not warm._kv_requests and eng.kv_used == 0

"""Each policy's order on hand-built runs, where the policies disagree."""

from __future__ import annotations

import numpy as np
import pytest
from policy_tables import Samples, TableEstimator, TablePool, pool_of

from hermes.core.policies import make_policy, policy_class, policy_names
from hermes.core.state import RequestView, RunState, UnitObservation


def run(rid: str, app: str = "a", submitted: float = 0.0, **kw) -> RunState:
    return RunState(run_id=rid, app=app, submitted=submitted, **kw)


def order(policy, runs: list[RunState], now: float = 0.0) -> list[str]:
    keys = {
        r.run_id: policy.request_key(r, RequestView(f"q{i}", r.run_id, "u", arrival=now, seq=i), now)
        for i, r in enumerate(runs)
    }
    return sorted(keys, key=keys.__getitem__)


def arrive(policy, runs: list[RunState], now: float = 0.0) -> None:
    for r in runs:
        policy.on_arrival(r, now)


# -- factory ------------------------------------------------------------------------------
def test_contract_names_and_driver_options() -> None:
    assert set(policy_names()) >= {
        "hermes", "hermes-no-refine", "hermes-ddl", "vllm", "parrot", "vtc", "edf", "srpt",
        "llmsched", "llmsched-lite", "seallm", "oracle", "sjf", "autellix-plas", "autellix-atlas",
    }
    for name in policy_names():  # the driver passes these two to every policy
        make_policy(name, estimators=None, seed=1)
    with pytest.raises(TypeError):
        make_policy("vllm", bogus=1)
    assert make_policy("hermes", estimators=None, buckets=20).buckets == 20
    assert policy_class("hermes").refine and not policy_class("hermes-no-refine").refine
    assert policy_class("oracle").uses_truth and not policy_class("hermes").uses_truth


# -- hermes (Gittins) vs srpt (mean) -----------------------------------------------------
def test_gittins_prefers_likely_quick_finish_srpt_prefers_lower_mean() -> None:
    # sure: 2 s for sure (mean 2, Gittins 2); coin: 0.5 s or 5 s (mean 2.75;
    # Gittins at Δ=0.5: (0.5·0.5 + 0.5·0.5)/0.5 = 1.0); heavy: 0.5 s w.p. 0.1 else 100 s
    # (mean 90.05, Gittins at Δ=0.5: (0.05 + 0.45)/0.1 = 5.0).
    pool = pool_of(
        sure=np.full(10, 2.0), coin=np.array([0.5, 5.0] * 5), heavy=np.array([0.5] + [100.0] * 9)
    )
    runs = [run("sure", "sure"), run("coin", "coin"), run("heavy", "heavy")]
    hermes = make_policy("hermes", estimators=pool)
    arrive(hermes, runs)
    assert [r.rank for r in runs] == pytest.approx([2.0, 1.0, 5.0])
    assert order(hermes, runs) == ["coin", "sure", "heavy"]
    srpt = make_policy("srpt", estimators=pool)
    arrive(srpt, runs)
    assert order(srpt, runs) == ["sure", "coin", "heavy"]


def test_hermes_refreshes_at_bucket_boundaries_offset_by_unit_start() -> None:
    est = TableEstimator({None: Samples(np.array([4.0])), "u": Samples(np.array([3.0]))},
                         {"u": [1.0, 2.0, 3.0]})
    pol = make_policy("hermes", estimators=TablePool({"a": est}), buckets=3)
    r = run("r", attained_s=10.0)
    pol.on_arrival(r, 0.0)
    assert r.rank == 4.0 and r.next_refresh_attained_s == np.inf  # no unit running yet
    r.progress.current = "u"
    pol.on_unit_start(r, "u", 1.0)
    assert r.rank == 3.0 and r.next_refresh_attained_s == 11.0
    calls = est.calls
    r.attained_s = 10.5
    pol.on_service(r, 0.5, 0, 2.0)
    assert est.calls == calls  # below the boundary: no re-rank
    r.attained_s = 12.2
    pol.on_service(r, 1.7, 0, 3.0)
    assert est.calls == calls + 1 and r.next_refresh_attained_s == 13.0
    r.attained_s = 13.5
    pol.on_service(r, 1.3, 0, 4.0)
    assert r.next_refresh_attained_s == np.inf  # past the last boundary
    r.progress.current = None
    pol.on_unit_finish(r, UnitObservation("u", service_s=3.5), 5.0)
    assert est.calls == calls + 3 and r.rank == 4.0 and r.rank_refreshed_at == 5.0


def test_unknown_app_falls_back_to_least_attained_service() -> None:
    pol = make_policy("hermes", estimators=pool_of(a=np.ones(3)), las_quantum_s=0.5)
    old, new = run("old", "x", attained_s=7.0), run("new", "y", attained_s=1.0, submitted=9.0)
    arrive(pol, [old, new])
    assert order(pol, [old, new]) == ["new", "old"]
    assert new.next_refresh_attained_s == 1.5


def test_no_refine_ranks_like_hermes() -> None:
    pool = pool_of(a=np.array([0.5, 5.0]), b=np.full(4, 2.0))
    runs = [run("1", "a"), run("2", "b")]
    for name in ("hermes", "hermes-no-refine"):
        pol = make_policy(name, estimators=pool)
        arrive(pol, runs)
        assert order(pol, runs) == ["1", "2"]


# -- deadlines ------------------------------------------------------------------------------
def test_hermes_ddl_least_worst_case_slack_first() -> None:
    spread = np.arange(100.0)  # p95 (numpy linear) = 94.05, mean 49.5
    pool = pool_of(long=spread, short=np.full(10, 5.0), free=np.full(10, 0.1))
    tight_far = run("far", "long", deadline=100.0)  # slack at 0: 100 - 94.05 = 5.95
    near = run("near", "short", deadline=50.0)  # slack 45
    free = run("free", "free")  # no deadline: after all, despite a tiny Gittins rank
    runs = [near, free, tight_far]
    ddl = make_policy("hermes-ddl", estimators=pool)
    arrive(ddl, runs)
    assert ddl.slack(tight_far, 0.0) == pytest.approx(100.0 - 94.05)
    assert ddl.slack(near, 20.0) == pytest.approx(25.0)
    assert order(ddl, runs) == ["far", "near", "free"]
    edf = make_policy("edf")
    arrive(edf, runs)
    assert order(edf, runs) == ["near", "far", "free"]
    # a lower quantile changes the worst case: p50 of 0..99 = 49.5 -> slack 50.5 > 45
    ddl50 = make_policy("hermes-ddl", estimators=pool, quantile=0.5)
    arrive(ddl50, runs)
    assert order(ddl50, runs) == ["near", "far", "free"]


def test_hermes_ddl_demotes_a_run_whose_deadline_is_lost_even_optimistically() -> None:
    pool = pool_of(long=np.arange(10.0, 20.0), short=np.full(10, 5.0), free=np.full(10, 0.1))
    lost = run("lost", "long", deadline=8.0)  # needs >= ~10.5 s even in the p5 case
    tight = run("tight", "short", deadline=30.0)
    free = run("free", "free")
    ddl = make_policy("hermes-ddl", estimators=pool)
    arrive(ddl, [lost, tight, free])
    # least slack alone would put "lost" first (8 - 19.55 < 30 - 5); it now competes with the
    # runs without a deadline, by Gittins rank (free 0.1 < lost ~10)
    assert lost.policy_state["deadline_lost"] is True
    assert order(ddl, [lost, tight, free]) == ["tight", "free", "lost"]
    # the same run with time to spare keeps its slack order
    early = run("early", "long", deadline=25.0)
    arrive(ddl, [early, tight])
    assert order(ddl, [early, tight]) == ["early", "tight"]


def test_edf_no_deadline_last_then_fcfs() -> None:
    runs = [run("late", submitted=5.0), run("early", submitted=1.0), run("d", submitted=9.0,
                                                                       deadline=1e6)]
    edf = make_policy("edf")
    arrive(edf, runs)
    assert order(edf, runs) == ["d", "early", "late"]


# -- FCFS baselines -----------------------------------------------------------------------
def test_vllm_orders_requests_parrot_orders_apps() -> None:
    old, new = run("old", submitted=0.0), run("new", submitted=5.0)
    req_old = RequestView("r1", "old", "u", arrival=10.0, seq=2)  # old app's later step
    req_new = RequestView("r2", "new", "u", arrival=6.0, seq=1)
    for name, first in (("vllm", "new"), ("parrot", "old")):
        pol = make_policy(name)
        arrive(pol, [old, new])
        keys = {"old": pol.request_key(old, req_old, 11.0), "new": pol.request_key(new, req_new, 11.0)}
        assert min(keys, key=keys.__getitem__) == first


# -- oracle -------------------------------------------------------------------------------
def test_oracle_uses_truth_and_rereads_it_on_service() -> None:
    a, b = run("a", true_remaining_s=10.0), run("b", true_remaining_s=3.0)
    pol = make_policy("oracle")
    arrive(pol, [a, b])
    assert order(pol, [a, b]) == ["b", "a"]
    a.true_remaining_s = 1.0
    pol.on_service(a, 9.0, 0, 9.0)
    assert order(pol, [a, b]) == ["a", "b"]


# -- VTC ----------------------------------------------------------------------------------
def test_vtc_heavy_tenant_does_not_starve_light_one() -> None:
    """One server, one request at a time; tenant H keeps 20 requests queued, L one at a time."""
    vtc = make_policy("vtc")
    heavy = [run(f"h{i}", tenant="H") for i in range(20)]
    arrive(vtc, heavy)
    light = run("l0", tenant="L", submitted=3.0)
    vtc.on_arrival(light, 3.0)
    served: list[str] = []
    queue = {r.run_id: r for r in heavy} | {light.run_id: light}
    for step in range(30):
        pick = order(vtc, list(queue.values()), now=3.0 + step)[0]
        r = queue.pop(pick)
        served.append(r.tenant)
        vtc.on_service(r, 1.0, 100, 4.0 + step)  # 100 prompt tokens
        vtc.on_unit_finish(r, UnitObservation("u", input_tokens=100, output_tokens=50), 4.0)
        vtc.on_finish(r, 4.0 + step)
        if r.tenant == "L":  # closed loop: the light tenant sends its next request at once
            nxt = run(f"l{step + 1}", tenant="L", submitted=4.0 + step)
            vtc.on_arrival(nxt, 4.0 + step)
            queue[nxt.run_id] = nxt
        if not any(q.tenant == "H" for q in queue.values()):
            break
    # both tenants cost 200 weighted tokens a request: they alternate after L arrives
    assert served.count("L") >= len(served) // 2 - 1
    assert abs(vtc.counter("H") - vtc.counter("L")) <= 200.0


def test_vtc_lifts_new_tenant_and_trues_up_weights() -> None:
    vtc = make_policy("vtc")
    a = run("a", tenant="A")
    vtc.on_arrival(a, 0.0)
    vtc.on_service(a, 1.0, 150, 1.0)
    assert vtc.counter("A") == 150.0  # provisional, at the input weight
    vtc.on_unit_finish(a, UnitObservation("u", input_tokens=100, output_tokens=50), 1.0)
    assert vtc.counter("A") == 200.0  # 1·100 + 2·50
    late = run("c", tenant="C", submitted=2.0)
    vtc.on_arrival(late, 2.0)
    assert vtc.counter("C") == 200.0  # lifted to the smallest active counter, no idle credit


# -- SeaLLM -------------------------------------------------------------------------------
def test_seallm_budget_doubles_when_spent() -> None:
    """The paper's reset: a spent budget is replaced by a fresh one twice as large (Q, 2Q, 4Q,
    ... in full), not doubled in place; resets at (2^k - 1)·Q of service."""
    pol = make_policy("seallm", min_history=4)
    warm = run("w")
    for s in (1.0, 3.0, 1.0, 3.0):  # mean 2, std 1 -> budget Q = 3
        pol.on_unit_finish(warm, UnitObservation("u", service_s=s), 0.0)
    r = run("r")
    pol.on_arrival(r, 0.0)
    r.progress.current = "u"
    pol.on_unit_start(r, "u", 0.0)
    assert r.rank == pytest.approx(3.0 * 2.0) and r.next_refresh_attained_s == 3.0
    r.attained_s = 2.0
    assert pol.rank(r, 1.0) == pytest.approx((3.0 - 2.0) * 2.0)
    r.attained_s = 3.5
    pol.on_service(r, 1.5, 0, 2.0)  # Q spent at 3: a fresh 2Q = 6, 0.5 of it spent
    assert r.rank == pytest.approx((6.0 - 0.5) * 2.0) and r.next_refresh_attained_s == 9.0
    r.attained_s = 13.0
    pol.on_service(r, 9.5, 0, 3.0)  # 2Q spent at 3 + 6 = 9: a fresh 4Q = 12, 4 of it spent
    assert r.rank == pytest.approx((12.0 - 4.0) * 2.0) and r.next_refresh_attained_s == 21.0
    # a cumulative doubling (3 -> 6 -> 12 -> 24 of one budget) would give (24 - 13)·2 = 22


def test_seallm_starved_requests_go_first_longest_wait_first() -> None:
    pol = make_policy("seallm", min_history=1, starvation_factor=10.0)
    warm = run("w")
    pol.on_unit_finish(warm, UnitObservation("cheap", service_s=1.0), 0.0)  # mean 1, std 0
    pol.on_unit_finish(warm, UnitObservation("dear", service_s=5.0), 0.0)  # mean 5, std 0
    runs = {}
    for rid, unit, t in (("old", "dear", 0.0), ("new", "cheap", 40.0), ("mid", "dear", 5.0)):
        r = run(rid, submitted=t)
        pol.on_arrival(r, t)
        r.progress.current = unit
        pol.on_unit_start(r, unit, t)
        runs[rid] = r
    views = {rid: RequestView(f"q{rid}", rid, "u", arrival=r.submitted, input_tokens=10, seq=i)
             for i, (rid, r) in enumerate(runs.items())}

    def first(now: float) -> list[str]:
        keys = {rid: pol.request_key(runs[rid], v, now) for rid, v in views.items()}
        return sorted(keys, key=keys.__getitem__)

    # ranks: cheap 1·1 = 1, dear 5·5 = 25; thresholds: cheap 10 s, dear 50 s of waiting
    assert first(41.0) == ["new", "old", "mid"]
    assert first(50.0) == ["old", "new", "mid"]  # old has waited 50 s = 10 x 5 s: starved
    assert first(56.0) == ["old", "mid", "new"]  # mid too (51 s), then new (16 s >= 10 s)
    runs["old"].attained_s = 20.0  # service received since it was queued is not waiting
    assert pol.starved(runs["old"], views["old"], 56.0) is None
    off = make_policy("seallm", starvation_factor=None)
    assert off.starved(runs["mid"], views["mid"], 1e6) is None


def test_seallm_uses_estimator_unit_samples_before_history() -> None:
    cheap = TableEstimator({}, {"u": [1.0, 1.0, 1.0]})
    dear = TableEstimator({}, {"u": [10.0, 20.0, 30.0]})
    pol = make_policy("seallm", estimators=TablePool({"cheap": cheap, "dear": dear}))
    runs = [run("d", "dear"), run("c", "cheap")]
    for r in runs:
        pol.on_arrival(r, 0.0)
        r.progress.current = "u"
        pol.on_unit_start(r, "u", 0.0)
    assert order(pol, runs) == ["c", "d"]
    std = np.std([10.0, 20.0, 30.0])
    assert runs[0].rank == pytest.approx((20.0 + std) * 20.0)


# -- LLMSched-lite --------------------------------------------------------------------------
def _llmsched_pool() -> TablePool:
    rng = np.random.default_rng(0)
    u = rng.exponential(4.0, 2000)
    informative = Samples(u + 6.0, current_s=u)  # the current unit decides everything: mean 10
    blind = Samples(rng.normal(8.0, 1.0, 2000).clip(0.1), current_s=rng.exponential(4.0, 2000))
    return TablePool({
        "inf": TableEstimator({None: informative}, {}),
        "blind": TableEstimator({None: blind}, {}),
    })


def test_llmsched_lite_prefers_informative_run_despite_higher_mean() -> None:
    pool = _llmsched_pool()
    runs = [run("blind", "blind"), run("inf", "inf")]
    pol = make_policy("llmsched-lite", estimators=pool, epsilon=0.0, r=0.5)
    arrive(pol, runs)
    gain_inf = runs[1].policy_state["llmsched_info"] / runs[1].policy_state["llmsched_entropy"]
    gain_blind = runs[0].policy_state["llmsched_info"] / runs[0].policy_state["llmsched_entropy"]
    assert gain_inf > 0.6 and gain_blind < 0.2
    assert order(pol, runs) == ["inf", "blind"]  # 10·(1 − 0.5·gain) < 8·(1 − 0.5·~0)
    srpt = make_policy("srpt", estimators=pool)
    arrive(srpt, runs)
    assert order(srpt, runs) == ["blind", "inf"]
    explore = make_policy("llmsched-lite", estimators=pool, epsilon=1.0)
    arrive(explore, runs)
    assert runs[1].rank == pytest.approx(-runs[1].policy_state["llmsched_info"])


def test_llmsched_lite_is_deterministic_by_seed() -> None:
    pool = _llmsched_pool()

    def ranks(seed: int) -> list[float]:
        pol = make_policy("llmsched-lite", estimators=pool, seed=seed, epsilon=0.3)
        out = []
        for i in range(40):
            r = run(str(i), "inf" if i % 2 else "blind")
            pol.on_arrival(r, float(i))
            out.append(r.rank)
        return out

    assert ranks(5) == ranks(5)
    assert ranks(5) != ranks(6)
    explored = sum(x < 0 for x in ranks(5))
    assert 2 <= explored <= 25  # ~ε of the refreshes explore


def test_key_scope_is_declared_for_keys_that_read_other_runs_state() -> None:
    from hermes.core.policies.base import SchedulingPolicy
    from hermes.core.policies.vtc import VirtualTokenCounterPolicy

    assert VirtualTokenCounterPolicy.key_scope == "tenant"
    with pytest.raises(TypeError, match="dynamic_keys.*key_scope must be 'tenant' or 'all'"):
        type("Shared", (SchedulingPolicy,), {"dynamic_keys": True, "rank": lambda s, r, n: 0.0})
    with pytest.raises(TypeError, match="key_scope must be run, tenant or all"):
        type("Odd", (SchedulingPolicy,), {"key_scope": "app", "rank": lambda s, r, n: 0.0})

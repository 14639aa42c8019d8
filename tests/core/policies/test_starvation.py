"""The bounded-wait guard (issue 18 item 6): age-based promotion of starving requests, alone
and inside ``hermes`` with a real PDGraph estimator, driven by hand as a queue would be."""

from __future__ import annotations

import math

import pytest

from hermes.core.costmodel import get_cost_model
from hermes.core.estimator import EstimatorPool
from hermes.core.ordering import KeyedQueue, policy_key
from hermes.core.policies import make_policy
from hermes.core.policies.base import SchedulingPolicy
from hermes.core.policies.hermes_policy import DEFAULT_MAX_WAIT_S
from hermes.core.policies.starvation import WaitGuard
from hermes.core.profiler import learn
from hermes.core.state import RequestView, RunState, UnitObservation
from hermes.protocol import key_to_priority
from tests.core.toyapps import one_unit_records


def view(name: str, arrival: float, seq: int) -> RequestView:
    return RequestView(request_id=name, run_id=name, unit="gen", arrival=arrival, seq=seq)


# ---------------------------------------------------------------------------- the guard alone
def llm_unit(started: float, finished: float, service_s: float) -> UnitObservation:
    return UnitObservation(unit="gen", input_tokens=100, output_tokens=50, started=started,
                           finished=finished, service_s=service_s)


def test_a_run_waits_its_units_excess_time_plus_its_queued_request_age() -> None:
    g = WaitGuard(30.0)
    run = RunState("r", "app", submitted=0.0)
    g.on_unit_finish(run, llm_unit(0.0, 12.0, 2.0))  # 10 s beyond its service
    g.on_unit_finish(run, UnitObservation(unit="tool", duration_s=50.0, started=12.0,
                                          finished=62.0))  # a tool call: not LLM waiting
    g.on_unit_finish(run, llm_unit(62.0, 63.0, 1.5))  # faster than isolated: no credit
    req = view("r", 70.0, 0)
    assert g.waited(run, req, 65.0) == 10.0  # a request's age is never negative
    assert g.waited(run, req, 75.0) == 15.0
    assert not g.promoted(run, req, 89.9)
    assert g.promoted(run, req, 90.0)  # 10 s before, 20 s queued now


def test_promoted_keys_go_first_oldest_run_first() -> None:
    g = WaitGuard(30.0)
    old, new, fresh = (RunState(n, "app", submitted=t) for n, t in
                       (("old", 0.0), ("new", 5.0), ("fresh", 39.0)))
    best = (0.0, 0.0, 0.0, 0)  # the best possible policy key
    k_new = g.key((9e9,), new, view("new", 6.0, 1), 40.0)
    k_old = g.key((9e9,), old, view("old", 9.0, 2), 40.0)  # queued later, older run
    k_fresh = g.key(best, fresh, view("fresh", 39.0, 3), 40.0)
    assert k_old < k_new < k_fresh
    assert k_fresh == best  # not promoted: the policy's own key, unchanged
    # a vLLM node's in-engine priority (from the key's first element) puts promoted first too
    assert key_to_priority(k_old) < key_to_priority(best)


@pytest.mark.parametrize("bound", [None, math.inf])
def test_guard_off_keeps_the_policy_key(bound: float | None) -> None:
    g = WaitGuard(bound)
    assert not g.enabled
    run = RunState("r", "app", submitted=0.0)
    assert g.key((3.0, 1.0), run, view("r", 0.0, 0), 1e9) == (3.0, 1.0)


@pytest.mark.parametrize("bound", [0.0, -1.0, math.nan])
def test_guard_rejects_a_bound_that_is_not_positive(bound: float) -> None:
    with pytest.raises(ValueError, match="max_wait_s"):
        WaitGuard(bound)


# ---------------------------------------------------------------------------- inside hermes
@pytest.fixture(scope="module")
def pool() -> EstimatorPool:
    graphs = {
        "short": learn(one_unit_records("short", [40] * 40)),  # ~0.5 s every time
        "long": learn(one_unit_records("long", [3000] * 40)),  # ~36 s every time
    }
    return EstimatorPool(graphs, get_cost_model("llama2-7b-a100"), n_walks=200, seed=0)


def starve(policy: SchedulingPolicy, horizon_s: float = 200.0) -> float | None:
    """A long run's request queued at 0 behind a stream of short runs, one arriving every
    second; the server takes the lowest key every second (re-keying the queue first, as the
    simulator does for ``aging_keys``). Returns when the long request was served (``None``:
    not within ``horizon_s``)."""
    q: KeyedQueue[tuple[RunState, RequestView]] = KeyedQueue()
    seq = 0

    def submit(app: str, t: float) -> None:
        nonlocal seq
        run = RunState(run_id=f"{app}{seq}", app=app, submitted=t)
        policy.on_arrival(run, t)
        run.begin_unit("gen")
        policy.on_unit_start(run, "gen", t)
        req = RequestView(request_id=run.run_id, run_id=run.run_id, unit="gen", arrival=t,
                          seq=seq)
        q.push(req.request_id, (run, req), policy_key(policy, run, req, t), run.run_id)
        seq += 1

    submit("long", 0.0)
    for t in range(1, int(horizon_s)):
        submit("short", float(t))
        q.rekey_all(lambda item, t=t: policy_key(policy, item[0], item[1], float(t)))
        run, _ = q.pop()
        if run.app == "long":
            return float(t)
    return None


def test_gittins_alone_starves_the_long_run(pool: EstimatorPool) -> None:
    pol = make_policy("hermes-noguard", estimators=pool)
    assert not pol.aging_keys
    assert starve(pol) is None


@pytest.mark.parametrize(("name", "bound"), [("hermes-wait120", 120.0), ("hermes-wait300", 300.0)])
def test_the_guard_serves_the_long_run_once_it_has_waited_the_bound(
        pool: EstimatorPool, name: str, bound: float) -> None:
    pol = make_policy(name, estimators=pool)
    assert pol.aging_keys
    # the shorts rank far ahead of the long run: only the guard can let it through
    short, long_ = RunState("s", "short", 0.0), RunState("l", "long", 0.0)
    for r in (short, long_):
        r.begin_unit("gen")
        pol.on_unit_start(r, "gen", 0.0)
    assert long_.rank > 10 * short.rank
    assert starve(pol, horizon_s=400.0) == bound


def test_a_constructor_bound_overrides_the_default(pool: EstimatorPool) -> None:
    assert make_policy("hermes", estimators=pool).guard == WaitGuard(DEFAULT_MAX_WAIT_S)
    pol = make_policy("hermes", estimators=pool, max_wait_s=30.0)
    assert starve(pol) == 30.0
    assert starve(make_policy("hermes", estimators=pool, max_wait_s=None)) is None

"""Fair share across tenants (hermes.core.policies.fair_share): a tenant served more goes a
band behind, the wrapped policy's order is kept within a band, and in the engine model one
tenant's long streams no longer hold another tenant's short request."""

from __future__ import annotations

import math

import pytest

from hermes.core.costmodel import SETUPS
from hermes.core.engine_model import EngineModel, EngineRequest
from hermes.core.policies.base import make_policy
from hermes.core.policies.fair_share import FairShare, squash
from hermes.core.state import RequestView, RunState


def _run(rid: str, tenant: str, t: float) -> RunState:
    return RunState(run_id=rid, app="chat", submitted=t, tenant=tenant)


def _view(rid: str, t: float, seq: int) -> RequestView:
    return RequestView(request_id=f"q-{rid}", run_id=rid, unit="u", arrival=t, seq=seq)


def test_squash_is_monotonic_into_the_unit_interval() -> None:
    xs = [-math.inf, -1e9, -3.0, 0.0, 0.5, 7.0, 1e9, math.inf]
    ys = [squash(x) for x in xs]
    assert ys == sorted(ys) and all(0.0 <= y < 1.0 for y in ys)
    assert 0.0 <= squash(math.nan) < 1.0


def test_a_tenant_served_more_goes_behind_a_newcomer() -> None:
    pol = FairShare(make_policy("vllm"), quantum_tokens=1000)
    b = [_run(f"b{i}", "B", 0.0) for i in range(4)]
    for r in b:
        pol.on_arrival(r, 0.0)
    for _ in range(30):  # B's streams are served 30 x 4 x 100 tokens
        for r in b:
            pol.on_service(r, 0.01, 100, 1.0)
    a = _run("a", "A", 2.0)
    pol.on_arrival(a, 2.0)
    ka = pol.request_key(a, _view("a", 2.0, 99), 2.0)
    kb = [pol.request_key(r, _view(r.run_id, 0.0, i), 2.0) for i, r in enumerate(b)]
    assert all(ka < k for k in kb), (ka, kb)
    # without the wrapper, FCFS puts the earlier streams first
    fcfs = make_policy("vllm")
    for r in (*b, a):
        fcfs.on_arrival(r, r.submitted)
    assert fcfs.request_key(a, _view("a", 2.0, 99), 2.0) > \
        fcfs.request_key(b[0], _view("b0", 0.0, 0), 2.0)


def test_within_a_band_the_policys_order_is_kept_and_weights_count() -> None:
    pol = FairShare(make_policy("vllm"), quantum_tokens=1000, weights={"B": 4.0})
    r1, r2 = _run("r1", "A", 0.0), _run("r2", "A", 1.0)
    for r in (r1, r2):
        pol.on_arrival(r, r.submitted)
    assert pol.request_key(r1, _view("r1", 0.0, 0), 2.0) < \
        pol.request_key(r2, _view("r2", 1.0, 1), 2.0)
    b = _run("b", "B", 0.0)
    pol.on_arrival(b, 0.0)
    pol.on_service(b, 0.1, 3000, 1.0)  # 3000 tokens at weight 4: under one quantum
    assert pol.band("B") == 0
    with pytest.raises(ValueError):
        FairShare(make_policy("vllm"), weights={"x": 0.0})


def _wait_of_short_request(keys: tuple[tuple[float, ...], tuple[float, ...]]) -> float:
    """Simulated seconds a 3-token request waits behind four 30,000-token streams that fill
    a 40,000-token KV (the probe's scenario in the engine model), with the given keys."""
    bkey, akey = keys
    eng = EngineModel(SETUPS["llama2-7b-a100"])
    now = 0.0
    for i in range(4):
        eng.add(EngineRequest(f"b{i}", f"rb{i}", 20, 30_000, key=bkey), now)
    t_a = None
    while now < 3000.0:
        res = eng.step(now, until=now + 1.0)
        now += res.duration_s
        if t_a is None and now > 200.0:  # the streams have filled the KV
            eng.add(EngineRequest("a", "ra", 10, 3, key=akey, arrival=now), now)
            t_a = now
        if "a" in res.finished:
            assert t_a is not None
            return now - t_a
    return math.inf


def test_a_band_ahead_bounds_the_short_requests_wait_in_the_engine() -> None:
    assert _wait_of_short_request(((2.0,), (1.0,))) < 5.0
    assert _wait_of_short_request(((0.0,), (0.0,))) > 100.0  # FCFS: behind the streams

"""Token buckets and admission (pure: every call takes ``now``)."""

from __future__ import annotations

import math

import pytest

from hermes.core.limits import Admission, TenantLimits, TokenBucket


def test_token_bucket_burst_then_rate() -> None:
    b = TokenBucket(rate=2.0, burst=3.0)
    assert [b.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take(0.0) == pytest.approx(0.5)  # one token in 1/rate s
    assert b.take(0.25) == pytest.approx(0.25)  # half a token refilled, not spent
    assert b.take(0.5) == 0.0
    assert b.take(100.0) == 0.0 and b.tokens == pytest.approx(2.0)  # capped at burst
    assert b.take(100.0, cost=5.0) == math.inf  # more than the burst: never
    with pytest.raises(ValueError):
        TokenBucket(rate=0.0, burst=1.0)


def test_admission_rate_concurrency_and_runs_per_tenant() -> None:
    adm = Admission(per_tenant={"a": TenantLimits(rate=1.0, burst=2.0),
                                "b": TenantLimits(max_concurrent=2, max_active_runs=1)})
    assert adm.admit("a", 0.0)[0] and adm.admit("a", 0.0)[0]
    ok, wait, why = adm.admit("a", 0.0)
    assert not ok and wait == pytest.approx(1.0) and "rate" in why
    assert adm.admit("a", 1.0)[0]
    assert adm.admit("b", 0.0)[0] and adm.admit("b", 0.0)[0]
    ok, wait, why = adm.admit("b", 0.0)
    assert not ok and wait > 0 and "in flight" in why
    adm.release("b")
    assert adm.admit("b", 0.0)[0]
    assert adm.runs_allowed("b", 0)[0] and not adm.runs_allowed("b", 1)[0]
    assert adm.admit("anyone", 0.0)[0]  # default: unlimited


def test_rpm_is_an_exact_sliding_window() -> None:
    """At most ``rpm`` requests in any 60 s, whatever the burst: a token bucket with rate
    rpm/60 and burst rpm lets more through within the first minute."""
    from hermes.core.limits import Admission, SlidingWindow, TenantLimits, TokenBucket

    adm = Admission(default=TenantLimits(rpm=5))
    got = [adm.admit("t", t)[0] for t in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 59.9)]
    assert got == [True] * 5 + [False, False]
    ok, wait, why = adm.admit("t", 30.0)
    assert not ok and abs(wait - 30.0) < 1e-9 and "5 requests a minute" in why
    assert adm.admit("t", 60.0)[0]  # the request of t=0 left the window
    bucket = TokenBucket(5 / 60, 5)
    assert sum(bucket.take(t) == 0.0 for t in range(0, 60, 2)) > 5
    w = SlidingWindow(2, window_s=10.0)
    assert [w.take(0.0), w.take(1.0)] == [0.0, 0.0] and w.take(5.0) == 5.0
    # a refusal by the window spends no token of the bucket beside it
    both = Admission(default=TenantLimits(rpm=1, rate=0.001, burst=2))
    assert both.admit("t", 0.0)[0] and not both.admit("t", 1.0)[0]
    assert abs(both.buckets["t"].tokens - 1.001) < 1e-9  # refilled, nothing spent


def test_counted_limits_are_the_set_ones_admission_counts_per_request() -> None:
    assert TenantLimits().counted() == []
    assert TenantLimits(burst=5, max_active_runs=2).counted() == []  # not counted per request
    assert TenantLimits(rate=2.5, rpm=100, max_concurrent=4).counted() == [
        ("rate", 2.5), ("rpm", 100.0), ("max_concurrent", 4.0)]

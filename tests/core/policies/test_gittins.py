"""The exact empirical Gittins rank against a brute-force evaluation of its definition."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes.core.policies.gittins import gittins_rank, gittins_ranks


def brute_force(x: np.ndarray) -> float:
    """inf over Δ of E[min(R,Δ)] / P(R ≤ Δ), scanning Δ on every sample value and between."""
    x = np.asarray(x, dtype=np.float64)
    v = np.unique(x)
    mids = (v[:-1] + v[1:]) / 2
    deltas = np.concatenate([v, mids, v * (1 + 1e-9) + 1e-12, [v[-1] * 2 + 1]])
    best = np.inf
    for d in deltas:
        p = (x <= d).mean()
        if p > 0:
            best = min(best, np.minimum(x, d).mean() / p)
    return best


def buggy(x: np.ndarray) -> float:
    """The known bug: numerator without Δ·P(R>Δ), i.e. inf_Δ E[R·1{R≤Δ}] / P(R≤Δ)."""
    x = np.asarray(x, dtype=np.float64)
    return min(np.where(x <= d, x, 0.0).mean() / (x <= d).mean() for d in np.unique(x))


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force_on_random_discrete_distributions(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 60))
    support = rng.lognormal(0.0, 1.5, size=int(rng.integers(1, 8)))
    x = rng.choice(support, size=k)  # few support points: many ties
    assert gittins_rank(x) == pytest.approx(brute_force(x), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=40))
def test_matches_brute_force_hypothesis(values: list[int]) -> None:
    x = np.asarray(values, dtype=np.float64) * 0.5
    assert gittins_rank(x) == pytest.approx(brute_force(x), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("value", [0.0, 0.3, 7.0, 1234.5])
def test_single_point_distribution_rank_is_the_value(value: float) -> None:
    assert gittins_rank(np.array([value])) == pytest.approx(value)
    assert gittins_rank(np.full(17, value)) == pytest.approx(value)


def test_hand_computed_two_point() -> None:
    # R = 1 w.p. 1/2, 10 w.p. 1/2: Δ=1 -> (0.5*1 + 0.5*1)/0.5 = 2; Δ=10 -> mean 5.5 -> rank 2
    assert gittins_rank(np.array([1.0, 10.0])) == pytest.approx(2.0)
    # with a tie: R = 1 w.p. 2/3: Δ=1 -> 1/(2/3) = 1.5; Δ=10 -> 4
    assert gittins_rank(np.array([10.0, 1.0, 1.0])) == pytest.approx(1.5)


def test_rank_never_exceeds_the_mean_nor_undercuts_the_minimum() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        x = rng.exponential(3.0, size=200)
        r = gittins_rank(x)
        assert x.min() - 1e-12 <= r <= x.mean() + 1e-12


def test_batch_equals_scalar() -> None:
    rng = np.random.default_rng(3)
    m = rng.choice(rng.lognormal(size=5), size=(30, 25))
    expect = np.array([gittins_rank(row) for row in m])
    np.testing.assert_allclose(gittins_ranks(m), expect, rtol=1e-12)


def test_buggy_formula_flips_heavy_vs_light_tail_order() -> None:
    # heavy: 10% chance of finishing after 0.5 s, otherwise 100 s; light: always 2 s.
    heavy = np.array([0.5] * 10 + [100.0] * 90)
    light = np.full(100, 2.0)
    # by hand: heavy at Δ=0.5 -> (0.05 + 0.5*0.9) / 0.1 = 5.0 (Δ=100 gives the mean, 90.05)
    assert gittins_rank(heavy) == pytest.approx(5.0)
    assert gittins_rank(light) == pytest.approx(2.0)
    assert gittins_rank(light) < gittins_rank(heavy)  # correct: light first
    assert buggy(heavy) < buggy(light)  # the bug serves the heavy-tailed run first


def test_rejects_empty_and_nan() -> None:
    with pytest.raises(ValueError):
        gittins_rank(np.array([]))
    with pytest.raises(ValueError):
        gittins_rank(np.array([1.0, np.nan]))

"""The Gittins index of a job with a known (empirical) remaining-service distribution.

For a run whose *remaining* service ``R`` (already conditioned on what it has attained) is
distributed as the empirical samples, the Gittins rank (Gittins 1989; Scully et al., "The
Gittins Policy in the M/G/1 Queue", 2021; Hermes paper §4) is::

    rank = inf_{Δ>0}  E[min(R, Δ)] / P(R ≤ Δ)

i.e. the least expected service per unit of completion probability over all service quanta
``Δ``. Lower is served first. The numerator keeps the ``Δ·P(R > Δ)`` term: dropping it gives
``E[R·1{R≤Δ}] / P(R≤Δ) = E[R | R ≤ Δ]``, minimised by the smallest sample, which ranks any
run with a tiny chance of finishing early ahead of everything (the known bug that favours
heavy-tailed apps; DESIGN.md, "Known pitfalls").

Exact on the empirical distribution: with ``x₁ ≤ … ≤ x_K`` sorted and prefix sums
``S_c = x₁ + … + x_c``, the ratio is right-continuous and, between two sample values,
its denominator is constant while its numerator grows, so the infimum is attained at a sample
value. At ``Δ = x_c``::

    E[min(R, x_c)] / P(R ≤ x_c) = (S_c + x_c·(K − c)) / c'

where ``c'`` counts the samples ``≤ x_c``. Evaluating with ``c`` in place of ``c'`` at every
index is still exact: within a run of ties the numerator ``S_c + x_c·(K − c)`` is the same for
every ``c`` of the run, and the denominator is largest at its last index, so the minimum over
indices lands on the last index of each tie group, which is the true value. O(K) after sorting.
"""

from __future__ import annotations

import numpy as np


def _check(samples: np.ndarray) -> np.ndarray:
    x = np.asarray(samples, dtype=np.float64)
    if x.shape[-1] == 0:
        raise ValueError("gittins rank of an empty sample set")
    if np.isnan(x).any():
        raise ValueError("gittins rank: NaN in samples")
    # remaining service is non-negative; tiny negative values come from float round-off
    return np.maximum(x, 0.0)


def gittins_rank(samples: np.ndarray) -> float:
    """Gittins rank of a run whose remaining service is distributed as ``samples`` (1-D)."""
    x = np.sort(_check(samples).ravel())
    k = x.size
    c = np.arange(1, k + 1, dtype=np.float64)
    ratios = (np.cumsum(x) + x * (k - c)) / c
    return float(ratios.min())


def gittins_ranks(samples: np.ndarray) -> np.ndarray:
    """Vectorised :func:`gittins_rank` over the rows of an ``(M, K)`` array (one run a row)."""
    x = np.sort(_check(samples), axis=-1)
    if x.ndim != 2:
        raise ValueError(f"gittins_ranks expects a 2-D (runs, samples) array, got {x.shape}")
    k = x.shape[1]
    c = np.arange(1, k + 1, dtype=np.float64)
    ratios = (np.cumsum(x, axis=1) + x * (k - c)) / c
    ranks: np.ndarray = ratios.min(axis=1)
    return ranks

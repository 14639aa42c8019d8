"""Small sampling helpers shared by the app models.

Distributions are parameterised by the figures they were calibrated on (mean, standard
deviation, observed range), so that each app module reads like its calibration notes.
"""

from __future__ import annotations

import math

import numpy as np

from hermes.workloads.base import LLMCall

LLAMA2_7B = "llm:llama-2-7b"


def _lognormal_params(mean: float, sd: float) -> tuple[float, float]:
    sigma2 = math.log1p((sd / mean) ** 2)
    return math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2)


def lognormal(rng: np.random.Generator, mean: float, sd: float) -> float:
    """One lognormal draw with the given mean and standard deviation."""
    mu, sigma = _lognormal_params(mean, sd)
    return float(rng.lognormal(mu, sigma))


def lognormal_from(z: float, mean: float, sd: float) -> float:
    """The lognormal value (mean, sd) at standard-normal score ``z``: for correlated draws."""
    mu, sigma = _lognormal_params(mean, sd)
    return math.exp(mu + sigma * z)


def tokens(x: float, lo: int, hi: int) -> int:
    """Round a token count and clip it to an observed range."""
    return int(min(max(round(x), lo), hi))


def negbin_count(rng: np.random.Generator, minimum: int, mean: float, sd: float, cap: int) -> int:
    """``minimum`` plus a negative-binomial count, so that the total has ``mean`` and ``sd``.

    Over-dispersed counts (claims, chunks, loop iterations) are negative binomial; when the
    variance is not above the mean this falls back to Poisson. Capped at ``cap``.
    """
    m = mean - minimum
    var = sd * sd
    if m <= 0:
        return minimum
    if var <= m:
        k = int(rng.poisson(m))
    else:
        r = m * m / (var - m)
        k = int(rng.negative_binomial(r, r / (r + m)))
    return min(minimum + k, cap)


def gap(rng: np.random.Generator, mean_ms: float, sd_ms: float, lo_ms: float) -> float:
    """Client-side time before a stage, in seconds (lognormal, floored at the observed min)."""
    return max(lognormal(rng, mean_ms, sd_ms), lo_ms) / 1000.0


def call(unit: str, input_tokens: int, output_tokens: int, prefix_tokens: int) -> LLMCall:
    """An LLM request whose shared prefix is the unit's system prompt."""
    return LLMCall(
        input_tokens=int(input_tokens),
        output_tokens=int(output_tokens),
        prefix=unit,
        prefix_tokens=int(min(prefix_tokens, input_tokens)),
    )

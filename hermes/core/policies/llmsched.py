"""LLMSched-lite: an approximation of LLMSched (Zhu et al., 2025) on the PDGraph estimator.

Registered as ``llmsched-lite``; the paper's own design (a Bayesian network per app,
``R(X)`` and Algorithm 1) is ``llmsched`` in :mod:`hermes.core.policies.llmsched_bn`.

LLMSched estimates each job's remaining duration with a Bayesian network over its stages and
schedules by a mix of shortest-expected-remaining-first and *uncertainty reduction*: running a
stage whose outcome says much about the rest of the job makes later decisions better. Here
the PDGraph estimator's Monte Carlo samples, conditioned on the run's state, play the role of
the Bayesian-network posterior. Per run, at each refresh:

- ``mean``: posterior mean of the remaining service ``R`` (seconds);
- ``H``: entropy (nats) of ``R`` on a histogram of ``log1p(R)`` with bins of ``log_bin``
  (fixed log-width bins make entropies comparable across runs of any scale);
- ``I``: the expected entropy drop of ``R`` after observing the current unit, i.e. the mutual
  information ``I(R; U)`` with ``U`` the current unit's remaining service. When the samples
  carry the per-walk current-unit service (``samples.current_s``), ``I`` is the plug-in
  estimate on the joint histogram (``u_bins`` equal-frequency bins of ``U``). Otherwise it is
  bounded by the entropy of ``U`` itself, from the unit's service quantiles above the attained
  service (``min(H(U), H)``); between units ``I = 0``;
- ``gain = I / H`` in ``[0, 1]``: the share of the uncertainty the next observation removes.

With probability ``epsilon`` (one seeded draw per refresh) the run is ranked for exploration,
``rank = −I`` (ahead of every exploiting run, the most informative first); otherwise
``rank = mean − r·gain·mean``: shortest posterior mean first, discounted by up to ``r`` of
its mean for the information it would bring. Defaults: ``epsilon = 0.1``, ``r = 0.5``,
``log_bin = 0.25``, ``u_bins = 8``. The draws come from ``numpy.random.default_rng(seed)``,
so a seed and a call sequence fix every decision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from hermes.core.policies.base import register
from hermes.core.policies.estimated import _BOUNDS, _OFFSET, EstimatedPolicy
from hermes.core.state import RunState

if TYPE_CHECKING:
    from hermes.core.estimator import DemandSamples, EstimatorPool


def entropy(counts: np.ndarray) -> float:
    """Shannon entropy (nats) of a histogram given by its counts."""
    c = np.asarray(counts, dtype=np.float64).ravel()
    c = c[c > 0]
    if c.size == 0:
        return 0.0
    p = c / c.sum()
    return float(-(p * np.log(p)).sum())


def log_bins(x: np.ndarray, width: float) -> np.ndarray:
    """Histogram bin index of each value on a ``log1p`` scale with bins of ``width``."""
    return np.floor(np.log1p(np.maximum(np.asarray(x, dtype=np.float64), 0.0)) / width).astype(
        np.int64
    )


def mutual_information(r_bins: np.ndarray, u: np.ndarray, u_bins: int) -> float:
    """Plug-in ``I(R; U)`` (nats) from paired samples: R already binned, U equal-frequency."""
    edges = np.quantile(u, np.linspace(0.0, 1.0, u_bins + 1)[1:-1])
    ub = np.searchsorted(edges, u, side="right")
    rb = r_bins - r_bins.min()
    joint = np.zeros((u_bins, int(rb.max()) + 1))
    np.add.at(joint, (ub, rb), 1.0)
    i = entropy(joint.sum(axis=0)) + entropy(joint.sum(axis=1)) - entropy(joint)
    return max(0.0, i)


@register("llmsched-lite")
class LLMSchedLitePolicy(EstimatedPolicy):
    """ε-greedy between uncertainty reduction and shortest posterior mean (see module doc)."""

    name: ClassVar[str] = "llmsched-lite"

    def __init__(
        self,
        *,
        estimators: EstimatorPool | None = None,
        epsilon: float = 0.1,
        r: float = 0.5,
        log_bin: float = 0.25,
        u_bins: int = 8,
        buckets: int = 10,
        n_walks: int | None = None,
        las_quantum_s: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__(
            estimators=estimators, buckets=buckets, n_walks=n_walks,
            las_quantum_s=las_quantum_s, seed=seed,
        )
        if not 0.0 <= epsilon <= 1.0 or not 0.0 <= r <= 1.0:
            raise ValueError(f"epsilon and r must be in [0, 1], got {epsilon}, {r}")
        self.epsilon = epsilon
        self.r = r
        self.log_bin = log_bin
        self.u_bins = u_bins
        self.rng = np.random.default_rng(seed)

    def information(self, run: RunState, samples: DemandSamples) -> tuple[float, float]:
        """``(H, I)``: entropy of the remaining service and the current unit's information."""
        rb = log_bins(samples.service_s, self.log_bin)
        h = entropy(np.bincount(rb - rb.min()))
        current = getattr(samples, "current_s", None)
        if current is not None:
            return h, min(h, mutual_information(rb, np.asarray(current), self.u_bins))
        bounds = run.policy_state.get(_BOUNDS)
        if bounds is None or len(bounds) == 0:
            return h, 0.0
        done = run.attained_s - run.policy_state.get(_OFFSET, 0.0)
        left = np.asarray(bounds, dtype=np.float64)
        left = left[left > done] - done
        if left.size == 0:
            return h, 0.0
        ub = log_bins(left, self.log_bin)
        return h, min(h, entropy(np.bincount(ub - ub.min())))

    def rank_from_samples(self, run: RunState, samples: DemandSamples, now: float) -> float:
        h, i = self.information(run, samples)
        run.policy_state["llmsched_entropy"] = h
        run.policy_state["llmsched_info"] = i
        if self.rng.random() < self.epsilon:
            return -i
        mean = float(np.mean(samples.service_s))
        gain = i / h if h > 0 else 0.0
        return mean - self.r * gain * mean

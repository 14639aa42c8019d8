"""SeaLLM's doubling-budget priority (Zhao et al., "SeaLLM: Service-Aware and
Latency-Optimized Resource Sharing for Large Language Model Inference", 2025).

When a unit invocation starts, the run gets a service budget ``mean + std`` of that unit's
service time; its priority is ``remaining budget × mean`` (lower first): short, nearly done
invocations of cheap units go first. When the budget is spent the invocation is evidently
longer than expected, so the budget doubles (and doubles again if needed), which pushes the
run back. The rank is refreshed each time the budget runs out (``next_refresh_attained_s``).

The unit's mean and standard deviation come from the service times observed for that
``(app, unit)`` once ``min_history`` invocations have finished (up to the last
``history`` of them), otherwise from the estimator's single-invocation samples
(``unit_service_samples(unit, n_unit_samples)``, cached per estimator and unit), otherwise from ``default_unit_s`` (mean, with zero
std). Between units (and before the first) a run keeps its last rank (0 for a new run).
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from hermes.core.policies.base import SchedulingPolicy, register
from hermes.core.state import RunState, UnitObservation

if TYPE_CHECKING:
    from hermes.core.estimator import EstimatorPool

_START = "seallm_unit_start_s"
_BUDGET = "seallm_budget_s"
_MEAN = "seallm_mean_s"


@register("seallm")
class DoublingBudgetPolicy(SchedulingPolicy):
    """Priority = remaining budget × mean unit service; budget = mean + std, doubled when spent."""

    name: ClassVar[str] = "seallm"
    uses_estimator: ClassVar[bool] = True

    def __init__(
        self,
        *,
        estimators: EstimatorPool | None = None,
        min_history: int = 5,
        history: int = 1000,
        default_unit_s: float = 1.0,
        n_unit_samples: int = 1000,
    ) -> None:
        self.estimators = estimators
        self.min_history = min_history
        self.default_unit_s = default_unit_s
        self.n_unit_samples = n_unit_samples
        self._prior: dict[tuple[int, str], tuple[float, float]] = {}
        self._history: dict[tuple[str, str], deque[float]] = defaultdict(
            lambda: deque(maxlen=history)
        )

    def unit_stats(self, app: str, unit: str) -> tuple[float, float]:
        """Mean and standard deviation of one invocation's service time of ``unit``."""
        seen = self._history.get((app, unit))
        if seen is not None and len(seen) >= self.min_history:
            x = np.fromiter(seen, dtype=np.float64)
            return float(x.mean()), float(x.std())
        est = None if self.estimators is None else self.estimators.get(app)
        if est is not None:
            key = (id(est), unit)
            if key not in self._prior:
                x = np.asarray(est.unit_service_samples(unit, self.n_unit_samples), dtype=float)
                if x.size:
                    self._prior[key] = (float(x.mean()), float(x.std()))
            if key in self._prior:
                return self._prior[key]
        return self.default_unit_s, 0.0

    def on_unit_start(self, run: RunState, unit: str, now: float) -> None:
        mean, std = self.unit_stats(run.app, unit)
        run.policy_state[_START] = run.attained_s
        run.policy_state[_MEAN] = mean
        run.policy_state[_BUDGET] = max(mean + std, 1e-9)
        run.rank = self.rank(run, now)
        run.rank_refreshed_at = now

    def on_unit_finish(self, run: RunState, obs: UnitObservation, now: float) -> None:
        self._history[(run.app, obs.unit)].append(obs.service_s)
        run.policy_state.pop(_BUDGET, None)
        run.next_refresh_attained_s = float("inf")

    def rank(self, run: RunState, now: float) -> float:
        st = run.policy_state
        if _BUDGET not in st:
            return run.rank if run.rank_refreshed_at > float("-inf") else 0.0
        spent = run.attained_s - st[_START]
        while st[_BUDGET] <= spent:
            st[_BUDGET] *= 2.0
        run.next_refresh_attained_s = st[_START] + st[_BUDGET]
        rank: float = (st[_BUDGET] - spent) * st[_MEAN]
        return rank

"""SeaLLM's doubling-budget (DB) priority with its starvation threshold (Zhao et al.,
"SeaLLM: Service-Aware and Latency-Optimized Resource Sharing for Large Language Model
Inference", 2025, §4.2 and Algorithm 2).

A SeaLLM *service* is here a ``(app, unit)`` pair: the requests of one unit share a service
time distribution, as the requests of one LLM service do in the paper. When a unit invocation
starts, the run gets a budget ``Q = L̂ + Var``: the mean plus the standard deviation ("standard
variance") of that unit's service time. The priority is ``O = Q_left · L̂`` (lower first), with
``Q_left`` the budget not yet spent: short, nearly done invocations of cheap units go first.

Budget reset (the paper's rule): when an invocation spends its budget without finishing, it
gets a *fresh* budget twice the previous one, ``Q' = 2Q``, and its priority is reset to
``Q'·L̂``; again and again until it finishes. The ``k``-th budget is ``2^k·Q`` in full, so the
``k``-th reset happens once the invocation has spent ``(2^k − 1)·Q`` (not ``2^(k-1)·Q``, as a
cumulative doubling of one budget would). The rank is refreshed at each reset
(``next_refresh_attained_s``).

Starvation threshold ("We set a starvation threshold for each service and serve the starved
services first"; Algorithm 2's ``GetHighestPriorityOrStarvedRequest``): a queued request
whose wait (time queued minus the service its invocation has received) reaches
``starvation_factor × L̂`` of its service is *starved* and goes before every request that is
not, the longest-waiting first. The paper gives no value; ``starvation_factor = 10`` is ours
(a request that has waited ten times its service's mean execution time), and ``None`` turns
the threshold off. The threshold depends on the clock, so the keys are ``dynamic_keys``
(re-read before each dispatch; ``key_scope = "all"``). Tool calls have no threshold.

The unit's mean and standard deviation come from the service times observed for that
``(app, unit)`` once ``min_history`` invocations have finished (up to the last ``history`` of
them), otherwise from the estimator's single-invocation samples
(``unit_service_samples(unit, n_unit_samples)``, cached per estimator and unit), otherwise
from ``default_unit_s`` (mean, with zero std). Between units (and before the first) a run
keeps its last rank (0 for a new run).
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from hermes.core.policies.base import RequestKey, SchedulingPolicy, register
from hermes.core.state import RequestView, RunState, UnitObservation

if TYPE_CHECKING:
    from hermes.core.estimator import EstimatorPool

_START = "seallm_unit_start_s"  # run.attained_s when the current budget began
_BUDGET = "seallm_budget_s"  # the current budget in full (Q, 2Q, 4Q, ...)
_MEAN = "seallm_mean_s"
_UNIT_AT = "seallm_unit_attained_s"  # run.attained_s when the unit started


@register("seallm")
class DoublingBudgetPolicy(SchedulingPolicy):
    """Priority = remaining budget × mean unit service; a spent budget is replaced by a fresh
    one twice as large; starved requests first."""

    name: ClassVar[str] = "seallm"
    uses_estimator: ClassVar[bool] = True
    dynamic_keys: ClassVar[bool] = True  # the starvation threshold reads the clock
    key_scope: ClassVar[str] = "all"

    def __init__(
        self,
        *,
        estimators: EstimatorPool | None = None,
        min_history: int = 5,
        history: int = 1000,
        default_unit_s: float = 1.0,
        n_unit_samples: int = 1000,
        starvation_factor: float | None = 10.0,
    ) -> None:
        if starvation_factor is not None and starvation_factor <= 0:
            raise ValueError(f"starvation_factor must be > 0 or None, got {starvation_factor}")
        self.estimators = estimators
        self.min_history = min_history
        self.default_unit_s = default_unit_s
        self.n_unit_samples = n_unit_samples
        self.starvation_factor = starvation_factor
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
        run.policy_state[_START] = run.policy_state[_UNIT_AT] = run.attained_s
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
        while st[_BUDGET] <= run.attained_s - st[_START]:  # spent: a fresh budget, twice as big
            st[_START] += st[_BUDGET]
            st[_BUDGET] *= 2.0
        run.next_refresh_attained_s = st[_START] + st[_BUDGET]
        rank: float = (st[_BUDGET] - (run.attained_s - st[_START])) * st[_MEAN]
        return rank

    def starved(self, run: RunState, req: RequestView, now: float) -> float | None:
        """When ``req`` began waiting, net of the service its invocation has received since it
        was queued, if its wait has reached its service's starvation threshold
        (``starvation_factor`` × the unit's mean service) by ``now``; else ``None``. LLM
        requests only."""
        st = run.policy_state
        if self.starvation_factor is None or req.input_tokens <= 0 or _MEAN not in st:
            return None
        since = req.arrival + run.attained_s - st.get(_UNIT_AT, run.attained_s)
        return since if now - since >= self.starvation_factor * st[_MEAN] else None

    def request_key(self, run: RunState, req: RequestView, now: float) -> RequestKey:
        since = self.starved(run, req, now)
        if since is not None:  # starved: before all others, the longest wait first
            return (0.0, since, run.submitted, req.arrival, req.seq)
        return (1.0, run.rank, run.submitted, req.arrival, req.seq)

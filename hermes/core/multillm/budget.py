"""SeaLLM's doubling budget (DB) priority (§4.2, Algorithm 2).

A request of service ``s`` starts with budget ``Q = L̂_s + σ_s`` (mean and standard deviation
of the service's execution time). Its priority is ``O = Q_left · L̂_s`` (smaller first). When
the budget is spent without the request finishing it gets a *fresh* budget ``2Q`` (then
``4Q``, ...): the ``k``-th budget is ``2^k·Q`` and starts once ``(2^k − 1)·Q`` was spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DoublingBudget:
    """The DB rule for one service: ``q_s`` (= L̂ + σ) and ``mean_s`` (= L̂)."""

    q_s: float
    mean_s: float

    def __post_init__(self) -> None:
        if not (self.q_s > 0 and self.mean_s > 0):
            raise ValueError(f"budget Q and mean must be > 0 (got Q={self.q_s}, L̂={self.mean_s})")

    def level(self, executed_s: float) -> int:
        """Index ``k`` of the budget in use after ``executed_s`` of execution."""
        if executed_s < 0:
            raise ValueError(f"executed time must be >= 0, got {executed_s}")
        return int(math.floor(math.log2(executed_s / self.q_s + 1.0) + 1e-12))

    def remaining(self, executed_s: float) -> float:
        """Budget left in the current (``2^k·Q``) budget."""
        k = self.level(executed_s)
        return float((2 ** (k + 1) - 1) * self.q_s - executed_s)

    def priority(self, executed_s: float) -> float:
        """``O = Q_left · L̂`` (smaller goes first)."""
        return self.remaining(executed_s) * self.mean_s

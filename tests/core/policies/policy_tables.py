"""A hand-made stand-in for the PDGraph estimator: fixed sample tables per (app, current unit).

The policies under test only consume an estimator's output (remaining-demand samples and a
unit's service quantiles), so a table lets each test state the distributions and derive the
expected order by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hermes.core.state import RunProgress


@dataclass
class Samples:
    service_s: np.ndarray
    input_tokens: np.ndarray | None = None
    output_tokens: np.ndarray | None = None
    current_s: np.ndarray | None = None
    wall_s: np.ndarray | None = None  # default: service only (no client gaps)

    def __post_init__(self) -> None:
        if self.wall_s is None:
            self.wall_s = self.service_s


class TableEstimator:
    def __init__(self, by_unit: dict[str | None, Samples], bounds: dict[str, list[float]]):
        self.by_unit = by_unit
        self.bounds = bounds
        self.calls = 0

    def sample(self, progress: RunProgress, n: int | None = None) -> Samples:
        self.calls += 1
        return self.by_unit[progress.current]

    def unit_service_boundaries(self, unit: str, buckets: int) -> np.ndarray:
        return np.asarray(self.bounds.get(unit, []), dtype=np.float64)

    def unit_service_samples(self, unit: str, n: int = 1000) -> np.ndarray:
        return np.asarray(self.bounds.get(unit, []), dtype=np.float64)


class TablePool:
    def __init__(self, estimators: dict[str, TableEstimator]):
        self.estimators = estimators

    def get(self, app: str) -> TableEstimator | None:
        return self.estimators.get(app)


def pool_of(**apps: np.ndarray | Samples) -> TablePool:
    """One app per keyword, each with one remaining-service sample table (any unit)."""
    ests = {}
    for app, s in apps.items():
        smp = s if isinstance(s, Samples) else Samples(np.asarray(s, dtype=np.float64))
        ests[app] = TableEstimator({None: smp, "u": smp}, {"u": [1.0, 2.0, 3.0]})
    return TablePool(ests)

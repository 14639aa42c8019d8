"""The estimator's condition key: exactly what its draw reads of a run's state."""

from __future__ import annotations

import numpy as np

from hermes.bench.sched import load_graphs
from hermes.core.costmodel import get_cost_model
from hermes.core.estimator import DemandEstimator
from hermes.core.state import RunProgress, UnitObservation

APP = "got_docmerge"  # every unit conditioned on its upstream units' tokens (refinement)


def estimator(seed: int = 0) -> DemandEstimator:
    return DemandEstimator(load_graphs()[APP], get_cost_model("llama2-7b-a100"), n_walks=100,
                           seed=seed)


def obs(unit: str, i: int, o: int) -> UnitObservation:
    return UnitObservation(unit=unit, input_tokens=i, output_tokens=o)


def test_states_with_one_key_draw_identical_walks_under_one_seed() -> None:
    """Equal keys: the draw reads nothing else, so the same seed gives the same walks,
    token for token. Different keys: the buckets the refinement reads differ."""
    est = estimator()
    rng = np.random.default_rng(7)

    def draw(progress: RunProgress) -> object:
        est.rng = np.random.default_rng(3)
        return est.sample(progress)

    same = differ = 0
    for _ in range(40):
        i, o = (int(x) for x in rng.integers(100, 4000, 2))
        j, p = i + int(rng.integers(-40, 40)), o + int(rng.integers(-40, 40))
        a = RunProgress(finished=[obs("generate1", i, o)])
        b = RunProgress(finished=[obs("generate1", j, p)])
        if est.condition_key(a) != est.condition_key(b):
            differ += 1
            continue
        same += 1
        wa, wb = draw(a), draw(b)
        for f in ("service_s", "wall_s", "input_tokens", "output_tokens"):
            assert np.array_equal(getattr(wa, f), getattr(wb, f)), f
        if same == 12:
            break
    assert same >= 10 and differ >= 1  # both cases were exercised
    far = RunProgress(finished=[obs("generate1", 50, 5)])
    near = RunProgress(finished=[obs("generate1", 60_000, 9_000)])
    assert est.condition_key(far) != est.condition_key(near)


def test_key_reads_visits_position_and_attained_service() -> None:
    est = estimator()
    one = [obs("generate1", 500, 100)]
    assert est.condition_key(RunProgress(finished=one)) != est.condition_key(
        RunProgress(finished=one + [obs("score1", 500, 100)]))
    assert est.condition_key(RunProgress(current="score1")) != est.condition_key(
        RunProgress(current="score1", current_attained_s=0.5))
    assert est.condition_key(RunProgress(), 100) != est.condition_key(RunProgress(), 200)
    # a unit the graph does not know is not read (the draw skips it too)
    assert est.condition_key(RunProgress(finished=one)) == est.condition_key(
        RunProgress(finished=[obs("no_such_unit", 1, 1), *one]))

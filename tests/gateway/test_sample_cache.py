"""The live scheduler's memo of demand samples: same state, same samples; new state or a
relearned graph, fresh ones."""

from __future__ import annotations

from hermes.bench.sched import load_graphs
from hermes.core.costmodel import get_cost_model
from hermes.core.estimator import EstimatorPool
from hermes.core.state import RunProgress, UnitObservation
from hermes.gateway.sample_cache import CachingEstimatorPool


def test_identical_states_share_samples_and_others_do_not() -> None:
    graphs = load_graphs()
    app = "factool_code"
    raw = EstimatorPool(graphs, get_cost_model("llama2-7b-a100"), n_walks=200)
    pool = CachingEstimatorPool(raw)
    est = pool.get(app)
    assert est is not None and pool.get("no-such-app") is None
    unit = "generate_queries"  # factool_code's first unit
    fresh = est.sample(RunProgress())
    assert est.sample(RunProgress()) is fresh  # two new runs of the app: one draw
    started = est.sample(RunProgress(current=unit))
    assert started is not fresh and est.sample(RunProgress(current=unit)) is started
    later = est.sample(RunProgress(current=unit, current_attained_s=0.5))
    assert later is not started  # attained service conditions the estimate
    done = [UnitObservation(unit=unit, input_tokens=300, output_tokens=60, duration_s=9.0)]
    a = est.sample(RunProgress(finished=done))
    other = [UnitObservation(unit=unit, input_tokens=300, output_tokens=61, duration_s=9.0)]
    assert est.sample(RunProgress(finished=other)) is not a
    # an LLM unit's wall time is not an estimator input: same tokens, same samples
    same = [UnitObservation(unit=unit, input_tokens=300, output_tokens=60, duration_s=2.0)]
    assert est.sample(RunProgress(finished=same)) is a
    assert pool.stats()["sample_cache_hits"] == 3
    raw.update(graphs[app])  # relearned graph: a new estimator, an empty memo
    assert pool.get(app).sample(RunProgress()) is not fresh

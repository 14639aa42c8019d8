"""``hermes bench estimator --rank-apps``: Gittins vs SRPT-on-the-mean at every unit
boundary (hermes.bench.estimator.rank_agreement), on a hand-made app."""

from __future__ import annotations

import numpy as np

from hermes.bench.estimator import rank_agreement, true_remaining_s
from hermes.core.costmodel import get_cost_model
from hermes.core.profiler import learn
from tests.core.toyapps import kbqa_like_records


def test_rank_agreement_states_bounds_and_truth() -> None:
    cost = get_cost_model("llama2-7b-a100")
    graph = learn(kbqa_like_records(200))
    recs = kbqa_like_records(12, seed=7)
    row, states = rank_agreement(graph, recs, cost, n_walks=200)
    # one state per unit boundary before the last unit of each run
    assert row["states"] == states.shape[0] == sum(len(r.units) - 1 for r in recs)
    assert row["runs"] == 12 and states.shape[1] == 3
    g, m, t = states.T
    # the Gittins rank never exceeds the mean (the quantum "all of it" gives E[R] / 1)
    assert (g <= m * (1 + 1e-9) + 1e-12).all()
    # the third column is the true remaining service after each boundary
    first = recs[0]
    assert t[: len(first.units) - 1].tolist() == [
        true_remaining_s(first, k, cost) for k in range(len(first.units) - 1)]
    for key in ("tau_gittins_mean", "tau_gittins_truth", "tau_mean_truth"):
        assert -1.0 <= row[key] <= 1.0
    assert row["discordant_pairs"] == round((1 - row["tau_gittins_mean"]) / 2, 3)
    # a fixed chain of four units: later boundaries have less left, and both ranks see it
    assert row["tau_mean_truth"] > 0.5 and row["tau_gittins_truth"] > 0.5
    assert np.isfinite(states).all()

"""The greedy search charges a stage for the work its preemptions throw away."""

from __future__ import annotations

import numpy as np
import pytest

from hermes.core.batchplan.oracle import Segment, TableOracle
from hermes.core.batchplan.search import Planner
from hermes.core.batchplan.workload import App, ModelNode, Request
from hermes.core.cluster.cost import Plan
from hermes.core.cluster.models import get_model


def test_lost_work_is_the_unfinished_requests_progress() -> None:
    # two requests of 10 work units each, run side by side from t=0 to t=10 (1 unit/s each)
    seg = Segment("m", Plan(1, 1), 0.0, 10.0, {0: 5.0, 1: 10.0}, np.array([0.0, 10.0]),
                  np.array([0.0, 15.0]), {0: 5.0, 1: 10.0})
    assert seg.lost_at(4.0) == pytest.approx(6.0)  # nothing finished: all of it is lost
    assert seg.lost_at(6.0) == pytest.approx(9.0 - 5.0)  # request 0 done and kept
    assert seg.lost_at(10.0) == pytest.approx(0.0)
    legacy = Segment("m", Plan(1, 1), 0.0, 1.0, {}, np.array([0.0, 1.0]), np.array([0.0, 1.0]))
    assert legacy.lost_at(0.5) == 0.0  # an oracle that gives no per-request work: no charge


# found by a random search over toy tables (4 models, 4 GPUs): the plain greedy stops models
# close to their end to start others; the priced search keeps them
TIMES = {"m0": {1: 9.0, 2: 6.4, 4: 2.3}, "m1": {1: 7.0, 2: 3.6, 4: 3.0},
         "m2": {1: 2.0, 2: 1.5, 4: 0.7}, "m3": {1: 9.0, 2: 5.5, 4: 4.3}}


def _total(price: bool) -> tuple[float, int]:
    spec = get_model("llama-2-7b")
    app = App({m: ModelNode(m, spec, [Request(i, 1, 1) for i in range(10)]) for m in TIMES})
    pl = Planner(app, TableOracle(TIMES, 4, k=10, load=2.0), price_preemption=price)
    sched = pl.run("greedy", lambda s: pl.greedy_stage(s, True))
    reloads = sum(p.reload for st in sched.stages[1:] for p in st.pairs)
    return sched.total_s, reloads


def test_priced_greedy_beats_the_plain_one() -> None:
    plain, plain_reloads = _total(False)
    priced, priced_reloads = _total(True)
    assert plain == pytest.approx(14.39)
    assert priced == pytest.approx(12.5)
    assert priced_reloads < plain_reloads

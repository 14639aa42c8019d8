"""The request path's reads of the knowledge base (``Learner.serving_graph``) for an app this
process has not learned: at most one per ``stores.learn_interval_s``, found or not, on a
real directory and a real Redis (the store schedulers of an election share)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hermes.core.costmodel import get_cost_model
from hermes.core.estimator import EstimatorPool
from hermes.gateway.config import GatewayConfig
from hermes.gateway.context import SchedulerClock, SchedulerContext, startup_policy
from hermes.gateway.learning import Learner


class CountingReads:
    """A real store whose ``get`` calls are counted (everything else passes through)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.gets = 0

    def get(self, app: str) -> Any:
        self.gets += 1
        return self.store.get(app)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def learner(tmp_path: Path, kb: Any, interval: float, **stores: object) -> Learner:
    config = GatewayConfig.model_validate({
        "stores": {"kb": "", "learn_interval_s": interval, **stores},
        "scheduler": {"policy": "hermes", "n_walks": 50}})
    cost = get_cost_model("llama2-7b-a100")
    pool = EstimatorPool({}, cost, n_walks=50)
    ctx = SchedulerContext(config, SchedulerClock(), cost, startup_policy(config, pool), pool)
    return Learner(ctx, kb, tmp_path / "records.jsonl")


def test_an_unlearned_app_is_read_once_per_interval_found_or_not(
        store_factory: Callable[..., Any], mkgraph: Callable[..., Any], tmp_path: Path) -> None:
    kb = CountingReads(store_factory())
    lr = learner(tmp_path, kb, interval=0.3)
    for _ in range(200):  # two asks per unit start, 100 unit starts
        assert lr.serving_graph("toy") is None
    assert kb.gets == 1

    store_factory().put(mkgraph("toy"))  # another process writes the graph
    assert lr.serving_graph("toy") is None  # within the interval: what was read
    time.sleep(0.35)
    found = lr.serving_graph("toy")
    assert found is not None and found.app == "toy"
    for _ in range(100):
        assert lr.serving_graph("toy") is found
    assert kb.gets == 2

    other = store_factory()  # ... and deletes it: gone after one interval
    other.delete("toy")
    time.sleep(0.35)
    assert lr.serving_graph("toy") is None
    assert kb.gets == 3
    lr.close()


def test_a_graph_put_through_the_learner_is_served_at_once(
        store_factory: Callable[..., Any], mkgraph: Callable[..., Any], tmp_path: Path) -> None:
    kb = CountingReads(store_factory())
    lr = learner(tmp_path, kb, interval=60.0)
    assert lr.serving_graph("toy") is None
    graph = mkgraph("toy")
    lr.put_graph(graph)  # the admin API's upload
    assert lr.serving_graph("toy") is graph
    lr.close()


def test_the_reads_remembered_are_bounded(store_factory: Callable[..., Any],
                                          tmp_path: Path) -> None:
    kb = CountingReads(store_factory())
    lr = learner(tmp_path, kb, interval=60.0, max_learned_apps=5)
    for i in range(20):
        assert lr.serving_graph(f"app{i}") is None
    assert list(lr._kb_reads) == [f"app{i}" for i in range(15, 20)]
    assert lr.serving_graph("app19") is None and kb.gets == 20  # still remembered
    assert lr.serving_graph("app0") is None and kb.gets == 21  # dropped: read again
    lr.close()

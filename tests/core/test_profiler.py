"""Profiler: records -> PDGraph, incremental, with the dependencies discovered as masks."""

from __future__ import annotations

import numpy as np

from hermes.core.pdgraph import MAX_SAMPLES
from hermes.core.profiler import Profiler, bucketed_pearson, learn
from tests.core.toyapps import kbqa_like_records, loop_records


def test_incremental_equals_batch() -> None:
    recs = kbqa_like_records(300)
    prof = Profiler()
    for i, r in enumerate(recs):
        prof.add(r)
        if i == 99:
            mid = prof.graph
    assert mid.runs == 100
    assert prof.graph == learn(recs)
    assert prof.graph.runs == 300


def test_resume_from_saved_graph_keeps_learning() -> None:
    recs = kbqa_like_records(400)
    first = learn(recs[:200])
    resumed = Profiler(graph=first)
    resumed.add_many(recs[200:])
    full = learn(recs)
    assert resumed.graph.runs == 400
    assert resumed.graph.units["query"].consumption == full.units["query"].consumption
    assert resumed.graph.entry == full.entry


def test_masks_find_the_built_in_dependencies() -> None:
    g = learn(kbqa_like_records(500))
    on = {e: {k for k, v in edge.masks.items() if v} for e, edge in g.edges.items()}
    assert "P<-O" in on["query<-extract"]  # one query per claim; claims drive extract's output
    assert "P<-P" in on["verify<-query"]  # one verify per query
    assert on["verify<-search"] == set()  # the tool in between is unrelated
    assert not on["search<-query"]


def test_fifo_cap_keeps_newest() -> None:
    recs = kbqa_like_records(MAX_SAMPLES + 50)
    g = learn(recs)
    par = g.units["query"].consumption.parallelism
    assert len(par) == MAX_SAMPLES
    assert par[-1] == len(recs[-1].units[1].requests)
    assert par[0] == len(recs[50].units[1].requests)


def test_visit_indexed_branching_captures_a_loop_cap() -> None:
    g = learn(loop_records(400, cap=3, p_continue=0.8))
    assert g.next_probs("think", 3) == {"": 1.0}  # never a 4th thought
    assert 0.7 < g.next_probs("think", 1)["act"] < 0.9
    assert max(g.units["think"].consumption.loops) == 3


def test_bucketed_pearson() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=500)
    assert bucketed_pearson(x, 3 * x + 1, 10) > 0.99
    assert abs(bucketed_pearson(x, rng.normal(size=500), 10)) < 0.2
    assert bucketed_pearson(np.ones(50), x[:50], 10) == 0.0


def test_learned_rows_are_not_walked_by_the_garbage_collector() -> None:
    """A learned graph's per-invocation rows (``branch``, ``joined``: up to MAX_SAMPLES per
    unit and edge) are tuples of floats, which the collector stops tracking, as is a graph
    read back from its JSON (a warm gateway's full collections walked them as lists: ~1.3
    million floats); the JSON is the arrays it was."""
    import gc
    import json

    from hermes.core.pdgraph import PDGraph

    graph = learn(kbqa_like_records(300))
    again = PDGraph.model_validate_json(graph.model_dump_json())
    gc.collect()  # a collection untracks the tuples whose items are all untracked
    for g in (graph, again):
        rows = [r for u in g.units.values() for r in u.branch]
        rows += [r for e in g.edges.values() for r in e.joined]
        assert len(rows) > 300
        assert all(type(r) is tuple and not gc.is_tracked(r) for r in rows)
    assert again == graph
    doc = json.loads(graph.model_dump_json())
    assert any(isinstance(u["branch"][0], list) for u in doc["units"].values() if u["branch"])

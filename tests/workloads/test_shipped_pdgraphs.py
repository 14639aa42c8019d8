"""The shipped PDGraphs: `hermes estimate` agrees with fresh runs, and the masks found include
the dependencies built into the app models."""

from __future__ import annotations

import numpy as np
import pytest

from hermes.core.costmodel import get_cost_model
from hermes.core.estimator import DemandEstimator
from hermes.core.pdgraph import PDGraph
from hermes.kb import shipped_pdgraphs_dir
from hermes.workloads.isolated import profile_app
from hermes.workloads.registry import APPS

PDGRAPHS = shipped_pdgraphs_dir()
COST = get_cost_model("llama2-7b-a100")


def total_output(rec) -> int:
    return sum(r.output_tokens for u in rec.units for r in (u.requests or []))


@pytest.mark.parametrize("app", sorted(APPS))
def test_estimate_matches_fresh_runs(app: str) -> None:
    graph = PDGraph.load(PDGRAPHS / f"{app}.json")
    assert graph.runs == 1000
    runs = 300 if app == "got_docmerge" else 1000  # DM runs are slow to generate
    truth = np.array([total_output(r) for r in profile_app(app, runs, 4242, COST)])
    est = DemandEstimator(graph, COST, n_walks=5000, seed=0).sample().output_tokens
    assert est.mean() == pytest.approx(truth.mean(), rel=0.10)
    assert np.percentile(est, 95) == pytest.approx(np.percentile(truth, 95), rel=0.15)


def masks(app: str) -> dict[str, set[str]]:
    g = PDGraph.load(PDGRAPHS / f"{app}.json")
    return {e: {k for k, on in edge.masks.items() if on} for e, edge in g.edges.items()}


def test_masks_include_the_built_in_dependencies() -> None:
    kbqa = masks("factool_kbqa")
    assert "P<-O" in kbqa["generate_queries<-extract_claims"]  # one query per extracted claim
    assert "P<-P" in kbqa["verifies<-generate_queries"]  # one verify per query
    dm = masks("got_docmerge")
    assert "I<-O" in dm["score2<-aggregate"]  # score prompts contain the aggregate output
    assert "I<-O" in dm["aggregate<-generate1"]  # the aggregate prompt holds both candidates
    mrs = masks("langchain_mapreduce")
    assert "P<-T" in mrs["collapse_summaries<-generate_summary"]  # collapse groups by summary length
    assert "I<-T" in mrs["generate_final_summary<-collapse_summaries"]
    mrs_graph = PDGraph.load(PDGRAPHS / "langchain_mapreduce.json")
    assert "T" in mrs_graph.units["collapse_summaries"].branch_masks  # collapse again while too long
    cg = PDGraph.load(PDGRAPHS / "code_generation.json")
    assert "D" in cg.units["execute_code"].branch_masks  # a fast failure leads to a fix
    fev = PDGraph.load(PDGRAPHS / "react_fever.json")
    assert max(fev.units["thought"].consumption.loops) == 3  # the ReAct loop's cap

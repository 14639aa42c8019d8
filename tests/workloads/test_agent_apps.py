"""The agent apps (SWE, RES): heavy-tailed loops, growing contexts, valid units, their shipped
PDGraphs, and the benchmark workloads that draw them."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from hermes.core.costmodel import get_cost_model
from hermes.core.estimator import DemandEstimator
from hermes.core.pdgraph import PDGraph
from hermes.workloads.apps.coding_agent import CodingAgent
from hermes.workloads.apps.research_agent import ResearchAgent
from hermes.workloads.base import Step
from hermes.workloads.isolated import profile_app
from hermes.workloads.registry import (
    AGENT_APPS,
    APPS,
    agent_pdgraphs_dir,
    draw_workload,
    get_app,
)

COST = get_cost_model("llama2-7b-a100")
LOOP_UNIT = {"swe_agent": "act", "research_agent": "plan"}
CAP = {"swe_agent": CodingAgent.MAX_TURNS, "research_agent": ResearchAgent.MAX_STEPS}


def runs(app: str, n: int, seed: int = 0) -> list[list[Step]]:
    return [list(get_app(app).steps(np.random.default_rng([seed, i]))) for i in range(n)]


@pytest.mark.parametrize("app", sorted(AGENT_APPS))
def test_turn_counts_are_heavy_tailed(app: str) -> None:
    turns = np.array([sum(s.unit == LOOP_UNIT[app] for s in r) for r in runs(app, 3000)])
    p50, p99 = np.percentile(turns, [50, 99])
    assert p99 / p50 >= 4.0, (p50, p99)  # lognormal sigma 0.7-0.8: ~5-6x
    assert turns.min() >= 1 and turns.max() <= CAP[app]
    # and so is each run's total tool time
    tool = np.array([sum(s.duration_s or 0.0 for s in r) for r in runs(app, 3000)])
    assert np.percentile(tool, 99) / np.percentile(tool, 50) >= 4.0


def test_research_agent_matches_the_published_session_lengths() -> None:
    steps = np.array([sum(s.unit == "plan" for s in r) for r in runs("research_agent", 3000)])
    assert 0.85 <= (steps <= 10).mean() <= 0.95  # "over 90% of sessions <= 10 steps"


@pytest.mark.parametrize("app", sorted(AGENT_APPS))
def test_contexts_grow_across_turns_up_to_the_cap(app: str) -> None:
    cap = AGENT_APPS[app].CONTEXT_TOKENS
    grew = 0
    for r in runs(app, 200):
        prompts = [s.requests[0].input_tokens for s in r if s.unit == LOOP_UNIT[app]]
        assert all(b >= a for a, b in zip(prompts, prompts[1:], strict=False))  # never shrink
        assert max(prompts) <= cap
        grew += len(prompts) > 1 and prompts[-1] > prompts[0]
    assert grew >= 100  # most multi-turn runs read more than they started with


@pytest.mark.parametrize("app", sorted(AGENT_APPS))
def test_units_are_valid(app: str) -> None:
    for r in runs(app, 100):
        assert r[0].is_llm and r[0].upstream is None
        for prev, s in zip(r, r[1:], strict=False):
            assert s.upstream == prev.unit  # each step follows the one before it
        for s in r:
            if s.is_llm:
                assert s.duration_s is None and len(s.requests) == 1
                req = s.requests[0]
                assert req.input_tokens > 0 and req.output_tokens > 0
                assert 0 < req.prefix_tokens <= req.input_tokens
            else:
                assert s.backend.split(":")[0] in ("docker", "api") and not s.requests
                assert s.duration_s is not None and s.duration_s > 0
    assert r[-1].is_llm  # a run ends with the agent's last word (submit / answer)


def test_the_agent_family_stays_apart_from_the_papers_apps() -> None:
    assert set(AGENT_APPS) == {"swe_agent", "research_agent"}
    assert not set(AGENT_APPS) & set(APPS) and len(APPS) == 10
    assert isinstance(get_app("swe_agent"), CodingAgent)
    assert isinstance(get_app("research_agent"), ResearchAgent)
    with pytest.raises(ValueError, match="unknown app 'nope'.*swe_agent"):
        get_app("nope")


@pytest.mark.parametrize("app", sorted(AGENT_APPS))
def test_shipped_agent_pdgraphs_match_fresh_runs(app: str) -> None:
    graph = PDGraph.load(agent_pdgraphs_dir() / f"{app}.json")
    assert graph.runs == 1000 and LOOP_UNIT[app] in graph.units
    truth = np.array([sum(r.output_tokens for u in rec.units for r in (u.requests or []))
                      for rec in profile_app(app, 1000, 4242, COST)])
    est = DemandEstimator(graph, COST, n_walks=5000, seed=0).sample().output_tokens
    assert est.mean() == pytest.approx(truth.mean(), rel=0.10)
    assert np.percentile(est, 95) == pytest.approx(np.percentile(truth, 95), rel=0.15)


def test_draw_workload() -> None:
    rng = np.random.default_rng(0)
    assert Counter(draw_workload(rng, 11, "stratified", "agents")).most_common() in (
        [("research_agent", 6), ("swe_agent", 5)], [("swe_agent", 6), ("research_agent", 5)])
    mixed = draw_workload(rng, 100, "stratified", "mixed")
    assert sum(a in AGENT_APPS for a in mixed) == 50 and sum(a in APPS for a in mixed) == 50
    assert all(a in APPS for a in draw_workload(rng, 50, "random", "paper"))
    with pytest.raises(ValueError, match="unknown workload 'both'"):
        draw_workload(rng, 5, "stratified", "both")
    with pytest.raises(ValueError, match="unknown mix 'even'"):
        draw_workload(rng, 5, "even", "agents")

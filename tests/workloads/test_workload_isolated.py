"""Isolated execution: timing on the cost model, gaps, tools, and seeding of profile runs."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from hermes.core.costmodel import get_cost_model
from hermes.workloads.base import AppModel, LLMCall, Step
from hermes.workloads.isolated import profile_app, run_isolated
from hermes.workloads.registry import get_app

COST = get_cost_model("llama2-7b-a100")


class _TwoSteps(AppModel):
    name = "two_steps"
    short = "TS"
    size_class = "small"

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        yield Step("ask", "llm:llama-2-7b", (LLMCall(100, 10), LLMCall(300, 40)))
        yield Step("tool", "docker:python:3.10-slim", duration_s=2.5, gap_s=0.5, upstream="ask")


def test_llm_units_take_cost_model_time_and_gaps_add_wall_time() -> None:
    rec = run_isolated(_TwoSteps(), np.random.default_rng(0), COST, run_id="r", submitted=10.0)
    ask, tool = rec.units
    # prefill of 400 tokens, then 40 decode steps (2 sequences for the first 10)
    by_hand = (
        COST.base_s
        + COST.prefill_s_per_token * 400
        + COST.base_s * 40
        + COST.decode_s_per_seq * 50
        + COST.decode_s_per_ctx_token * (10 * 100 + 50 + 40 * 300 + 800)
    )
    assert ask.started == 10.0
    assert ask.finished - ask.started == pytest.approx(by_hand)
    assert [(r.input_tokens, r.output_tokens) for r in ask.requests] == [(100, 10), (300, 40)]
    assert tool.started == pytest.approx(ask.finished + 0.5)
    assert tool.duration_s == 2.5 and tool.finished == pytest.approx(tool.started + 2.5)
    assert tool.upstream == "ask" and tool.requests is None
    assert rec.submitted == 10.0 and rec.finished == pytest.approx(tool.finished)


def test_profile_runs_are_seeded_per_index() -> None:
    calls = []
    recs = profile_app("factool_kbqa", 4, 9, COST, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
    again = run_isolated(
        get_app("factool_kbqa"), np.random.default_rng([9, 2]), COST, run_id=recs[2].run_id
    )
    assert again == recs[2]
    assert len({r.run_id for r in recs}) == 4
    assert recs[0] != recs[1]

"""App models: determinism, valid records, and the dependencies built into each app."""

from __future__ import annotations

import numpy as np
import pytest

from hermes.core.backend import BackendSpec
from hermes.core.costmodel import get_cost_model
from hermes.core.records import RunRecord
from hermes.workloads.isolated import profile_app
from hermes.workloads.registry import APPS, get_app

COST = get_cost_model("llama2-7b-a100")


def _runs(name: str, n: int, seed: int = 11) -> list[RunRecord]:
    return profile_app(name, n, seed, COST)


def _steps(name: str, seed: int) -> list:
    return list(get_app(name).steps(np.random.default_rng(seed)))


@pytest.mark.parametrize("name", sorted(APPS))
def test_same_seed_same_run_other_seed_differs(name: str) -> None:
    assert _steps(name, 5) == _steps(name, 5)
    assert any(_steps(name, 5) != _steps(name, s) for s in (6, 7, 8))


@pytest.mark.parametrize("name", sorted(APPS))
def test_every_app_yields_valid_records(name: str) -> None:
    app = get_app(name)
    assert app.name == name and app.short and app.size_class in ("small", "medium", "large")
    for rec in _runs(name, 20):
        RunRecord.model_validate_json(rec.model_dump_json())  # round-trips the contract
        assert rec.app == name and rec.units
        prev_finish = rec.submitted
        for u in rec.units:
            spec = BackendSpec.parse(u.backend)
            assert u.started >= prev_finish - 1e-9 and u.finished >= u.started
            prev_finish = u.finished
            if spec.is_llm:
                assert u.backend == "llm:llama-2-7b"
                assert u.requests and u.duration_s is None
                assert all(r.input_tokens > 0 and r.output_tokens > 0 for r in u.requests)
            else:
                assert u.requests is None and u.duration_s is not None and u.duration_s > 0
        assert rec.finished == pytest.approx(rec.units[-1].finished)


@pytest.mark.parametrize("name", sorted(APPS))
def test_llm_calls_carry_the_unit_prefix(name: str) -> None:
    for step in _steps(name, 3):
        for r in step.requests:
            assert r.prefix == step.unit
            assert 0 < r.prefix_tokens <= r.input_tokens


def _units(rec: RunRecord, unit: str) -> list:
    return [u for u in rec.units if u.unit == unit]


def test_kbqa_one_verify_per_query_and_claims_drive_extract_output() -> None:
    recs = _runs("factool_kbqa", 200)
    par, ext_out = [], []
    for rec in recs:
        (q,) = _units(rec, "generate_queries")
        (v,) = _units(rec, "verifies")
        assert len(v.requests) == len(q.requests)
        assert [u.unit for u in rec.units] == [
            "extract_claims",
            "generate_queries",
            "search",
            "verifies",
        ]
        par.append(len(q.requests))
        ext_out.append(_units(rec, "extract_claims")[0].requests[0].output_tokens)
    assert len(set(par)) > 3
    assert np.corrcoef(par, ext_out)[0, 1] > 0.8


def test_math_claims_drive_query_parallelism() -> None:
    recs = _runs("factool_math", 200)
    par = [len(_units(r, "generate_queries")[0].requests) for r in recs]
    out = [_units(r, "extract_claims")[0].requests[0].output_tokens for r in recs]
    assert np.corrcoef(par, out)[0, 1] > 0.7


def test_docmerge_score_prompts_contain_the_scored_text() -> None:
    agg_out, score_in = [], []
    for rec in _runs("got_docmerge", 40):
        units = rec.units
        for i, u in enumerate(units):
            if u.unit == "aggregate":
                s1, s2 = units[i + 1], units[i + 2]
                assert s1.unit == s2.unit == "score2"
                for a, s in zip(u.requests, (s1, s2), strict=True):
                    assert len(s.requests) == 20
                    assert len({r.input_tokens for r in s.requests}) == 1
                    agg_out.append(a.output_tokens)
                    score_in.append(s.requests[0].input_tokens)
    # score input = template + aggregate output
    diff = np.array(score_in) - np.array(agg_out)
    assert np.ptp(diff) == 0 and diff[0] > 1000
    assert np.std(agg_out) > 100


def test_docmerge_section_length_drives_downstream_lengths() -> None:
    g1, agg, g2 = [], [], []
    for rec in _runs("got_docmerge", 60):
        first = rec.units[: [u.unit for u in rec.units].index("score3") + 1]
        g1.append(np.mean([r.output_tokens for r in _units_of(first, "generate1")]))
        agg.append(np.mean([r.output_tokens for r in _units_of(first, "aggregate")]))
        g2.append(_units_of(first, "generate2")[0].output_tokens)
    assert np.corrcoef(g1, agg)[0, 1] > 0.5
    assert np.corrcoef(g1, g2)[0, 1] > 0.4


def _units_of(units: list, name: str) -> list:
    return [r for u in units if u.unit == name for r in u.requests]


def test_mapreduce_collapse_follows_the_summaries() -> None:
    from hermes.workloads.apps.mapreduce import LangchainMapReduce

    token_max = LangchainMapReduce.TOKEN_MAX
    seen_direct = seen_collapse = 0
    for rec in _runs("langchain_mapreduce", 150):
        (m,) = _units(rec, "generate_summary")
        total = sum(r.output_tokens for r in m.requests)
        collapses = _units(rec, "collapse_summaries")
        (final,) = _units(rec, "generate_final_summary")
        if total <= token_max:
            assert not collapses
            seen_direct += 1
            remaining = total
        else:
            assert collapses
            seen_collapse += 1
            # every collapse prompt holds its group, groups cover the summaries
            first = collapses[0]
            assert sum(r.input_tokens for r in first.requests) - 60 * len(first.requests) == total
            assert all(r.input_tokens <= token_max + 60 for r in first.requests)
            remaining = sum(r.output_tokens for r in collapses[-1].requests)
        assert final.requests[0].input_tokens == remaining + 200
    assert seen_direct and seen_collapse


@pytest.mark.parametrize(("name", "cap"), [("react_fever", 3), ("react_alfw", 31)])
def test_react_loops_are_capped_and_prompts_grow(name: str, cap: int) -> None:
    counts = []
    for rec in _runs(name, 300):
        thoughts = _units(rec, "thought")
        counts.append(len(thoughts))
        prompts = [t.requests[0].input_tokens for t in thoughts]
        assert all(b >= a for a, b in zip(prompts, prompts[1:], strict=False))
        assert prompts[-1] > prompts[0]
        tool = rec.units[1].unit if len(rec.units) > 1 else None
        assert tool in ("search", "env_step")
    assert max(counts) <= cap
    assert len(set(counts)) > 1


def test_codegen_retries_only_after_failed_execution_and_code_drives_runtime() -> None:
    code_len, run_s = [], []
    retried = 0
    for rec in _runs("code_generation", 200):
        names = [u.unit for u in rec.units]
        assert names[0] == "generate_code" and names[-1] == "summarize"
        for i, n in enumerate(names):
            if n == "fix_code":
                assert names[i - 1] == "execute_code" and names[i + 1] == "execute_code"
                retried += 1
        last_exec = [u for u in rec.units if u.unit == "execute_code"][-1]
        code_unit = [u for u in rec.units if u.unit in ("generate_code", "fix_code")][-1]
        if "fix_code" not in names:
            code_len.append(code_unit.requests[0].output_tokens)
            run_s.append(last_exec.duration_s)
    assert retried > 10
    assert np.corrcoef(code_len, run_s)[0, 1] > 0.4


def test_plan_execute_calls_dnn_tools_per_planned_task() -> None:
    backends = set()
    for rec in _runs("plan_execute", 60):
        steps = [u for u in rec.units if u.unit == "execute_step"]
        tools = [u for u in rec.units if u.backend.startswith("dnn:")]
        assert len(steps) == len(tools) >= 1
        backends |= {t.backend for t in tools}
    assert backends == {"dnn:resnet50", "dnn:whisper", "dnn:stable-diffusion"}

"""The per-service demand forecast from runs in flight (hermes/core/multillm/forecast.py)."""

from __future__ import annotations

import pytest

from hermes.core.multillm.forecast import (
    AppTable,
    ObservedCall,
    RunInFlight,
    Unit,
    forecast_demand,
    learn_table,
)
from hermes.core.pdgraph import Consumption, PDGraph, UnitNode


def _two_step() -> AppTable:
    """A run calls service A (unit ``a``), then always service B (unit ``b``), then ends."""
    return AppTable(
        "pipe",
        {"a": Unit("A", tokens=100.0, step_s=2.0), "b": Unit("B", tokens=500.0, step_s=3.0)},
        entry={"a": 1.0},
        next={"a": {"b": 1.0}, "b": {"": 1.0}},
    )


def test_run_on_a_with_next_on_b_raises_b() -> None:
    tables = {"pipe": _two_step()}
    none = forecast_demand(tables, [], {}, horizon_s=10.0)
    assert none.calls.get("B", 0.0) == 0.0
    one = forecast_demand(tables, [RunInFlight("pipe", "a", elapsed_s=0.5)], {}, horizon_s=10.0)
    assert one.calls == {"B": pytest.approx(1.0)}  # A's call is already issued: not counted again
    assert one.tokens == {"B": pytest.approx(500.0)}
    # the next call comes after the rest of a's step (1.5 s): beyond a 1 s horizon, not counted
    late = forecast_demand(tables, [RunInFlight("pipe", "a", elapsed_s=0.5)], {}, horizon_s=1.0)
    assert late.calls.get("B", 0.0) == 0.0
    # a run on its last unit adds nothing
    assert forecast_demand(tables, [RunInFlight("pipe", "b")], {}, horizon_s=10.0).calls == {}


def test_forecast_is_the_sum_over_runs() -> None:
    loop = AppTable("loop", {"x": Unit("A", 10.0, 1.0), "y": Unit("B", 20.0, 1.0)},
                    entry={"x": 1.0}, next={"x": {"x": 0.5, "y": 0.5}, "y": {"": 1.0}})
    tables = {"pipe": _two_step(), "loop": loop}
    runs = [RunInFlight("pipe", "a"), RunInFlight("loop", "x"), RunInFlight("loop", "x", 0.7)]
    total = forecast_demand(tables, runs, {}, horizon_s=50.0)
    parts = [forecast_demand(tables, [r], {}, horizon_s=50.0) for r in runs]
    for svc in ("A", "B"):
        assert total.calls[svc] == pytest.approx(sum(p.calls.get(svc, 0.0) for p in parts))
        assert total.tokens[svc] == pytest.approx(sum(p.tokens.get(svc, 0.0) for p in parts))
    # the loop on x: expected further x calls 0.5 + 0.25 + ... = 1, then one y
    lone = forecast_demand(tables, [RunInFlight("loop", "x")], {}, horizon_s=1e6)
    assert lone.calls["A"] == pytest.approx(1.0, rel=1e-4)
    assert lone.calls["B"] == pytest.approx(1.0, rel=1e-4)
    assert loop.calls_per_run() == pytest.approx(3.0, rel=1e-4)


def test_no_runs_gives_rates_only() -> None:
    tables = {"pipe": _two_step()}
    fc = forecast_demand(tables, [], {"pipe": 0.5}, horizon_s=10.0)
    assert fc.calls["A"] == pytest.approx(5.0)  # 0.5 runs/s x 10 s, each issues its A call
    # B comes 2 s after A: new runs starting in the horizon's last 2 s miss it (2 of the 8
    # start points, 0.625 s and 1.875 s before the end)
    assert fc.calls["B"] == pytest.approx(5.0 * 6 / 8)
    assert fc.tokens["B"] == pytest.approx(500.0 * 5.0 * 6 / 8)
    assert fc.rates(10.0)["A"] == pytest.approx(0.5)
    assert forecast_demand(tables, [], {"pipe": 0.0}, horizon_s=10.0).calls == {}
    with pytest.raises(ValueError, match="horizon"):
        forecast_demand(tables, [], {}, horizon_s=0.0)


def test_table_validation_and_pdgraph_adapter() -> None:
    with pytest.raises(ValueError, match="sum"):
        AppTable("bad", {"a": Unit("A", 1.0, 1.0)}, entry={"a": 0.5})
    with pytest.raises(ValueError, match="unknown unit"):
        AppTable("bad", {"a": Unit("A", 1.0, 1.0)}, entry={"a": 1.0}, next={"a": {"zz": 1.0}})
    g = PDGraph(
        version=1, app="rag", entry={"read": 1.0},
        units={
            "read": UnitNode(backend="llm:llama-2-13b", next={"answer": 1.0},
                             consumption=Consumption(input_tokens=[1000, 3000], output_tokens=[20, 40])),
            "answer": UnitNode(backend="llm:llama-2-7b", next={"": 1.0},
                               consumption=Consumption(input_tokens=[100], output_tokens=[300],
                                                       parallelism=[2, 2])),
        },
    )
    t = AppTable.from_pdgraph(g, {"read": "c1-13b", "answer": "c0-7b"}, {"read": 1.0, "answer": 5.0})
    assert t.units["read"].tokens == pytest.approx(2030.0)
    assert t.units["answer"].tokens == pytest.approx(800.0)  # (100 + 300) x 2 requests
    fc = forecast_demand({"rag": t}, [RunInFlight("rag", "read")], {}, horizon_s=10.0)
    assert fc.calls == {"c0-7b": pytest.approx(1.0)}


def test_learn_table_from_observed_runs() -> None:
    def call(unit: str, at: float, tok: float = 10.0) -> ObservedCall:
        return ObservedCall(unit, unit.upper(), at, tok)

    runs = [
        ([call("a", 0.0), call("b", 2.0, 30.0)], True),  # a -> b -> end
        ([call("a", 5.0), call("a", 9.0)], True),  # a -> a -> end
        ([call("a", 10.0), call("b", 12.0, 50.0)], False),  # in flight on b: b's next unknown
    ]
    t = learn_table("app", runs, {"A": 1.0, "B": 7.0})
    assert t is not None
    assert t.entry == {"a": 1.0}
    # a -> b twice, a -> a once, and the second run ends on a
    assert t.next["a"] == {"b": 0.5, "a": 0.25, "": 0.25}
    assert t.next["b"] == {"": 1.0}  # only the finished run's b counts
    assert t.units["a"].step_s == pytest.approx((2.0 + 4.0 + 2.0) / 3)
    assert t.units["b"].step_s == 7.0  # no next call seen after b: the service's default
    assert t.units["b"].tokens == pytest.approx(40.0) and t.units["b"].service == "B"
    assert learn_table("app", [], {}) is None


def _agent_graph() -> PDGraph:
    """plan (LLM, LoRA) -> search (API tool) -> answer (LLM) -> end; gaps of 1 s."""
    return PDGraph(
        version=1, app="agent", entry={"plan": 1.0},
        units={
            "plan": UnitNode(backend="llm:llama-2-7b@planner", next={"search": 1.0},
                             consumption=Consumption(input_tokens=[400, 600], output_tokens=[50],
                                                     gap_s=[1.0])),
            "search": UnitNode(backend="api:web", next={"answer": 1.0},
                               consumption=Consumption(duration_s=[2.0, 4.0], gap_s=[1.0])),
            "answer": UnitNode(backend="llm:llama-2-13b", next={"": 1.0},
                               consumption=Consumption(input_tokens=[900], output_tokens=[300],
                                                       gap_s=[1.0])),
        },
    )


def test_pdgraph_table_fills_services_and_steps_from_the_graph() -> None:
    """A learned PDGraph's table: an LLM unit's service is its base model (the LoRA runs on
    it), a tool's is its backend; step = mean gap + the mean request's isolated service (LLM)
    or the mean duration (tool); the forecast says which (app, unit) its calls come from."""
    from hermes.core.costmodel import get_cost_model
    from hermes.core.multillm.forecast import pdgraph_table, unit_service

    assert unit_service("llm:llama-2-7b@planner") == "llama-2-7b"
    assert unit_service("docker:py") == "docker:py"
    cost = get_cost_model("llama2-7b-a100")
    t = pdgraph_table(_agent_graph(), cost)
    assert {u: x.service for u, x in t.units.items()} == {
        "plan": "llama-2-7b", "search": "api:web", "answer": "llama-2-13b"}
    assert t.units["plan"].step_s == pytest.approx(1.0 + cost.request_service_s(500, 50))
    assert t.units["search"].step_s == pytest.approx(1.0 + 3.0)
    assert t.units["plan"].tokens == pytest.approx(550.0)
    fc = forecast_demand({"agent": t}, [RunInFlight("agent", "plan")], {}, horizon_s=60.0)
    # from plan: search, then answer, both inside a minute; plan itself was issued already
    assert fc.unit_calls == {("agent", "search"): pytest.approx(1.0),
                             ("agent", "answer"): pytest.approx(1.0)}
    assert fc.calls["llama-2-13b"] == pytest.approx(1.0) and "llama-2-7b" not in fc.calls

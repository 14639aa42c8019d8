"""Engine-queue waits in the simulator (``RunResult.wait_s``) and ``hermes``'s wait guard
end to end: a run that the rank keeps behind a stream of short runs waits at most about the
bound with the guard, and until the stream dries up without it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np
import pytest

from hermes.core.costmodel import get_cost_model
from hermes.core.policies import make_policy
from hermes.sim.simulator import Arrival, Simulator
from hermes.workloads.base import AppModel, LLMCall, Step

from .conftest import RequestFCFS

# one sequence at a time: a request waits for every request served before it
COST = get_cost_model("llama2-7b-a100").with_overrides(max_num_seqs=1)


class Quick(AppModel):
    """One short LLM call."""

    name: ClassVar[str] = "quick"
    short: ClassVar[str] = "Q"
    size_class = "small"

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        yield Step("ask", "llm:m", (LLMCall(50, 30),))


class Hog(AppModel):
    """A long LLM call, then a short one: after the first, it has attained much service."""

    name: ClassVar[str] = "hog"
    short: ClassVar[str] = "H"
    size_class = "large"

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        yield Step("think", "llm:m", (LLMCall(100, 600),))
        yield Step("answer", "llm:m", (LLMCall(100, 20),), upstream="think")


APPS = {"quick": Quick(), "hog": Hog()}


def simulate(policy: object, arrivals: list[Arrival]) -> dict[str, float]:
    res = Simulator(policy, cost=COST, apps=APPS, record=False).run(arrivals)
    return {r.run_id: r.wait_s for r in res.runs}


def test_wait_is_the_time_queued_behind_other_requests() -> None:
    arrivals = [Arrival(0.0, "quick", 0, run_id="a"), Arrival(0.0, "quick", 1, run_id="b")]
    res = Simulator(RequestFCFS(), cost=COST, apps=APPS, record=False).run(arrivals)
    by_id = {r.run_id: r for r in res.runs}
    assert by_id["a"].wait_s == 0.0
    # b waits exactly while a is served: a's whole run
    assert by_id["b"].wait_s == pytest.approx(by_id["a"].act_s, rel=1e-6)
    assert by_id["b"].wait_s > 0.1


def stream() -> list[Arrival]:
    """The hog at 0, then a short run every 0.3 s for 60 s (more than the engine serves)."""
    quick = [Arrival(0.1 + 0.3 * i, "quick", i, run_id=f"q{i}") for i in range(200)]
    return [Arrival(0.0, "hog", 0, run_id="hog"), *quick]


def test_without_the_guard_the_hog_waits_for_the_whole_stream() -> None:
    # no estimator: hermes ranks by attained service (its fallback), so after its long first
    # call the hog's second request ranks behind every fresh short run
    waits = simulate(make_policy("hermes-noguard"), stream())
    assert waits["hog"] > 30.0


@pytest.mark.parametrize("bound", [10.0, 20.0])
def test_with_the_guard_the_hog_waits_about_the_bound(bound: float) -> None:
    pol = make_policy("hermes", max_wait_s=bound)
    waits = simulate(pol, stream())
    # the bound, plus the short request in service when it was promoted (the shorts queued
    # before it were served within the bound: none was promoted ahead of it)
    assert bound <= waits["hog"] < bound + 1.0
    # the longest wait of any run is cut by more than half (the hog's, without the guard)
    unguarded = simulate(make_policy("hermes-noguard"), stream())
    assert max(waits.values()) < 0.5 * max(unguarded.values())

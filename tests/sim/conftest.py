"""Hand-made apps and minimal policies for simulator tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from hermes.core.policies.base import SchedulingPolicy
from hermes.core.state import RequestView, RunState
from hermes.workloads.base import AppModel, LLMCall, Step


class ShortApp(AppModel):
    name: ClassVar[str] = "short"
    short: ClassVar[str] = "S"
    size_class = "small"

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        yield Step("ask", "llm:m", (LLMCall(int(rng.integers(50, 150)), int(rng.integers(10, 40))),))


class LongApp(AppModel):
    """An LLM fan-out, a docker tool call, then a loop of LLM calls."""

    name: ClassVar[str] = "long"
    short: ClassVar[str] = "L"
    size_class = "large"

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        par = int(rng.integers(2, 4))
        yield Step("plan", "llm:m", tuple(LLMCall(200, int(rng.integers(100, 300))) for _ in range(par)))
        yield Step("run", "docker:python:3.10-slim", duration_s=float(rng.uniform(0.5, 2.0)),
                   gap_s=0.05, upstream="plan")
        for _ in range(int(rng.integers(2, 5))):
            yield Step("write", "llm:m", (LLMCall(int(rng.integers(300, 900)), int(rng.integers(200, 500))),),
                       upstream="run")


APPS = {"short": ShortApp(), "long": LongApp()}


class RequestFCFS(SchedulingPolicy):
    name: ClassVar[str] = "test-fcfs"

    def rank(self, run: RunState, now: float) -> float:
        return 0.0

    def request_key(self, run: RunState, req: RequestView, now: float):
        return (req.arrival, req.seq)


class TruthSRPT(SchedulingPolicy):
    name: ClassVar[str] = "test-srpt-truth"
    uses_truth: ClassVar[bool] = True

    def rank(self, run: RunState, now: float) -> float:
        return float(run.true_remaining_s)

    def on_service(self, run: RunState, seconds: float, tokens: int, now: float) -> None:
        run.rank = self.rank(run, now)


class Recorder(RequestFCFS):
    """FCFS that records the hook calls a live gateway would make."""

    name: ClassVar[str] = "test-recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.final: dict[str, tuple[float, int]] = {}

    def on_arrival(self, run, now):
        self.calls.append(("arrival", run.run_id))
        super().on_arrival(run, now)

    def on_unit_start(self, run, unit, now):
        self.calls.append(("start", run.run_id))

    def on_unit_finish(self, run, obs, now):
        self.calls.append(("unit", run.run_id))
        super().on_unit_finish(run, obs, now)

    def on_finish(self, run, now):
        self.calls.append(("finish", run.run_id))
        self.final[run.run_id] = (run.attained_s, run.attained_tokens)

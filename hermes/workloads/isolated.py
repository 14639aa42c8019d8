"""Run an app model alone on the engine cost model: profiling runs and isolated ACT.

Each step runs after the previous one finished plus its client gap; an LLM unit takes the
cost model's isolated service time of its parallel requests (one batch), a tool unit its
``duration_s``. This is the "run alone on LLaMA-2-7B on an A100" of the paper's size classes,
and the source of the run records from which the shipped PDGraphs are learned.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hermes.core.costmodel import CostModel
from hermes.core.records import RequestRecord, RunRecord, UnitRecord
from hermes.workloads.base import AppModel, Step


def step_service_s(step: Step, cost: CostModel) -> float:
    """Isolated service time of one step: cost-model time (LLM) or tool duration."""
    if step.is_llm:
        if not step.requests:
            return 0.0
        inp = np.array([r.input_tokens for r in step.requests], dtype=np.float64)
        out = np.array([r.output_tokens for r in step.requests], dtype=np.float64)
        return float(cost.unit_service_s(inp, out))
    return float(step.duration_s or 0.0)


def run_isolated(
    app: AppModel,
    rng: np.random.Generator,
    cost: CostModel,
    *,
    run_id: str,
    submitted: float = 0.0,
) -> RunRecord:
    """Execute one run of ``app`` alone and return its run record."""
    t = submitted
    units: list[UnitRecord] = []
    for step in app.steps(rng):
        t += step.gap_s
        started = t
        t += step_service_s(step, cost)
        units.append(
            UnitRecord(
                unit=step.unit,
                backend=step.backend,
                started=started,
                finished=t,
                requests=[
                    RequestRecord(input_tokens=r.input_tokens, output_tokens=r.output_tokens)
                    for r in step.requests
                ]
                if step.is_llm
                else None,
                duration_s=None if step.is_llm else float(step.duration_s or 0.0),
                upstream=step.upstream,
            )
        )
    return RunRecord(app=app.name, run_id=run_id, submitted=submitted, finished=t, units=units)


def profile_app(
    name: str,
    runs: int,
    seed: int,
    cost: CostModel,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> list[RunRecord]:
    """``runs`` isolated runs of app ``name``; run ``i`` draws from ``default_rng([seed, i])``.

    ``progress(done, total)`` is called after each run when given.
    """
    from hermes.workloads.registry import get_app

    app = get_app(name)
    records = []
    for i in range(runs):
        records.append(
            run_isolated(app, np.random.default_rng([seed, i]), cost, run_id=f"{name}-{seed}-{i}")
        )
        if progress is not None:
            progress(i + 1, runs)
    return records

"""Small hand-built run records with known dependencies, shared by the core tests."""

from __future__ import annotations

import numpy as np

from hermes.core.records import RequestRecord, RunRecord, UnitRecord


def kbqa_like_records(n: int, seed: int = 0) -> list[RunRecord]:
    """extract (output grows with #claims) -> query (one request per claim) -> search (tool)
    -> verify (one request per claim: upstream is ``query``, not the tool before it)."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(n):
        claims = int(rng.integers(1, 10))
        t = 0.0
        units: list[UnitRecord] = []

        def add(unit: str, backend: str, dur: float, units: list[UnitRecord] = units, **kw: object) -> None:
            nonlocal t
            units.append(UnitRecord(unit=unit, backend=backend, started=t, finished=t + dur, **kw))
            t += dur

        add("extract", "llm:m", 1.0, requests=[RequestRecord(input_tokens=700, output_tokens=20 * claims + int(rng.integers(0, 10)))])
        add("query", "llm:m", 1.0, requests=[RequestRecord(input_tokens=360, output_tokens=17) for _ in range(claims)])
        add("search", "api:search", float(rng.uniform(1, 2)), duration_s=float(rng.uniform(1, 2)))
        add("verify", "llm:m", 1.0, upstream="query", requests=[
            RequestRecord(input_tokens=600, output_tokens=int(rng.integers(100, 200))) for _ in range(claims)
        ])
        out.append(RunRecord(app="toy_kbqa", run_id=f"r{r}", submitted=0.0, finished=t, units=units))
    return out


def loop_records(n: int, cap: int, p_continue: float, seed: int = 0) -> list[RunRecord]:
    """A ReAct-like loop: think -> act -> think ... at most ``cap`` thoughts."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(n):
        units = []
        t = 0.0
        k = 0
        while True:
            k += 1
            units.append(UnitRecord(unit="think", backend="llm:m", started=t, finished=t + 1,
                                    requests=[RequestRecord(input_tokens=500 + 100 * k, output_tokens=int(rng.integers(10, 40)))]))
            t += 1
            if k >= cap or rng.random() > p_continue:
                break
            units.append(UnitRecord(unit="act", backend="api:env", started=t, finished=t + 0.5, duration_s=0.5))
            t += 0.5
        out.append(RunRecord(app="toy_react", run_id=f"r{r}", submitted=0.0, finished=t, units=units))
    return out


def one_unit_records(app: str, outputs: list[int]) -> list[RunRecord]:
    """Runs of ``app`` with one LLM unit ``gen``: one request of 100 prompt tokens and
    ``outputs[i]`` output tokens in run ``i`` (a demand distribution chosen by hand)."""
    return [
        RunRecord(app=app, run_id=f"{app}{i}", submitted=0.0, finished=1.0, units=[
            UnitRecord(unit="gen", backend="llm:llama2-7b", started=0.0, finished=1.0,
                       requests=[RequestRecord(input_tokens=100, output_tokens=o)])
        ])
        for i, o in enumerate(outputs)
    ]

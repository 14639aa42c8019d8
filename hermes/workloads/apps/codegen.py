"""CG: code generation with execution in Docker and a fix-and-retry loop (not measured).

Modelled from the paper's Fig. 1: ``generate_code`` writes a program for a data/ML task;
``execute_code`` runs it in a ``python:3.10-slim`` container (tests or a small training /
processing job); on failure ``fix_code`` gets the code plus the error trace and writes a
corrected program, which is run again, up to ``MAX_FIXES`` times; ``summarize`` reports the
result.

Built-in dependencies: the code length drives the execution time (bigger programs do more
work) and the ``fix_code`` prompt; each fix attempt succeeds more often than the last; the
``summarize`` prompt holds the program's output.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from hermes.workloads.apps._sampling import LLAMA2_7B, call, gap, lognormal, tokens
from hermes.workloads.base import AppModel, SizeClass, Step

DOCKER_PYTHON = "docker:python:3.10-slim"


class CodeGeneration(AppModel):
    name: ClassVar[str] = "code_generation"
    short: ClassVar[str] = "CG"
    size_class: ClassVar[SizeClass] = "medium"
    description: ClassVar[str] = "LLM code generation, Docker execution, fix-and-retry"

    MAX_FIXES: ClassVar[int] = 4
    P_FAIL_FIRST: ClassVar[float] = 0.45
    P_FAIL_DECAY: ClassVar[float] = 0.6  # each retry fails with probability x 0.6

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        task = tokens(lognormal(rng, 260, 120), 40, 1200)
        code = tokens(lognormal(rng, 650, 280), 120, 2000)
        yield Step("generate_code", LLAMA2_7B, (call("generate_code", 520 + task, code, 520),))
        # seconds of work per token of code (dataset size / epochs of the task)
        work = lognormal(rng, 0.08, 0.04)
        p_fail = self.P_FAIL_FIRST
        fixes = 0
        while True:
            fails = rng.random() < p_fail
            run_s = 1.5 + work * code * (rng.uniform(0.05, 0.6) if fails else 1.0)
            yield Step(
                "execute_code",
                DOCKER_PYTHON,
                duration_s=run_s,
                upstream="fix_code" if fixes else "generate_code",
                meta={"failed": fails, "code_tokens": code},
            )
            if not fails or fixes >= self.MAX_FIXES:
                break
            trace = tokens(lognormal(rng, 220, 120), 30, 1200)
            code = tokens(code * lognormal(rng, 1.05, 0.15), 120, 2000)
            fixes += 1
            yield Step(
                "fix_code",
                LLAMA2_7B,
                (call("fix_code", 450 + task + code + trace, code, 450),),
                gap_s=gap(rng, 50, 30, 10),
                upstream="execute_code",
                meta={"attempt": fixes},
            )
            p_fail *= self.P_FAIL_DECAY
        result = tokens(lognormal(rng, 250, 150), 20, 1500)
        yield Step(
            "summarize",
            LLAMA2_7B,
            (
                call(
                    "summarize", 300 + task + result, tokens(lognormal(rng, 180, 70), 30, 600), 300
                ),
            ),
            gap_s=gap(rng, 50, 30, 10),
            upstream="execute_code",
        )

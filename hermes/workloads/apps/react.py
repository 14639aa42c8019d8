"""ReAct agents (Yao et al., 2023): ALFWorld (ALFWI) and FEVER fact verification (FEV).

Each iteration is one ``thought`` LLM request (thought + action) followed by a tool step: the
ALFWorld environment (``api:alfworld``) or the Wikipedia search API (``api:search``). Every
prompt holds the few-shot examples plus the trajectory so far, so it grows with the loop
index (the dependency online refinement should find); the number of iterations per run is
capped as in the real agents. Calibrated on ``app-profiles.json`` (figures in comments:
measured mean ± sd [min, max]).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from hermes.workloads.apps._sampling import LLAMA2_7B, call, lognormal, negbin_count, tokens
from hermes.workloads.base import AppModel, SizeClass, Step


class ReactAlfworld(AppModel):
    """ALFWI: think/act in a text household environment until the task is done (≤ 31 steps)."""

    name: ClassVar[str] = "react_alfw"
    short: ClassVar[str] = "ALFWI"
    size_class: ClassVar[SizeClass] = "small"
    description: ClassVar[str] = "ReAct agent on ALFWorld"

    MAX_STEPS: ClassVar[int] = 31
    # LLaMA-2's 4k context minus the completion budget: older steps are dropped beyond it
    # (measured prompts never exceed 2,755 tokens).
    CONTEXT_TOKENS: ClassVar[int] = 2760

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        # loops 15.3 ± 4.9 [6, 31]
        k = negbin_count(rng, 6, 15.3, 4.9, self.MAX_STEPS)
        # prompt 2131 ± 272 [1477, 2755]: few-shot examples + the trajectory so far.
        base = tokens(rng.normal(1810, 110), 1477, 2200)
        history = 0
        for i in range(k):
            # completion 15.7 ± 16.9 [4, 74], p50 8: mostly short actions ("go to desk 1"),
            # sometimes a "think:" step.
            if rng.random() < 0.2:
                out = tokens(lognormal(rng, 47, 13), 25, 74)
            else:
                out = tokens(lognormal(rng, 7.8, 2.5), 4, 18)
            prompt = min(base + history, self.CONTEXT_TOKENS)
            yield Step(
                "thought",
                LLAMA2_7B,
                (call("thought", prompt, out, base),),
                upstream="env_step" if i else None,
                meta={"iteration": i},
            )
            # environment step: gap before each thought 162 ± 32 ms [101, 234]
            obs = tokens(lognormal(rng, 27, 12), 5, 90)
            history += out + obs
            yield Step(
                "env_step",
                "api:alfworld",
                duration_s=min(max(lognormal(rng, 0.162, 0.032), 0.10), 0.24),
                upstream="thought",
                meta={"iteration": i},
            )


class ReactFever(AppModel):
    """FEV: claim verification with Wikipedia search; at most 3 thoughts."""

    name: ClassVar[str] = "react_fever"
    short: ClassVar[str] = "FEV"
    size_class: ClassVar[SizeClass] = "small"
    description: ClassVar[str] = "ReAct fact verification (FEVER) with a search API"

    MAX_THOUGHTS: ClassVar[int] = 3

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        # loops 2.1 ± 0.3 [2, 3]: search once, answer; sometimes search twice.
        k = 3 if rng.random() < 0.1 else 2
        k = min(k, self.MAX_THOUGHTS)
        # prompt 1166 ± 156 [1017, 1731]: few-shot examples + trajectory so far.
        base = tokens(rng.normal(1040, 12), 1010, 1090)
        history = 0
        for i in range(k):
            out = tokens(lognormal(rng, 26, 10), 13, 54)  # completion 26 ± 9.8 [13, 54]
            yield Step(
                "thought",
                LLAMA2_7B,
                (call("thought", base + history, out, base),),
                upstream="search" if i else None,
                meta={"iteration": i},
            )
            if i == k - 1:
                break  # the last thought answers (Finish[...])
            # search API before the next thought: 2.16 ± 1.0 s [1.15, 7.2]
            obs = tokens(lognormal(rng, 190, 90), 20, 420)  # the observation paragraph
            history += out + 8 + obs  # thought, action line, observation
            yield Step(
                "search",
                "api:search",
                duration_s=min(max(lognormal(rng, 2.16, 1.0), 1.15), 7.5),
                upstream="thought",
                meta={"iteration": i},
            )

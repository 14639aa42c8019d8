"""LLMR: multi-step LLM reasoning with self-consistency (not measured in app-profiles.json).

Modelled from the paper's Fig. 1 description of an LLM reasoning app: ``decompose`` splits
the question into sub-questions; ``solve`` answers them one after another (each prompt holds
the answers so far), sampling ``SAMPLES`` chains of thought in parallel for a majority vote;
``answer`` writes the final answer from the solved steps. Token figures are typical of
chain-of-thought prompting on GSM8K/StrategyQA-style tasks with few-shot prompts.

Built-in dependencies: the number of sub-questions drives ``decompose``'s completion length
and the number of ``solve`` iterations; ``solve`` prompts grow with the loop index; the
``answer`` prompt holds the voted answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from hermes.workloads.apps._sampling import LLAMA2_7B, call, gap, lognormal, negbin_count, tokens
from hermes.workloads.base import AppModel, SizeClass, Step


class LLMReasoning(AppModel):
    name: ClassVar[str] = "llm_reasoning"
    short: ClassVar[str] = "LLMR"
    size_class: ClassVar[SizeClass] = "small"
    description: ClassVar[str] = "Question decomposition + self-consistent chain-of-thought"

    SAMPLES: ClassVar[int] = 5
    MAX_SUBQUESTIONS: ClassVar[int] = 8

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        n_sub = negbin_count(rng, 1, 3.0, 1.5, self.MAX_SUBQUESTIONS)
        question = tokens(lognormal(rng, 120, 50), 20, 600)
        d_in = 650 + question
        d_out = tokens(20 + 28 * n_sub + rng.normal(0, 10), 30, 400)
        yield Step("decompose", LLAMA2_7B, (call("decompose", d_in, d_out, 650),))
        solved = 0
        for i in range(n_sub):
            s_in = 900 + question + solved
            reqs = tuple(
                call("solve", s_in, tokens(lognormal(rng, 220, 110), 30, 1024), 900)
                for _ in range(self.SAMPLES)
            )
            yield Step(
                "solve",
                LLAMA2_7B,
                reqs,
                gap_s=gap(rng, 40, 20, 10),
                upstream="decompose" if i == 0 else "solve",
                meta={"iteration": i},
            )
            # the voted step (answer sentence) joins the next prompt
            solved += tokens(lognormal(rng, 60, 25), 10, 300)
        a_in = 400 + question + solved
        yield Step(
            "answer",
            LLAMA2_7B,
            (call("answer", a_in, tokens(lognormal(rng, 90, 40), 10, 400), 400),),
            gap_s=gap(rng, 40, 20, 10),
            upstream="solve",
        )

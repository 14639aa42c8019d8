"""RES: a web research agent (search / browse loop, then a written answer; issue 18 item 5).

Each step is one ``plan`` LLM request (reason over the evidence so far, emit the next tool
call) followed by the call: a ``search`` (results snippets from a search API) or a
``browse`` (fetch one page, extract its text). After the last step, ``answer`` writes the
report over the accumulated evidence.

Published statistics it is calibrated on:

- Steps per session: over 90% of multi-turn agentic search sessions contain at most ten
  steps, and 89% of inter-step intervals are under one minute (Ning et al., "Agentic Search
  in the Wild: Intents and Trajectory Dynamics from 14M+ Real Search Requests",
  https://arxiv.org/html/2601.17617v1), with reasoning-intent sessions sustaining longer
  exploration than fact-seeking ones (same source).
- Long-horizon search agents accumulate long, noisy page content and hit their context
  window and tool budgets (Yen et al., "Lost in the Maze: Overcoming Context Limitations in
  Long-Horizon Agentic Search", https://arxiv.org/html/2510.18939v1): the context grows with
  every page read until it is truncated.

Assumed (no published figure found): steps are ``Lognormal(median 4, sigma 0.7)``, at least
1, capped at ``MAX_STEPS`` = 40: P(steps <= 10) ≈ 0.9 as above, and p99/p50 ≈ 5. A step
browses with probability 0.4 (else searches). Tool times: ``search`` ``Lognormal(mean 1.5 s,
sd 1.0 s)``; ``browse`` ``Lognormal(mean 6 s, sd 12 s)`` up to a 60 s fetch timeout (slow
sites, rendering), so ~90% of intervals stay under a minute. Observations: search results
``Lognormal(mean 600, sd 250)`` tokens; a page ``Lognormal(mean 1500, sd 1800)`` tokens,
clipped to 6,000. The context keeps the latest ``CONTEXT_TOKENS``. The answer:
``Lognormal(mean 500, sd 400)`` tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from hermes.workloads.apps._sampling import LLAMA2_7B, call, gap, lognormal, tokens
from hermes.workloads.base import AppModel, SizeClass, Step


class ResearchAgent(AppModel):
    """RES: plan, search or browse, read, repeat; then write the answer."""

    name: ClassVar[str] = "research_agent"
    short: ClassVar[str] = "RES"
    size_class: ClassVar[SizeClass] = "medium"
    description: ClassVar[str] = "web research agent: search / browse loop, written answer"

    MAX_STEPS: ClassVar[int] = 40
    STEPS_MEDIAN: ClassVar[float] = 4.0
    STEPS_SIGMA: ClassVar[float] = 0.7
    P_BROWSE: ClassVar[float] = 0.4
    CONTEXT_TOKENS: ClassVar[int] = 12_000
    SYSTEM_TOKENS: ClassVar[int] = 900
    FETCH_TIMEOUT_S: ClassVar[float] = 60.0

    def n_steps(self, rng: np.random.Generator) -> int:
        """The number of tool steps of one run (heavy-tailed, see the module notes)."""
        k = int(round(self.STEPS_MEDIAN * float(rng.lognormal(0.0, self.STEPS_SIGMA))))
        return min(max(k, 1), self.MAX_STEPS)

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        k = self.n_steps(rng)
        question = tokens(lognormal(rng, 120, 80), 15, 800)
        base = self.SYSTEM_TOKENS + question
        evidence = 0
        prev: str | None = None
        for i in range(k):
            out = tokens(lognormal(rng, 90, 60), 15, 600)
            yield Step(
                "plan",
                LLAMA2_7B,
                (call("plan", min(base + evidence, self.CONTEXT_TOKENS), out, self.SYSTEM_TOKENS),),
                gap_s=gap(rng, 30, 15, 5) if i else 0.0,
                upstream=prev,
                meta={"step": i, "steps": k},
            )
            if rng.random() < self.P_BROWSE:
                unit = "browse"
                dur = min(lognormal(rng, 6.0, 12.0), self.FETCH_TIMEOUT_S)
                obs = tokens(lognormal(rng, 1500, 1800), 50, 6000)
            else:
                unit = "search"
                dur = lognormal(rng, 1.5, 1.0)
                obs = tokens(lognormal(rng, 600, 250), 80, 2000)
            evidence += out + obs
            yield Step(unit, f"api:{unit}", duration_s=max(dur, 0.05), upstream="plan",
                       meta={"step": i, "observation_tokens": obs})
            prev = unit
        answer = tokens(lognormal(rng, 500, 400), 40, 2500)
        yield Step(
            "answer",
            LLAMA2_7B,
            (call("answer", min(base + evidence, self.CONTEXT_TOKENS), answer, self.SYSTEM_TOKENS),),
            gap_s=gap(rng, 30, 15, 5),
            upstream=prev,
        )

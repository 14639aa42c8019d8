"""SWE: a SWE-agent-style coding agent (not in the Hermes paper; issue 18 item 5).

One run resolves one repository issue in a sandbox container. Each turn is one ``act`` LLM
request (a thought plus one shell command, over the system prompt, the issue and the
trajectory so far) followed by the command's execution: a quick ``shell`` command (open,
search, edit, ls) or a slow ``run_tests`` (reproduction script or the test suite). The run
ends when the agent submits a patch or runs out of turns.

Published statistics it is calibrated on (scaled where said):

- Turns per task are heavy-tailed and failures are long: median trajectory length 29 to 78
  steps across four frontier models with SWE-agent on SWE-Bench Pro, the longest ~1.5x more
  steps per task ("SWE-Bench Pro trajectory analysis",
  https://nilenso.github.io/swe-bench-pro-cost-token-time-analysis/reference.html); failed
  trajectories "consistently longer and exhibit higher variance" than successful ones
  (Majgaonkar et al., "Understanding Code Agent Behaviour: An Empirical Study of Success and
  Failure Trajectories", https://arxiv.org/html/2511.00197v1).
- "Expensive failures" and the "token snowball": SWE-agent + GPT-4o-mini on SWE-bench
  Verified uses 1,860k input tokens per resolved issue on average and 8,841k per unresolved
  one; mean tool (CPU) time 59.9 s resolved, 146.8 s unresolved (Fan et al., "SWE-Effi:
  Re-Evaluating Software AI Agent System Effectiveness Under Resource Constraints",
  https://arxiv.org/html/2509.09853v2; figures as tabulated at
  https://alphaxiv.org/benchmarks/the-chinese-university-of-hong-kong-shenzhen/swe-effi).
- Agents alternate exploring (read/search) and executing (run/write), shifting from the
  first to the second late in a run (Nayak et al., "Agentic AI Workload Characteristics",
  https://arcxiv.org/abs/2605.26297).

Assumed (no published figure found): the engine serves a 7B model, so the trajectories are
shorter than frontier-model ones: turns are ``Lognormal(median 14, sigma 0.8)``, at least 3,
capped at ``MAX_TURNS`` = 75 (a step limit): p50 14, p99 75 (at the cap), p99/p50 ≈ 5,
close to the unresolved/resolved token ratio (4.8x) above. Per-turn completion
``Lognormal(mean 160, sd 120)`` tokens. Observations (file views, grep hits, test logs):
``Lognormal(mean 300, sd 500)`` tokens after a shell command, ``(700, 900)`` after tests,
clipped to 4,000. The history is kept up to ``CONTEXT_TOKENS`` (older observations elided,
as SWE-agent's history processors do). Tool times: ``shell`` ``Lognormal(mean 1.2 s, sd
1.5 s)``; ``run_tests`` ``Lognormal(mean 25 s, sd 45 s)`` up to a 300 s command timeout, so
that a run's tool time is 143 s on average (3,000 draws; median 91 s, p99 698 s) against
SWE-Effi's 138.1 s for SWE-agent with GPT-4o-mini. ``run_tests`` is chosen with probability
0.15 rising to 0.45 over the run (explore first, execute later). Per-run input tokens stay far
below SWE-Effi's millions: the context cap (a 7B model's window) is assumed, not measured.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from hermes.workloads.apps._sampling import LLAMA2_7B, call, gap, lognormal, tokens
from hermes.workloads.base import AppModel, SizeClass, Step

SANDBOX = "docker:swe-sandbox"


class CodingAgent(AppModel):
    """SWE: think, run a shell command or the tests in a sandbox, read the output, repeat."""

    name: ClassVar[str] = "swe_agent"
    short: ClassVar[str] = "SWE"
    size_class: ClassVar[SizeClass] = "large"
    description: ClassVar[str] = "SWE-agent-style coding agent: edit / run-tests loop in Docker"

    MAX_TURNS: ClassVar[int] = 75
    MIN_TURNS: ClassVar[int] = 3
    TURNS_MEDIAN: ClassVar[float] = 14.0
    TURNS_SIGMA: ClassVar[float] = 0.8
    CONTEXT_TOKENS: ClassVar[int] = 12_000
    SYSTEM_TOKENS: ClassVar[int] = 1_400  # system prompt + command documentation
    TEST_TIMEOUT_S: ClassVar[float] = 300.0

    def turns(self, rng: np.random.Generator) -> int:
        """The number of turns of one run (heavy-tailed, see the module notes)."""
        k = int(round(self.TURNS_MEDIAN * float(rng.lognormal(0.0, self.TURNS_SIGMA))))
        return min(max(k, self.MIN_TURNS), self.MAX_TURNS)

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        k = self.turns(rng)
        issue = tokens(lognormal(rng, 450, 350), 60, 3000)
        base = self.SYSTEM_TOKENS + issue
        history = 0
        prev: str | None = None
        for i in range(k):
            out = tokens(lognormal(rng, 160, 120), 15, 1200)
            prompt = min(base + history, self.CONTEXT_TOKENS)
            yield Step(
                "act",
                LLAMA2_7B,
                (call("act", prompt, out, self.SYSTEM_TOKENS),),
                gap_s=gap(rng, 40, 20, 10) if i else 0.0,
                upstream=prev,
                meta={"turn": i, "turns": k},
            )
            if i == k - 1:
                break  # the last action is ``submit``: no command to run
            p_tests = 0.15 + 0.30 * i / max(k - 1, 1)
            if rng.random() < p_tests:
                unit = "run_tests"
                dur = min(lognormal(rng, 25.0, 45.0), self.TEST_TIMEOUT_S)
                obs = tokens(lognormal(rng, 700, 900), 20, 4000)
            else:
                unit = "shell"
                dur = lognormal(rng, 1.2, 1.5)
                obs = tokens(lognormal(rng, 300, 500), 5, 4000)
            history += out + obs
            yield Step(unit, SANDBOX, duration_s=max(dur, 0.05), upstream="act",
                       meta={"turn": i, "observation_tokens": obs})
            prev = unit

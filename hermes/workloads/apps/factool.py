"""FacTool (Chern et al., 2023) fact-checking pipelines: code (CC), KB-QA (KBQAV), math (EV).

Calibrated on ``app-profiles.json`` (100 profiled runs each on LLaMA-2-7B). The figures in the
comments are the measured mean ± sd [min, max] the parameters were picked from; tests compare
the models against the file itself when it is present.

Built-in dependencies (what online refinement should discover):

- KBQAV, EV: a latent number of claims drives ``extract_claims``'s completion length and the
  parallelism of ``generate_queries`` (one query request per claim); KBQAV issues one
  ``verifies`` request per generated query, after one ``search`` API call for all queries.
- CC: a latent problem length drives both prompts and, mildly, the solutions' length.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from hermes.workloads.apps._sampling import (
    LLAMA2_7B,
    call,
    gap,
    lognormal,
    lognormal_from,
    negbin_count,
    tokens,
)
from hermes.workloads.base import AppModel, SizeClass, Step


class FactoolCode(AppModel):
    """CC: generate test queries for a code answer, then three candidate solutions."""

    name: ClassVar[str] = "factool_code"
    short: ClassVar[str] = "CC"
    size_class: ClassVar[SizeClass] = "small"
    description: ClassVar[str] = "FacTool code checking: test-case queries + 3 reference solutions"

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        # Latent problem statement length (tokens). Prompts: generate_queries 361 ± 47
        # [285, 493], generate_solutions 333 ± 51 [271, 452]: template + problem.
        z = float(rng.standard_normal())
        problem = lognormal_from(z, 95.0, 48.0)
        q_in = tokens(266 + problem + rng.normal(0, 6), 285, 500)
        # completion 72.5 ± 21.8 [2, 125]
        q_out = tokens(rng.normal(72.5, 21.8), 2, 125)
        yield Step("generate_queries", LLAMA2_7B, (call("generate_queries", q_in, q_out, 260),))
        # gap 73.5 ± 77.7 ms [28, 439]; three solutions, completion 196.6 ± 60.6 [2, 398],
        # longer problems get somewhat longer solutions.
        s_in = tokens(238 + problem + rng.normal(0, 6), 271, 460)
        reqs = []
        for _ in range(3):
            zs = 0.35 * z + 0.94 * float(rng.standard_normal())
            reqs.append(
                call("generate_solutions", s_in, tokens(lognormal_from(zs, 197, 60), 2, 398), 230)
            )
        yield Step(
            "generate_solutions",
            LLAMA2_7B,
            tuple(reqs),
            gap_s=gap(rng, 73.5, 77.7, 28),
            upstream="generate_queries",
        )


class FactoolKBQA(AppModel):
    """KBQAV: extract claims, one search query per claim, a search API call, one verify each."""

    name: ClassVar[str] = "factool_kbqa"
    short: ClassVar[str] = "KBQAV"
    size_class: ClassVar[SizeClass] = "small"
    description: ClassVar[str] = "FacTool knowledge-QA verification with a search API"

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        # claims = generate_queries parallelism 3.8 ± 2.5 [1, 13]; verifies 3.6 ± 1.9 [1, 13]
        # (one verify per query, so both are the claim count; mean between the two)
        n = negbin_count(rng, 1, 3.7, 2.4, 13)
        # extract_claims prompt 716 ± 33 [676, 891] (template + answer text, longer with more
        # claims); completion 77 ± 46 [17, 328] = ~17.5 tokens per claim listed.
        e_in = tokens(672 + 10 * n + rng.normal(0, 18), 676, 900)
        e_out = tokens(10 + 17.5 * n + rng.normal(0, 12), 17, 330)
        yield Step("extract_claims", LLAMA2_7B, (call("extract_claims", e_in, e_out, 640),))
        # generate_queries: prompt 360 ± 3.5 [352, 368] = template + the claim;
        # completion 17.4 ± 3.2 [10, 26]; gap 72.6 ± 66.4 ms [23, 336].
        q_outs = [tokens(rng.normal(17.4, 3.2), 10, 26) for _ in range(n)]
        q_reqs = tuple(
            call("generate_queries", tokens(342 + rng.normal(17.5, 3.0), 352, 368), o, 330)
            for o in q_outs
        )
        yield Step(
            "generate_queries",
            LLAMA2_7B,
            q_reqs,
            gap_s=gap(rng, 72.6, 66.4, 23),
            upstream="extract_claims",
        )
        # The search API runs all queries before verification: the measured gap before
        # `verifies`, 1.50 ± 0.55 s [0.92, 3.14], a little longer with more queries.
        search_s = (1.2 + 0.08 * n) * lognormal(rng, 1.0, 0.3)
        yield Step(
            "search", "api:search", duration_s=max(search_s, 0.9), upstream="generate_queries"
        )
        # verifies: one per query; prompt 592 ± 114 [446, 952] = template + evidence;
        # completion 154 ± 37 [88, 259], longer evidence -> slightly longer verdicts.
        v_reqs = []
        for _ in range(n):
            ze = float(rng.standard_normal())
            evidence = lognormal_from(ze, 165, 110)
            zo = 0.3 * ze + 0.95 * float(rng.standard_normal())
            v_reqs.append(
                call(
                    "verifies",
                    tokens(428 + evidence, 446, 960),
                    tokens(lognormal_from(zo, 154, 37), 88, 260),
                    400,
                )
            )
        yield Step("verifies", LLAMA2_7B, tuple(v_reqs), upstream="generate_queries")


class FactoolMath(AppModel):
    """EV: extract the equations (claims) of an answer, then one checking query per claim."""

    name: ClassVar[str] = "factool_math"
    short: ClassVar[str] = "EV"
    size_class: ClassVar[SizeClass] = "small"
    description: ClassVar[str] = "FacTool math: equation verification"

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        # claims = generate_queries parallelism 2.7 ± 1.4 [1, 9]
        n = negbin_count(rng, 1, 2.7, 1.4, 9)
        # extract_claims prompt 831 ± 79 [721, 1113]; completion 94 ± 52 [24, 315]
        # = ~31 tokens per extracted equation.
        e_in = tokens(lognormal(rng, 800, 70) + 12 * n, 721, 1113)
        e_out = tokens(10 + 31 * n + rng.normal(0, 30), 24, 315)
        yield Step("extract_claims", LLAMA2_7B, (call("extract_claims", e_in, e_out, 700),))
        # generate_queries: prompt 261 ± 7.5 [247, 286] = template + the equation;
        # completion 30.8 ± 5.6 [20, 43]; gap 82 ± 104 ms [24, 721].
        reqs = tuple(
            call(
                "generate_queries",
                tokens(235 + rng.normal(26, 7.5), 247, 290),
                tokens(rng.normal(30.8, 5.6), 20, 43),
                230,
            )
            for _ in range(n)
        )
        yield Step(
            "generate_queries",
            LLAMA2_7B,
            reqs,
            gap_s=gap(rng, 82.2, 103.5, 24),
            upstream="extract_claims",
        )

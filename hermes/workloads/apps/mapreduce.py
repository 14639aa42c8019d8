"""MRS: LangChain map-reduce summarisation (``MapReduceDocumentsChain`` with collapsing).

The document is split into chunks; ``generate_summary`` summarises every chunk in parallel;
while the summaries together exceed ``TOKEN_MAX``, ``collapse_summaries`` packs them greedily
into groups of at most ``TOKEN_MAX`` tokens and summarises each group (one request per group,
in parallel), possibly for several rounds; ``generate_final_summary`` reduces what is left.

Built-in dependencies (all mechanical, as in LangChain): document length → number of chunks =
map parallelism; total summary length → whether to collapse, the number of groups (collapse
parallelism) and the number of collapse rounds; each collapse prompt holds its group's
summaries; the final prompt holds the collapsed summaries; completion lengths grow with their
prompts. Calibrated on ``app-profiles.json`` (figures in comments: measured mean ± sd [min,
max]).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from hermes.workloads.apps._sampling import LLAMA2_7B, call, gap, lognormal, negbin_count, tokens
from hermes.workloads.base import AppModel, SizeClass, Step

MAP_TEMPLATE = 45
COLLAPSE_TEMPLATE = 60
FINAL_TEMPLATE = 200  # reduce instructions; final prompt 1583 measured


class LangchainMapReduce(AppModel):
    name: ClassVar[str] = "langchain_mapreduce"
    short: ClassVar[str] = "MRS"
    size_class: ClassVar[SizeClass] = "large"
    description: ClassVar[str] = "LangChain map-reduce summarisation of a long document"

    TOKEN_MAX: ClassVar[int] = 2000  # collapse prompt ≤ 2078 measured
    MAX_CHUNKS: ClassVar[int] = 48

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        # chunks = map parallelism 20.6 ± 8.8 [7, 44]; chunk prompt 470 ± 122 [59, 653]
        # (full chunks ~420-610 tokens, the last one is the remainder).
        n = negbin_count(rng, 7, 20.6, 8.8, self.MAX_CHUNKS)
        chunk = [tokens(rng.normal(440, 60), 300, 608) for _ in range(n - 1)]
        chunk.append(tokens(rng.uniform(15, 560), 15, 610))
        # map completion 190 ± 102 [40, 640], longer for denser/longer chunks
        summaries = [
            tokens(lognormal(rng, 190, 100) * (0.6 + 0.4 * c / 440), 40, 640) for c in chunk
        ]
        yield Step(
            "generate_summary",
            LLAMA2_7B,
            tuple(
                call("generate_summary", MAP_TEMPLATE + c, s, MAP_TEMPLATE)
                for c, s in zip(chunk, summaries, strict=True)
            ),
        )
        upstream = "generate_summary"
        # collapse rounds: loops 1.1 ± 0.4 [0, 2]; parallelism 2.6 ± 0.8 [2, 5];
        # prompt 1504 ± 560 [190, 2078]; completion 565 ± 207 [123, 1333] (~0.37 x prompt).
        while sum(summaries) > self.TOKEN_MAX:
            groups = _pack(summaries, self.TOKEN_MAX)
            reqs = []
            outs = []
            for g in groups:
                g_in = COLLAPSE_TEMPLATE + sum(g)
                out = tokens(g_in * lognormal(rng, 0.36, 0.08), 60, 1333)
                outs.append(out)
                reqs.append(call("collapse_summaries", g_in, out, COLLAPSE_TEMPLATE))
            yield Step(
                "collapse_summaries",
                LLAMA2_7B,
                tuple(reqs),
                gap_s=gap(rng, 133, 180, 30),
                upstream=upstream,
            )
            upstream = "collapse_summaries"
            if len(outs) == len(summaries):  # cannot shrink further: stop collapsing
                summaries = outs
                break
            summaries = outs
        # final: prompt 1583 ± 579 [645, 3447]; completion 690 ± 253 [276, 1471]
        f_in = FINAL_TEMPLATE + sum(summaries)
        f_out = tokens(lognormal(rng, 300, 90) + 0.25 * f_in, 276, 1471)
        yield Step(
            "generate_final_summary",
            LLAMA2_7B,
            (call("generate_final_summary", f_in, f_out, FINAL_TEMPLATE),),
            gap_s=gap(rng, 137, 97, 22),
            upstream=upstream,
        )


def _pack(lengths: list[int], token_max: int) -> list[list[int]]:
    """Greedy packing of consecutive summaries into groups of at most ``token_max`` tokens."""
    groups: list[list[int]] = [[]]
    total = 0
    for x in lengths:
        if groups[-1] and total + x > token_max:
            groups.append([])
            total = 0
        groups[-1].append(x)
        total += x
    return groups

"""PE: plan-and-execute with DNN tools (HuggingGPT-style; not measured).

Modelled from the paper's Fig. 1: ``plan`` turns the request into a list of tool tasks; for
each task ``execute_step`` (LLM) writes the tool arguments, then the tool runs on its DNN
backend (``classify_image`` on ``dnn:resnet50``, ``transcribe`` on ``dnn:whisper``,
``generate_image`` on ``dnn:stable-diffusion``); ``summarize`` answers from the results.

Tool durations are warm service times on one GPU: ResNet-50 over a batch of images, Whisper
(large) at ~10x real time over the audio, Stable Diffusion at ~2.5 s per 512x512 image (50
steps).

Built-in dependencies: the number of tasks drives ``plan``'s completion length and the number
of executor/tool iterations; executor prompts grow with the results so far; the summary
prompt holds all results; audio length drives transcription time and transcript tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from hermes.workloads.apps._sampling import LLAMA2_7B, call, gap, lognormal, negbin_count, tokens
from hermes.workloads.base import AppModel, SizeClass, Step

TOOLS: tuple[tuple[str, str, float], ...] = (
    # unit, backend, probability
    ("classify_image", "dnn:resnet50", 0.35),
    ("transcribe", "dnn:whisper", 0.35),
    ("generate_image", "dnn:stable-diffusion", 0.30),
)


class PlanExecute(AppModel):
    name: ClassVar[str] = "plan_execute"
    short: ClassVar[str] = "PE"
    size_class: ClassVar[SizeClass] = "medium"
    description: ClassVar[str] = "Planner LLM + DNN tool calls + LLM executor and summary"

    MAX_TASKS: ClassVar[int] = 8

    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        n = negbin_count(rng, 1, 3.0, 1.4, self.MAX_TASKS)
        request = tokens(lognormal(rng, 90, 40), 15, 500)
        plan_out = tokens(40 + 55 * n + rng.normal(0, 20), 60, 700)
        yield Step("plan", LLAMA2_7B, (call("plan", 1100 + request, plan_out, 1100),))
        results = 0
        probs = np.array([p for _, _, p in TOOLS])
        prev = "plan"
        for i in range(n):
            yield Step(
                "execute_step",
                LLAMA2_7B,
                (
                    call(
                        "execute_step",
                        700 + request + plan_out + results,
                        tokens(lognormal(rng, 110, 45), 20, 400),
                        700,
                    ),
                ),
                gap_s=gap(rng, 60, 30, 10),
                upstream=prev,
                meta={"iteration": i},
            )
            unit, backend, _ = TOOLS[int(rng.choice(len(TOOLS), p=probs))]
            if unit == "classify_image":
                images = 1 + int(rng.poisson(15))
                dur = 1.0 + 0.04 * images * lognormal(rng, 1.0, 0.2)
                results += 25 * min(images, 10)
            elif unit == "transcribe":
                audio_s = lognormal(rng, 600, 400)  # seconds of audio
                dur = 2.0 + audio_s / 10.0
                results += tokens(audio_s * 2.5, 50, 1500)  # transcript (truncated)
            else:
                images = 1 + int(rng.poisson(3))
                dur = 3.0 + 2.5 * images * lognormal(rng, 1.0, 0.1)
                results += 20 * images
            yield Step(
                unit, backend, duration_s=dur, upstream="execute_step", meta={"iteration": i}
            )
            prev = unit
        yield Step(
            "summarize",
            LLAMA2_7B,
            (
                call(
                    "summarize",
                    500 + request + plan_out + results,
                    tokens(lognormal(rng, 260, 110), 40, 900),
                    500,
                ),
            ),
            gap_s=gap(rng, 60, 30, 10),
            upstream=prev,
        )

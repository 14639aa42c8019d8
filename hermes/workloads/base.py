"""The app-model interface shared by every driver.

An app model is a stochastic model of a real LLM program. :meth:`AppModel.steps` yields one
:class:`Step` per unit invocation, in order; the demand of each step (tokens, parallelism,
tool durations) is drawn from the given ``numpy.random.Generator`` so that a seed fixes a run.
Drivers execute the steps: ``hermes.workloads.isolated`` (alone, on the cost model: profiling and
isolated run time), the discrete-event simulator, hosted apps in the live gateway and the HTTP
load driver. The truth (what the run will still do) stays inside the generator, hidden from
the scheduler.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

SizeClass = Literal["small", "medium", "large"]


@dataclass(frozen=True, slots=True)
class LLMCall:
    """One LLM request: prompt and completion lengths in tokens.

    ``prefix`` names the shared prompt prefix (system prompt/role) and ``prefix_tokens`` its
    length, so that KV-prefix caching and prewarming can be modelled.
    """

    input_tokens: int
    output_tokens: int
    prefix: str | None = None
    prefix_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Step:
    """One unit invocation.

    LLM units carry ``requests`` (issued in parallel; the unit finishes when all have);
    tool units (docker, dnn, api) carry ``duration_s``, the tool's service time when warm.
    ``gap_s`` is client-side time before the step starts (parsing, glue code).
    """

    unit: str
    backend: str
    requests: tuple[LLMCall, ...] = ()
    duration_s: float | None = None
    gap_s: float = 0.0
    upstream: str | None = None
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def is_llm(self) -> bool:
        return self.backend.startswith("llm:")


class AppModel(ABC):
    """A benchmark application. Subclasses set the class attributes and implement ``steps``."""

    name: ClassVar[str]  # the app name every command takes, e.g. "factool_kbqa"
    short: ClassVar[str]  # the paper's abbreviation, e.g. "KBQAV"
    size_class: ClassVar[SizeClass]
    description: ClassVar[str] = ""

    @abstractmethod
    def steps(self, rng: np.random.Generator) -> Iterator[Step]:
        """Yield the run's unit invocations in order."""

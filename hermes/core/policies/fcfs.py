"""First-come-first-served baselines.

- ``vllm``: request-level FCFS, vLLM's default scheduling (Kwon et al., SOSP'23): every queued
  request is served in order of its own arrival, blind to the application it belongs to.
- ``parrot``: application-level FCFS (Parrot, Lin et al., OSDI'24): requests are ordered by the
  submission time of their run, so an earlier application's later steps go before a newer
  application's first step.
"""

from __future__ import annotations

from typing import ClassVar

from hermes.core.policies.base import RequestKey, SchedulingPolicy, register
from hermes.core.state import RequestView, RunState


@register("vllm")
class RequestFCFSPolicy(SchedulingPolicy):
    """Request-level FCFS: key = (request arrival, submission order)."""

    name: ClassVar[str] = "vllm"

    def rank(self, run: RunState, now: float) -> float:
        return run.submitted

    def request_key(self, run: RunState, req: RequestView, now: float) -> RequestKey:
        return (req.arrival, req.seq)


@register("parrot")
class AppFCFSPolicy(SchedulingPolicy):
    """Application-level FCFS: rank = the run's submission time."""

    name: ClassVar[str] = "parrot"

    def rank(self, run: RunState, now: float) -> float:
        return run.submitted

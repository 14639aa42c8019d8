"""The KV gate: an engine takes a new request only when its whole prompt fits in free KV.

Why. A continuous-batching engine with chunked prefill (vLLM v1) admits a waiting request as
soon as its *first chunk* fits in the free KV blocks. A prompt longer than the room left (an
agent's 10,000-token history beside three others that are decoding) is then admitted, runs one
8,192-token chunk, finds no block for the rest at the next iteration, and is preempted by
recompute (it is the lowest-priority running request: the last admitted). Its blocks are
freed, it is the head of the waiting queue again, and the next iteration admits its first
chunk again: it thrashes, each cycle an iteration that prefills 8,192 tokens for nothing, until
a running request finishes. Measured with ``hermes bench sched --workload agents`` (50 agent
runs in 10 minutes, LLaMA-2-7B on one A100-40GB, 40,000 KV tokens): without the gate a run's
request was preempted up to 72 times in a row and 4.7 M prompt tokens were recomputed at one
seed; the figures with and without the gate are in the README.

The rule (:meth:`KvGate.admits`): the head of the queue goes to the engine when the KV its
whole remaining prompt needs (its cached prefix included, when that takes blocks too) fits in
what the engine has free, less ``reserve_tokens`` kept for the running requests' decode
growth; an idle engine takes any request (nothing would ever free room for it otherwise). The
head still blocks the requests behind it, so the order the policy chose is kept: the gate
changes *when* a request starts, never *which* starts first.

Two drivers apply it: the engine model (:class:`hermes.core.engine_model.EngineModel` with
``kv_gate``: the simulator and the built-in engine) at admission, and the HermesLet's window
in front of a real engine (:mod:`hermeslet.agent`), which holds a request in its own queue
until its prompt fits the engine's KV budget beside the requests it already released. A
decision of the core: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KvGate:
    """Admit a request only when its whole prompt fits in free KV (module doc)."""

    #: KV tokens kept free for the running requests' decode growth
    reserve_tokens: int = 0

    def __post_init__(self) -> None:
        if self.reserve_tokens < 0:
            raise ValueError(f"reserve_tokens must be >= 0, got {self.reserve_tokens}")

    def admits(self, prompt_tokens: int, free_tokens: int, *, busy: bool) -> bool:
        """Whether a request whose prompt needs ``prompt_tokens`` KV tokens may start now on
        an engine with ``free_tokens`` free; ``busy``: the engine has running requests (an
        idle engine takes anything)."""
        return not busy or prompt_tokens <= free_tokens - self.reserve_tokens

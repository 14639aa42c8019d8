"""The engine adapter interface: what a HermesLet needs from an LLM engine.

An adapter turns one OpenAI-style request into an async stream: zero or more
:class:`GenChunk` (output as it is produced) and exactly one final :class:`GenResult` (token
counts from the engine's own usage report, and for a request that was not streamed the
engine's whole JSON answer).

What the client sees is the engine's own output, not a text rebuilt from it: a streamed
:class:`GenChunk` carries the engine's chunk object (``chunk``: one server-sent event's JSON,
with every field of every choice: ``tool_calls`` deltas with their indexes, ``logprobs``,
``refusal``, ``reasoning_content``, provider extensions), and :class:`GenResult.response` the
whole non-streamed body. ``text`` is the first choice's text, kept for Hermes' own use
(learning prefixes, logs); the gateway only rewrites what it owns (ids, model, usage). Aborting is cancelling the consumer's task; an
adapter that holds engine-side state also implements :meth:`EngineAdapter.abort`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from hermeslet.kv_events import KVEventsSource

#: the W3C ``traceparent`` of the request being served (the gateway's span for it, from
#: ``Submit.traceparent``): set by the node in the request's task; an adapter that speaks HTTP
#: sends it on as the ``traceparent`` header, so that the engine's own spans join the run's trace
TRACEPARENT: ContextVar[str | None] = ContextVar("hermes_traceparent", default=None)

log = logging.getLogger("hermeslet.engines")

#: ``messages``: Anthropic's Messages API, for an engine that lists it in ``native_endpoints``
Endpoint = Literal["chat", "completions", "embeddings", "messages"]
#: what runs behind an adapter: the built-in engine, an OpenAI-compatible server, vLLM
EngineKind = Literal["sim", "openai", "vllm"]
#: what an engine's model does: ``generate`` (chat and text completions) or ``embed``
#: (``/v1/embeddings``), as vLLM's ``--task``/``--runner``; a request for the other is refused
Task = Literal["generate", "embed"]

__all__ = ["Endpoint", "EngineAdapter", "EngineError", "EngineKind", "EngineMetrics",
           "GenChunk", "GenResult", "KVEventsSource", "Task"]



@dataclass(slots=True)
class GenChunk:
    """Streamed output: ``n_tokens`` generated tokens, ``text`` the first choice's part of
    them, ``chunk`` the engine's chunk object as it would go to a client (``None`` only for an
    adapter that produces text alone: the gateway then builds the chunk from ``text``)."""

    text: str
    n_tokens: int
    chunk: dict[str, Any] | None = None


@dataclass(slots=True)
class GenResult:
    """End of a request: the engine's usage and the full text."""

    input_tokens: int
    output_tokens: int
    text: str
    finish_reason: str | None
    response: dict[str, Any] | None = None  # the engine's whole JSON answer (non-streamed)


@dataclass(slots=True)
class EngineMetrics:
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None  # 0..1
    #: the engine's KV capacity in tokens (vLLM: ``vllm:cache_config_info``'s
    #: ``num_gpu_blocks`` x ``block_size``), when the page says
    kv_capacity_tokens: int | None = None
    extra: dict[str, float] = field(default_factory=dict)


class EngineError(Exception):
    """The engine refused or failed a request. ``retryable``: another engine may succeed."""

    def __init__(self, message: str, *, retryable: bool = False, status: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class EngineAdapter(ABC):
    """One engine serving ``model`` (and LoRA adapters ``loras``) on this node."""

    kind: ClassVar[EngineKind]
    #: the adapter learns the engine's KV capacity once the engine runs (``/metrics``): a KV
    #: gate without a budget waits for it instead of being refused
    reports_kv_capacity: ClassVar[bool] = False

    def __init__(self, *, name: str, model: str | None, max_inflight: int = 8,
                 use_priority: bool = False, task: Task = "generate") -> None:
        if max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        if task not in ("generate", "embed"):
            raise ValueError(f"task must be 'generate' or 'embed', not {task!r}")
        self.task: Task = task
        self.name = name
        self.model = model or ""
        self.max_inflight = max_inflight
        #: pass vLLM's ``priority`` field (the engine runs ``--scheduling-policy priority``)
        self.use_priority = use_priority
        self.loras: list[str] = []
        self.last_metrics = EngineMetrics()
        #: the engine publishes KV events there (None: it does not)
        self.kv_events: KVEventsSource | None = None
        #: the KV gate's budget (:mod:`hermes.core.kv_gate`): KV tokens the node's window may
        #: fill with the prompts it released to this engine; a request is held in the node's
        #: queue until its prompt fits beside them (None: no gate, the window counts requests)
        self.kv_gate_tokens: int | None = None
        #: a gate was asked for without a budget, and the capacity is not known yet
        self.kv_gate_pending = False
        #: the client APIs the engine serves itself beside its task's endpoints (e.g.
        #: ``messages``: Anthropic's ``/v1/messages``): a request carrying its client's body
        #: (:attr:`hermes.protocol.Submit.native`) goes to it as sent, untranslated
        self.native_endpoints: frozenset[str] = frozenset()

    async def start(self) -> None:
        """Get ready to serve (launch, connect, learn the model name). Default: nothing."""
        return None

    async def close(self) -> None:
        """Release resources (stop a supervised server). Default: nothing."""
        return None

    def kv_capacity_tokens(self) -> int | None:
        """The engine's KV capacity in tokens, when the adapter knows it (default: no)."""
        return None

    def set_kv_gate(self, tokens: int | None = None) -> None:
        """Turn the node's KV gate on with a budget of ``tokens`` (default: the engine's KV
        capacity; for an adapter that learns it once the engine runs, the gate starts then:
        ``kv_gate_pending``); ``ValueError`` when it cannot be known or is not positive."""
        budget = tokens if tokens is not None else self.kv_capacity_tokens()
        if budget is None and self.reports_kv_capacity:
            self.kv_gate_pending = True
            return
        if budget is None:
            raise ValueError(f"engine {self.name}: the KV gate needs a budget in tokens "
                             "(this engine does not report its KV capacity)")
        if budget < 1:
            raise ValueError(f"engine {self.name}: KV gate budget must be >= 1 token, "
                             f"got {budget}")
        self.kv_gate_tokens = int(budget)
        self.kv_gate_pending = False

    def _kv_capacity_learned(self) -> None:
        """Start a pending KV gate now that the engine reported its capacity."""
        cap = self.kv_capacity_tokens()
        if self.kv_gate_pending and cap:
            self.set_kv_gate(cap)
            log.info("engine %s: KV gate on, budget %d tokens (the engine's KV capacity)",
                     self.name, cap)

    def serves(self, model: str) -> bool:
        return model == self.model or model in self.loras

    @abstractmethod
    def generate(
        self,
        endpoint: Endpoint,
        body: dict[str, Any],
        stream: bool,
        *,
        request_id: str,
        priority: int | None = None,
    ) -> AsyncGenerator[GenChunk | GenResult, None]:
        """Run one request. ``body`` includes ``model``; the last item is a :class:`GenResult`."""

    async def abort(self, request_id: str) -> None:
        """Abort a request at the engine (default: nothing; cancelling the stream suffices)."""
        return None

    def reprioritize(self, request_id: str, priority: int) -> None:  # noqa: B027
        """A request already at the engine has a new ``priority`` (its run's rank, or its
        tenant's fair-share band, moved). Default: nothing, as vLLM, whose ``priority`` is
        fixed at submission; the built-in engine re-keys it, so that a request preempted
        for KV goes back to its waiting queue behind the ones that now rank ahead of it."""

    async def health(self) -> bool:
        return True

    async def metrics(self) -> EngineMetrics:
        """Current engine load; also cached in ``last_metrics`` for heartbeats."""
        return self.last_metrics

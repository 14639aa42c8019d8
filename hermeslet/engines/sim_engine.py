"""The built-in simulated engine: :mod:`hermes.core.engine_model` driven in wall-clock time.

The same continuous-batching model the simulator runs in virtual time runs here on a real
clock: a driver task calls ``EngineModel.step`` and sleeps for the iteration's modelled
latency divided by ``time_scale`` (a speed-up factor: ``time_scale=10`` runs ten times faster
than the modelled GPU). Tokens are delivered when their iteration ends.

What the simulated engine produces (documented contract, also for ``hermeslet sim-engine``):

- **Output length**: exactly ``max_tokens`` (``max_completion_tokens`` for chat; default
  :data:`DEFAULT_MAX_TOKENS`) tokens, always, with ``finish_reason="length"``: the engine has
  no EOS. ``min_tokens``/``ignore_eos``/``stop`` are accepted and ignored; ``n`` must be 1.
- **Output text**: placeholder words from a small fixed vocabulary, one word (with its
  leading space) per token, from a generator seeded by the request id and the engine seed, so
  a request id always yields the same text.
- **Input length**: ``len(prompt_token_ids)`` when the prompt is a token-id list, else
  ``ceil(chars / 4)`` of the prompt text (at least 1); chat adds 4 tokens per message for
  the template on top of ``ceil(chars / 4)`` of its text content.
- **Priority**: the optional integer ``priority`` orders the waiting queue (lower first, FIFO
  on ties), as vLLM's ``--scheduling-policy priority``.
- **Prefix cache**: for chat requests the first message (the system prompt: a unit's shared
  role) is the cacheable prefix; an LRU of :data:`PREFIX_CACHE_ENTRIES` prefixes feeds the
  engine model's prefix-cache hook and the ``vllm:prefix_cache_*`` counters. With
  ``kv_cache_gb`` it is instead the engine's one KV block pool, as in the simulator
  (:class:`~hermes.core.warm_models.BlockPoolPrefixCache`): that many GB of KV for running
  requests and cached prefixes together, cached prefixes evicted least recently used when
  running requests need the blocks, to a host-memory tier of ``cpu_cache_gb`` (0: dropped);
  a prefix found there is swapped back in, stalling the iteration that admits its request
  for its size at ``swap_gb_per_s``. ``prefix_cache_queries``/``hits`` count prompt-prefix
  tokens (GPU or host hits), ``prefix_cache_cpu_hits`` the requests served from host memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from hermes.core.costmodel import DEFAULT_SETUP, CostModel, get_cost_model
from hermes.core.engine_model import EngineModel, EngineRequest
from hermes.core.warm_models import BlockPoolPrefixCache, LRUPrefixCache, gb_to_tokens
from hermeslet.engines.base import EngineAdapter, EngineError, EngineMetrics, GenChunk, GenResult

DEFAULT_MAX_TOKENS = 16
_ABORTED = -1
VOCAB = (
    "the of and to in is that for it as with was on be by this are from at or an not have "
    "which but all were can has one their more will would there been if they so about than "
    "into time only some could new these two may first any like such then other its our "
    "model token engine run unit graph queue rank state plan tool code data result"
).split()


def text_tokens(text: str) -> int:
    """Token count heuristic for text: ``ceil(chars / 4)``, at least 1."""
    return max(1, math.ceil(len(text) / 4))


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def prompt_tokens(endpoint: str, body: dict[str, Any]) -> tuple[int, str | None, int]:
    """(input tokens, cacheable prefix or None, prefix tokens) of a request body."""
    if endpoint == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise EngineError("'messages' must be a non-empty list", status=400)
        texts = [_content_text(m.get("content")) if isinstance(m, dict) else "" for m in msgs]
        n = text_tokens("".join(texts)) + 4 * len(msgs)
        prefix = texts[0] if len(msgs) > 1 and texts[0] else None
        return n, prefix, (text_tokens(prefix) + 4 if prefix else 0)
    if "prompt_token_ids" in body and isinstance(body["prompt_token_ids"], list):
        return max(1, len(body["prompt_token_ids"])), None, 0
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return text_tokens(prompt), None, 0
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt), None, 0
    raise EngineError("'prompt' must be a string, one string in a list, or token ids",
                      status=400)


def output_tokens(endpoint: str, body: dict[str, Any]) -> int:
    key = "max_completion_tokens" if endpoint == "chat" and "max_completion_tokens" in body \
        else "max_tokens"
    v = body.get(key)
    if v is None:
        return DEFAULT_MAX_TOKENS
    if not isinstance(v, int) or v < 1:
        raise EngineError(f"'{key}' must be a positive integer", status=400)
    return v


@dataclass(slots=True)
class _Pending:
    queue: asyncio.Queue
    rng: random.Random


class SimEngine(EngineAdapter):
    """In-process adapter around one :class:`EngineModel` on a wall clock."""

    kind = "sim"

    def __init__(
        self,
        *,
        name: str = "sim",
        model: str = "sim-llama2-7b",
        max_inflight: int = 8,
        time_scale: float = 1.0,
        setup: str = DEFAULT_SETUP,
        cost: CostModel | None = None,
        seed: int = 0,
        use_priority: bool = True,
        step_wall_s: float = 0.02,
        max_catchup_s: float = 1.0,
        kv_cache_gb: float | None = None,
        cpu_cache_gb: float = 0.0,
        swap_gb_per_s: float = 16.0,
    ) -> None:
        super().__init__(name=name, model=model, max_inflight=max_inflight,
                         use_priority=use_priority)
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.time_scale = time_scale
        self.cost = cost or get_cost_model(setup)
        self.prefix_cache: LRUPrefixCache | _EngineKVPool
        if kv_cache_gb is None:
            self.prefix_cache = LRUPrefixCache()
            self.core = EngineModel(self.cost, name=name, prefix_cache=self.prefix_cache)
        else:
            if kv_cache_gb <= 0 or cpu_cache_gb < 0 or swap_gb_per_s <= 0:
                raise ValueError("kv_cache_gb and swap_gb_per_s must be > 0, cpu_cache_gb >= 0")
            per_token = self.cost.kv_bytes_per_token
            pool = _EngineKVPool(
                gb_to_tokens(kv_cache_gb, per_token),
                cpu_capacity_tokens=gb_to_tokens(cpu_cache_gb, per_token),
                kv_bytes_per_token=per_token, swap_bytes_per_s=swap_gb_per_s * 1e9,
            )
            self.prefix_cache = pool
            self.core = EngineModel(self.cost, name=name, prefix_cache=pool)
            pool.engine_tokens = lambda: self.core.kv_used
            self.core.admission_hook = pool  # the swap-in stalls the admitting iteration
        self.seed = seed
        self.step_wall_s = step_wall_s
        self.max_catchup_s = max(step_wall_s, max_catchup_s)
        self._pending: dict[str, _Pending] = {}
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task | None = None
        self._t0 = 0.0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_finished = 0
        self.requests_aborted = 0

    # ------------------------------------------------------------------ lifecycle
    def _loop_time(self) -> float:
        return asyncio.get_running_loop().time()

    def now(self) -> float:
        """Model time: wall seconds since start times ``time_scale``."""
        return (self._loop_time() - self._t0) * self.time_scale

    async def start(self) -> None:
        if self._driver is None:
            self._t0 = self._loop_time()
            self._wake = asyncio.Event()
            self._driver = asyncio.create_task(self._drive(), name=f"sim-engine-{self.name}")

    async def close(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
            self._driver = None

    def load_lora(self, name: str) -> None:
        if name in self.loras or name == self.model:
            raise EngineError(f"LoRA adapter {name!r} is already loaded", status=400)
        self.loras.append(name)

    def unload_lora(self, name: str) -> None:
        if name not in self.loras:
            raise EngineError(f"LoRA adapter {name!r} is not loaded", status=404)
        self.loras.remove(name)

    # ------------------------------------------------------------------ driver
    async def _drive(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        next_wall = loop.time()
        while True:
            if not self.core.has_work:
                self._wake.clear()
                await self._wake.wait()
                next_wall = loop.time()
                continue
            now = self.now()
            res = self.core.step(now, until=now + self.step_wall_s * self.time_scale)
            if res.idle:  # nothing admissible (cannot happen with work, but never spin)
                await asyncio.sleep(self.step_wall_s)
                continue
            # a loop blocked by other work (up to max_catchup_s) is caught up with back-to-back
            # steps, so that the engine's throughput in model time does not depend on it
            next_wall = max(next_wall, loop.time() - self.max_catchup_s) \
                + res.duration_s / self.time_scale
            delay = next_wall - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            for rid, k in res.emitted.items():
                self.generation_tokens_total += k
                p = self._pending.get(rid)
                if p is not None:
                    p.queue.put_nowait(k)
            for rid in res.finished:
                self.requests_finished += 1
                p = self._pending.get(rid)
                if p is not None:
                    p.queue.put_nowait(None)

    # ------------------------------------------------------------------ requests
    async def generate(
        self,
        endpoint: str,
        body: dict[str, Any],
        stream: bool,
        *,
        request_id: str,
        priority: int | None = None,
    ) -> AsyncIterator[GenChunk | GenResult]:
        if self._driver is None:
            await self.start()
        model = body.get("model") or self.model
        if not self.serves(model):
            raise EngineError(f"The model `{model}` does not exist.", status=404)
        if body.get("n", 1) != 1:
            raise EngineError("the simulated engine supports n=1 only", status=400)
        n_in, prefix, prefix_n = prompt_tokens(endpoint, body)
        n_out = output_tokens(endpoint, body)
        if request_id in self._pending:
            raise EngineError(f"duplicate request id {request_id!r}", status=400)
        prio = priority if (self.use_priority and priority is not None) else 0
        req = EngineRequest(
            request_id=request_id, run_id=request_id, input_tokens=n_in, output_tokens=n_out,
            key=(float(prio),), prefix=prefix, prefix_tokens=min(prefix_n, n_in),
        )
        try:
            self.core.add(req, self.now())
        except ValueError as e:
            raise EngineError(str(e), status=400) from None
        self.prompt_tokens_total += n_in
        rng = random.Random(zlib.crc32(request_id.encode()) ^ self.seed)
        pending = _Pending(asyncio.Queue(), rng)
        self._pending[request_id] = pending
        assert self._wake is not None
        self._wake.set()
        parts: list[str] = []
        produced = 0
        finished = False
        try:
            while True:
                k = await pending.queue.get()
                if k is None:
                    finished = True
                    break
                if k == _ABORTED:
                    raise EngineError(f"request {request_id!r} was aborted", status=499)
                text = "".join(" " + rng.choice(VOCAB) for _ in range(k))
                parts.append(text)
                produced += k
                if stream:
                    yield GenChunk(text=text, n_tokens=k)
            yield GenResult(input_tokens=n_in, output_tokens=produced, text="".join(parts),
                            finish_reason="length")
        finally:
            self._pending.pop(request_id, None)
            if not finished and self.core.abort(request_id) is not None:
                self.requests_aborted += 1

    async def abort(self, request_id: str) -> None:
        if self.core.abort(request_id) is not None:
            self.requests_aborted += 1
        p = self._pending.get(request_id)
        if p is not None:
            p.queue.put_nowait(_ABORTED)

    def stats(self) -> EngineMetrics:
        waiting = len(self.core.waiting)
        running = len(self.core.running)
        used = self.core.kv_used
        extra: dict[str, float] = {}
        if isinstance(self.prefix_cache, BlockPoolPrefixCache):
            used += self.prefix_cache.locked_tokens()  # shared prefix blocks in use
            extra["prefix_cache_cpu_hits"] = float(self.prefix_cache.stats.cpu_hits)
        kv = used / self.core.kv_capacity
        return EngineMetrics(
            running=running, waiting=waiting, kv_usage=kv,
            extra={
                **extra,
                "prefix_cache_queries": float(self.prefix_cache.queries),
                "prefix_cache_hits": float(self.prefix_cache.hits),
                "prompt_tokens": float(self.prompt_tokens_total),
                "generation_tokens": float(self.generation_tokens_total),
                "request_success": float(self.requests_finished),
            },
        )

    async def metrics(self) -> EngineMetrics:
        self.last_metrics = self.stats()
        return self.last_metrics


class _EngineKVPool(BlockPoolPrefixCache):
    """The KV block pool of a built-in engine with ``kv_cache_gb``: counts prompt-prefix
    tokens looked up and found (``queries``/``hits``, as vLLM's ``prefix_cache_*`` counters)
    and is the engine model's admission hook, so that a host-memory swap-in stalls the
    iteration that admits its request."""

    def __init__(self, capacity_tokens: int, **kw: Any) -> None:
        super().__init__(capacity_tokens, **kw)
        self.queries = 0
        self.hits = 0

    def cached_tokens(self, prefix: str, prefix_tokens: int, now: float) -> int:
        got = super().cached_tokens(prefix, prefix_tokens, now)
        self.queries += prefix_tokens
        self.hits += got
        return got

    def on_admit(self, req: EngineRequest, now: float) -> float:
        return self.take_stall_s()

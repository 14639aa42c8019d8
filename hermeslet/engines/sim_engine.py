"""The built-in simulated engine: :mod:`hermes.core.engine_model` driven in wall-clock time.

The same continuous-batching model the simulator runs in virtual time runs here on a real
clock: a driver task calls ``EngineModel.step`` and sleeps for the iteration's modelled
latency divided by ``time_scale`` (a speed-up factor: ``time_scale=10`` runs ten times faster
than the modelled GPU). Tokens are delivered when their iteration ends.

What the simulated engine produces (documented contract, also for ``hermeslet sim-engine``;
the planning is :mod:`hermeslet.engines.sim_output`, pure and tested on its own): it plays an
agent's model well enough for agent frameworks (OpenAI SDK, openai-agents, LangChain,
pydantic-ai, LiteLLM) to run multi-step tool loops against it, and the engine model decodes
exactly the tokens of the answer it planned, so timing stays the engine model's.

- **Output length**: a text answer has a natural length (log-normal around
  ``mean_answer_tokens``, default 24) and ends with ``finish_reason="stop"``; it is cut at
  ``max_tokens`` (``max_completion_tokens`` for chat; default :data:`DEFAULT_OUTPUT_CAP`,
  at most what the KV capacity leaves after the prompt) with ``"length"``, tool calls and
  JSON included. ``ignore_eos: true`` (vLLM's field) gives exactly ``max_tokens`` tokens of
  text with ``"length"``: what load generators and benchmarks send when they need exact
  lengths. ``min_tokens`` lengthens a natural answer; ``stop`` (a string or a list) ends the
  text before its first occurrence, with ``"stop"``.
- **Output text**: placeholder words from a small fixed vocabulary (:data:`VOCAB`), one word
  (with its leading space) per token. ``response_format`` ``json_object`` gives a JSON object,
  ``json_schema`` a valid instance of the schema (also vLLM's ``guided_json``), streamed in
  pieces of about 4 characters, one token each.
- **Tool calls** (chat with ``tools``, or the legacy ``functions``): ``tool_choice`` ``none``,
  ``auto`` (default), ``required`` or a named function. With ``auto`` the model calls tools on
  the turn after a user message, and after tool results calls again with probability
  ``tool_call_p`` (default 0.5) while fewer than ``max_tool_rounds`` (default 4) tool-call
  rounds happened since the last user message, else answers in text. ``parallel_tool_calls``
  (default true) lets a turn call up to ``max_parallel`` (default 2) distinct tools. Arguments
  are a JSON string valid against the tool's ``parameters`` schema (``$ref``/``$defs``,
  ``anyOf``/``oneOf``/``allOf``, enums, formats, numeric and length bounds; ``pattern`` is
  best effort); ids are ``call_`` + 24 alphanumerics; a call's name is one token and its
  arguments one token per ~4 characters. The knobs are :class:`AgentBehaviour` (per engine:
  ``SimEngine(behaviour=...)``, ``hermeslet sim-engine --tool-call-p ...``) and can be
  overridden per request with ``"sim_agent": {"tool_call_p": ..., ...}`` in the body (a bad
  value is an error 400 naming the field).
- **Seed**: with ``seed``, the same seed and body give the same answer (the generator is
  seeded by the seed and a hash of the body, stream fields left out); without it, by the
  request id and the engine seed, so a request id always yields the same answer.
- **Logprobs**: chat ``logprobs``/``top_logprobs`` (k <= 20) and completions ``logprobs: k``
  give plausible negative values per content token, in the answer and in each stream chunk.
- **n > 1**: ``n`` independent choices, run in the engine model as ``n`` sequences (choice
  ``i > 0`` as request ``ID#i``, with the same prompt and prefix), decoded side by side as
  vLLM runs parallel sampling: the request lasts as long as its longest choice, the batch and
  the KV cache hold ``n`` sequences, and ``completion_tokens`` is the sum over the choices
  (each sequence prefills the prompt; ``prompt_tokens`` is reported once).
- **Streaming**: the adapter yields OpenAI chunk objects (:attr:`GenChunk.chunk`): for chat a
  first chunk per choice with ``delta: {"role": "assistant", "content": ""}``, then per choice
  and engine iteration that iteration's tokens (content, ``tool_calls`` deltas by call index,
  logprobs) in chunks as OpenAI's service sends them: one tool call a chunk, its ``id`` and
  ``function.name`` first (``arguments: ""``), then its argument pieces
  (:func:`~hermeslet.engines.sim_output.stream_spans`), then a chunk with the choice's
  ``finish_reason`` (the first and
  last have ``n_tokens=0``). The final :class:`GenResult` always carries the whole answer
  (``response``: ``chat.completion`` or ``text_completion`` with usage).
- **Embeddings** (an engine with ``task="embed"``, ``hermeslet sim-engine --task embed``):
  ``input`` a string, strings, token ids or lists of them; a deterministic hashing-trick bag
  of words (texts sharing words get close vectors), L2-normalised, 256 dimensions or
  ``dimensions``, ``encoding_format`` ``float`` or ``base64``. Priced in the engine model as
  a prefill-only request (the inputs' tokens, no output token). An engine asked for the other
  task's endpoint answers an error 400 naming the model and its task.
- **Input length**: ``len(prompt_token_ids)`` when the prompt is a token-id list, else
  ``ceil(chars / 4)`` of the prompt text (at least 1); chat adds 4 tokens per message for
  the template on top of ``ceil(chars / 4)`` of its text content (with the tool calls of
  assistant messages and the ``tools`` JSON).
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
- **KV events** (``kv_events_endpoint``, ``hermeslet run --kv-events``): the prefix cache's
  changes are published after each iteration as vLLM publishes its KV-cache events (ZeroMQ
  PUB, msgpack ``BlockStored``/``BlockRemoved`` with ``medium`` GPU or CPU;
  :mod:`hermeslet.engines.sim_kv_events`), the blocks named by vLLM's hashes of the built-in
  tokenizer's ids (:func:`hermes.core.kv_blocks.builtin_chat_token_ids`: the same count as
  above), so that the gateway can look a prompt's blocks up before it sends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from hermes.core.costmodel import DEFAULT_SETUP, CostModel, get_cost_model
from hermes.core.engine_model import EngineModel, EngineRequest
from hermes.core.kv_blocks import BlockHashing
from hermes.core.warm_models import BlockPoolPrefixCache, LRUPrefixCache, gb_to_tokens
from hermeslet.engines.base import (
    EngineAdapter,
    EngineError,
    EngineMetrics,
    GenChunk,
    GenResult,
    KVEventsSource,
    Task,
)
from hermeslet.engines.sim_kv_events import PrefixEventTracker, held_prefixes
from hermeslet.engines.sim_output import (
    DEFAULT_EMBED_DIMS,
    DEFAULT_OUTPUT_CAP,
    VOCAB,
    AgentBehaviour,
    Envelope,
    OutputPlan,
    embedding_response,
    finish_chunk,
    max_tokens,
    plan_output,
    prompt_tokens,
    request_rng,
    response,
    role_chunk,
    stream_chunk,
    stream_spans,
    text_tokens,
)
from hermeslet.kv_events import KVEventPublisher

__all__ = ["DEFAULT_OUTPUT_CAP", "VOCAB", "AgentBehaviour", "SimEngine", "prompt_tokens",
           "text_tokens"]

_ABORTED = -1
#: what a sequence's queue gets: (choice index, tokens emitted or None: finished), or _ABORTED
_Progress = tuple[int, int | None] | int
#: child request ids of a request with ``n > 1`` (choice ``i`` > 0 runs as ``ID#i``)
CHILD_SEP = "#"


#: output tokens (n x max_tokens) past which a request's output is planned in a worker
#: thread, off the event loop
BIG_PLAN_TOKENS = 50_000


@dataclass(slots=True)
class _Pending:
    """A sequence in the engine model: its request's queue and its choice index. The driver
    puts ``(index, tokens emitted)``, ``(index, None)`` when it finished, or ``_ABORTED``."""

    queue: asyncio.Queue[_Progress]
    index: int = 0


class SimEngine(EngineAdapter):
    """In-process adapter around one :class:`EngineModel` on a wall clock."""

    kind = "sim"

    def __init__(
        self,
        *,
        name: str = "sim",
        model: str = "llama-2-7b",
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
        behaviour: AgentBehaviour | None = None,
        task: Task = "generate",
        embed_dims: int = DEFAULT_EMBED_DIMS,
        kv_events_endpoint: str | None = None,
        kv_events_replay_endpoint: str | None = None,
        kv_block_size: int = 16,
    ) -> None:
        super().__init__(name=name, model=model, max_inflight=max_inflight,
                         use_priority=use_priority, task=task)
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
        #: how the model behaves as an agent's model (per request: the body's ``sim_agent``)
        self.behaviour = behaviour or AgentBehaviour()
        self.embed_dims = embed_dims
        self.step_wall_s = step_wall_s
        self.max_catchup_s = max(step_wall_s, max_catchup_s)
        self._pending: dict[str, _Pending] = {}  # engine-model id -> its sequence
        self._children: dict[str, list[str]] = {}  # request id -> its engine-model ids
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task[None] | None = None
        self._t0 = 0.0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_finished = 0
        self.requests_aborted = 0
        #: vLLM KV events of the prefix cache (``kv_events_endpoint``: a ZeroMQ address to
        #: bind, ``tcp://127.0.0.1:0`` for a free port): :mod:`hermeslet.engines.sim_kv_events`
        self.kv_tracker: PrefixEventTracker | None = None
        self.kv_publisher: KVEventPublisher | None = None
        self._kv_endpoints = (kv_events_endpoint, kv_events_replay_endpoint)
        if kv_events_endpoint is not None:
            self.kv_tracker = PrefixEventTracker(BlockHashing(block_size=kv_block_size))

    # ------------------------------------------------------------------ lifecycle
    def _loop_time(self) -> float:
        return asyncio.get_running_loop().time()

    def now(self) -> float:
        """Model time: wall seconds since start times ``time_scale``."""
        return (self._loop_time() - self._t0) * self.time_scale

    async def start(self) -> None:
        endpoint, replay = self._kv_endpoints
        if endpoint is not None and self.kv_publisher is None:
            assert self.kv_tracker is not None
            pub = KVEventPublisher(endpoint, replay_endpoint=replay)
            self.kv_publisher = pub
            hashing = self.kv_tracker.hashing
            self.kv_events = KVEventsSource(
                endpoint=pub.endpoint, replay_endpoint=pub.replay_endpoint,
                block_size=hashing.block_size, hash_algo=hashing.hash_algo,
                seed=hashing.seed, tokenizer="builtin")
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
        if self.kv_publisher is not None:
            self.kv_publisher.close()
            self.kv_publisher = None

    def load_lora(self, name: str) -> None:
        if name in self.loras or name == self.model:
            raise EngineError(f"LoRA adapter {name!r} is already loaded", status=400)
        self.loras.append(name)

    def unload_lora(self, name: str) -> None:
        if name not in self.loras:
            raise EngineError(f"LoRA adapter {name!r} is not loaded", status=404)
        self.loras.remove(name)

    def publish_kv_events(self) -> int:
        """Publish what changed in the prefix cache since the last call (a no-op without
        ``kv_events_endpoint``): how many events were sent."""
        if self.kv_tracker is None or self.kv_publisher is None:
            return 0
        events = self.kv_tracker.diff(held_prefixes(self.prefix_cache))
        if events:
            self.kv_publisher.publish(events)
        return len(events)

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
            self.publish_kv_events()
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
                    p.queue.put_nowait((p.index, k))
            for rid in res.finished:
                p = self._pending.get(rid)
                if p is None or p.index == 0:  # a request, not each of its n sequences
                    self.requests_finished += 1
                if p is not None:
                    p.queue.put_nowait((p.index, None))

    # ------------------------------------------------------------------ requests
    async def generate(
        self,
        endpoint: str,
        body: dict[str, Any],
        stream: bool,
        *,
        request_id: str,
        priority: int | None = None,
    ) -> AsyncGenerator[GenChunk | GenResult, None]:
        if self._driver is None:
            await self.start()
        model = body.get("model") or self.model
        if not self.serves(model):
            raise EngineError(f"The model `{model}` does not exist.", status=404)
        self._check_task(endpoint, model)
        if request_id in self._children:
            raise EngineError(f"duplicate request id {request_id!r}", status=400)
        prio = priority if (self.use_priority and priority is not None) else 0
        if endpoint == "embeddings":
            # CPU work proportional to the request: in a worker thread, never on the loop
            # that also serves the node's other requests (and, embedded, the gateway)
            answer, n_in = await asyncio.to_thread(embedding_response, body, model,
                                                   default_dims=self.embed_dims)
            await self._run(request_id, [0], n_in, None, 0, prio)
            yield GenResult(input_tokens=n_in, output_tokens=0, text="", finish_reason=None,
                            response=answer)
            return
        n_in, prefix, prefix_n = prompt_tokens(endpoint, body)
        asked = max_tokens(endpoint, body)
        if asked is not None and n_in + asked > self.core.kv_capacity:
            raise EngineError(  # vLLM refuses prompt + max_tokens beyond the context too
                f"{self.name}: request {request_id!r} needs {n_in + asked} KV tokens, more "
                f"than the engine's capacity ({self.core.kv_capacity})", status=400)
        cap = max(1, min(DEFAULT_OUTPUT_CAP, self.core.kv_capacity - n_in))
        n = body.get("n")
        work = (n if isinstance(n, int) and n > 1 else 1) * (asked or cap)
        rng = request_rng(body, request_id, self.seed)
        # planning the output is CPU work proportional to n x max_tokens: a big one goes
        # to a worker thread (n = 128 x 8,000 tokens stalled the loop 3.4 s)
        big = work > BIG_PLAN_TOKENS
        plan = await asyncio.to_thread(plan_output, endpoint, body, rng, self.behaviour,
                                       default_cap=cap) if big else \
            plan_output(endpoint, body, rng, self.behaviour, default_cap=cap)
        prefix_n = min(prefix_n, n_in)
        if prefix is not None and self.kv_tracker is not None:
            first = body["messages"][0]
            self.kv_tracker.note(prefix, str(first.get("role", "")))
        env = Envelope(("chatcmpl-" if endpoint == "chat" else "cmpl-") + request_id, model,
                       int(time.time()))
        queue = await self._submit(request_id, [c.n_tokens for c in plan.choices], n_in,
                                   prefix, prefix_n, prio)
        pos = [0] * len(plan.choices)
        try:
            remaining = len(plan.choices)
            while remaining:
                item = await queue.get()
                if not isinstance(item, tuple):  # _ABORTED
                    raise EngineError(f"request {request_id!r} was aborted", status=499)
                i, k = item
                if k is None:
                    remaining -= 1
                    if stream:
                        yield GenChunk(text="", n_tokens=0, chunk=finish_chunk(plan, i, env))
                    continue
                start, pos[i] = pos[i], min(pos[i] + k, plan.choices[i].n_tokens)
                if stream and pos[i] > start:
                    if start == 0 and (first := role_chunk(plan, i, env)) is not None:
                        yield GenChunk(text="", n_tokens=0, chunk=first)
                    for a, b in stream_spans(plan, i, start, pos[i]):
                        yield self._chunk(plan, i, a, b, env)
            self._forget(request_id)
            c0 = plan.choices[0]
            answer = await asyncio.to_thread(response, plan, env, n_in) if big else \
                response(plan, env, n_in)
            yield GenResult(input_tokens=n_in, output_tokens=plan.output_tokens,
                            text=c0.content, finish_reason=c0.finish_reason,
                            response=answer)
        finally:
            self._release(request_id)

    def _check_task(self, endpoint: str, model: str) -> None:
        """An engine serves its task's endpoints only (vLLM's ``--task``)."""
        if (endpoint == "embeddings") == (self.task == "embed"):
            return
        what = "embeddings" if endpoint == "embeddings" else f"{endpoint} completions" \
            if endpoint == "chat" else "text completions"
        other = "embed" if self.task == "generate" else "generate"
        raise EngineError(
            f"The model `{model}` does not support {what}: engine {self.name!r} runs task "
            f"{self.task!r} (an engine with task {other!r} serves them)", status=400)

    @staticmethod
    def _chunk(plan: OutputPlan, i: int, start: int, end: int, env: Envelope) -> GenChunk:
        ch = plan.choices[i]
        text = "".join(t.text for t in ch.tokens[start:end] if t.kind == "text") \
            if i == 0 else ""
        return GenChunk(text=text, n_tokens=end - start,
                        chunk=stream_chunk(plan, i, start, end, env))

    async def _submit(self, request_id: str, outputs: list[int], n_in: int,
                      prefix: str | None, prefix_n: int, prio: int) -> asyncio.Queue[_Progress]:
        """Queue one engine-model sequence per entry of ``outputs`` (its output tokens):
        ``request_id`` for the first, ``request_id#i`` for the others. Returns the queue the
        driver reports their progress on."""
        queue: asyncio.Queue[_Progress] = asyncio.Queue()
        ids = [request_id] + [f"{request_id}{CHILD_SEP}{i}" for i in range(1, len(outputs))]
        self._children[request_id] = []
        now = self.now()
        for i, (rid, n_out) in enumerate(zip(ids, outputs, strict=True)):
            req = EngineRequest(
                request_id=rid, run_id=request_id, input_tokens=n_in, output_tokens=n_out,
                key=(float(prio),), prefix=prefix, prefix_tokens=prefix_n,
            )
            try:
                self.core.add(req, now)
            except ValueError as e:
                self._release(request_id)
                raise EngineError(str(e), status=400) from None
            self._children[request_id].append(rid)
            self._pending[rid] = _Pending(queue, i)
        self.prompt_tokens_total += n_in
        assert self._wake is not None
        self._wake.set()
        return queue

    async def _run(self, request_id: str, outputs: list[int], n_in: int, prefix: str | None,
                   prefix_n: int, prio: int) -> None:
        """Submit and wait until every sequence finished (no streaming: embeddings)."""
        queue = await self._submit(request_id, outputs, n_in, prefix, prefix_n, prio)
        try:
            remaining = len(outputs)
            while remaining:
                item = await queue.get()
                if not isinstance(item, tuple):  # _ABORTED
                    raise EngineError(f"request {request_id!r} was aborted", status=499)
                if item[1] is None:
                    remaining -= 1
            self._forget(request_id)
        finally:
            self._release(request_id)

    def _forget(self, request_id: str) -> None:
        """Every sequence of the request finished: nothing is left to abort."""
        for rid in self._children.get(request_id, ()):
            self._pending.pop(rid, None)
        self._children[request_id] = []

    def _release(self, request_id: str) -> None:
        """The request left (finished, failed or its consumer went away): abort what is
        still in the engine model and forget it."""
        aborted = False
        for rid in self._children.pop(request_id, ()):
            self._pending.pop(rid, None)
            aborted = self.core.abort(rid) is not None or aborted
        if aborted:
            self.requests_aborted += 1

    def reprioritize(self, request_id: str, priority: int) -> None:
        if not self.use_priority:
            return
        for rid in self._children.get(request_id) or [request_id]:
            self.core.update_key(rid, (float(priority),))

    async def abort(self, request_id: str) -> None:
        ids = self._children.get(request_id) or [request_id]
        queue = None
        aborted = False
        for rid in ids:
            aborted = self.core.abort(rid) is not None or aborted
            p = self._pending.get(rid)
            queue = p.queue if p is not None else queue
        if aborted:
            self.requests_aborted += 1
        if queue is not None:
            queue.put_nowait(_ABORTED)

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

    def kv_capacity_tokens(self) -> int | None:
        return int(self.core.kv_capacity)

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

"""Continuous-batching engine model (vLLM v1 style), I/O-free and clock-free.

One :class:`EngineModel` is one LLM engine (one model on its GPUs). The simulator drives it in
virtual time and the built-in engine server drives it in wall-clock time, through the same
calls: :meth:`EngineModel.add`, :meth:`~EngineModel.abort`, :meth:`~EngineModel.update_key`
and :meth:`~EngineModel.step`, each taking ``now`` from the caller.

Model of one iteration (what vLLM v1's scheduler does, reduced to token counts):

- A request has ``input_tokens`` (prompt) and will generate ``output_tokens`` (the engine's
  EOS: known to the engine model, never to the scheduler). ``computed`` tokens have KV in the
  cache; ``generated`` tokens were emitted. A request is *prefilling* while
  ``computed < input_tokens + generated`` and *decoding* otherwise.
- Running requests are scheduled first: a decoding request computes one token and emits one;
  a prefilling request gets a chunk of the remaining token budget (chunked prefill). Then
  waiting requests are admitted in policy order (lowest key first, strictly: the head blocks
  the rest) while ``max_num_seqs``, the token budget ``max_batched_tokens`` and the KV capacity
  (``kv_capacity_tokens``) allow. No admission in an iteration that preempted. With a
  ``kv_gate`` (:mod:`hermes.core.kv_gate`, Hermes' gate in front of the engine, not vLLM's
  rule) the head is admitted only when its whole prompt fits, not just its first chunk.
- KV usage is the sum of ``computed`` over running requests. When a running request needs a
  KV slot and none is free, the running request with the *largest* key (lowest priority) is
  preempted by recompute: it goes back to the waiting queue and loses its KV; it is prefilled
  again (prompt plus the tokens it had generated) when readmitted.
- Iteration latency is ``CostModel.iteration_s(prefill_tokens, decode_seqs, decode_ctx,
  prefill_seqs=..., prefill_pairs=...)`` where ``decode_ctx`` is the summed context (computed
  tokens) of the decoding requests, ``prefill_seqs`` the prefilling requests and
  ``prefill_pairs`` the sum over prefill chunks of ``n * (cached + n / 2)`` (the calibrated
  model's prefill attention). A lone request thus takes one prefill iteration and
  ``output_tokens`` decode iterations.

Scheduler modes (``CostModel.chunked_prefill``): the above is vLLM v1 (``vllm-v1``). Without
chunked prefill (``vllm-0.4``, vLLM 0.4.3's default scheduler) an iteration first admits
waiting requests, each prompt whole (the first of the iteration may exceed the budget and then
runs alone; vLLM 0.4 would reject a prompt longer than its budget), and an iteration that
admitted any runs no decodes (prefill-first: decodes stall); otherwise it decodes every
running request, preempting as above, and admits nothing.

Speed: :meth:`EngineModel.step` with ``until`` set advances several pure-decode iterations at
once when nothing can change in between (no prefill in flight, no admission possible, no KV
exhaustion, no request finishing before the last of them, and every iteration but the last
starting before ``until``). With the linear cost model the summed latency has a closed form,
so the accounting is exact: the result equals running the iterations one by one.

LoRA batch rule (vLLM's, active only when ``max_loras`` is set): a running batch holds at most
``max_loras`` distinct adapters. A waiting request whose adapter is not among the running
requests' adapters, when ``max_loras`` of them are already running, is skipped (it keeps its
place in the queue) and admission goes on with the requests behind it, as vLLM v1's scheduler
does (``skipped_waiting_requests``); at most :data:`LORA_SKIP_SCAN` requests are skipped per
iteration (a bound on simulation cost; vLLM scans the whole queue). The load of an adapter that
is not on the GPU is the admission hook's stall (vLLM activates adapters synchronously before
the forward pass). Without ``max_loras`` the engine behaves exactly as before.

Prefix caching (a later issue) plugs in through :class:`PrefixCache`: on admission, the
engine asks the cache how many leading prompt tokens of ``request.prefix`` are already
cached and starts prefill after them. The default is no cache.

One block pool (vLLM v1's ``KVCacheManager`` / ``BlockPool`` with prefix caching), when the
prefix cache is a :class:`SharedBlockPool`: the engine's KV capacity is the pool's, and cached
prefixes and running requests take their blocks from it. A running request holds its own
tokens (``computed - shared``, summed in ``kv_used``) and references the cached prefix it
shares (``shared`` tokens; several running requests share one copy). A prefix its own prefill
computed becomes a cached entry that the request references (no copy); as in vLLM, which
registers a prompt's full blocks in the prefix cache when it schedules them, requests admitted
after it (in the same iteration too) share them. Entries that no running
request references stay cached in the free blocks and are evicted least recently used when
running requests need blocks (vLLM evicts a cached block when its free block is reallocated).
A prefix *held* by a prewarm is referenced too (not evicted for admissions or other prefixes),
but its hold is dropped before a running request would be preempted for blocks, and when the
engine would otherwise stall with nothing running. Free blocks for an admission or a running
request's next tokens are ``capacity - kv_used - locked`` (locked: referenced or held
entries); the evictions they imply are carried out after each iteration (after a multi-
iteration decode run, at the next step, so that a truncated run evicts only what its kept
iterations needed).

Dispatch across several engines of one model: :func:`pick_engine` sends a request to the
engine with the least outstanding work, measured as (requests waiting or running, prompt
tokens still to prefill), the quantities a live HermesLet can observe without knowing output
lengths.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from hermes.core.costmodel import CostModel
from hermes.core.kv_gate import KvGate
from hermes.core.ordering import Key, KeyedQueue

#: at most this many waiting requests are skipped by the LoRA batch rule in one iteration
LORA_SKIP_SCAN = 512


class PrefixCache(Protocol):
    """Hook for a KV prefix cache (later issue). Default: none (nothing cached)."""

    def cached_tokens(self, prefix: str, prefix_tokens: int, now: float) -> int:
        """Leading prompt tokens of ``prefix`` whose KV is reusable now (0 if none)."""
        ...

    def on_prefilled(self, prefix: str, prefix_tokens: int, now: float) -> None:
        """The prefix's KV was computed (the cache may keep it)."""
        ...


class SharedBlockPool(PrefixCache, Protocol):
    """A prefix cache that is the engine's KV block pool (module docstring): the engine
    references entries for the running requests that share them and asks the pool to evict
    unreferenced entries when it needs their blocks."""

    shares_pool: bool
    capacity: int

    def lookup(self, prefix: str, prefix_tokens: int) -> tuple[str, int, bool]:
        """Without side effects: (``"gpu"`` / ``"cpu"`` / ``"none"``, cached tokens, whether
        the GPU entry is locked: referenced or held)."""
        ...

    def locked_tokens(self) -> int:
        """Tokens of GPU entries that cannot be evicted now (referenced or held)."""
        ...

    def acquire(self, prefix: str) -> None:
        """A running request shares the entry's blocks."""
        ...

    def unref(self, prefix: str) -> None:
        """A request that shared the entry's blocks finished, was preempted or aborted."""
        ...

    def adopt(self, prefix: str, prefix_tokens: int, now: float) -> bool:
        """A running request computed the prefix: its blocks become the cached entry (which
        the request then references). ``False`` when the entry is already on the GPU (the
        request keeps its own copy)."""
        ...

    def fit(self, limit_tokens: int) -> None:
        """Evict unlocked entries, least recently used first, until the GPU entries take at
        most ``limit_tokens``."""
        ...

    def release_holds(self, tokens: int) -> int:
        """Drop prewarm holds of unreferenced entries (oldest first) until ``tokens`` are
        unlocked; returns the tokens unlocked."""
        ...


class AdmissionHook(Protocol):
    """Hook for backend warm state at admission (prewarming): LoRA adapter loads and prefix
    swap-ins that the engine performs synchronously before the iteration runs."""

    def on_admit(self, req: EngineRequest, now: float) -> float:
        """``req`` is admitted in the iteration starting at ``now``: extra seconds the
        iteration is stalled for (0 when everything it needs is warm)."""
        ...


@dataclass(slots=True)
class EngineRequest:
    """One LLM request inside an engine."""

    request_id: str
    run_id: str
    input_tokens: int
    output_tokens: int  # tokens this request will generate (its EOS), hidden from schedulers
    key: Key = ()
    arrival: float = 0.0
    prefix: str | None = None
    prefix_tokens: int = 0
    lora: str | None = None  # LoRA adapter the request runs with (prewarming)
    shared: int = 0  # leading tokens that are a cached entry's blocks (shared block pool)
    adopted: bool = False  # its prefix was registered at admission, computed this iteration
    generated: int = 0
    computed: int = 0  # tokens with KV in the cache
    prompt_done: int = 0  # prompt tokens ever prefilled (service accounting; not reset)
    preemptions: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.output_tokens and self.computed >= self.total_tokens


@dataclass(slots=True)
class StepResult:
    """What one call to :meth:`EngineModel.step` did (one or several iterations)."""

    duration_s: float = 0.0
    iterations: int = 0
    emitted: dict[str, int] = field(default_factory=dict)  # request id -> tokens emitted
    prefilled: dict[str, int] = field(default_factory=dict)  # request id -> tokens prefilled
    finished: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    prefill_tokens: int = 0  # summed over iterations
    decode_seqs: int = 0  # batch size of the (last) decode iteration
    decode_tokens: int = 0  # decode tokens summed over iterations
    # multi-iteration decode runs only (for truncate): latency of iteration j is
    # iter_base_s + j * iter_growth_s; batch is the running list they advanced
    iter_base_s: float = 0.0
    iter_growth_s: float = 0.0
    batch: list[EngineRequest] | None = None

    @property
    def idle(self) -> bool:
        return self.iterations == 0


class EngineModel:
    """A continuous-batching engine: waiting queue by policy key, running batch, KV capacity."""

    def __init__(
        self,
        cost: CostModel,
        *,
        name: str = "engine0",
        prefix_cache: PrefixCache | None = None,
        admission_hook: AdmissionHook | None = None,
        max_loras: int | None = None,
        kv_gate: KvGate | None = None,
    ) -> None:
        if max_loras is not None and max_loras < 1:
            raise ValueError(f"{name}: max_loras must be >= 1 (or None), got {max_loras}")
        self.cost = cost
        self.max_loras = max_loras
        #: admit a waiting request only when its whole prompt fits (``None``: vLLM's rule,
        #: its first chunk)
        self.kv_gate = kv_gate
        self.name = name
        self._pool: SharedBlockPool | None = None
        self._peak = 0  # highest kv_used since the pool last evicted for it
        self.prefix_cache = prefix_cache
        self.admission_hook = admission_hook
        self.waiting: KeyedQueue[EngineRequest] = KeyedQueue()
        self.running: list[EngineRequest] = []
        self.requests: dict[str, EngineRequest] = {}
        self.kv_used = 0
        self.pending_prefill = 0  # prompt tokens of waiting requests not yet computed
        # adapters / prompt prefixes of the running requests (a warm cache must not evict
        # them) and of the waiting ones (request counts)
        self.running_loras: Counter[str] = Counter()
        self.running_prefixes: Counter[str] = Counter()
        self.waiting_loras: Counter[str] = Counter()
        self.waiting_prefixes: Counter[str] = Counter()

    @property
    def prefix_cache(self) -> PrefixCache | None:
        return self._prefix_cache

    @prefix_cache.setter
    def prefix_cache(self, cache: PrefixCache | None) -> None:
        self._prefix_cache = cache
        self._pool = cache if getattr(cache, "shares_pool", False) else None  # type: ignore[assignment]

    @property
    def kv_capacity(self) -> int:
        """KV tokens of the engine: the shared block pool's, else the cost model's."""
        return self._pool.capacity if self._pool is not None else self.cost.kv_capacity_tokens

    def _kv_free(self) -> int:
        """Blocks (tokens) a running or admitted request can take now."""
        free = self.kv_capacity - self.kv_used
        if self._pool is not None:
            free -= self._pool.locked_tokens()
        return free

    def _own(self, req: EngineRequest) -> int:
        """Tokens ``req`` holds by itself (not a shared cached prefix)."""
        return req.computed - req.shared

    def _unshare(self, req: EngineRequest) -> None:
        if req.shared:
            if self._pool is not None and req.prefix:
                self._pool.unref(req.prefix)
            req.shared = 0

    def _fit_pool(self) -> None:
        """Carry out the evictions that the running requests' blocks imply."""
        if self._pool is not None:
            self._pool.fit(self.kv_capacity - max(self._peak, self.kv_used))
        self._peak = self.kv_used

    # ------------------------------------------------------------------ queue management
    def add(self, req: EngineRequest, now: float) -> None:
        """Queue a request (its ``key`` orders it among the waiting)."""
        if req.request_id in self.requests:
            raise ValueError(f"{self.name}: duplicate request id {req.request_id!r}")
        if req.input_tokens + req.output_tokens > self.kv_capacity:
            raise ValueError(
                f"{self.name}: request {req.request_id!r} needs "
                f"{req.input_tokens + req.output_tokens} KV tokens, more than the engine's "
                f"capacity ({self.kv_capacity})"
            )
        req.arrival = now
        self.requests[req.request_id] = req
        self._push_waiting(req)

    def abort(self, request_id: str) -> EngineRequest | None:
        """Drop a request wherever it is; frees its KV."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if self.waiting.remove(request_id) is None:
            self.running.remove(req)
            self.kv_used -= self._own(req)
            self._unshare(req)
            self._left_running(req)
        else:
            self._left_waiting(req)
        return req

    # ------------------------------------------------------------------ adapter bookkeeping
    @staticmethod
    def _count(c: Counter[str], key: str, d: int) -> None:
        n = c[key] + d
        if n > 0:
            c[key] = n
        else:
            del c[key]

    def _push_waiting(self, req: EngineRequest) -> None:
        self.waiting.push(req.request_id, req, req.key, req.run_id)
        if req.lora:
            self.waiting_loras[req.lora] += 1
        if req.prefix:
            self.waiting_prefixes[req.prefix] += 1

    def _left_waiting(self, req: EngineRequest) -> None:
        if req.lora:
            self._count(self.waiting_loras, req.lora, -1)
        if req.prefix:
            self._count(self.waiting_prefixes, req.prefix, -1)

    def _entered_running(self, req: EngineRequest) -> None:
        self._left_waiting(req)
        if req.lora:
            self.running_loras[req.lora] += 1
        if req.prefix:
            self.running_prefixes[req.prefix] += 1

    def _left_running(self, req: EngineRequest) -> None:
        if req.lora:
            self._count(self.running_loras, req.lora, -1)
        if req.prefix:
            self._count(self.running_prefixes, req.prefix, -1)

    def lora_blocked(self, req: EngineRequest) -> bool:
        """Whether the LoRA batch rule keeps ``req`` waiting now: ``max_loras`` other adapters
        are already running."""
        return (
            self.max_loras is not None
            and bool(req.lora)
            and req.lora not in self.running_loras
            and len(self.running_loras) >= self.max_loras
        )

    def _lora_admissible_exists(self) -> bool:
        """Some waiting request is not held back by the LoRA batch rule (adapter-less, or of a
        running adapter, or the rule has room)."""
        if self.max_loras is None or len(self.running_loras) < self.max_loras:
            return True
        if sum(self.waiting_loras.values()) < len(self.waiting):
            return True  # an adapter-less request waits
        return any(a in self.running_loras for a in self.waiting_loras)

    def update_key(self, request_id: str, key: Key) -> None:
        """A new key for a request (its run's rank changed); reorders the waiting queue."""
        req = self.requests.get(request_id)
        if req is None:
            return
        req.key = key
        self.waiting.rekey(request_id, key)

    @property
    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def outstanding(self) -> tuple[int, int]:
        """(requests waiting or running, prompt tokens still to prefill): dispatch load."""
        todo = sum(r.total_tokens - r.computed for r in self.running)
        todo += sum(r.total_tokens - r.computed for r in self.waiting.items())
        return (len(self.running) + len(self.waiting), todo)

    # ------------------------------------------------------------------ iterations
    def step(self, now: float, until: float | None = None) -> StepResult:
        """Run one iteration, or several pure-decode ones while every one of them but the
        last starts before ``until`` (see the module doc). Returns what happened; an idle
        engine returns a result with ``iterations == 0``."""
        if self._pool is not None:
            self._fit_pool()
        if until is not None:
            k = self._decode_run_length(until - now)
            if k >= 2:
                return self._multi_decode(k)
        return self._one_iteration(now)

    def _admissible_head(self, n_decode: int, kv_free: int) -> bool:
        """Could the head of the waiting queue be admitted next to ``n_decode`` decodes?
        (Without chunked prefill: before them, whole, as the iteration's first prompt.)"""
        if not self.waiting or len(self.running) >= self.cost.max_num_seqs:
            return False
        budget = self.cost.max_batched_tokens - n_decode
        if budget <= 0:
            return False
        head = self.waiting.peek()
        assert head is not None
        if not self.cost.chunked_prefill:
            budget = max(budget, head.total_tokens)
        if self.max_loras is not None and self.lora_blocked(head):
            # the head is skipped; one behind it may be admitted: no multi-iteration run
            return self._lora_admissible_exists()
        need, n, hit = self._admit_need(head, budget)
        if self._gated(head, need, n, hit, kv_free):
            return False
        return need <= kv_free

    def _gated(self, head: EngineRequest, need: int, n: int, hit: int, kv_free: int) -> bool:
        """Whether the KV gate holds ``head`` back: admitting it takes ``need`` free tokens
        now (its first ``n`` tokens, ``hit`` of its prompt cached) and the rest of its prompt
        later (:mod:`hermes.core.kv_gate`)."""
        if self.kv_gate is None:
            return False
        whole = need + max(0, head.total_tokens - max(hit, head.computed) - n)
        return not self.kv_gate.admits(whole, kv_free, busy=bool(self.running))

    def _admit_need(self, head: EngineRequest, budget: int) -> tuple[int, int, int]:
        """Admitting ``head`` now: (free blocks it takes, tokens it computes this iteration,
        prompt tokens it finds cached). With the shared block pool a cached prefix on the GPU
        costs no new blocks when it is already locked (another running request shares it) and
        its own size otherwise (its free blocks become referenced); one in host memory is
        swapped into new blocks. Without the pool (or for a request that already has computed
        tokens) the cached part counts against the free blocks as before."""
        pool = self._pool
        if pool is None or head.computed or not head.prefix:
            n = min(head.total_tokens - head.computed, budget)
            return n + (head.computed if pool is None else 0), n, 0
        where, tokens, locked = pool.lookup(head.prefix, head.prefix_tokens)
        hit = max(0, min(tokens, head.input_tokens - 1)) if where != "none" else 0
        n = min(head.total_tokens - hit, budget)
        extra = 0 if (where == "none" or (where == "gpu" and locked)) else hit
        return n + extra, n, hit

    def _decode_run_length(self, horizon_s: float) -> int:
        """How many pure-decode iterations can run back to back right now (0 or 1: not
        applicable, take one ordinary iteration)."""
        running = self.running
        n = len(running)
        if n == 0:
            return 0
        ctx = 0
        k_out = math.inf
        for r in running:
            if r.computed != r.total_tokens:
                return 0
            ctx += r.computed
            rem = r.output_tokens - r.generated
            if rem < k_out:
                k_out = rem
        free = self._kv_free()
        # chunked: admitted next to the n decodes; prefill-first: before them, decodes stalled
        chunked = self.cost.chunked_prefill
        if self._admissible_head(n if chunked else 0, free - n if chunked else free):
            return 0
        k_kv = free // n
        k = int(min(k_out, k_kv))  # an int already: running is not empty, so k_out is one
        if k < 2:
            return 0
        c = self.cost
        a = c.iteration_s(0, n, ctx)
        b = c.decode_s_per_ctx_token * n
        # largest m with S(m) = m*a + b*m*(m-1)/2 < horizon: m iterations end before
        # `until`, so iteration m+1 still starts before it.
        m = self._max_prefix_below(a, b, horizon_s, k)
        return min(k, m + 1)

    @staticmethod
    def _max_prefix_below(a: float, b: float, horizon: float, cap: int) -> int:
        if horizon <= 0:
            return 0
        if math.isinf(horizon):
            return cap

        def s(m: int) -> float:
            return m * a + b * m * (m - 1) / 2

        if b > 0:
            qa, qb = b / 2, a - b / 2
            m = int((-qb + math.sqrt(qb * qb + 4 * qa * horizon)) / (2 * qa))
        else:
            m = int(horizon / a)
        m = max(0, min(m, cap))
        while m > 0 and s(m) >= horizon:
            m -= 1
        while m < cap and s(m + 1) < horizon:
            m += 1
        return m

    def _multi_decode(self, k: int) -> StepResult:
        c = self.cost
        n = len(self.running)
        ctx = sum(r.computed for r in self.running)
        a = c.iteration_s(0, n, ctx)
        b = c.decode_s_per_ctx_token * n
        res = StepResult(
            duration_s=k * a + b * k * (k - 1) / 2,
            iterations=k,
            decode_seqs=n,
            decode_tokens=n * k,
            iter_base_s=a,
            iter_growth_s=b,
            batch=list(self.running),
        )
        still = []
        self._peak = max(self._peak, self.kv_used + n * k)
        for r in self.running:
            r.computed += k
            r.generated += k
            res.emitted[r.request_id] = k
            if r.generated >= r.output_tokens:
                res.finished.append(r.request_id)
                self.kv_used -= self._own(r)
                if r.shared and self._pool is not None and r.prefix:
                    self._pool.unref(r.prefix)  # (``shared`` kept: truncate may restore it)
                del self.requests[r.request_id]
                self._left_running(r)
            else:
                still.append(r)
        self.kv_used += n * k
        self.running = still
        return res

    @staticmethod
    def iterations_started(res: StepResult, elapsed_s: float) -> int:
        """For a multi-iteration result: the iterations begun by ``elapsed_s`` after its start
        (an arrival then can join from the next one). 0 when ``elapsed_s <= 0``."""
        if res.batch is None or elapsed_s <= 0:
            return 0 if res.batch is not None else res.iterations
        a, b = res.iter_base_s, res.iter_growth_s
        m = EngineModel._max_prefix_below(a, b, elapsed_s, res.iterations)
        # m iterations end strictly before elapsed: iteration m+1 is in progress (or starts)
        done = m * a + b * m * (m - 1) / 2
        return min(res.iterations, m + 1 if done < elapsed_s else m)

    def truncate(self, res: StepResult, keep: int) -> None:
        """Cut the in-flight multi-iteration decode run ``res`` (the last result of
        :meth:`step`) to its first ``keep`` iterations, undoing the rest exactly."""
        if res.batch is None:
            raise ValueError("only a multi-iteration decode run can be truncated")
        k = res.iterations
        if keep >= k:
            return
        undo = k - keep
        gone = set(res.finished)
        for r in res.batch:
            r.computed -= undo
            r.generated -= undo
            self.requests[r.request_id] = r
            if r.request_id in gone and r.shared and self._pool is not None and r.prefix:
                self._pool.acquire(r.prefix)
        self.running = list(res.batch)
        self.kv_used = sum(self._own(r) for r in self.running)
        self._peak = self.kv_used  # the most the kept iterations held
        self.running_loras = Counter(r.lora for r in self.running if r.lora)
        self.running_prefixes = Counter(r.prefix for r in self.running if r.prefix)
        a, b = res.iter_base_s, res.iter_growth_s
        res.iterations = keep
        res.duration_s = keep * a + b * keep * (keep - 1) / 2
        res.decode_tokens = len(res.batch) * keep
        res.emitted = {r.request_id: keep for r in res.batch} if keep else {}
        res.finished = []

    def _preempt_victim(self) -> EngineRequest:
        return max(self.running, key=lambda r: (r.key, r.arrival))

    def _one_iteration(self, now: float) -> StepResult:
        c = self.cost
        res = StepResult()
        budget = c.max_batched_tokens
        kv_free = self._kv_free()
        sched: dict[str, int] = {}  # request id -> tokens computed this iteration
        stall = 0.0
        if not c.chunked_prefill and self.waiting:
            # vLLM 0.4: prefill-first; an iteration that admits prompts runs no decodes
            budget, kv_free, stall = self._admit_waiting(now, budget, kv_free, sched, whole=True)
        if not sched:
            budget, kv_free, preempted = self._schedule_running(res, budget, kv_free, sched)
            if not preempted and c.chunked_prefill:
                budget, kv_free, stall = self._admit_waiting(
                    now, budget, kv_free, sched, whole=False
                )
        return self._execute(now, res, sched, stall)

    def _schedule_running(
        self, res: StepResult, budget: int, kv_free: int, sched: dict[str, int]
    ) -> tuple[int, int, set[str]]:
        """Schedule the running requests (a decode token each, or a prefill chunk),
        preempting the lowest-priority ones by recompute when KV runs out. Returns the token
        budget and free KV left and the preempted request ids."""
        pool = self._pool
        preempted: set[str] = set()
        for r in list(self.running):
            if r.request_id in preempted:
                continue
            need = r.total_tokens - r.computed
            n = 1 if need == 0 else min(need, budget)
            if n <= 0:
                continue
            while n > kv_free:
                if pool is not None:
                    # a prewarm's hold gives way before a running request is preempted
                    got = pool.release_holds(n - kv_free)
                    if got:
                        kv_free += got
                        continue
                victim = self._preempt_victim()
                preempted.add(victim.request_id)
                if victim.request_id in sched:
                    got = sched.pop(victim.request_id)
                    budget += got
                    kv_free += got
                locked = pool.locked_tokens() if pool is not None else 0
                kv_free += self._own(victim)
                self._preempt(victim, res)
                if pool is not None:
                    kv_free += locked - pool.locked_tokens()  # its prefix may be unlocked now
                if victim is r:
                    break
            if r.request_id in preempted:
                continue
            sched[r.request_id] = n
            budget -= n
            kv_free -= n
        return budget, kv_free, preempted

    def _admit_waiting(
        self, now: float, budget: int, kv_free: int, sched: dict[str, int], *, whole: bool
    ) -> tuple[int, int, float]:
        """Admit waiting requests in policy order (the head blocks the rest) while the token
        budget, ``max_num_seqs`` and the KV allow. ``whole`` (no chunked prefill): a prompt is
        admitted only whole; the first one of the iteration may exceed the budget (it then
        runs alone). Returns the budget and free KV left and the admission hooks' stall."""
        c = self.cost
        pool = self._pool
        stall = 0.0
        skipped: list[tuple[EngineRequest, int]] = []  # held back by the LoRA batch rule
        while (
            self.waiting and budget > 0 and len(self.running) < c.max_num_seqs
        ):
            head = self.waiting.peek()
            assert head is not None
            if self.max_loras is not None and self.lora_blocked(head):
                if len(skipped) >= LORA_SKIP_SCAN:
                    break
                skipped.append(self.waiting.pop_tie())
                continue
            # whole: the iteration's first prompt may exceed the budget (it runs alone)
            eff = max(budget, head.total_tokens) if whole and not sched else budget
            if pool is not None:
                need, n, hit = self._admit_need(head, eff)
                if whole and n < head.total_tokens - hit:
                    break
                if need > kv_free and not self.running and not sched:
                    kv_free += pool.release_holds(need - kv_free)  # never stall on holds
                if need > kv_free or self._gated(head, need, n, hit, kv_free):
                    break
                if head.prefix and not head.computed:
                    got = pool.cached_tokens(head.prefix, head.prefix_tokens, now)
                    head.computed = max(0, min(got, head.input_tokens - 1))
                    assert head.computed == hit, (head.computed, hit)
                    head.prompt_done = max(head.prompt_done, head.computed)
                    if head.computed:
                        head.shared = head.computed
                        pool.acquire(head.prefix)
                    elif 0 < head.prefix_tokens <= n and pool.adopt(
                        head.prefix, head.prefix_tokens, now
                    ):
                        # vLLM registers a prompt's full blocks when it schedules them:
                        # requests admitted after it, in this iteration too, share them
                        head.adopted = True
                        pool.acquire(head.prefix)
                self.waiting.pop()
                self._entered_running(head)
                if self.admission_hook is not None:
                    stall += self.admission_hook.on_admit(head, now)
                self.running.append(head)
                kv_free -= need
                sched[head.request_id] = n
                budget -= n
                continue
            if head.computed == 0 and self.prefix_cache is not None and head.prefix:
                hit = self.prefix_cache.cached_tokens(head.prefix, head.prefix_tokens, now)
                head.computed = max(0, min(hit, head.input_tokens - 1))
                head.prompt_done = max(head.prompt_done, head.computed)
            n = min(head.total_tokens - head.computed, eff)
            if whole and n < head.total_tokens - head.computed:
                break
            if self._gated(head, n + head.computed, n, 0, kv_free):
                break
            if n > kv_free - head.computed:
                if head.computed and not self.running:
                    head.computed = 0  # cannot keep the cached prefix: compute it all
                    continue
                break
            self.waiting.pop()
            self._entered_running(head)
            if self.admission_hook is not None:
                stall += self.admission_hook.on_admit(head, now)
            self.running.append(head)
            self.kv_used += head.computed
            kv_free -= head.computed
            sched[head.request_id] = n
            budget -= n
            kv_free -= n
        for r, tie in skipped:
            self.waiting.restore(r.request_id, r, r.key, r.run_id, tie)
        return budget, kv_free, stall

    def _execute(
        self, now: float, res: StepResult, sched: dict[str, int], stall: float
    ) -> StepResult:
        """Run the scheduled iteration: price it, advance the requests, finish the done."""
        c = self.cost
        pool = self._pool
        if not sched:
            return res
        prefill = decode = ctx = seqs = 0
        pairs = 0.0
        by_id = self.requests
        for rid, n in sched.items():
            r = by_id[rid]
            if r.computed == r.total_tokens:
                decode += 1
                ctx += r.computed
            else:
                prefill += n
                seqs += 1
                pairs += n * (r.computed + 0.5 * n)
        res.duration_s = c.iteration_s(
            prefill, decode, ctx, prefill_seqs=seqs, prefill_pairs=pairs
        ) + stall
        res.iterations = 1
        res.prefill_tokens = prefill
        res.decode_seqs = decode
        res.decode_tokens = decode
        # insertion-ordered (a set's order would follow string hashes, which differ per
        # process: the simulator handles finished requests in this order)
        finished: dict[str, None] = {}
        for rid, n in sched.items():
            r = by_id[rid]
            if r.computed == r.total_tokens:  # decode: one token in, one token out
                r.computed += 1
                r.generated += 1
                res.emitted[rid] = 1
            else:
                r.computed += n
                res.prefilled[rid] = n
                if r.computed > r.prompt_done:
                    r.prompt_done = min(r.computed, r.input_tokens)
                if (
                    self.prefix_cache is not None
                    and r.prefix
                    and r.computed >= r.prefix_tokens > 0
                    and r.computed - n < r.prefix_tokens
                ):
                    if pool is None:
                        self.prefix_cache.on_prefilled(r.prefix, r.prefix_tokens, now)
                    elif not r.shared and (
                        r.adopted or pool.adopt(r.prefix, r.prefix_tokens, now)
                    ):
                        # its blocks become the cached entry, which it references
                        if not r.adopted:
                            pool.acquire(r.prefix)
                        r.adopted = False
                        r.shared = r.prefix_tokens
                        self.kv_used -= r.prefix_tokens
            self.kv_used += n
            if r.done:
                finished[rid] = None
        self._peak = max(self._peak, self.kv_used)
        if finished:
            self.running = [r for r in self.running if r.request_id not in finished]
            for rid in finished:
                r = by_id.pop(rid)
                self.kv_used -= self._own(r)
                self._unshare(r)
                self._left_running(r)
                res.finished.append(rid)
        if pool is not None:
            self._fit_pool()
        return res

    def _preempt(self, victim: EngineRequest, res: StepResult) -> None:
        self.running.remove(victim)
        self._left_running(victim)
        self.kv_used -= self._own(victim)
        self._unshare(victim)
        victim.computed = 0
        victim.preemptions += 1
        self._push_waiting(victim)
        res.preempted.append(victim.request_id)


def pick_engine(engines: Sequence[EngineModel]) -> EngineModel:
    """The engine with the least outstanding work (requests, then prompt tokens to prefill);
    ties go to the first engine."""
    if len(engines) == 1:
        return engines[0]
    return min(engines, key=lambda e: e.outstanding())

"""Warm-state models of LLM-engine backends: KV prefix cache and LoRA adapter slots.

Pure and clock-free (every call takes ``now``); the simulator drives them in virtual time and
the built-in engine can drive them in wall-clock time.

:class:`PrefixCacheModel` (implements the engine model's ``PrefixCache`` hook): the KV of
shared prompt prefixes (system prompts), with a GPU tier of ``capacity_tokens`` (from GB via
the model's KV bytes per token, :func:`gb_to_tokens`) and a host-memory (CPU) tier. Least
recently used prefixes are evicted from the GPU tier to the CPU tier, and dropped from there;
prefixes *pinned* by prewarms (held for a unit that is about to run) are evicted only when
everything else is gone. A prefix that a running request uses (``in_use``, wired to the
engine's counters) is never evicted and does not count against the capacity: in vLLM its
blocks belong to the running request, and the tier stands for the free blocks that keep
finished requests' prefixes. A planned prewarm's prefix also spares those of queued requests.
A request admitted with its prefix on the GPU skips that part of its prefill (a *hit*); with
its prefix on the CPU the engine first swaps it in, which stalls the iteration for
``tokens * kv_bytes_per_token / swap_bytes_per_s`` (vLLM swaps synchronously). A prefetch
(:meth:`PrefixCacheModel.prefetch`) swaps a CPU-resident prefix in asynchronously; a prefix
that is nowhere must be prefilled (the driver submits a prefill-only request, and
:meth:`on_prefilled` stores it).

:class:`BlockPoolPrefixCache` (what the simulator uses): the same prefixes, but in the engine's
one KV block pool (vLLM v1), shared with the running requests' own tokens; see its docstring
and :class:`~hermes.core.engine_model.SharedBlockPool`.

:class:`LoraSlots`: adapters resident on the GPU (``max_loras`` slots) and in host memory
(``max_cpu_loras``), vLLM style. An adapter that is not on the GPU when a request using it is
admitted is loaded synchronously (from host memory, or from disk), stalling the iteration; a
prefetch loads it in the background. Eviction is least recently used among the adapters no
running request uses; a prefetch also spares the adapters of queued requests (and a planned
prewarm those held for coming units), and loads into host memory only when no slot is free of
them. vLLM batches at most ``max_loras`` distinct adapters; the engine model enforces that rule
(``EngineModel(max_loras=...)``), so a slot that no running request uses always exists at
admission.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass

GB = 1024**3
#: prefix-name mark of a prewarm's own prefill-only request: cached like any other, but its
#: lookups are not counted in the hit statistics (they measure the workload's requests)
UNCOUNTED = "\x00prewarm:"


def gb_to_tokens(gb: float, kv_bytes_per_token: int) -> int:
    """KV tokens that fit in ``gb`` GiB."""
    if gb < 0:
        raise ValueError(f"cache size must be >= 0 GB, got {gb}")
    return int(gb * GB // kv_bytes_per_token)


@dataclass(slots=True)
class CacheStats:
    lookups: int = 0
    hits: int = 0  # resident and ready on the GPU
    warming_hits: int = 0  # prefetch (or load into host memory) under way: waited for its rest
    cpu_hits: int = 0  # ready in host memory: swapped (or loaded) in synchronously from there
    misses: int = 0
    evictions: int = 0
    prefetches: int = 0
    stall_s: float = 0.0

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def as_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["hit_ratio"] = self.hit_ratio
        return d


@dataclass(slots=True)
class _IterationStall:
    """Synchronous transfers before one iteration's forward pass (admissions at the same
    ``now``): they run one after the other, and waiting for a transfer already under way
    costs only what is left of it. The iteration stalls until the last one is done, so the
    stalls handed to the engine (summed over its admissions) add up to that, not to each
    admission's full wait (two requests of one adapter admitted together wait for one load)."""

    now: float = float("-inf")
    end: float = float("-inf")

    def _at(self, now: float) -> None:
        if now != self.now:
            self.now = self.end = now

    def wait(self, now: float, ready_at: float) -> float:
        """Wait for something ready at ``ready_at``: the extra stall (seconds)."""
        self._at(now)
        extra = max(0.0, ready_at - self.end)
        self.end += extra
        return extra

    def load(self, now: float, seconds: float) -> tuple[float, float]:
        """A synchronous transfer of ``seconds`` after the ones before it: (ready at, stall)."""
        self._at(now)
        self.end += seconds
        return self.end, seconds


@dataclass(slots=True)
class _Entry:
    tokens: int
    ready_at: float
    pins: int = 0  # prewarms holding it for a unit about to run (not evicted while > 0)


#: prefixes the built-in engine's :class:`LRUPrefixCache` keeps
PREFIX_CACHE_ENTRIES = 1024


class LRUPrefixCache:
    """A small LRU of whole prompt prefixes for the engine model's prefix-cache hook, counted in
    entries, not KV blocks: the built-in engine's cache (``hermeslet sim-engine`` and the
    gateway's embedded engine), and the simulator's when it emulates that engine
    (``hermes load --sim``). ``queries``/``hits`` count prefix tokens."""

    def __init__(self, entries: int = PREFIX_CACHE_ENTRIES) -> None:
        self.entries = entries
        self._lru: OrderedDict[str, int] = OrderedDict()
        self.queries = 0  # prefix tokens looked up
        self.hits = 0  # of them, cached

    def cached_tokens(self, prefix: str, prefix_tokens: int, now: float) -> int:
        self.queries += prefix_tokens
        got = self._lru.get(prefix)
        if got is None:
            return 0
        self._lru.move_to_end(prefix)
        hit = min(got, prefix_tokens)
        self.hits += hit
        return hit

    def on_prefilled(self, prefix: str, prefix_tokens: int, now: float) -> None:
        self._lru[prefix] = prefix_tokens
        self._lru.move_to_end(prefix)
        while len(self._lru) > self.entries:
            self._lru.popitem(last=False)


class PrefixCacheModel:
    """GPU + CPU tiers of cached prompt-prefix KV (see the module docstring)."""

    def __init__(
        self,
        capacity_tokens: int,
        *,
        cpu_capacity_tokens: int = 0,
        kv_bytes_per_token: int = 512 * 1024,
        swap_bytes_per_s: float = 16e9,
        enabled: bool = True,
    ) -> None:
        self.capacity = capacity_tokens
        self.cpu_capacity = cpu_capacity_tokens
        self.swap_s_per_token = kv_bytes_per_token / swap_bytes_per_s
        self.enabled = enabled
        self.gpu: OrderedDict[str, _Entry] = OrderedDict()
        self.cpu: OrderedDict[str, int] = OrderedDict()
        self.gpu_used = 0
        self.cpu_used = 0
        self.stats = CacheStats()
        self._stall = 0.0
        self._iter = _IterationStall()
        self._pending_pins: dict[str, int] = {}
        #: whether a running request uses the prefix (wired to the engine by the driver): its
        #: KV blocks are referenced, so it is never evicted (vLLM's block ref counts)
        self.in_use: Callable[[str], bool] = lambda prefix: False
        #: whether a queued request will use the prefix: a planned prewarm does not evict it
        self.queued: Callable[[str], bool] = lambda prefix: False

    # ------------------------------------------------------------------ engine hook
    def cached_tokens(self, prefix: str, prefix_tokens: int, now: float) -> int:
        """Admission of a request with ``prefix``: how many prompt tokens are cached."""
        st = self.stats
        if prefix.startswith(UNCOUNTED):
            prefix = prefix[len(UNCOUNTED):]
            st = CacheStats()  # not counted
        st.lookups += 1
        e = self.gpu.get(prefix)
        if e is not None:
            self.gpu.move_to_end(prefix)
            if e.ready_at <= now:
                st.hits += 1
            else:
                st.warming_hits += 1
                self._stall += self._iter.wait(now, e.ready_at)
            return min(e.tokens, prefix_tokens)
        if prefix in self.cpu:
            tokens = self.cpu.pop(prefix)
            self.cpu_used -= tokens
            st.cpu_hits += 1
            ready, stall = self._iter.load(now, tokens * self.swap_s_per_token)
            self._stall += stall
            self._put(prefix, tokens, ready)
            return min(tokens, prefix_tokens)
        st.misses += 1
        return 0

    def on_prefilled(self, prefix: str, prefix_tokens: int, now: float) -> None:
        """The prefix's KV was computed: keep it (most recently used)."""
        speculative = prefix.startswith(UNCOUNTED)  # a prewarm's prefill-only request
        prefix = prefix.removeprefix(UNCOUNTED)
        if not self.enabled or prefix_tokens <= 0:
            return
        e = self.gpu.get(prefix)
        if e is not None:
            self.gpu.move_to_end(prefix)
            e.ready_at = min(e.ready_at, now)
            return
        self._put(prefix, prefix_tokens, now, speculative=speculative)

    def take_stall_s(self) -> float:
        """Synchronous swap-in time accrued by admissions since the last call."""
        s, self._stall = self._stall, 0.0
        self.stats.stall_s += s
        return s

    # ------------------------------------------------------------------ prefetch
    def is_warm(self, prefix: str) -> bool:
        """On the GPU (or being swapped in)."""
        return prefix in self.gpu

    def where(self, prefix: str) -> str:
        return "gpu" if prefix in self.gpu else "cpu" if prefix in self.cpu else "none"

    def prefetch(self, prefix: str, now: float, *, pin: bool = False) -> float | None:
        """Swap a CPU-resident prefix in asynchronously (``pin``: held until released).
        Returns when it is ready; ``None`` when it is not on the CPU (already on the GPU, or
        must be prefilled)."""
        if not self.enabled or prefix not in self.cpu:
            return None
        tokens = self.cpu.pop(prefix)
        self.cpu_used -= tokens
        ready = now + tokens * self.swap_s_per_token
        if pin:
            self.pin(prefix)
        self._put(prefix, tokens, ready, speculative=pin)
        self.stats.prefetches += 1
        return ready

    def pin(self, prefix: str) -> None:
        """Hold ``prefix`` on the GPU for a coming unit (if it is not there yet, from when it
        arrives: a prefill under way)."""
        e = self.gpu.get(prefix)
        if e is not None:
            e.pins += 1
        else:
            self._pending_pins[prefix] = self._pending_pins.get(prefix, 0) + 1

    def release(self, prefix: str) -> None:
        """One hold on ``prefix`` ends (its unit ran, or its branch was not taken)."""
        e = self.gpu.get(prefix)
        if e is not None and e.pins > 0:
            e.pins -= 1
        elif prefix in self._pending_pins:
            self._pending_pins[prefix] -= 1
            if self._pending_pins[prefix] <= 0:
                del self._pending_pins[prefix]

    # ------------------------------------------------------------------ internals
    def _put(
        self, prefix: str, tokens: int, ready_at: float, *, speculative: bool = False
    ) -> None:
        """Store ``prefix`` on the GPU tier, evicting least recently used prefixes to the CPU
        tier. Prefixes of running requests are never evicted and do not count against the
        capacity: their KV blocks belong to the running requests (vLLM's referenced blocks),
        the tier models the free blocks that keep finished requests' prefixes. A
        ``speculative`` newcomer (a planned prewarm) does not evict queued requests' prefixes
        either. Held prefixes go after the others, and the newcomer itself when nothing else
        may go. (Prefixes whose requests finished count again from the next insertion on.)"""
        if tokens > self.capacity:
            return
        self.gpu[prefix] = _Entry(tokens, ready_at, self._pending_pins.pop(prefix, 0))
        self.gpu_used += tokens
        if self.gpu_used <= self.capacity:
            return
        referenced = sum(e.tokens for k, e in self.gpu.items() if self.in_use(k))
        budget = self.capacity + referenced
        if self.gpu_used <= budget:
            return

        def protected(key: str) -> bool:
            return self.in_use(key) or (speculative and self.queued(key))

        unheld = [k for k, e in self.gpu.items() if k != prefix and e.pins == 0]
        held = [k for k, e in self.gpu.items() if k != prefix and e.pins > 0]
        # everything else is held: the newcomer goes, unless it is held too, then the oldest
        # holds give way
        last = held + [prefix] if self.gpu[prefix].pins > 0 else [prefix] + held
        for key in unheld + last:
            if self.gpu_used <= budget:
                break
            if protected(key):
                continue
            e = self.gpu.pop(key)
            self.gpu_used -= e.tokens
            self.stats.evictions += 1
            self._to_cpu(key, e.tokens)

    def _to_cpu(self, prefix: str, tokens: int) -> None:
        if tokens > self.cpu_capacity:
            return
        self.cpu[prefix] = tokens
        self.cpu_used += tokens
        while self.cpu_used > self.cpu_capacity:
            _, t = self.cpu.popitem(last=False)
            self.cpu_used -= t


class LoraSlots:
    """LoRA adapters on the GPU and in host memory (see the module docstring).

    ``running(adapter)`` / ``queued(adapter)`` tell whether a request running in / waiting at
    the engine uses the adapter (wired to the engine model's counters by the driver). An
    adapter that a running request uses is never evicted (vLLM cannot: the batch computes with
    it); a prefetch evicts neither a running nor a queued request's adapter, nor (a planned
    one) an adapter held for a coming unit: when no GPU slot is free of those it loads the
    adapter into host memory only.
    """

    def __init__(
        self,
        max_loras: int,
        max_cpu_loras: int,
        *,
        disk_load_s: float = 0.25,
        cpu_load_s: float = 0.02,
        running: Callable[[str], bool] | None = None,
        queued: Callable[[str], bool] | None = None,
    ) -> None:
        if max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {max_loras}")
        if max_cpu_loras < max_loras:
            raise ValueError(
                f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({max_loras}), as in vLLM"
            )
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self.disk_load_s = disk_load_s
        self.cpu_load_s = cpu_load_s
        self.running = running or (lambda a: False)
        self.queued = queued or (lambda a: False)
        self.gpu: OrderedDict[str, float] = OrderedDict()  # adapter -> ready_at
        # host-memory cache (GPU ones too), LRU order: adapter -> when it is in host memory
        self.cpu: OrderedDict[str, float] = OrderedDict()
        self.pins: dict[str, int] = {}  # adapters held for a coming unit
        self.stats = CacheStats()
        self._iter = _IterationStall()

    def pin(self, adapter: str) -> None:
        self.pins[adapter] = self.pins.get(adapter, 0) + 1

    def release(self, adapter: str) -> None:
        n = self.pins.get(adapter, 0) - 1
        if n > 0:
            self.pins[adapter] = n
        else:
            self.pins.pop(adapter, None)

    def load_time_s(self, adapter: str) -> float:
        return self.cpu_load_s if adapter in self.cpu else self.disk_load_s

    def is_warm(self, adapter: str) -> bool:
        return adapter in self.gpu

    def admit(self, adapter: str, now: float) -> float:
        """A request using ``adapter`` is admitted: the stall (seconds) to load it first."""
        st = self.stats
        st.lookups += 1
        ready = self.gpu.get(adapter)
        if ready is not None:
            self.gpu.move_to_end(adapter)
            self._touch_cpu(adapter)
            if ready <= now:
                st.hits += 1
                return 0.0
            if self.cpu.get(adapter, float("inf")) <= now:
                st.cpu_hits += 1  # in host memory: it waits for the copy under way, no disk read
            else:
                st.warming_hits += 1
            stall = self._iter.wait(now, ready)
            st.stall_s += stall
            return stall
        if adapter in self.cpu:
            if self.cpu[adapter] <= now:
                st.cpu_hits += 1
            else:
                st.warming_hits += 1
            self._iter.wait(now, self.cpu[adapter])  # still coming from disk
            t = self.cpu_load_s
        else:
            st.misses += 1
            t = self.disk_load_s
        ready, stall = self._iter.load(now, t)
        victim = self._victim(self._admit_order)
        if victim is None and len(self.gpu) >= self.max_loras:
            # only without the engine's batch rule: every slot serves a running request
            victim = next(iter(self.gpu))
        self._load(adapter, ready, victim)
        st.stall_s += stall
        return stall

    def prefetch(self, adapter: str, now: float, *, planned: bool = False) -> float | None:
        """Load ``adapter`` in the background (``planned``: a speculative prewarm, which also
        spares adapters held for coming units). Returns when it is ready on the GPU, or
        ``None`` when it already is there or when no slot could be taken (then it is loaded
        into host memory, if it was not there)."""
        if adapter in self.gpu:
            return None
        victim = self._victim(self._planned_order if planned else self._prefetch_order)
        if victim is None and len(self.gpu) >= self.max_loras:
            if adapter not in self.cpu:
                self._to_cpu(adapter, now + self.disk_load_s)
                self.stats.prefetches += 1
            return None
        ready = max(now, self.cpu.get(adapter, now)) + self.load_time_s(adapter)
        self._load(adapter, ready, victim)
        self.stats.prefetches += 1
        return ready

    # victim classes, best first; an adapter of a running request is never one
    def _admit_order(self, a: str) -> int | None:
        if self.running(a):
            return None
        return (1 if self.queued(a) else 0) + (2 if a in self.pins else 0)

    def _prefetch_order(self, a: str) -> int | None:
        if self.running(a) or self.queued(a):
            return None
        return 1 if a in self.pins else 0

    def _planned_order(self, a: str) -> int | None:
        if self.running(a) or self.queued(a) or a in self.pins:
            return None
        return 0

    def _victim(self, order: Callable[[str], int | None]) -> str | None:
        """The least recently used GPU adapter of the best class, when every slot is taken
        (``None``: a slot is free, or no adapter may be evicted)."""
        if len(self.gpu) < self.max_loras:
            return None
        best: tuple[int, str] | None = None
        for a in self.gpu:  # LRU first
            c = order(a)
            if c is not None and (best is None or c < best[0]):
                best = (c, a)
                if c == 0:
                    break
        return None if best is None else best[1]

    def _touch_cpu(self, adapter: str) -> None:
        if adapter in self.cpu:
            self.cpu.move_to_end(adapter)

    def _load(self, adapter: str, ready_at: float, victim: str | None) -> None:
        if victim is not None:
            del self.gpu[victim]
            self.stats.evictions += 1
        self.gpu[adapter] = ready_at
        self._to_cpu(adapter, min(ready_at, self.cpu.get(adapter, ready_at)))

    def _to_cpu(self, adapter: str, ready_at: float) -> None:
        self.cpu[adapter] = ready_at
        self.cpu.move_to_end(adapter)
        if len(self.cpu) > self.max_cpu_loras:
            cands = [k for k in self.cpu if k not in self.gpu and k != adapter]
            keep = [k for k in cands if k in self.pins or self.queued(k)]
            drop = next((k for k in cands if k not in keep), None) or next(iter(keep), None)
            if drop is not None:
                del self.cpu[drop]


class BlockPoolPrefixCache(PrefixCacheModel):
    """Cached prompt prefixes in the engine's one KV block pool (vLLM v1 ``BlockPool`` with
    prefix caching; :class:`~hermes.core.engine_model.SharedBlockPool`).

    ``capacity`` is the whole pool: the engine's KV capacity becomes this, and the running
    requests' own tokens come out of it too. An entry is *referenced* while running requests
    share its blocks (``refs``, kept by the engine), and *held* while prewarms pin it for a
    coming unit; both lock it. Unlocked entries sit in free blocks and are evicted least
    recently used (to the host-memory tier) when the engine needs those blocks
    (:meth:`fit`), never when a prefix is stored: storing one computed by a request only
    relabels the request's blocks. A hold gives way (:meth:`release_holds`) before a running
    request would be preempted; held tokens are capped at ``max_held_fraction`` of the pool
    (a pin that would exceed it is refused: the prefix is still warmed, unheld)."""

    shares_pool = True

    def __init__(
        self, capacity_tokens: int, *, max_held_fraction: float = 0.25, **kw: object
    ) -> None:
        super().__init__(capacity_tokens, **kw)  # type: ignore[arg-type]
        if not 0.0 <= max_held_fraction <= 1.0:
            raise ValueError(f"max_held_fraction must be in [0, 1], got {max_held_fraction}")
        self.max_held_fraction = max_held_fraction
        self.refs: dict[str, int] = {}
        self.held_tokens = 0  # tokens of GPU entries with pins > 0
        self.holds_dropped = 0  # holds given up for running requests' blocks
        self.pins_refused = 0  # pins over the held-token cap
        #: tokens the engine's running requests hold by themselves (wired by the driver)
        self.engine_tokens: Callable[[], int] = lambda: 0

    # ------------------------------------------------------------------ pool hooks
    def lookup(self, prefix: str, prefix_tokens: int) -> tuple[str, int, bool]:
        prefix = prefix.removeprefix(UNCOUNTED)
        e = self.gpu.get(prefix)
        if e is not None:
            return "gpu", min(e.tokens, prefix_tokens), self._locked(prefix, e)
        if prefix in self.cpu:
            return "cpu", min(self.cpu[prefix], prefix_tokens), False
        return "none", 0, False

    def locked_tokens(self) -> int:
        return sum(e.tokens for k, e in self.gpu.items() if self._locked(k, e))

    def acquire(self, prefix: str) -> None:
        prefix = prefix.removeprefix(UNCOUNTED)
        self.refs[prefix] = self.refs.get(prefix, 0) + 1

    def unref(self, prefix: str) -> None:
        prefix = prefix.removeprefix(UNCOUNTED)
        n = self.refs.get(prefix, 0) - 1
        if n > 0:
            self.refs[prefix] = n
        else:
            self.refs.pop(prefix, None)

    def adopt(self, prefix: str, prefix_tokens: int, now: float) -> bool:
        speculative = prefix.startswith(UNCOUNTED)
        prefix = prefix.removeprefix(UNCOUNTED)
        if not self.enabled or prefix_tokens <= 0 or prefix_tokens > self.capacity:
            return False
        e = self.gpu.get(prefix)
        if e is not None:
            self.gpu.move_to_end(prefix)
            e.ready_at = min(e.ready_at, now)
            return False
        if prefix in self.cpu:  # an older copy in host memory: superseded
            self.cpu_used -= self.cpu.pop(prefix)
        self._put(prefix, prefix_tokens, now, speculative=speculative)
        return True

    def fit(self, limit_tokens: int) -> None:
        if self.gpu_used <= limit_tokens:
            return
        for key in [k for k, e in self.gpu.items() if not self._locked(k, e)]:
            if self.gpu_used <= limit_tokens:
                break
            self._evict(key)

    def release_holds(self, tokens: int) -> int:
        freed = 0
        for key, e in self.gpu.items():
            if freed >= tokens:
                break
            if e.pins > 0 and not self.refs.get(key):
                self.held_tokens -= e.tokens
                e.pins = 0
                self.holds_dropped += 1
                freed += e.tokens
        return freed

    # ------------------------------------------------------------------ holds
    def pin(self, prefix: str) -> None:
        e = self.gpu.get(prefix)
        if e is None:
            self._pending_pins[prefix] = self._pending_pins.get(prefix, 0) + 1
            return
        if e.pins == 0:
            if not self._room_to_hold(e.tokens):
                self.pins_refused += 1
                return
            self.held_tokens += e.tokens
        e.pins += 1

    def release(self, prefix: str) -> None:
        e = self.gpu.get(prefix)
        if e is not None and e.pins > 0:
            e.pins -= 1
            if e.pins == 0:
                self.held_tokens -= e.tokens
        else:
            super().release(prefix)  # a pending pin

    def prefetch(self, prefix: str, now: float, *, pin: bool = False) -> float | None:
        """Swap a host-memory prefix into free blocks (evicting unlocked entries); ``None``
        when it is not in host memory or the pool has no room for it now."""
        if not self.enabled or prefix not in self.cpu:
            return None
        tokens = self.cpu[prefix]
        room = self.capacity - self.engine_tokens() - self.locked_tokens()
        if tokens > room:
            return None
        self.fit(self.capacity - self.engine_tokens() - tokens)
        return super().prefetch(prefix, now, pin=pin)

    # ------------------------------------------------------------------ internals
    def _locked(self, key: str, e: _Entry) -> bool:
        return e.pins > 0 or bool(self.refs.get(key))

    def _room_to_hold(self, tokens: int) -> bool:
        return self.held_tokens + tokens <= self.max_held_fraction * self.capacity

    def _evict(self, key: str) -> None:
        e = self.gpu.pop(key)
        self.gpu_used -= e.tokens
        if e.pins > 0:
            self.held_tokens -= e.tokens
        self.stats.evictions += 1
        self._to_cpu(key, e.tokens)

    def _put(
        self, prefix: str, tokens: int, ready_at: float, *, speculative: bool = False
    ) -> None:
        """Store on the GPU without evicting: the blocks are already the caller's (a computed
        prefix) or were made free by the engine / :meth:`prefetch` (a swap-in)."""
        if tokens > self.capacity:
            return
        pins = self._pending_pins.pop(prefix, 0)
        if pins and not self._room_to_hold(tokens):
            self.pins_refused += 1
            pins = 0
        self.gpu[prefix] = _Entry(tokens, ready_at, pins)
        self.gpu_used += tokens
        if pins:
            self.held_tokens += tokens


class RetainingPrefixCache(PrefixCacheModel):
    """:class:`PrefixCacheModel` with the mechanisms of KV retention through tool calls
    (:mod:`hermes.core.kv_retention`; issue 19): an entry grows with its run's history (a
    longer prefix computed under the same key replaces the shorter one), a TTL pin
    (:meth:`pin_until`: held until it expires, at most ``max_pinned_fraction`` of the GPU
    tier pinned, a pin over that is refused), an explicit :meth:`offload` to the host tier
    (reloaded asynchronously by :meth:`prefetch`), and :meth:`drop`. TTL pins expire lazily at
    the next lookup or store (``now`` is passed in). ``queries``/``hits``/``cpu_hit_tokens``
    count prefix tokens looked up, found on the GPU (ready or loading) and found in host
    memory."""

    def __init__(self, capacity_tokens: int, *, max_pinned_fraction: float = 0.5,
                 **kw: object) -> None:
        super().__init__(capacity_tokens, **kw)  # type: ignore[arg-type]
        if not 0.0 <= max_pinned_fraction <= 1.0:
            raise ValueError(f"max_pinned_fraction must be in [0, 1], got {max_pinned_fraction}")
        self.max_pinned_fraction = max_pinned_fraction
        self.ttl: dict[str, float] = {}  # prefix -> when its TTL pin expires
        self.queries = 0
        self.hits = 0
        self.cpu_hit_tokens = 0
        self.pins_refused = 0
        self.offloads = 0
        self.drops = 0

    @property
    def pressure(self) -> float:
        """GPU tier use over its capacity."""
        return self.gpu_used / self.capacity if self.capacity else 1.0

    def tokens(self, prefix: str) -> int:
        """Tokens of ``prefix`` on either tier (0: not cached)."""
        e = self.gpu.get(prefix)
        return e.tokens if e is not None else self.cpu.get(prefix, 0)

    # ------------------------------------------------------------------ engine hook
    def cached_tokens(self, prefix: str, prefix_tokens: int, now: float) -> int:
        self.expire(now)
        counted = not prefix.startswith(UNCOUNTED)
        where = self.where(prefix.removeprefix(UNCOUNTED))
        got = super().cached_tokens(prefix, prefix_tokens, now)
        if counted:
            self.queries += prefix_tokens
            if where == "gpu":
                self.hits += got
            elif where == "cpu":
                self.cpu_hit_tokens += got
        return got

    def on_prefilled(self, prefix: str, prefix_tokens: int, now: float) -> None:
        self.expire(now)
        key = prefix.removeprefix(UNCOUNTED)
        e = self.gpu.get(key)
        if e is not None and prefix_tokens > e.tokens and self.enabled:
            # the run's history grew: the longer prefix replaces the shorter one
            pins = e.pins
            del self.gpu[key]
            self.gpu_used -= e.tokens
            self._pending_pins[key] = self._pending_pins.get(key, 0) + pins
            self._put(key, prefix_tokens, now)
            return
        if e is None and key in self.cpu and prefix_tokens > self.cpu[key]:
            self.cpu_used -= self.cpu.pop(key)
        super().on_prefilled(prefix, prefix_tokens, now)

    # ------------------------------------------------------------------ retention
    def pin_until(self, prefix: str, expires_at: float) -> bool:
        """Hold ``prefix`` on the GPU until ``expires_at`` (extends a pin already there).
        ``False`` when it is not on the GPU or pinning it would exceed the cap."""
        e = self.gpu.get(prefix)
        if e is None:
            return False
        if prefix in self.ttl:
            self.ttl[prefix] = max(self.ttl[prefix], expires_at)
            return True
        pinned = sum(self.gpu[k].tokens for k in self.ttl if k in self.gpu)
        if pinned + e.tokens > self.max_pinned_fraction * self.capacity:
            self.pins_refused += 1
            return False
        self.ttl[prefix] = expires_at
        self.pin(prefix)
        return True

    def unpin(self, prefix: str) -> None:
        """End the TTL pin of ``prefix`` now (its run came back, or ended)."""
        if self.ttl.pop(prefix, None) is not None:
            self.release(prefix)

    def expire(self, now: float) -> None:
        """Release the TTL pins that expired by ``now``."""
        for k in [k for k, t in self.ttl.items() if t <= now]:
            self.unpin(k)

    def offload(self, prefix: str) -> bool:
        """Move ``prefix`` from the GPU to the host tier now (``False``: not on the GPU, or
        pinned)."""
        e = self.gpu.get(prefix)
        if e is None or e.pins > 0:
            return False
        del self.gpu[prefix]
        self.gpu_used -= e.tokens
        self._to_cpu(prefix, e.tokens)
        self.offloads += 1
        return True

    def drop(self, prefix: str) -> None:
        """Forget ``prefix`` on both tiers (its TTL pin too)."""
        self.unpin(prefix)
        e = self.gpu.get(prefix)
        if e is not None and e.pins == 0:
            del self.gpu[prefix]
            self.gpu_used -= e.tokens
            self.drops += 1
        if prefix in self.cpu:
            self.cpu_used -= self.cpu.pop(prefix)
            self.drops += 1

"""Engine choice for an LLM request among the engines serving its model (issue 19).

A decision of the core: no I/O, no clock (``now`` is passed in), the same for the live
gateway (:meth:`hermes.gateway.nodes.NodeTable.pick_engine`) and the simulator. The driver
describes each candidate engine (:class:`EngineState`: its load as the driver sees it) and the
request (:class:`RouteRequest`: its run, its prompt's prefixes as opaque keys with their
token counts, its adapter); a :class:`Router` picks one. What each engine holds is tracked by
:class:`PrefixIndex`, an approximate index of the prompt prefixes sent to each engine (what
llm-d calls its approximate prefix-cache scorer, and SGLang's router its radix tree of sent
requests): bounded per engine in tokens, least recently used out first, as the engine's own
cache evicts.

Routers (``scheduler.router``; :func:`make_router`):

- ``least-loaded``: the lowest in-flight fraction of the engine's window, then the fewest
  queued requests (the gateway's choice before routers existed);
- ``prefix``: llm-d's weighted scorers: ``2 x`` the cached fraction of the prompt ``+ 1 x``
  the free fraction of the window ``+ 1 x`` the free fraction of the KV cache;
- ``session``: the engine the run's last request went to while that was less than ``ttl_s``
  ago and the engine is not saturated, else ``least-loaded``;
- ``hermes``: the engine with the earliest estimated finish for this request: the queue
  ahead of it (in-flight fraction of the window, times the engine's per-request service
  scale) plus the prefill of the tokens the engine does not hold, in units of a prefill token,
  with the run's affinity counted as the prefix the engine will hold for the run's next units
  (``next_llm_p``: the probability, from the run's PDGraph, that an LLM unit follows), and
  the run's affinity (its previous request's engine holds that prompt) as a prefix held. It
  trades a hit against a queue, where ``prefix`` adds their scores.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from hermes.core.pdgraph import UNKNOWN_NEXT_LLM_P

#: a prompt prefix as the driver names it (a digest of messages, a prefix name) and the
#: prompt tokens it spans from the start of the prompt (cumulative)
PrefixKey = tuple[Hashable, int]


@dataclass(slots=True)
class EngineState:
    """One candidate engine as the driver sees it when it routes."""

    engine: str
    #: requests in flight at the engine / its window (0 idle, 1 full)
    load: float
    #: requests waiting in the node's queue for it
    queued: int = 0
    #: the engine's KV cache use (0..1), None when it does not report it
    kv_usage: float | None = None
    #: prompt tokens the engine holds, exactly, from its KV-event block index
    #: (:mod:`hermes.core.kv_index`); None: it publishes no events, the router reads its
    #: approximate :class:`PrefixIndex` instead
    cached_tokens: int | None = None


@dataclass(slots=True)
class RouteRequest:
    """What a router knows of the request it places."""

    run_id: str
    #: the prompt's prefixes, shortest first (``[(key, cumulative tokens)]``)
    prefixes: Sequence[PrefixKey] = ()
    #: prompt tokens (0: unknown; the longest prefix's tokens are used)
    input_tokens: int = 0
    #: probability that an LLM unit of the run follows this one (from its PDGraph:
    #: :func:`hermes.core.pdgraph.next_llm_p`; 0.5 when the run has no graph)
    next_llm_p: float = UNKNOWN_NEXT_LLM_P


class PrefixIndex:
    """Per engine, the prompt prefixes recently sent to it (an approximation of its prefix
    cache), bounded to ``capacity_tokens`` per engine: a prefix is charged the tokens it adds
    beyond its parent, the least recently used go first."""

    def __init__(self, capacity_tokens: int = 200_000) -> None:
        self.capacity_tokens = capacity_tokens
        #: engine -> key -> tokens charged, least recently used first
        self._engines: dict[str, OrderedDict[Hashable, int]] = {}
        self._used: dict[str, int] = {}

    def matched_tokens(self, engine: str, prefixes: Sequence[PrefixKey]) -> int:
        """Tokens of the longest of ``prefixes`` the engine holds (0: none)."""
        held = self._engines.get(engine)
        if not held:
            return 0
        for key, tokens in reversed(prefixes):
            if key in held:
                return tokens
        return 0

    def record(self, engine: str, prefixes: Sequence[PrefixKey]) -> None:
        """The engine was sent a prompt with these prefixes: it holds them now."""
        held = self._engines.get(engine)
        if held is None:
            held = self._engines[engine] = OrderedDict()
            self._used[engine] = 0
        used = self._used[engine]
        prev = 0
        for key, tokens in prefixes:
            add = max(0, tokens - prev)
            prev = max(prev, tokens)
            old = held.pop(key, None)
            if old is not None:
                used -= old
            held[key] = add
            used += add
        while used > self.capacity_tokens and held:
            _, n = held.popitem(last=False)
            used -= n
        self._used[engine] = used

    def forget(self, engine: str) -> None:
        """The engine lost its cache (restarted, removed)."""
        self._engines.pop(engine, None)
        self._used.pop(engine, None)

    def size(self, engine: str) -> int:
        """Tokens the index charges ``engine``."""
        return self._used.get(engine, 0)


class Router:
    """Picks an engine for a request; ``name`` is its ``scheduler.router`` name."""

    name: ClassVar[str] = ""

    def __init__(self, index: PrefixIndex | None = None) -> None:
        self.index = index if index is not None else PrefixIndex()

    def pick(self, req: RouteRequest, engines: Sequence[EngineState], now: float) -> EngineState:
        """The engine for ``req`` (``engines`` is not empty)."""
        raise NotImplementedError

    def matched_tokens(self, req: RouteRequest, e: EngineState) -> int:
        """Prompt tokens of ``req`` that ``e`` holds: exact when the engine's block index is
        known (``cached_tokens``), else the approximate index's guess."""
        if e.cached_tokens is not None:
            return e.cached_tokens
        return self.index.matched_tokens(e.engine, req.prefixes)

    def sent(self, req: RouteRequest, engine: str, now: float) -> None:
        """``req`` went to ``engine``: it holds the request's prefixes now."""
        if req.prefixes:
            self.index.record(engine, req.prefixes)


def _least_loaded_key(e: EngineState) -> tuple[float, int]:
    return (e.load, e.queued)


class LeastLoadedRouter(Router):
    """The lowest in-flight fraction of the window, then the fewest queued requests."""

    name = "least-loaded"

    def pick(self, req: RouteRequest, engines: Sequence[EngineState], now: float) -> EngineState:
        return min(engines, key=_least_loaded_key)


class PrefixRouter(Router):
    """llm-d's default weights: ``2 x`` prefix hit fraction ``+`` free window ``+`` free KV."""

    name = "prefix"
    prefix_weight: ClassVar[float] = 2.0
    load_weight: ClassVar[float] = 1.0
    kv_weight: ClassVar[float] = 1.0

    def pick(self, req: RouteRequest, engines: Sequence[EngineState], now: float) -> EngineState:
        total = req.input_tokens or (req.prefixes[-1][1] if req.prefixes else 0)

        def score(e: EngineState) -> tuple[float, float]:
            hit = min(1.0, self.matched_tokens(req, e) / total) if total else 0.0
            free_kv = 1.0 - e.kv_usage if e.kv_usage is not None else 1.0
            s = (self.prefix_weight * hit + self.load_weight * (1.0 - min(1.0, e.load))
                 + self.kv_weight * free_kv)
            return (s, -e.queued)

        return max(engines, key=score)


class SessionRouter(Router):
    """Sticky: the run's last engine while it was used less than ``ttl_s`` ago and is not
    saturated (``load < max_load``), else the least loaded."""

    name = "session"

    def __init__(self, index: PrefixIndex | None = None, *, ttl_s: float = 300.0,
                 max_load: float = 1.0, max_runs: int = 100_000) -> None:
        super().__init__(index)
        self.ttl_s = ttl_s
        self.max_load = max_load
        self.max_runs = max_runs
        self._last: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def pick(self, req: RouteRequest, engines: Sequence[EngineState], now: float) -> EngineState:
        hit = self._last.get(req.run_id)
        if hit is not None and now - hit[1] <= self.ttl_s:
            for e in engines:
                if e.engine == hit[0] and e.load < self.max_load:
                    return e
        return min(engines, key=_least_loaded_key)

    def sent(self, req: RouteRequest, engine: str, now: float) -> None:
        super().sent(req, engine, now)
        self._last[req.run_id] = (engine, now)
        self._last.move_to_end(req.run_id)
        while len(self._last) > self.max_runs:
            self._last.popitem(last=False)


class HermesRouter(Router):
    """The earliest estimated finish of this request and the run's next ones (module doc).

    Cost of engine ``e``, in prefill-token units: ``queue_tokens x load(e)`` (the work ahead
    of the request: a full window is worth ``queue_tokens`` tokens of prefill) ``+ (1 +
    next_llm_p) x`` the prompt tokens ``e`` does not hold (this request's prefill, and the
    share of it the run's next LLM unit saves by finding its context where this one ran).
    ``queue_tokens`` = 65,536: a full window of 32 requests ahead is worth ~5.6 s of
    LLaMA-2-7B prefill on an A100, about the time such a window takes to drain; chosen on the
    agent mix at seeds 5 and 6, not the seeds the README reports, from 4,096 / 16,384 / 65,536
    / 131,072 (mean ACT 249.0 / 172.6 / 168.4 / 171.1 s at seed 5, 154.3 / 123.1 / 116.9 /
    118.5 s at seed 6). Load counts below a full window too: a batch of long agent contexts
    slows every iteration of the engine (a separate term for waiting beyond a full window
    changed nothing there: the engines' outstanding requests stayed under the window).

    What ``e`` holds of the prompt is the larger of the prefix index's match and the run's
    **affinity**: the prompt tokens of the run's previous request, if it went to ``e`` less
    than ``ttl_s`` ago (an agent's next turn begins with its previous prompt, and its tool
    call may outlast the index's memory of it: the approximate index forgets a prefix once
    ``capacity_tokens`` of other prompts were sent after it, which a long tool call of a busy
    engine exceeds). An engine that reports its cache exactly (``cached_tokens``) is taken at
    its word."""

    name = "hermes"

    def __init__(self, index: PrefixIndex | None = None, *, queue_tokens: float = 65536.0,
                 ttl_s: float = 300.0, max_runs: int = 100_000) -> None:
        super().__init__(index)
        self.queue_tokens = queue_tokens
        self.ttl_s = ttl_s
        self.max_runs = max_runs
        #: run -> (engine, prompt tokens, when) of its last request, least recent first
        self._last: OrderedDict[str, tuple[str, int, float]] = OrderedDict()

    def affinity(self, req: RouteRequest, now: float) -> tuple[str, int] | None:
        """The engine of the run's previous request and that request's prompt tokens, while
        it is less than ``ttl_s`` old (``None`` otherwise)."""
        last = self._last.get(req.run_id)
        if last is None or now - last[2] > self.ttl_s:
            return None
        return last[0], last[1]

    def pick(self, req: RouteRequest, engines: Sequence[EngineState], now: float) -> EngineState:
        total = req.input_tokens or (req.prefixes[-1][1] if req.prefixes else 0)
        future = 1.0 + max(0.0, min(1.0, req.next_llm_p))
        aff = self.affinity(req, now)

        def cost(e: EngineState) -> tuple[float, int]:
            held = self.matched_tokens(req, e)
            if aff is not None and e.cached_tokens is None and aff[0] == e.engine:
                held = max(held, min(aff[1], total))
            miss = max(0, total - held)
            kv = e.kv_usage if e.kv_usage is not None else 0.0
            return (self.queue_tokens * (e.load + 0.25 * kv) + future * miss, e.queued)

        return min(engines, key=cost)

    def sent(self, req: RouteRequest, engine: str, now: float) -> None:
        super().sent(req, engine, now)
        tokens = req.input_tokens or (req.prefixes[-1][1] if req.prefixes else 0)
        self._last[req.run_id] = (engine, tokens, now)
        self._last.move_to_end(req.run_id)
        while len(self._last) > self.max_runs:
            self._last.popitem(last=False)


ROUTERS: dict[str, type[Router]] = {
    r.name: r for r in (LeastLoadedRouter, PrefixRouter, SessionRouter, HermesRouter)}


def router_names() -> list[str]:
    return list(ROUTERS)


def make_router(name: str, *, index: PrefixIndex | None = None) -> Router:
    """The router called ``name`` (``ValueError`` naming the known ones otherwise)."""
    cls = ROUTERS.get(name)
    if cls is None:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
    return cls(index)




@dataclass(slots=True)
class RouteStats:
    """What routing did, for metrics and benchmarks: requests routed and prompt tokens the
    chosen engine was expected to hold."""

    routed: int = 0
    prompt_tokens: int = 0
    matched_tokens: int = 0
    by_engine: dict[str, int] = field(default_factory=dict)

    def note(self, engine: str, prompt_tokens: int, matched: int) -> None:
        self.routed += 1
        self.prompt_tokens += prompt_tokens
        self.matched_tokens += matched
        self.by_engine[engine] = self.by_engine.get(engine, 0) + 1

    @property
    def hit_ratio(self) -> float:
        return self.matched_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

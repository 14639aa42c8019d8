"""Backend prewarming with the K knob: the planner and its baselines (pure, no I/O, no clock).

A *resource* is one thing that can be warm or cold, named by a string key:

- ``docker:IMAGE``: a started container of the image (tool units);
- ``dnn:MODEL``: a loaded DNN tool model;
- ``lora:MODEL@ADAPTER``: a LoRA adapter resident on the GPU of the engine serving MODEL;
- ``kv:MODEL/APP/UNIT``: the KV cache of the unit's shared prompt prefix (its system prompt).

:func:`default_resources` maps a unit's backend spec to the resources it needs; a driver may
pass its own mapping (e.g. one that knows the tenant's adapter).

The Hermes planner (:class:`HermesPrewarm`), at the start of a unit of a run and for each
possible next unit ``v`` whose resources are cold:

- ``p_s``: the branch probability of ``v`` after the current unit (the PDGraph's next-unit
  table for this visit index);
- ``t_c``: samples of the time until the current unit completes: the estimator's remaining
  service of the current unit (:attr:`DemandSamples.current_s`), for an LLM unit times the
  observed stretch of wall time over service time of LLM units (queueing and batching under
  load; an EWMA over finished units; a tool call's duration is not stretched), plus ``v``'s
  median client gap;
- ``t_p``: the resource's warm-up time, learned online (:class:`WarmupLearner`, an EWMA of
  observed warm-ups seeded with :data:`DEFAULT_WARMUP_S`).

No prewarm when ``p_s < K``; a cached prompt prefix or LoRA adapter that is already warm but
evictable is *held* from now on (a hint to the cache: evicted after the unheld ones, never in
place of what a running request uses); a cold resource starts warming
at ``t_s`` (seconds from now) where
``p_s * P(t_c > t_s + t_p) = K``, i.e. ``t_s = Q_{t_c}(1 - K/p_s) - t_p`` clipped at 0
(:func:`start_offset`). A higher K demands a higher chance that the warm-up is over before the
backend is needed, so it prewarms fewer branches and starts them earlier; a lower K prewarms
unlikely branches too and starts late. ``timing="late"`` (the default) instead solves
``p_s * P(t_c <= t_s + t_p) = K`` (the chance of a late warm-up on the branch taken is K), so
that a lower K both admits more branches and starts earlier: a monotone knob, at the price of
departing from the rule above (README, *Prewarming results*; ``timing="ready"`` keeps it). When the run's next unit starts, prewarms of the branch
taken are *used* and the others are *cancelled* (released if already started). A started
prewarm that is neither used nor cancelled is *released* after ``idle_timeout_s``.

K comes, in order of precedence, from the run (``RunState.k``, set per request through the
API), its tenant, its app, then the default 0.5.

Baselines, selectable like policies (:func:`make_prewarm`): ``lru`` (no prewarm; backends are
cached reactively and evicted least recently used), ``epwq`` (prefetch only for requests
already in a waiting queue: when a request is queued its resources start warming instead of at
admission), ``none`` (no prewarm and no prefix caching), ``hermes`` (the planner, plus the
``epwq`` prefetch for what it did not foresee; for LoRA adapters a queue lookahead instead,
:func:`head_adapters`: the adapters of the next requests in admission order are kept loaded,
so that a fetch lands shortly before its request is admitted rather than when it is queued).

Waste accounting (:class:`PrewarmStats`): a prewarm that was started and not used wastes the
backend from its start to its release; a used one wastes the time it sat warm and idle before
the unit needed it. Both are summed in ``wasted_backend_s``.
"""

from __future__ import annotations

import heapq
import itertools
import weakref
from abc import ABC
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal, Protocol

import numpy as np

from hermes.core.backend import BackendSpec
from hermes.core.pdgraph import END, PDGraph
from hermes.core.policy_switch import resolve_k
from hermes.core.state import RunProgress, RunState

DEFAULT_K = 0.5
#: seeds of the warm-up time per resource kind, seconds (container start, DNN load, LoRA load
#: from host memory, prefix prefill); replaced by observations as they come in
DEFAULT_WARMUP_S: dict[str, float] = {"docker": 1.0, "dnn": 3.0, "lora": 0.3, "kv": 0.1}
DEFAULT_IDLE_TIMEOUT_S = 60.0
#: resources that a warm cache could evict before use: the planner holds them when warm
HOLDABLE = ("kv", "lora")


def resource_kind(resource: str) -> str:
    """``docker`` / ``dnn`` / ``lora`` / ``kv`` of a resource key."""
    return resource.partition(":")[0]


def resource_model(resource: str) -> str:
    """The engine model a ``kv:MODEL/...`` or ``lora:MODEL@ADAPTER`` resource belongs to (the
    node routes its prewarm to an engine of that model)."""
    name = resource.partition(":")[2]
    return name.partition("@")[0] if resource_kind(resource) == "lora" else name.partition("/")[0]


def default_resources(run: RunState | None, app: str, unit: str, backend: str) -> list[str]:
    """The resources a unit needs warm: a container, a DNN model, a LoRA adapter, the KV of its
    prompt prefix (API tools have nothing to warm)."""
    spec = BackendSpec.parse(backend)
    if spec.kind == "docker":
        return [f"docker:{spec.name}"]
    if spec.kind == "dnn":
        return [f"dnn:{spec.name}"]
    if spec.kind == "llm":
        out = [f"lora:{spec.name}@{spec.lora}"] if spec.lora else []
        out.append(f"kv:{spec.name}/{app}/{unit}")
        return out
    return []


ResourcesFn = Callable[[RunState | None, str, str, str], Sequence[str]]


class WarmView(Protocol):
    """What the driver tells the planner about backends: is a resource warm (or warming)?"""

    def is_warm(self, resource: str, now: float) -> bool: ...


#: how the start time follows from K (:func:`start_offset`)
TIMINGS = ("ready", "late")
#: the default: ``late``, whose K sweep is monotone (lower K: lower latency, more waste), as the
#: knob is documented to behave; ``ready`` is the start rule as first specified, whose two
#: halves pull against each other (README, *Prewarming results*)
DEFAULT_TIMING = "late"


@dataclass(frozen=True, slots=True)
class SortedTimes:
    """Samples of a time, ``sorted_s * scale + shift`` elementwise, kept as the sorted base
    samples and the map: the planner asks one quantile per branch and resource of the same
    completion samples (shared between runs by the live gateway's sample cache), and
    ``np.quantile`` of a fresh array per ask (a partition of up to 1000 samples and numpy's
    fixed overhead) was a cost per request. Sorting commutes with the map (``x * scale +
    shift`` is monotone in ``x`` for ``scale > 0``, rounding included), so
    :meth:`quantile` reads two samples and interpolates as numpy does, bit for bit
    (``test_sorted_times_quantile_is_numpys_bit_for_bit``)."""

    sorted_s: np.ndarray
    scale: float = 1.0
    shift: float = 0.0

    @property
    def size(self) -> int:
        return int(self.sorted_s.size)

    def __post_init__(self) -> None:
        if not self.scale >= 0.0:
            raise ValueError(f"SortedTimes scale must be >= 0 (order-preserving), got {self.scale}")

    def quantile(self, q: float) -> float:
        """``np.quantile(sorted_s * scale + shift, q)`` (method ``linear``), without the array:
        numpy's virtual index ``(n - 1) * q``, its two neighbours and its two-sided ``_lerp``
        (``b - (b - a) * (1 - g)`` from the upper side when ``g >= 0.5``)."""
        s, n = self.sorted_s, int(self.sorted_s.size)
        if n == 0:
            raise ValueError("quantile of no samples")
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        if s[-1] != s[-1]:  # a NaN sorts last: numpy's answer is NaN
            return float("nan")
        vi = (n - 1) * float(q)
        if vi >= n - 1:
            return float(s[-1]) * self.scale + self.shift
        lo = int(vi)
        gamma = vi - lo
        a = float(s[lo]) * self.scale + self.shift
        b = float(s[lo + 1]) * self.scale + self.shift
        diff = b - a
        return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


def start_offset(tc: np.ndarray | SortedTimes, p_s: float, k: float, t_p: float,
                 timing: str = DEFAULT_TIMING) -> float | None:
    """Seconds from now at which to start warming, or ``None`` when ``p_s < k``.

    ``timing="ready"`` (the rule as first specified): solves ``p_s * P(t_c > t_s + t_p) = k`` on the
    empirical distribution of ``tc``: the warm-up must be over before the current unit
    completes with probability ``k / p_s``, so a lower K starts later.

    ``timing="late"`` (the default, :data:`DEFAULT_TIMING`): solves ``p_s * P(t_c <= t_s + t_p) = k``: the chance that the branch is
    taken and finds its backend still warming is ``k``, so a lower K starts earlier. With the
    ``p_s >= k`` gate (both timings) a lower K is then more eager on both counts, which is what
    makes the K sweep monotone (lower K: lower latency, more waste); under ``"ready"`` the gate
    and the start time pull in opposite directions (README, *Prewarming results*).

    Starts now (0) when even an immediate start does not meet the condition.
    """
    if timing not in TIMINGS:
        raise ValueError(f"prewarm timing must be one of {', '.join(TIMINGS)}, not {timing!r}")
    if p_s <= 0.0 or p_s < k:
        return None
    if tc.size == 0:
        return 0.0
    r = min(1.0, k / p_s)
    q = r if timing == "late" else 1.0 - r
    x = tc.quantile(q) if isinstance(tc, SortedTimes) else float(np.quantile(tc, q))
    return max(0.0, x - t_p)


#: queued requests a LoRA lookahead scans per adapter it may load (the simulator's and the
#: HermesLet's): the first few requests hold the next distinct adapters, unless a run sends
#: many requests of one adapter: then fewer are fetched ahead
LOOKAHEAD_SCAN = 4


#: ``head(n)``: the adapters of a queue's next ``n`` requests in admission order (``None``: a
#: request without one)
QueueHead = Callable[[int], Iterable[str | None]]


def head_adapters(
    head: QueueHead, running: Collection[str], slots: int, *, scan: int = LOOKAHEAD_SCAN
) -> list[str]:
    """The LoRA adapters to have loaded for the head of a queue (Hermes' queue lookahead).

    A queued request needs its adapter at its *admission*, and the order of admissions is the
    queue's key order, which the scheduler sets. Under load many more distinct adapters wait
    than an engine keeps loaded, so fetching each one when its request is queued (``epwq``)
    evicts the adapters of earlier requests before they are admitted. Instead, keep loaded
    the adapters of the next requests in admission order, as many distinct ones as the host
    cache holds beside those of running requests: ``head`` lists the queued requests' adapters
    in admission order (asked for ``scan`` requests per free slot), ``running`` the adapters of
    running requests, ``slots`` the adapters the engine keeps loaded (vLLM's
    ``max_cpu_loras``). Returns at most ``slots - len(running)`` distinct adapters, none of
    them running, in admission order (the first is needed first)."""
    room = slots - len(running)
    out: list[str] = []
    if room <= 0:
        return out
    for a in head(scan * room):
        if a and a not in running and a not in out:
            out.append(a)
            if len(out) >= room:
                break
    return out


def lookahead_full(adapter: str, head: Sequence[str], running: Collection[str],
                   slots: int) -> bool:
    """Whether a planned (next-unit) load of ``adapter`` should wait for the queue
    lookahead: the head of the queue (``head``, from :func:`head_adapters`) already fills the
    slots beside the running adapters, so the next unit's request will queue behind those
    requests, and loading its adapter now would evict one that is needed sooner. The lookahead
    loads it when its request nears the head."""
    return adapter not in head and len(head) >= slots - len(running)


class WarmupLearner:
    """Warm-up time per resource: EWMA of observations, seeded per kind."""

    def __init__(self, defaults: dict[str, float] | None = None, alpha: float = 0.3) -> None:
        self.defaults = dict(DEFAULT_WARMUP_S)
        if defaults:
            self.defaults.update(defaults)
        self.alpha = alpha
        self._est: dict[str, float] = {}
        self.observations = 0

    def estimate(self, resource: str) -> float:
        got = self._est.get(resource)
        if got is not None:
            return got
        return self.defaults.get(resource_kind(resource), 1.0)

    def observe(self, resource: str, seconds: float) -> None:
        """A warm-up of ``resource`` took ``seconds`` (measured by a prewarmer or the engine)."""
        if seconds < 0:
            raise ValueError(f"warm-up time of {resource!r} must be >= 0, got {seconds}")
        self.observations += 1
        old = self._est.get(resource)
        self._est[resource] = seconds if old is None else old + self.alpha * (seconds - old)


PrewarmStateName = Literal["pending", "started", "used", "cancelled", "released"]


@dataclass(slots=True)
class Prewarm:
    """One planned prewarm of one resource for one (run, next unit)."""

    pid: int
    run_id: str
    unit: str  # the next unit it is for
    resource: str
    p_s: float
    planned_at: float
    start_at: float
    t_p: float
    state: PrewarmStateName = "pending"
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def ready_at(self) -> float | None:
        return None if self.started_at is None else self.started_at + self.t_p


@dataclass(frozen=True, slots=True)
class PrewarmAction:
    """A decision for the driver: ``start`` warming ``resource`` now, or ``release`` it."""

    action: Literal["start", "release"]
    resource: str
    run_id: str
    unit: str
    pid: int
    used: bool = False  # release only: whether the warm backend served its unit
    prefetch: bool = False  # start only: for a request already queued (epwq), not planned


@dataclass(slots=True)
class PrewarmStats:
    """Counters a driver exports (``stats()`` is a flat dict for metrics)."""

    planned: int = 0
    prefetched: int = 0  # fetched for a request already queued (epwq; not planned ahead)
    started: int = 0
    used: int = 0  # started, and its branch was taken
    late: int = 0  # planned, branch taken before the planned start (not started)
    cancelled: int = 0  # started, branch not taken: released (wasted)
    dropped: int = 0  # planned, branch not taken before the start: nothing spent
    deferred: int = 0  # due, but the driver left it to the queue lookahead: nothing spent
    released_idle: int = 0  # started, neither used nor cancelled within the idle timeout
    wasted_backend_s: float = 0.0
    idle_backend_s: float = 0.0  # part of wasted_backend_s: used prewarms warm before needed

    @property
    def wasted(self) -> int:
        return self.cancelled + self.released_idle

    def as_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["wasted"] = self.wasted
        return d


EstimatorLookup = Callable[[str], object | None]  # app -> DemandEstimator (or None)
GraphLookup = Callable[[str], PDGraph | None]


class PrewarmStrategy(ABC):
    """Base of every prewarm strategy: K resolution, bookkeeping, resolution of branches.

    Driver calls (each takes ``now``): :meth:`on_unit_start` when a unit of a run starts,
    :meth:`on_enqueue` when a request of a unit waits in a queue, :meth:`on_run_finish`,
    :meth:`due` at (or after) :meth:`next_due`. Each returns the actions to carry out.
    """

    name: ClassVar[str]
    #: whether the driver keeps backends warm after use (prefix cache, idle containers)
    caches: ClassVar[bool] = True
    #: whether queued requests' resources are fetched on enqueue (epwq)
    prefetch_queued: ClassVar[bool] = False
    #: whether the planner prewarms predicted next units
    plans: ClassVar[bool] = False
    #: whether queued requests' LoRA adapters are loaded in admission order, for the head of
    #: the queue (:func:`head_adapters`), instead of on enqueue
    lookahead: ClassVar[bool] = False

    def __init__(
        self,
        *,
        k: float = DEFAULT_K,
        k_by_app: dict[str, float] | None = None,
        k_by_tenant: dict[str, float] | None = None,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        resources: ResourcesFn = default_resources,
        learner: WarmupLearner | None = None,
        graphs: GraphLookup | None = None,
        estimators: EstimatorLookup | None = None,
        n_walks: int = 200,
        timing: str = DEFAULT_TIMING,
    ) -> None:
        if timing not in TIMINGS:
            raise ValueError(f"prewarm timing must be one of {', '.join(TIMINGS)}, not {timing!r}")
        for where, v in [("k", k), *(("k_by_app." + a, x) for a, x in (k_by_app or {}).items()),
                         *(("k_by_tenant." + t, x) for t, x in (k_by_tenant or {}).items())]:
            _check_k(v, where)
        self.k = k
        self.k_by_app = dict(k_by_app or {})
        self.k_by_tenant = dict(k_by_tenant or {})
        self.k_default: dict[str, float] = {}  # {"": k} overrides ``k`` (live knob setting)
        self.idle_timeout_s = idle_timeout_s
        self.resources = resources
        self.learner = learner or WarmupLearner()
        self.graphs = graphs
        self.estimators = estimators
        self.n_walks = n_walks
        self.timing = timing
        self.counters = PrewarmStats()
        self.by_type: dict[str, PrewarmStats] = {}  # the same counters per backend type
        # wall seconds per isolated service second of LLM units (queueing and batching under
        # load), learned from finished units: the estimator's t_c is in service seconds
        self.stretch = 1.0
        self.stretch_alpha = 0.1
        self._ids = itertools.count(1)
        self._by_run: dict[str, list[Prewarm]] = {}
        self._pending: dict[int, Prewarm] = {}  # not started yet
        self._live: dict[int, Prewarm] = {}  # started, unresolved
        #: when each pending prewarm starts and each live one times out, as heaps of
        #: (time, order, pid): :meth:`due` and :meth:`next_due` run at every unit start, and a
        #: scan of every outstanding prewarm there cost a request time in proportion to the
        #: traffic of the last idle timeout. Entries of prewarms ended meanwhile are skipped
        #: when they surface (and dropped in bulk when they outnumber the live ones).
        #: ``order`` is the insertion order into ``_pending`` / ``_live``, the order the scan
        #: reported them in, so the actions come out exactly as before.
        self._pending_at: list[tuple[float, int, int]] = []
        self._live_at: list[tuple[float, int, int]] = []
        self._order = itertools.count()
        #: (app, unit) -> (weak reference to the graph version it was computed on, median
        #: client gap before the unit): planning asks at every unit start, and a median of
        #: the unit's gap samples (up to 1000) per ask was a cost per request. One entry per
        #: app and unit, and no strong reference: keeping the graph in it kept every version
        #: an app was ever planned with alive (+2 MiB per 1,000 agent requests of 50 apps)
        self._gap_median: dict[tuple[str, str], tuple[weakref.ref[Any], float]] = {}

    # ------------------------------------------------------------------ K
    def k_for(self, run: RunState) -> float:
        """K of a run: per request, then per tenant, then per app, then the default
        (``k_default[""]`` when set, e.g. by ``hermes knob set``, else ``k``); the same order
        as :func:`hermes.core.policy_switch.resolve_k`."""
        knobs = {"tenant": self.k_by_tenant, "app": self.k_by_app, "default": self.k_default}
        return resolve_k(knobs, self.k, app=run.app, tenant=run.tenant, run_k=run.k)

    # ------------------------------------------------------------------ driver calls
    def on_unit_start(
        self, run: RunState, unit: str, backend: str, now: float, warm: WarmView
    ) -> list[PrewarmAction]:
        """``unit`` of ``run`` starts: resolve the run's prewarms (used / cancelled), then plan
        for the units that may follow."""
        out = self._resolve(run.run_id, unit, now)
        self._learn_stretch(run)
        if self.plans:
            self._plan(run, unit, now, warm)
            out.extend(self.due(now))
        return out

    def on_enqueue(
        self, run: RunState, unit: str, backend: str, now: float, warm: WarmView
    ) -> list[PrewarmAction]:
        """A request of ``unit`` waits in a queue: fetch its cold resources (epwq)."""
        if not self.prefetch_queued:
            return []
        out = []
        for res in self.resources(run, run.app, unit, backend):
            if warm.is_warm(res, now) or (self.lookahead and resource_kind(res) == "lora"):
                continue
            self._bump(res, "prefetched", 1)  # serves a request already waiting: never wasted
            out.append(PrewarmAction("start", res, run.run_id, unit, 0, prefetch=True))
        return out

    def on_run_finish(self, run: RunState, now: float) -> list[PrewarmAction]:
        """The run ended: whatever it still had planned is not needed."""
        return self._resolve(run.run_id, None, now)

    def due(self, now: float) -> list[PrewarmAction]:
        """Prewarms whose start time has come (``start``) and started ones idle past the
        timeout (``release``)."""
        out: list[PrewarmAction] = []
        starting = sorted(self._pop_due(self._pending_at, self._pending, now + 1e-12))
        for _, pid in starting:
            pw = self._pending.pop(pid)
            pw.state = "started"
            pw.started_at = now
            self._live[pid] = pw
            self._push_live(pw)
            self._bump(pw.resource, "started", 1)
            out.append(PrewarmAction("start", pw.resource, pw.run_id, pw.unit, pid))
        releasing = []
        for order, pid in self._pop_due(self._live_at, self._live, now + 1e-9):
            pw = self._live[pid]
            ready = pw.ready_at or now
            if now >= ready + self.idle_timeout_s - 1e-9:  # same sum as next_due
                releasing.append((order, pid))
            else:  # ready_at == 0.0 reads as "now" here: not due, as the scan had it
                heapq.heappush(self._live_at, (self._live_deadline(pw), order, pid))
        for _, pid in sorted(releasing):
            pw = self._live[pid]
            self._end(pw, "released", now)
            self._bump(pw.resource, "released_idle", 1)
            out.append(PrewarmAction("release", pw.resource, pw.run_id, pw.unit, pid))
        return out

    def next_due(self) -> float | None:
        """When :meth:`due` next has something to do (``None``: nothing planned)."""
        times = []
        for heap, table in ((self._pending_at, self._pending), (self._live_at, self._live)):
            while heap and heap[0][2] not in table:
                heapq.heappop(heap)
            if heap:
                times.append(heap[0][0])
        return min(times) if times else None

    def _live_deadline(self, pw: Prewarm) -> float:
        return (pw.ready_at or 0.0) + self.idle_timeout_s

    def _push_live(self, pw: Prewarm) -> None:
        heapq.heappush(self._live_at, (self._live_deadline(pw), next(self._order), pw.pid))
        self._compact(self._live_at, self._live)

    def _push_pending(self, pw: Prewarm) -> None:
        self._pending[pw.pid] = pw
        heapq.heappush(self._pending_at, (pw.start_at, next(self._order), pw.pid))
        self._compact(self._pending_at, self._pending)

    @staticmethod
    def _pop_due(heap: list[tuple[float, int, int]], table: dict[int, Prewarm],
                 until: float) -> list[tuple[int, int]]:
        """(order, pid) of the entries of ``table`` due by ``until``, taken off ``heap``
        (entries of prewarms no longer in ``table`` are dropped on the way)."""
        out = []
        while heap and heap[0][0] <= until:
            _, order, pid = heapq.heappop(heap)
            if pid in table:
                out.append((order, pid))
        return out

    @staticmethod
    def _compact(heap: list[tuple[float, int, int]], table: dict[int, Prewarm]) -> None:
        """Drop the entries of ended prewarms once they are most of ``heap``."""
        if len(heap) > 64 and len(heap) > 4 * len(table):
            heap[:] = [e for e in heap if e[2] in table]
            heapq.heapify(heap)

    def defer(self, pid: int, now: float) -> None:
        """The driver did not carry out the start of prewarm ``pid`` (an adapter left to the
        queue lookahead, :func:`lookahead_full`): it ends unstarted, costs nothing, and its
        unit is served by the lookahead."""
        pw = self._live.get(pid)
        if pw is None:
            return
        self._bump(pw.resource, "started", -1)
        self._bump(pw.resource, "deferred", 1)
        pw.started_at = None
        self._end(pw, "cancelled", now)

    def observe_warmup(self, resource: str, seconds: float) -> None:
        self.learner.observe(resource, seconds)

    def stats(self) -> dict[str, float]:
        """Flat counters: planned, started, used, late, cancelled, dropped, deferred,
        released_idle, wasted, wasted_backend_s, idle_backend_s."""
        return self.counters.as_dict()

    def stats_by_type(self) -> dict[str, dict[str, float]]:
        """The same counters per backend type (``docker``, ``lora``, ``kv``, ``dnn``)."""
        return {kind: c.as_dict() for kind, c in self.by_type.items()}

    def _bump(self, resource: str, field: str, amount: float = 1) -> None:
        kind = resource.partition(":")[0]  # resource_kind
        by = self.by_type.get(kind)
        if by is None:  # (not a setdefault: that built a PrewarmStats per count)
            by = self.by_type[kind] = PrewarmStats()
        for c in (self.counters, by):
            setattr(c, field, getattr(c, field) + amount)

    def outstanding(self, run_id: str) -> list[Prewarm]:
        return [p for p in self._by_run.get(run_id, []) if p.state in ("pending", "started")]

    # ------------------------------------------------------------------ internals
    def _learn_stretch(self, run: RunState) -> None:
        fin = run.progress.finished
        if not fin:
            return
        last = fin[-1]
        if last.input_tokens > 0 and last.service_s > 0 and last.duration_s > 0:
            ratio = min(100.0, max(1.0, last.duration_s / last.service_s))
            self.stretch += self.stretch_alpha * (ratio - self.stretch)

    def _new(self, run_id: str, unit: str, res: str, p_s: float, now: float, at: float) -> Prewarm:
        pw = Prewarm(next(self._ids), run_id, unit, res, p_s, now, at, self.learner.estimate(res))
        self._by_run.setdefault(run_id, []).append(pw)
        return pw

    def _end(self, pw: Prewarm, state: PrewarmStateName, now: float) -> None:
        self._live.pop(pw.pid, None)
        self._pending.pop(pw.pid, None)
        pw.state = state
        pw.ended_at = now
        if pw.started_at is not None:
            if state == "used":
                idle = max(0.0, now - (pw.ready_at or now))
                self._bump(pw.resource, "idle_backend_s", idle)
                self._bump(pw.resource, "wasted_backend_s", idle)
            else:
                self._bump(pw.resource, "wasted_backend_s", now - pw.started_at)

    def _resolve(self, run_id: str, unit: str | None, now: float) -> list[PrewarmAction]:
        out: list[PrewarmAction] = []
        for pw in self._by_run.pop(run_id, []):
            if pw.state == "pending":
                if pw.unit == unit:
                    self._bump(pw.resource, "late", 1)
                else:
                    self._bump(pw.resource, "dropped", 1)
                self._end(pw, "cancelled", now)
            elif pw.state == "started":
                if pw.unit == unit:
                    self._end(pw, "used", now)
                    self._bump(pw.resource, "used", 1)
                    out.append(PrewarmAction("release", pw.resource, run_id, pw.unit, pw.pid,
                                             used=True))
                else:
                    self._end(pw, "cancelled", now)
                    self._bump(pw.resource, "cancelled", 1)
                    out.append(PrewarmAction("release", pw.resource, run_id, pw.unit, pw.pid))
        return out

    def _plan(self, run: RunState, unit: str, now: float, warm: WarmView) -> None:
        graph = self.graphs(run.app) if self.graphs else None
        if graph is None or unit not in graph.units:
            return
        k = self.k_for(run)
        visit = run.progress.visits(unit) + 1
        probs = graph.next_probs(unit, visit)
        tc: SortedTimes | None = None
        for nxt, p_s in probs.items():
            if nxt == END or p_s < k or p_s <= 0.0:
                continue
            node = graph.units[nxt]
            # a cached prefix or adapter that is warm now may be evicted before the unit
            # needs it: it is planned like a cold one, and at t_s it is held if still warm,
            # re-warmed if not (holding it from now on would tie up cache for the whole t_c)
            cold = [
                r
                for r in self.resources(run, run.app, nxt, node.backend)
                if resource_kind(r) in HOLDABLE or not warm.is_warm(r, now)
            ]
            if not cold:
                continue
            if tc is None:
                # only an LLM unit's requests queue and batch at an engine: the stretch
                # (learned from LLM units) does not apply to a tool call's duration
                stretch = self.stretch if graph.units[unit].is_llm else 1.0
                tc = SortedTimes(self._sorted_completion_samples(run, unit), scale=stretch)
            t = SortedTimes(tc.sorted_s, tc.scale, self._median_gap(graph, nxt))
            for res in cold:
                off = start_offset(t, p_s, k, self.learner.estimate(res), self.timing)
                if off is None:
                    continue
                pw = self._new(run.run_id, nxt, res, p_s, now, now + off)
                self._push_pending(pw)
                self._bump(res, "planned", 1)

    def _median_gap(self, graph: Any, unit: str) -> float:
        """Median client gap before ``unit`` in ``graph`` (0 without samples), memoized per
        graph version (the latest version per app and unit, at most 4096 kept)."""
        key = (str(getattr(graph, "app", "")), unit)
        hit = self._gap_median.get(key)
        if hit is not None and hit[0]() is graph:
            return hit[1]
        gap = np.asarray(graph.units[unit].consumption.gap_s, dtype=float)
        value = float(np.median(gap)) if gap.size else 0.0
        if len(self._gap_median) >= 4096 and key not in self._gap_median:
            self._gap_median.clear()
        self._gap_median[key] = (weakref.ref(graph), value)
        return value

    def _sorted_completion_samples(self, run: RunState, unit: str) -> np.ndarray:
        """Samples of the current unit's remaining time (estimator), sorted, or an empty
        array. Samples that several runs share (the live gateway's sample cache) carry their
        sorted copy (``sorted_current``), so that it is sorted once, not per unit start."""
        est = self.estimators(run.app) if self.estimators else None
        if est is None:
            return np.empty(0)
        prog = run.progress
        if prog.current != unit:  # (a driver that has not set the running unit yet)
            prog = RunProgress(finished=prog.finished, current=unit,
                               current_attained_s=prog.current_attained_s)
        s = est.sample(prog, n=self.n_walks)  # type: ignore[attr-defined]
        if s.current_s is None:
            return np.empty(0)
        shared = getattr(s, "sorted_current", None)
        return shared() if shared is not None else np.sort(s.current_s)


def _check_k(v: float, where: str) -> None:
    if not isinstance(v, int | float) or not 0.0 <= float(v) <= 1.0:
        raise ValueError(f"prewarm knob {where} must be a number in [0, 1], got {v!r}")


class HermesPrewarm(PrewarmStrategy):
    """The PDGraph planner with the K knob (module docstring), plus prefetch on enqueue
    (LoRA adapters: for the head of the queue, :func:`head_adapters`)."""

    name = "hermes"
    plans = True
    prefetch_queued = True
    lookahead = True


class LRUPrewarm(PrewarmStrategy):
    """Reactive caching: no prewarm; warm backends stay until evicted (LRU) or idle."""

    name = "lru"


class EPWQPrewarm(PrewarmStrategy):
    """Prefetch only for requests already in a waiting queue."""

    name = "epwq"
    prefetch_queued = True


class NoPrewarm(PrewarmStrategy):
    """No prewarm and no prefix caching (a lower bound)."""

    name = "none"
    caches = False


_STRATEGIES: dict[str, type[PrewarmStrategy]] = {
    c.name: c for c in (HermesPrewarm, LRUPrewarm, EPWQPrewarm, NoPrewarm)
}


def prewarm_names() -> list[str]:
    return list(_STRATEGIES)


def make_prewarm(name: str, **kw: object) -> PrewarmStrategy:
    """Build the prewarm strategy ``name`` (``hermes``, ``lru``, ``epwq``, ``none``)."""
    try:
        cls = _STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"unknown prewarm strategy {name!r}; known: {', '.join(_STRATEGIES)}"
        ) from None
    return cls(**kw)  # type: ignore[arg-type]


@dataclass(slots=True)
class WarmSet:
    """A simple :class:`WarmView`: a set of warm resources (tests, live nodes' reports)."""

    warm: set[str] = field(default_factory=set)

    def is_warm(self, resource: str, now: float) -> bool:
        return resource in self.warm

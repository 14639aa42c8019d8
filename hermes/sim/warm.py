"""Backend warm state in the simulator: the prewarm strategy driven in virtual time.

:class:`SimWarmState` owns, per engine, a KV prefix cache and LoRA
slots (:class:`LoraSlots`), uses the simulator's tool pool for containers and DNN models, and
carries out the decisions of a :class:`~hermes.core.prewarm.PrewarmStrategy`. The prefix cache
is the engine's one KV block pool (:class:`BlockPoolPrefixCache`): its capacity, from the
cache size, is the engine's KV capacity, for every strategy.

- ``start kv:...`` planned (hermes): submit a prefill-only request (the prefix, one output
  token), queued at the engine like the run's own request for that unit would be (the policy's
  key): it costs engine time like any request, is a one-token refresh when the prefix is still
  cached, and its hold on the prefix starts when it is admitted; for a queued request
  (epwq, hermes): swap the prefix in from host memory if it is there;
- ``start lora:...``: load the adapter into a GPU slot in the background;
- LoRA lookahead (``strategy.lookahead``, hermes): on every enqueue and admission, the
  adapters of the engine's next requests in admission order are loaded
  (:func:`~hermes.core.prewarm.head_adapters`), in place of the epwq fetch on enqueue; a
  planned adapter prewarm is deferred to it (not started) when the head already fills the
  host slots (:func:`~hermes.core.prewarm.lookahead_full`);
- ``start docker:...`` / ``dnn:...``: start a tool instance (its cold start);
- ``release``: unpin the prefix, or shut down an unused prewarmed tool instance. The release of
  a *used* prefix or adapter (its unit started) is handed over to the unit's request: the hold
  lasts until that request is admitted by the engine (or the run ends), since a unit's request
  can wait in the engine's queue for a long time and the hold exists for it.

With LoRA slots configured, each engine enforces vLLM's batch rule (at most ``max_loras``
distinct adapters running; :class:`~hermes.core.engine_model.EngineModel`), and the slots know
which adapters the engine's running and queued requests use, so that no load evicts them.

The simulator calls :meth:`on_unit_start`, :meth:`on_request`, :meth:`on_enqueue`,
:meth:`on_run_finish` and :meth:`due` (at the wake-ups it is asked for); the engines call
:meth:`on_admit` through their admission hook.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hermes.core.backend import BackendSpec
from hermes.core.costmodel import CostModel
from hermes.core.engine_model import EngineModel, EngineRequest, pick_engine
from hermes.core.prewarm import (
    PrewarmAction,
    PrewarmStrategy,
    head_adapters,
    lookahead_full,
)
from hermes.core.state import RunState
from hermes.core.tools_model import ToolPool
from hermes.core.warm_models import (
    UNCOUNTED,
    BlockPoolPrefixCache,
    LoraSlots,
    gb_to_tokens,
)
from hermes.workloads.base import LLMCall, Step

if TYPE_CHECKING:
    from hermes.sim.simulator import Simulator

#: (run, step) -> LoRA adapter name of an LLM step, or None
AdapterFn = Callable[[RunState, str, str], "str | None"]

PREWARM_RUN = "prewarm"  # run id of the prefill-only requests a prewarm submits


class SimWarmState:
    """Warm state of every backend of one simulation (see the module docstring)."""

    def __init__(
        self,
        strategy: PrewarmStrategy,
        cost: CostModel,
        *,
        n_engines: int = 1,
        cache_gb: float | None = None,
        cpu_cache_gb: float = 0.0,
        swap_bytes_per_s: float = 16e9,
        max_loras: int | None = None,
        max_cpu_loras: int | None = None,
        lora_disk_load_s: float = 0.25,
        lora_cpu_load_s: float = 0.02,
        adapter: AdapterFn | None = None,
        max_held_fraction: float = 0.25,
    ) -> None:
        self.strategy = strategy
        strategy.resources = self.resources
        self.cost = cost
        self.adapter = adapter
        self.caches: list[BlockPoolPrefixCache | None] = []
        self.loras: list[LoraSlots | None] = []
        for _ in range(n_engines):
            if cache_gb is None:
                self.caches.append(None)
            else:
                self.caches.append(
                    BlockPoolPrefixCache(
                        gb_to_tokens(cache_gb, cost.kv_bytes_per_token),
                        max_held_fraction=max_held_fraction,
                        cpu_capacity_tokens=gb_to_tokens(cpu_cache_gb, cost.kv_bytes_per_token),
                        kv_bytes_per_token=cost.kv_bytes_per_token,
                        swap_bytes_per_s=swap_bytes_per_s,
                        enabled=strategy.caches,
                    )
                )
            if max_loras is None:
                self.loras.append(None)
            else:
                self.loras.append(
                    LoraSlots(max_loras, max_cpu_loras or max_loras, disk_load_s=lora_disk_load_s,
                              cpu_load_s=lora_cpu_load_s)
                )
        self.sim: Simulator | None = None
        self.tools: ToolPool | None = None
        self._wake: float | None = None
        self._prefill_seq = 0
        self._prefix_tokens: dict[str, int] = {}
        self._held: dict[int, int] = {}  # prewarm id -> engine index holding its resource
        # kv: prefill-only request id -> prewarm id (its hold starts when it is admitted), and
        # the prewarms whose prefix is pinned
        self._kv_requests: dict[str, int] = {}
        self._kv_waiting: dict[int, tuple[int, str]] = {}  # pid -> (engine, request) queued
        self._kv_pinned: set[int] = set()
        self.prewarm_prefill_tokens = 0
        self.prewarm_dequeued = 0  # KV prewarm requests taken out of the queue unused
        # holds of used prewarms, until the unit's request is admitted: (run, kind, name) ->
        # engine indices
        self._handover: dict[tuple[str, str, str], list[int]] = {}

    # ------------------------------------------------------------------ wiring
    def bind(self, sim: Simulator) -> None:
        self.sim = sim
        self.tools = sim.tools
        for i, eng in enumerate(sim.engines):
            eng.prefix_cache = self.caches[i]
            eng.admission_hook = self
            cache = self.caches[i]
            if cache is not None:
                cache.engine_tokens = self._kv_used_view(eng)
            slots = self.loras[i]
            if slots is not None:
                eng.max_loras = slots.max_loras
                slots.running = self._counter_view(eng, "running_loras")
                slots.queued = self._counter_view(eng, "waiting_loras")

    @staticmethod
    def _counter_view(eng: EngineModel, attr: str) -> Callable[[str], bool]:
        # the engine may replace the counter (truncate): look it up on each call
        return lambda name: name in getattr(eng, attr)

    @staticmethod
    def _kv_used_view(eng: EngineModel) -> Callable[[], int]:
        return lambda: eng.kv_used

    def _engines(self) -> list[EngineModel]:
        assert self.sim is not None
        return self.sim.engines

    # ------------------------------------------------------------------ names
    def prefix_name(self, model: str, tenant: str, prefix: str) -> str:
        """Prompt prefixes are per model and tenant (the tenant is the app unless the
        workload deploys an app for several tenants, each with its own prompts)."""
        return f"{model}/{tenant}/{prefix}"

    def resources(self, run: RunState | None, app: str, unit: str, backend: str) -> list[str]:
        """The strategy's resource mapping for the simulator: the tenant's adapter, and the
        unit's prompt prefix only when its prefix length is known (it has run once)."""
        spec = BackendSpec.parse(backend)
        if spec.kind in ("docker", "dnn"):
            return [f"{spec.kind}:{spec.name}"]
        if spec.kind != "llm":
            return []
        out = []
        lora = self.adapter(run, app, unit) if (self.adapter and run is not None) else spec.lora
        if lora and self.loras[0] is not None:
            out.append(f"lora:{lora}")
        if self.caches[0] is not None:
            tenant = run.tenant if run is not None else app
            out.append(f"kv:{self.prefix_name(spec.name, tenant, unit)}")
        return out

    # ------------------------------------------------------------------ WarmView
    def is_warm(self, resource: str, now: float) -> bool:
        kind, _, name = resource.partition(":")
        if kind == "kv":
            if name not in self._prefix_tokens:
                return True  # never seen: nothing known to warm
            return any(c is None or c.is_warm(name) for c in self.caches)
        if kind == "lora":
            return any(s is None or s.is_warm(name) for s in self.loras)
        if kind in ("docker", "dnn"):
            assert self.tools is not None
            return self.tools.server(resource).is_warm(now)
        return True

    # ------------------------------------------------------------------ simulator hooks
    def on_request(self, run: RunState, step: Step, call: LLMCall, req: EngineRequest) -> None:
        """Name the request's prefix per model and app, and give it its adapter."""
        spec = BackendSpec.parse(step.backend)
        if req.prefix:
            req.prefix = self.prefix_name(spec.name, run.tenant, req.prefix)
            self._prefix_tokens[req.prefix] = req.prefix_tokens
        req.lora = self.adapter(run, run.app, step.unit) if self.adapter else spec.lora

    def on_unit_start(self, run: RunState, step: Step, now: float) -> None:
        self._apply(self.strategy.on_unit_start(run, step.unit, step.backend, now, self), now)

    def on_enqueue(self, run: RunState, step: Step, now: float) -> None:
        self._apply(self.strategy.on_enqueue(run, step.unit, step.backend, now, self), now)
        if self.strategy.lookahead:
            for ei, slots in enumerate(self.loras):
                if slots is not None:
                    self._lookahead(ei, slots, now)

    def on_run_finish(self, run: RunState, now: float) -> None:
        self._apply(self.strategy.on_run_finish(run, now), now)
        for key in [k for k in self._handover if k[0] == run.run_id]:
            self._unhold(key[1], key[2], self._handover.pop(key))

    def due(self, now: float) -> None:
        self._wake = None
        self._apply(self.strategy.due(now), now)

    def on_admit(self, req: EngineRequest, now: float) -> float:
        """Engine admission hook: synchronous LoRA load and prefix swap-in stalls."""
        stall = 0.0
        ei = self._engine_index(req)
        cache = self.caches[ei]
        if cache is not None:
            stall += cache.take_stall_s()
        slots = self.loras[ei]
        if slots is not None and req.lora:
            stall += slots.admit(req.lora, now)
        if slots is not None and self.strategy.lookahead:
            self._lookahead(ei, slots, now)
        if req.run_id == PREWARM_RUN:
            # engine work a prewarm adds: the prompt tokens its request computes
            self.prewarm_prefill_tokens += req.input_tokens - req.computed
            pid = self._kv_requests.pop(req.request_id, None)
            if pid is not None:
                self._kv_waiting.pop(pid, None)
            if pid is not None and pid in self._held and cache is not None and req.prefix:
                cache.pin(req.prefix.removeprefix(UNCOUNTED))  # found cached, or computed now
                self._kv_pinned.add(pid)
            return stall
        if self._handover:
            for kind, name in (("kv", req.prefix), ("lora", req.lora)):
                held = self._handover.pop((req.run_id, kind, name or ""), None)
                if held:
                    self._unhold(kind, name or "", held)
        return stall

    def _lookahead(self, ei: int, slots: LoraSlots, now: float) -> None:
        """Load the adapters of the engine's next requests in admission order
        (:func:`~hermes.core.prewarm.head_adapters`) that are not loaded yet: into a free GPU
        slot, else into host memory."""
        for a in self._head(ei, slots):
            if a not in slots.cpu and a not in slots.gpu:
                slots.prefetch(a, now)

    def _head(self, ei: int, slots: LoraSlots) -> list[str]:
        eng = self._engines()[ei]
        if not eng.waiting_loras:
            return []
        return head_adapters(lambda n: (r.lora for r in eng.waiting.head(n)),
                             eng.running_loras, slots.max_cpu_loras)

    # ------------------------------------------------------------------ actions
    def _engine_index(self, req: EngineRequest) -> int:
        engines = self._engines()
        if len(engines) == 1:
            return 0
        for i, e in enumerate(engines):
            if req.request_id in e.requests:
                return i
        return 0

    def _apply(self, actions: list[PrewarmAction], now: float) -> None:
        for a in actions:
            if a.action == "start":
                self._start(a.resource, now, prefetch=a.prefetch, pid=a.pid, run_id=a.run_id,
                            unit=a.unit)
            else:
                self._release(a.resource, now, used=a.used, pid=a.pid, run_id=a.run_id)
        nxt = self.strategy.next_due()
        if nxt is not None and (self._wake is None or nxt < self._wake - 1e-12):
            assert self.sim is not None
            self._wake = max(nxt, now)
            self.sim.schedule_prewarm(self._wake)

    def _start(
        self, resource: str, now: float, *, prefetch: bool = False, pid: int = 0,
        run_id: str = "", unit: str = "",
    ) -> None:
        """Warm ``resource``; a planned prewarm (not a queued request's prefetch) also holds
        a prefix or adapter against eviction until it is released. A prefix cached nowhere is
        prefilled by a request queued at the engine like the run's own request for ``unit``
        would be (the scheduling policy's key; under ``vllm``, FCFS from now): a real engine
        does not let a prewarm jump its queue."""
        kind, _, name = resource.partition(":")
        if kind in ("docker", "dnn"):
            assert self.tools is not None
            srv = self.tools.server(resource)
            if srv.prewarm(now):
                self.strategy.observe_warmup(resource, srv.config.cold_start_s)
            return
        engines = self._engines()
        ei = engines.index(pick_engine(engines))
        if kind == "lora":
            slots = self.loras[ei]
            if slots is not None:
                if not prefetch and self.strategy.lookahead and lookahead_full(
                        name, self._head(ei, slots), engines[ei].running_loras,
                        slots.max_cpu_loras):
                    self.strategy.defer(pid, now)  # its request will queue behind the head
                    return
                if not prefetch:
                    slots.pin(name)
                    self._held[pid] = ei
                ready = slots.prefetch(name, now, planned=not prefetch)
                if ready is not None:
                    self.strategy.observe_warmup(resource, ready - now)
            return
        if kind == "kv":
            cache = self.caches[ei]
            if cache is None or not cache.enabled:
                return
            if prefetch:  # for a queued request: swap it in from host memory, if it is there
                if not cache.is_warm(name):
                    ready = cache.prefetch(name, now)
                    if ready is not None:
                        self.strategy.observe_warmup(resource, ready - now)
                return  # a queued request prefills its prefix itself
            # planned: a prefill-only request, whether the prefix is cached now or not (a live
            # gateway cannot see the engine's cache; a cached prefix makes it a cheap hit that
            # refreshes the prefix, an evicted one is recomputed, one in host memory swapped
            # in). The hold starts when the request is admitted, right before the unit's own.
            tokens = self._prefix_tokens.get(name, 0)
            if tokens <= 0:
                return
            assert self.sim is not None
            self._prefill_seq += 1
            req = EngineRequest(
                request_id=f"{PREWARM_RUN}/{self._prefill_seq}/0",
                run_id=PREWARM_RUN,
                input_tokens=tokens + 1,
                output_tokens=1,
                key=self.sim.prewarm_key(run_id, unit, now),
                prefix=UNCOUNTED + name,
                prefix_tokens=tokens,
            )
            engines[ei].add(req, now)
            self._held[pid] = ei
            self._kv_requests[req.request_id] = pid
            self._kv_waiting[pid] = (ei, req.request_id)
            self.strategy.observe_warmup(resource, self.cost.iteration_s(tokens, 0, 0))
            self.sim.prewarm_queue_changed(ei, now)

    def _release(
        self, resource: str, now: float, *, used: bool = False, pid: int = 0, run_id: str = ""
    ) -> None:
        """End a prewarm: unhold a prefix or adapter (a used one once its request is
        admitted); shut down an unused tool instance."""
        kind, _, name = resource.partition(":")
        if kind in ("docker", "dnn"):
            if not used:
                assert self.tools is not None
                self.tools.server(resource).release(now)
            return
        if kind == "kv":  # the handover names the prewarm: its hold may not have started
            waiting = self._kv_waiting.pop(pid, None)
            if waiting is not None and not used:  # a wrong branch: the HermesLet's way,
                ei, rid = waiting  # take its prefill request out of the queue (live: agent.py)
                eng = self._engines()[ei]
                if rid in eng.waiting and eng.abort(rid) is not None:
                    self.prewarm_dequeued += 1
                    self._kv_requests.pop(rid, None)
                    self._held.pop(pid, None)
                    assert self.sim is not None
                    self.sim.prewarm_queue_changed(ei, now)
                    return
            if pid not in self._held:
                return
            if used and run_id:
                self._handover.setdefault((run_id, kind, name), []).append(pid)
            else:
                self._unhold(kind, name, [pid])
            return
        ei = self._held.pop(pid, None)
        if ei is None:
            return
        if used and run_id:
            self._handover.setdefault((run_id, kind, name), []).append(ei)
            return
        self._unhold(kind, name, [ei])

    def _unhold(self, kind: str, name: str, held: list[int]) -> None:
        """End holds: ``held`` are prewarm ids (kv) or engine indices (lora)."""
        for h in held:
            if kind == "kv":
                ei = self._held.pop(h, None)
                if h in self._kv_pinned:
                    self._kv_pinned.discard(h)
                    if ei is not None and self.caches[ei] is not None:
                        self.caches[ei].release(name)  # type: ignore[union-attr]
            elif kind == "lora" and self.loras[h] is not None:
                self.loras[h].release(name)  # type: ignore[union-attr]

    # ------------------------------------------------------------------ results
    def stats(self) -> dict[str, float]:
        """Flat counters: the strategy's, and hit ratios of prefixes, adapters and tools."""
        out = {f"prewarm_{k}": v for k, v in self.strategy.stats().items()}
        for label, models in (("kv", self.caches), ("lora", self.loras)):
            ms = [m for m in models if m is not None]
            if not ms:
                continue
            look = sum(m.stats.lookups for m in ms)
            hits = sum(m.stats.hits for m in ms)
            out[f"{label}_lookups"] = look
            out[f"{label}_hits"] = hits
            out[f"{label}_hit_ratio"] = hits / look if look else 0.0
            out[f"{label}_warming_hits"] = sum(m.stats.warming_hits for m in ms)
            out[f"{label}_cpu_hits"] = sum(m.stats.cpu_hits for m in ms)
            # resident in GPU or host memory when admitted: nothing loaded from disk / computed
            out[f"{label}_resident_hit_ratio"] = (
                (hits + out[f"{label}_cpu_hits"]) / look if look else 0.0
            )
            out[f"{label}_stall_s"] = sum(m.stats.stall_s for m in ms)
            out[f"{label}_evictions"] = sum(m.stats.evictions for m in ms)
        caches = [c for c in self.caches if c is not None]
        if caches:
            out["kv_holds_dropped"] = sum(c.holds_dropped for c in caches)
            out["kv_pins_refused"] = sum(c.pins_refused for c in caches)
            out["kv_prewarm_prefill_tokens"] = self.prewarm_prefill_tokens
            out["kv_prewarm_dequeued"] = self.prewarm_dequeued
        if self.tools is not None:
            calls = sum(s.calls for s in self.tools.servers.values() if not s.backend.startswith("api:"))
            hits = sum(s.warm_hits for s in self.tools.servers.values() if not s.backend.startswith("api:"))
            out["tool_calls"] = calls
            out["tool_warm_hits"] = hits
            out["tool_hit_ratio"] = hits / calls if calls else 0.0
        return out

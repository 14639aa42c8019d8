"""Prewarmers on the HermesLet: warm backends ahead of use when the scheduler says so.

- :class:`ContainerPool` (Docker SDK): containers of an image created and started ahead of use
  (``prewarm``), each handed to exactly one tool call (single use: no state leaks between
  calls), removed afterwards; idle ones are reaped after ``idle_timeout_s``. Created with the
  same options as :class:`~hermeslet.tools.DockerSandbox`
  (:func:`~hermeslet.tools.sandbox_container_options`); a call past its timeout is killed
  with its container.
  :class:`PooledDockerSandbox` is the tool runner's Docker sandbox backed by the pool: a call
  that finds a warm container skips the create+start (``cold=False``).
- :class:`LoraPrewarmer`: runtime ``POST /v1/load_lora_adapter`` / ``unload_lora_adapter`` on
  a vLLM-compatible server, through the engine's adapter, keeping at most ``max_loras``
  adapters it loaded (LRU unload, never of an adapter in use: see
  :mod:`hermeslet.lora_lookahead`).
- :class:`KVPrefixPrewarmer`: a prefill-only request (``max_tokens: 1``) carrying the next
  unit's shared prompt prefix (its system message), sent through the engine's adapter (HTTP
  engines and the built-in one alike), so that the engine's prefix cache holds it.
- :class:`DnnHook`: load/unload callables of a DNN tool model, with the measured load time.

:class:`NodePrewarmer` routes the protocol's ``prewarm`` messages (``backend``, ``action``,
``params``) to them and counts started/used/wasted prewarms and wasted backend-seconds
(:meth:`NodePrewarmer.stats`, a flat dict for metrics). Every warm-up time it measures is
reported in the ack (``detail``), so the scheduler's planner learns ``t_p``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from hermes.core.prewarm import resource_model
from hermeslet.engines.base import EngineAdapter, EngineError
from hermeslet.tools import (
    DEFAULT_MAX_OUTPUT,
    BlockingDockerSandbox,
    CappedOutput,
    DockerCall,
    ToolLimits,
    ToolResult,
    docker_client,
    kill_container,
    sandbox_container_options,
)

if TYPE_CHECKING:
    from hermeslet.engines.openai_http import OpenAIHTTPEngine

IDLE_CMD = ["sleep", "86400"]

_E = TypeVar("_E", bound=EngineAdapter)


@dataclass(slots=True)
class PrewarmCounters:
    started: int = 0
    used: int = 0
    wasted: int = 0  # started and released/reaped without being used
    wasted_backend_s: float = 0.0
    cold_starts: int = 0  # calls that had to create+start a container themselves
    warm_hits: int = 0
    warmup_s_last: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(slots=True)
class _Warm:
    container: Any
    image: str
    started_at: float  # monotonic, when the prewarm began
    ready_at: float


class ContainerPool:
    """Warm, sandboxed, single-use containers per image (see the module docstring)."""

    def __init__(
        self,
        *,
        base_url: str | None = None,
        client: Any = None,
        limits: ToolLimits | None = None,
        idle_timeout_s: float = 120.0,
        max_per_image: int = 8,
        max_output_chars: int = DEFAULT_MAX_OUTPUT,
        label: str = "hermes-prewarm",
    ) -> None:
        self._base_url = base_url
        self._client = client
        self.limits = limits or ToolLimits()
        self.idle_timeout_s = idle_timeout_s
        self.max_per_image = max_per_image
        self.max_output_chars = max_output_chars
        self.label = label
        self.idle: dict[str, list[_Warm]] = {}
        self.counters = PrewarmCounters()

    def _docker(self) -> Any:
        if self._client is None:
            from hermes.extras import require

            require("docker")  # the `docker` extra
            self._client = docker_client(self._base_url)
        return self._client

    def _create_started(self, image: str) -> Any:
        c = self._docker().containers.create(
            image, IDLE_CMD, labels={self.label: "1"}, detach=True,
            **sandbox_container_options(self.limits),
        )
        c.start()
        return c

    # ------------------------------------------------------------------ blocking API
    def prewarm(self, image: str) -> float:
        """Create and start one container of ``image``; returns the measured warm-up seconds."""
        if len(self.idle.get(image, [])) >= self.max_per_image:
            return 0.0
        t0 = time.monotonic()
        c = self._create_started(image)
        t1 = time.monotonic()
        self.idle.setdefault(image, []).append(_Warm(c, image, t0, t1))
        self.counters.started += 1
        self.counters.warmup_s_last = t1 - t0
        return t1 - t0

    def release(self, image: str) -> bool:
        """Remove one idle prewarmed container (its prewarm was not needed)."""
        lst = self.idle.get(image)
        if not lst:
            return False
        w = lst.pop()
        self._waste(w, time.monotonic())
        _remove(w.container)
        return True

    def reap(self, now: float | None = None) -> int:
        """Remove containers idle longer than ``idle_timeout_s``; returns how many."""
        now = time.monotonic() if now is None else now
        n = 0
        for image, lst in self.idle.items():
            keep = []
            for w in lst:
                if now - w.ready_at > self.idle_timeout_s:
                    self._waste(w, now)
                    _remove(w.container)
                    n += 1
                else:
                    keep.append(w)
            self.idle[image] = keep
        return n

    def close(self) -> None:
        for lst in self.idle.values():
            for w in lst:
                _remove(w.container)
        self.idle.clear()

    def _waste(self, w: _Warm, now: float) -> None:
        self.counters.wasted += 1
        self.counters.wasted_backend_s += now - w.started_at

    def run_blocking(self, argv: list[str], image: str, timeout_s: float,
                     call: DockerCall | None = None) -> ToolResult:
        """Run one call in a warm container of ``image`` (or a new one: cold), then remove it.
        A cancelled ``call`` kills the container (the exec in it ends at once)."""
        t0 = time.monotonic()
        lst = self.idle.get(image)
        cold = not lst
        if cold:
            c = self._create_started(image)
            self.counters.cold_starts += 1
        else:
            w = lst.pop(0)  # type: ignore[union-attr]
            c = w.container
            self.counters.used += 1
            self.counters.warm_hits += 1
        try:
            if call is not None and not call.attach(c):
                return ToolResult(exit_code=-9, stdout="", stderr="cancelled\n",
                                  duration_s=time.monotonic() - t0, cold=cold,
                                  timed_out=False)
            rc, out, err, timed_out = _exec(c, argv, timeout_s, self.max_output_chars)
            dt = time.monotonic() - t0  # the call's latency; removal is off its path
        finally:
            threading.Thread(target=_remove, args=(c,), daemon=True).start()
        return ToolResult(
            exit_code=rc,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=dt,
            cold=cold,
            timed_out=timed_out,
        )

    def stats(self) -> dict[str, float]:
        d = self.counters.as_dict()
        d["idle"] = sum(len(v) for v in self.idle.values())
        return d


def _exec(c: Any, argv: list[str], timeout_s: float, limit_chars: int
          ) -> tuple[int, CappedOutput, CappedOutput, bool]:
    """``docker exec`` with a timeout: on expiry the container is killed (and the exec ends).
    Output is streamed and cut at ``limit_chars`` per stream, never held whole."""
    box: dict[str, Any] = {}
    out, err = CappedOutput(limit_chars), CappedOutput(limit_chars)

    def target() -> None:
        try:
            api = c.client.api
            exec_id = api.exec_create(c.id, argv, user="65534:65534", workdir="/tmp")["Id"]
            for o, e in api.exec_start(exec_id, stream=True, demux=True):
                if o:
                    out.feed(o)
                if e:
                    err.feed(e)
            box["rc"] = api.exec_inspect(exec_id).get("ExitCode")
        except Exception as exc:  # the container was killed under it
            box["exc"] = exc

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        kill_container(c)
        th.join(5.0)
        err.feed(b"killed: timeout\n")
        return -9, out, err, True
    if "exc" in box:
        err.feed(str(box["exc"]).encode())
        return -1, out, err, False
    rc = box.get("rc")
    return int(rc if rc is not None else -1), out, err, False


def _remove(c: Any) -> None:
    try:
        c.remove(force=True)
    except Exception:
        pass


class PooledDockerSandbox(BlockingDockerSandbox):
    """The tool runner's Docker sandbox, served from a :class:`ContainerPool`."""

    def __init__(self, pool: ContainerPool, *, default_image: str = "python:3.10-slim") -> None:
        self.pool = pool
        self.default_image = default_image

    def run_blocking(self, argv: list[str], image: str, timeout_s: float,
                     call: DockerCall | None = None) -> ToolResult:
        return self.pool.run_blocking(argv, image, timeout_s, call)


@contextlib.asynccontextmanager
async def engine_adapter(engine: _E | str, *, name: str,
                         model: str | None = None) -> AsyncIterator[_E | OpenAIHTTPEngine]:
    """The engine adapter a prewarmer calls: ``engine`` itself, or, given only a server URL,
    an :class:`~hermeslet.engines.openai_http.OpenAIHTTPEngine` made for the call and closed
    after it."""
    if not isinstance(engine, str):
        yield engine
        return
    from hermeslet.engines.openai_http import OpenAIHTTPEngine

    eng = OpenAIHTTPEngine(engine, name=name, model=model)
    try:
        yield eng
    finally:
        await eng.close()


@dataclass(slots=True)
class LookaheadCounters:
    """What the LoRA queue lookahead (:mod:`hermeslet.lora_lookahead`) did, apart from the
    scheduler's prewarms (it is no prewarm: no used/wasted accounting)."""

    loads: int = 0  # adapters loaded ahead of their queued requests
    failed: int = 0  # loads that raised (logged; the request loads it itself, or fails)
    no_path: int = 0  # distinct adapters skipped: no path known (``--lora-path``)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class _AllInFlight(RuntimeError):
    """Every loaded adapter serves an in-flight request: a request's load must wait."""


class LoraPrewarmer:
    """Runtime LoRA loading on a vLLM-compatible server (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``).

    ``max_loras`` is the number of adapters it keeps loaded (vLLM's ``max_cpu_loras``). Loads
    are serialized (one at a time, so that the LRU bound holds), and an adapter in ``in_use``
    (set by the agent: adapters of in-flight requests, and of the queue's head when the
    lookahead is on) or in a load's ``keep`` is never unloaded to make room.

    Adapters with a known path (``paths``, ``--lora-path``) are *loadable*: the node serves
    them whether they are loaded now or not, and a request whose adapter is not loaded when it
    is released loads it first (:meth:`ensure`: a cold start, ``counters.cold_starts``; one
    that finds it loaded is a ``warm_hits``). An adapter loaded by a scheduler prewarm is
    ``used`` when a request first finds it, and ``wasted`` (with the seconds it sat loaded) when
    it is unloaded before that."""

    def __init__(self, engine: OpenAIHTTPEngine | str, *, max_loras: int = 8,
                 timeout_s: float = 30.0, paths: dict[str, str] | None = None) -> None:
        #: the engine's adapter (its ``load_lora``/``unload_lora`` keep ``engine.loras``
        #: current), or a server URL (an adapter is made for each load or unload)
        self.engine = engine.rstrip("/") if isinstance(engine, str) else engine
        self.max_loras = max_loras
        self.timeout_s = timeout_s
        self.paths = dict(paths or {})  # adapter name -> path on the engine's host
        self.loaded: OrderedDict[str, float] = OrderedDict()  # name -> load seconds
        self.counters = PrewarmCounters()
        self.lookahead = LookaheadCounters()
        #: adapters that must stay loaded: of in-flight requests and of the queue's head
        self.in_use: set[str] = set()
        #: of them, the in-flight requests' only (a request's own load may unload a head one)
        self.inflight: set[str] = set()
        self._prewarmed: dict[str, float] = {}  # loaded by a prewarm, not used yet -> when
        self._lock: asyncio.Lock | None = None  # created in the running loop
        self._freed: asyncio.Event | None = None  # set when in-flight adapters change

    def loadable(self, name: str) -> bool:
        """Whether this prewarmer can serve ``name``: loaded now, or its path is known."""
        return name in self.loaded or bool(self.paths.get(name))

    async def ensure(self, name: str) -> float:
        """A request with adapter ``name`` is about to be sent: load it if it is not loaded
        (waiting for a load of it already under way, and, while every loaded adapter serves
        an in-flight request, for one of those to finish, up to ``timeout_s``); returns the
        seconds the request waited (0.0: it was loaded)."""
        if name in self.loaded:
            self.loaded.move_to_end(name)
            self._hit(name)
            return 0.0
        t0 = time.monotonic()
        while True:
            try:
                await self.load(name, on_demand=True)
                return time.monotonic() - t0
            except _AllInFlight:
                left = self.timeout_s - (time.monotonic() - t0)
                if left <= 0:
                    raise
                if self._freed is None:
                    self._freed = asyncio.Event()
                self._freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._freed.wait(), left)

    def set_in_use(self, inflight: set[str], head: set[str]) -> None:
        """The adapters of in-flight requests and of the queue's head (the agent's view)."""
        if not inflight >= self.inflight and self._freed is not None:
            self._freed.set()  # an in-flight adapter was released: a waiting load may go
        self.inflight = inflight
        self.in_use = inflight | head

    def _hit(self, name: str) -> None:
        self.counters.warm_hits += 1
        if self._prewarmed.pop(name, None) is not None:
            self.counters.used += 1

    async def load(self, name: str, path: str | None = None, *, keep: Collection[str] = (),
                   lookahead: bool = False, on_demand: bool = False) -> float:
        """Load ``name`` (LRU-unloading one of ours beyond ``max_loras``, never one in ``keep``
        or :attr:`in_use`); returns seconds (0.0: already loaded). ``lookahead``: count it as
        a queue-lookahead load, ``on_demand``: as a request's own (cold) load, else as a
        prewarm."""
        if path:
            self.paths.setdefault(name, path)
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if name in self.loaded:
                self.loaded.move_to_end(name)
                if on_demand:
                    self._hit(name)
                return 0.0
            path = path or self.paths.get(name)
            if not path:
                raise ValueError(f"no path known for LoRA adapter {name!r}")
            async with engine_adapter(self.engine, name="lora-prewarm") as eng:
                while len(self.loaded) >= self.max_loras:
                    old = self._victim(name, keep, on_demand=on_demand)
                    self.loaded.pop(old)
                    self._unloaded(old)
                    with contextlib.suppress(EngineError):  # gone already: the slot is free
                        await asyncio.wait_for(eng.unload_lora(old), self.timeout_s)
                t0 = time.monotonic()
                try:
                    await asyncio.wait_for(eng.load_lora(name, path), self.timeout_s)
                except EngineError as e:
                    if "already" not in str(e):
                        raise RuntimeError(f"loading LoRA adapter {name!r}: {e}") from e
                dt = time.monotonic() - t0
            self.loaded[name] = dt
            if lookahead:
                self.lookahead.loads += 1
            elif on_demand:
                self.counters.cold_starts += 1
            else:
                self.counters.started += 1
                self._prewarmed[name] = time.monotonic()
            self.counters.warmup_s_last = dt
            return dt

    def _unloaded(self, name: str) -> None:
        """``name`` left the engine: a prewarm of it that no request used was wasted."""
        since = self._prewarmed.pop(name, None)
        if since is not None:
            self.counters.wasted += 1
            self.counters.wasted_backend_s += time.monotonic() - since

    def _victim(self, name: str, keep: Collection[str], *, on_demand: bool = False) -> str:
        """The least recently used loaded adapter that nothing needs now. A request's own
        load (``on_demand``) may take one that only the queue's head needs: that request is
        already released, the head is not, and the window it waits for may be full of
        requests waiting for loads."""
        spare = self.inflight if on_demand else self.in_use
        for old in self.loaded:
            if old not in keep and old not in spare:
                return old
        if on_demand:
            raise _AllInFlight(f"cannot load LoRA adapter {name!r}: all {len(self.loaded)} "
                               f"loaded adapters (max {self.max_loras}) serve in-flight "
                               "requests")
        raise RuntimeError(f"cannot load LoRA adapter {name!r}: all {len(self.loaded)} loaded "
                           f"adapters (max {self.max_loras}) are in use")

    async def unload(self, name: str) -> bool:
        """Unload ``name`` if we loaded it and nothing needs it now (:attr:`in_use`: an
        in-flight or next queued request runs with it)."""
        if name not in self.loaded or name in self.in_use:
            return False
        self.loaded.pop(name, None)
        self._unloaded(name)
        async with engine_adapter(self.engine, name="lora-prewarm") as eng:
            try:
                await asyncio.wait_for(eng.unload_lora(name), self.timeout_s)
            except EngineError:
                return False
        return True


class KVPrefixPrewarmer:
    """Warms an engine's prefix cache with a prefill-only request (``max_tokens: 1``) carrying
    the prefix as its system message, as the unit's own requests carry it, sent through the
    node's adapter of that engine: vLLM or any OpenAI-compatible server (``--enable-prefix-
    caching``), or the built-in engine, whose prefix cache (the KV block pool with
    ``--kv-cache-gb``) it fills the same way. ``engine`` may also be a server URL (an adapter
    is made for each warm-up)."""

    def __init__(self, engine: EngineAdapter | str, model: str | None = None, *,
                 timeout_s: float = 30.0) -> None:
        self.engine = engine
        self.model = model or (engine if isinstance(engine, str) else engine.model)
        self.timeout_s = timeout_s
        self.counters = PrewarmCounters()
        self._ids = itertools.count(1)

    def request_body(self, prefix: str, model: str | None = None) -> dict[str, Any]:
        """The prefill-only chat request that warms ``prefix`` (with ``model``: an adapter)."""
        return {"model": model or self.model, "max_tokens": 1, "temperature": 0.0,
                "messages": [{"role": "system", "content": prefix},
                             {"role": "user", "content": "."}]}

    def queued(self) -> None:
        """The node took a warm-up on (queued it for the engine, or sent it at once)."""
        self.counters.started += 1

    def served(self, warmup_s: float) -> None:
        """The engine served a warm-up in ``warmup_s`` seconds."""
        self.counters.warmup_s_last = warmup_s

    def dequeued(self) -> None:
        """A queued warm-up was taken out unused (a wrong branch): wasted, at no engine cost."""
        self.counters.wasted += 1

    async def warm(self, prefix: str, model: str | None = None) -> float:
        """Prefill ``prefix`` on the engine now; returns the measured seconds."""
        body = self.request_body(prefix, model)
        rid = f"prewarm-kv-{id(self):x}-{next(self._ids)}"
        t0 = time.monotonic()
        try:
            async with (engine_adapter(self.engine, name="kv-prewarm", model=self.model) as eng,
                        asyncio.timeout(self.timeout_s)):
                async for _ in eng.generate("chat", body, False, request_id=rid):
                    pass
        except EngineError as e:
            raise RuntimeError(f"prefix prewarm: {e}") from e
        dt = time.monotonic() - t0
        self.queued()
        self.served(dt)
        return dt


@dataclass(slots=True)
class DnnHook:
    """Load/unload of one DNN tool model; the load time is measured on every load."""

    load_fn: Callable[[], Any]
    unload_fn: Callable[[Any], None] = lambda _m: None
    model: Any = None
    load_s: float | None = None
    loads: int = 0

    def load(self) -> float:
        if self.model is not None:
            return 0.0
        t0 = time.monotonic()
        self.model = self.load_fn()
        self.load_s = time.monotonic() - t0
        self.loads += 1
        return self.load_s

    def unload(self) -> None:
        if self.model is not None:
            self.unload_fn(self.model)
            self.model = None


@dataclass(slots=True)
class NodePrewarmer:
    """Routes ``prewarm`` signals by backend kind; see the module docstring."""

    containers: ContainerPool | None = None
    loras: dict[str, LoraPrewarmer] = field(default_factory=dict)  # model -> prewarmer
    prefixes: dict[str, KVPrefixPrewarmer] = field(default_factory=dict)  # model -> prewarmer
    dnn: dict[str, DnnHook] = field(default_factory=dict)  # model -> hook
    #: the LoRA queue lookahead (a :class:`hermeslet.lora_lookahead.LoraLookahead`), if on
    lora_lookahead: Any = None
    #: engine name -> (base model, adapters of its in-flight requests, of its queue's head
    #: when the lookahead is on)
    _use: dict[str, tuple[str, set[str], set[str]]] = field(default_factory=dict)

    def set_in_use(self, engine: str, base: str, inflight: Collection[str],
                   head: Collection[str] = ()) -> None:
        """The adapters that ``engine`` (serving ``base``) needs loaded now: its in-flight
        requests' and its queue head's. The base model's LoRA prewarmer unloads none of them
        for a prewarm or lookahead load (the union over the engines of that model); a
        request's own load spares only the in-flight ones."""
        pw = self.loras.get(base)
        if pw is None:
            return
        self._use[engine] = (base, set(inflight), set(head))
        mine = [(f, h) for b, f, h in self._use.values() if b == base]
        pw.set_in_use(set().union(*(f for f, _ in mine)), set().union(*(h for _, h in mine)))

    def loadable_adapters(self, base: str) -> list[str]:
        """Adapters of ``base`` that this node can serve without their being loaded now
        (their path is known), for the node's ``hello``."""
        pw = self.loras.get(base)
        return sorted(a for a in pw.paths if pw.paths[a]) if pw is not None else []

    async def handle(self, backend: str, action: str,
                     params: dict[str, Any] | None = None) -> tuple[bool, str]:
        """Carry out one signal; returns (ok, detail) for the ack (detail has ``warmup_s=``)."""
        params = params or {}
        kind, _, name = backend.partition(":")
        try:
            if kind == "docker" and self.containers is not None:
                if action == "start":
                    dt = await asyncio.to_thread(self.containers.prewarm, name)
                    return True, f"warmup_s={dt:.4f}"
                return await asyncio.to_thread(self.containers.release, name), "released"
            if kind == "lora":
                model, _, adapter = name.partition("@")
                pw = self.loras.get(model)
                if pw is not None:
                    if action == "start":
                        dt = await pw.load(adapter, params.get("path"))
                        return True, f"warmup_s={dt:.4f}"
                    return await pw.unload(adapter), "unloaded"
            if kind == "kv":
                kv = self.prefixes.get(resource_model(backend))
                if kv is not None and action == "start":
                    prefix = params.get("prefix")
                    if not prefix:
                        return False, "kv prewarm needs params.prefix (the shared prompt prefix)"
                    dt = await kv.warm(prefix, params.get("model"))  # the unit's adapter
                    return True, f"warmup_s={dt:.4f}"
                if kv is not None:
                    return True, "released (the engine's cache evicts it)"
            if kind == "dnn" and name in self.dnn:
                hook = self.dnn[name]
                if action == "start":
                    dt = await asyncio.to_thread(hook.load)
                    return True, f"warmup_s={dt:.4f}"
                await asyncio.to_thread(hook.unload)
                return True, "unloaded"
        except Exception as exc:  # report, never crash the node
            return False, f"{type(exc).__name__}: {exc}"
        return False, f"no prewarmer for {backend!r} on this node"

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.containers is not None:
            out.update({f"docker_{k}": v for k, v in self.containers.stats().items()})
        for model, pw in self.loras.items():
            out.update({f"lora_{model}_{k}": v for k, v in pw.counters.as_dict().items()})
            out[f"lora_{model}_loaded"] = len(pw.loaded)
            if self.lora_lookahead is not None:
                out.update({f"lora_{model}_lookahead_{k}": v
                            for k, v in pw.lookahead.as_dict().items()})
        for model, kv in self.prefixes.items():
            out.update({f"kv_{model}_{k}": v for k, v in kv.counters.as_dict().items()})
        for model, hook in self.dnn.items():
            out[f"dnn_{model}_loads"] = hook.loads
            out[f"dnn_{model}_load_s"] = hook.load_s or 0.0
        return out


def build_node_prewarmer(
    engines: list[Any], *, docker_url: str | None = None, lora: bool = False, max_loras: int = 4,
    lora_paths: dict[str, str] | None = None,
) -> tuple[PooledDockerSandbox | None, NodePrewarmer]:
    """The prewarmers a node can run: a container pool when Docker is configured (``""``: the
    default daemon) and, per HTTP engine, KV prefixes and (``lora``) runtime LoRA loading of
    at most ``max_loras`` adapters (``lora_paths``: adapter name -> path on the engine's
    host). The LoRA queue lookahead, which drives these prewarmers, is set on the result by
    the caller (:class:`hermeslet.lora_lookahead.LoraLookahead`; this module does not import
    it). Returns the pooled Docker sandbox for the tool runner (or ``None``) and the
    prewarmer."""
    pool = ContainerPool(base_url=docker_url or None) if docker_url is not None else None
    node = NodePrewarmer(containers=pool)
    for e in engines:
        url, model = getattr(e, "url", None), getattr(e, "model", None)
        if not model:
            continue  # a server whose model is learned at start: nothing to key it by yet
        node.prefixes[model] = KVPrefixPrewarmer(e)  # through its adapter (built-in too)
        if lora and url:  # an HTTP engine (vLLM's runtime LoRA API), through its adapter
            node.loras[model] = LoraPrewarmer(e, max_loras=max_loras, paths=lora_paths)
    return (PooledDockerSandbox(pool) if pool is not None else None), node

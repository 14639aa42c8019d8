"""Hosted apps: application code that runs inside the gateway (the paper's hosted setting).

The provider registers an app as Python code; users submit inputs with ``POST /v1/runs
{"app", "input"}``; the gateway runs the app as an asyncio task whose LLM and tool calls go
through the same scheduler as external clients' calls, and ``GET /v1/runs/{id}`` returns its
result.

Writing one::

    from hermes.gateway.hosted import hosted_app

    @hosted_app("summarise")
    async def summarise(ctx, input):
        async with ctx.unit("summarise") as u:          # one unit invocation
            out = await u.chat([{"role": "user", "content": input["text"]}], max_tokens=64)
        return {"summary": out.text}

Registration: ``--apps MODULE`` (``[apps] modules``) imports the module and registers every
module-level :class:`HostedApp` (``@hosted_app`` makes one) or the apps listed in a
``HERMES_APPS`` attribute; the entry-point group ``hermes.apps`` names an app object, an app
class or an ``async def (ctx, input)`` (the entry point's name is the app's name). The ten
benchmark apps are hosted apps with input ``{"seed": int}``: each :class:`~hermes.workloads.base.Step`
becomes LLM requests whose prompts have the step's input token counts and whose
``max_tokens`` are its output tokens, or a tool call (simulated by sleeping its duration, in
model time, unless docker steps are routed to a tool runner).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Literal, Protocol

import numpy as np

from hermes.core.backend import BackendSpec
from hermes.gateway.config import GatewayConfig
from hermes.gateway.durable import DurableState, call_entry
from hermes.gateway.errors import NoCapacity, RequestFailed
from hermes.gateway.nodes import NO_SANDBOX
from hermes.gateway.recovery import Recovery, Replay
from hermes.gateway.runs import RunObserver
from hermes.gateway.state import LiveRun, PendingRequest, UnitInvocation
from hermes.protocol import Done, ToolDone

log = logging.getLogger("hermes.gateway.hosted")

ENTRY_POINT_GROUP = "hermes.apps"


@dataclass(frozen=True, slots=True)
class LLMResult:
    """What a hosted app gets back from an LLM call."""

    text: str
    input_tokens: int
    output_tokens: int
    finish_reason: str | None


@dataclass(frozen=True, slots=True)
class ToolResult:
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool


class HostedApp(ABC):
    """An application whose code the gateway runs."""

    name: str
    description: str = ""

    @abstractmethod
    async def run(self, ctx: HostedContext, input: Any) -> Any:
        """Run on one input; the return value (JSON-serialisable) is the run's result."""


class FunctionApp(HostedApp):
    """A hosted app from an ``async def (ctx, input)``."""

    def __init__(self, name: str, fn: Callable[[HostedContext, Any], Awaitable[Any]],
                 description: str = "") -> None:
        self.name = name
        self.fn = fn
        self.description = description or (fn.__doc__ or "").strip().split("\n")[0]

    async def run(self, ctx: HostedContext, input: Any) -> Any:
        return await self.fn(ctx, input)


def hosted_app(name: str, description: str = "") -> Callable[
        [Callable[[HostedContext, Any], Awaitable[Any]]], FunctionApp]:
    """Decorator: turn ``async def (ctx, input)`` into a :class:`HostedApp` called ``name``."""

    def deco(fn: Callable[[HostedContext, Any], Awaitable[Any]]) -> FunctionApp:
        return FunctionApp(name, fn, description)

    return deco


# ---------------------------------------------------------------------------------- context
class HostedScheduler(Protocol):
    """What a hosted app's code reaches through ``ctx.scheduler``: the live scheduler
    (:class:`hermes.gateway.scheduler.LiveScheduler`), named here by what it is used for."""

    durable: DurableState
    recovery: Recovery

    @property
    def stats(self) -> dict[str, int]: ...

    async def serving_model(self, model: str | None, *, strict: bool,
                            task: str = "generate") -> str: ...

    def begin_unit(self, run: LiveRun, unit: str, backend: str, *, explicit: bool = True,
                   upstream: str | None = None, at: float | None = None) -> UnitInvocation: ...

    def end_unit(self, run: LiveRun, inv: UnitInvocation, *,
                 duration_s: float | None = None) -> None: ...

    def credit_tool_time(self, run: LiveRun, seconds: float) -> None: ...

    async def submit_llm(self, run: LiveRun, inv: UnitInvocation, *, model: str,
                         endpoint: Literal["chat", "completions", "embeddings"],
                         body: dict[str, Any], stream: bool = False) -> PendingRequest: ...

    async def submit_tool(self, run: LiveRun, inv: UnitInvocation, *, backend: str,
                          code: str | None = None, command: list[str] | None = None,
                          timeout_s: float = 30.0) -> PendingRequest: ...

    async def wait(self, req: PendingRequest, timeout: float | None = None) -> Done | ToolDone: ...

    def no_tool_sandbox(self) -> bool: ...

    def wall_s(self, model_s: float) -> float: ...

    def finish_run(self, run_id: str, *, result: Any = None) -> LiveRun: ...

    def fail_run(self, run_id: str, error: str) -> None: ...


class UnitHandle:
    """One open unit invocation of a hosted run: its LLM and tool calls."""

    def __init__(self, ctx: HostedContext, inv: UnitInvocation) -> None:
        self.ctx = ctx
        self.inv = inv

    async def chat(self, messages: list[dict[str, Any]], *, model: str | None = None,
                   max_tokens: int | None = None, **params: Any) -> LLMResult:
        body = {"messages": messages, **params}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        return await self.ctx._llm(self.inv, "chat", body, model)

    async def complete(self, prompt: str, *, model: str | None = None,
                       max_tokens: int | None = None, **params: Any) -> LLMResult:
        body = {"prompt": prompt, **params}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        return await self.ctx._llm(self.inv, "completions", body, model)

    async def tool(self, *, code: str | None = None, command: list[str] | None = None,
                   timeout_s: float | None = None) -> ToolResult:
        """Run a tool call of this unit on a node's tool runner (ordered by the run's rank)."""
        return await self.ctx._tool(self.inv, self.inv.backend, code, command, timeout_s)

    async def simulate(self, duration_s: float) -> None:
        """Spend ``duration_s`` model seconds in this unit's tool (api/dnn stand-ins)."""
        await self.ctx.sleep(duration_s)
        self.inv.duration_s = (self.inv.duration_s or 0.0) + duration_s
        self.ctx.scheduler.credit_tool_time(self.ctx.run, duration_s)


class HostedContext:
    """What a hosted app's code sees: its run, and LLM/tool calls through the scheduler."""

    def __init__(self, scheduler: HostedScheduler, run: LiveRun, config: GatewayConfig,
                 replay: Replay | None = None) -> None:
        self.scheduler = scheduler
        self.run = run
        self.config = config
        #: after a gateway restart: the run's journal, answered instead of re-running work
        self.replay = replay
        self._calls = 0  # LLM/tool calls made so far (their index in the durable journal)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @contextlib.asynccontextmanager
    async def unit(self, name: str, backend: str | None = None, *,
                   upstream: str | None = None) -> AsyncIterator[UnitHandle]:
        """Open one invocation of unit ``name``; it finishes when the block exits."""
        rp = self.replay
        if rp is not None and rp.unit_seq < len(rp.units):
            done_inv = rp.units[rp.unit_seq]
            rp.unit_seq += 1
            if done_inv is not None:  # closed before the restart: its calls are journaled
                yield UnitHandle(self, done_inv)
                return
        model = await self.scheduler.serving_model(None, strict=False) if backend is None else None
        inv = self.scheduler.begin_unit(self.run, name, backend or f"llm:{model}",
                                        explicit=True, upstream=upstream)
        try:
            yield UnitHandle(self, inv)
        finally:
            if self.run.status in ("queued", "running"):
                self.scheduler.end_unit(self.run, inv)

    async def chat(self, unit: str, messages: list[dict[str, Any]], **kw: Any) -> LLMResult:
        """One LLM call as its own invocation of ``unit``."""
        async with self.unit(unit) as u:
            return await u.chat(messages, **kw)

    async def complete(self, unit: str, prompt: str, **kw: Any) -> LLMResult:
        async with self.unit(unit) as u:
            return await u.complete(prompt, **kw)

    async def tool(self, unit: str, backend: str, *, code: str | None = None,
                   command: list[str] | None = None, timeout_s: float | None = None) -> ToolResult:
        async with self.unit(unit, backend) as u:
            return await u.tool(code=code, command=command, timeout_s=timeout_s)

    async def sleep(self, model_s: float) -> None:
        """Sleep ``model_s`` seconds of model time (shorter in wall time when time-scaled)."""
        if self.replay is not None and self.replay.replaying:
            return  # this time passed before the restart
        if model_s > 0:
            await asyncio.sleep(self.scheduler.wall_s(model_s))

    async def _llm(self, inv: UnitInvocation, endpoint: str, body: dict[str, Any],
                   model: str | None) -> LLMResult:
        if model is None and inv.backend.startswith("llm:"):
            spec = BackendSpec.parse(inv.backend)
            model = spec.lora or spec.name
        seq, got = await self._journaled(inv)
        if got is None:
            served = await self.scheduler.serving_model(model, strict=False)
            req = await self.scheduler.submit_llm(self.run, inv, model=served,
                                                  endpoint=endpoint, body=body)  # type: ignore[arg-type]
            got = await self._wait_journaled(seq, req)
        done = got
        assert isinstance(done, Done)
        return LLMResult(done.text, done.input_tokens, done.output_tokens, done.finish_reason)

    async def _journaled(self, inv: UnitInvocation) -> tuple[int, Done | ToolDone | None]:
        """The next call's journal index and, when replaying, its result from before the
        restart (waiting for it if a node still holds it); None: make the call."""
        seq = self._calls
        self._calls += 1
        rp = self.replay
        entry = rp.calls.get(seq) if rp is not None else None
        if rp is not None:
            rp.call_seq = max(rp.call_seq, seq + 1)
        if entry is None:
            return seq, None
        res = entry.get("result")
        if entry.get("state") == "done" and res is not None:
            return seq, (Done(**res) if entry["kind"] == "llm" else ToolDone(**res))
        got = self.scheduler.recovery.adopt(self.run, inv, entry)
        if isinstance(got, Done | ToolDone):
            return seq, got
        if got is not None:  # a node still holds it: wait for it
            return seq, await self._wait_journaled(seq, got)
        if entry["kind"] == "tool":
            raise RequestFailed(f"tool call {entry['request_id']} was in flight when the gateway "
                                "restarted and no node holds it; tool calls are not run twice")
        self.scheduler.stats["resent"] += 1
        return seq, None

    async def _wait_journaled(self, seq: int, req: Any) -> Done | ToolDone:
        durable = self.scheduler.durable
        durable.call(self.run, seq, call_entry(req, "sent"))
        done = await self.scheduler.wait(req)
        durable.call(self.run, seq, call_entry(req, "done"))
        return done

    async def _tool(self, inv: UnitInvocation, backend: str, code: str | None,
                    command: list[str] | None, timeout_s: float | None) -> ToolResult:
        seq, got = await self._journaled(inv)
        if got is None:
            if self.scheduler.no_tool_sandbox():  # refused, never run unsandboxed (issue 15)
                raise NoCapacity(NO_SANDBOX)
            req = await self.scheduler.submit_tool(
                self.run, inv, backend=backend, code=code, command=command,
                timeout_s=timeout_s or self.config.tools.timeout_s,
            )
            got = await self._wait_journaled(seq, req)
        done = got
        assert isinstance(done, ToolDone)
        return ToolResult(done.exit_code, done.stdout, done.stderr, done.duration_s, done.timed_out)


# ---------------------------------------------------------------------------------- benchmark
def _text(n_chars: int, word: str) -> str:
    """Exactly ``n_chars`` characters of repeated ``word`` (the sim engine counts chars / 4)."""
    if n_chars <= 0:
        return ""
    return (word * (n_chars // len(word) + 1))[:n_chars]


def step_request(app: str, unit: str, input_tokens: int, output_tokens: int,
                 prefix_tokens: int) -> tuple[str, dict[str, Any]]:
    """An OpenAI request body whose prompt has ``input_tokens`` tokens (4 chars a token).

    With a shared prefix long enough, a chat request whose system message is the unit's
    fixed prompt (cacheable across runs, as a real unit's role is); else a completion.
    """
    out = max(1, int(output_tokens))
    if prefix_tokens >= 8 and input_tokens - prefix_tokens >= 8:
        system = _text(4 * (prefix_tokens - 4), f"[{app}/{unit}] ")
        user = _text(4 * (input_tokens - prefix_tokens - 4), "tok ")
        return "chat", {
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": out, "ignore_eos": True,
        }
    return "completions", {"prompt": _text(4 * max(1, int(input_tokens)), "tok "), "max_tokens": out, "ignore_eos": True}


class BenchmarkApp(HostedApp):
    """One of the ten benchmark app models, run live (input: ``{"seed": int}``)."""

    def __init__(self, name: str) -> None:
        from hermes.workloads.registry import get_app

        self.model = get_app(name)
        self.name = name
        self.description = self.model.description

    async def run(self, ctx: HostedContext, input: Any) -> Any:
        seed = int((input or {}).get("seed", 0)) if isinstance(input, dict) else int(input or 0)
        rng = np.random.default_rng(seed)
        units: list[str] = []
        n_req = in_tok = out_tok = 0
        tool_s = 0.0
        for step in self.model.steps(rng):
            await ctx.sleep(step.gap_s)
            async with ctx.unit(step.unit, step.backend, upstream=step.upstream) as u:
                units.append(step.unit)
                if step.is_llm:
                    calls = [step_request(self.name, step.unit, c.input_tokens, c.output_tokens,
                                          c.prefix_tokens) for c in step.requests]
                    results = await asyncio.gather(*(
                        u.chat(body.pop("messages"), **body) if ep == "chat"
                        else u.complete(body.pop("prompt"), **body)
                        for ep, body in calls
                    ))
                    n_req += len(results)
                    in_tok += sum(r.input_tokens for r in results)
                    out_tok += sum(r.output_tokens for r in results)
                else:
                    duration = float(step.duration_s or 0.0)
                    tool_s += duration
                    if (step.backend.startswith("docker:")
                            and ctx.config.tools.docker_steps == "runner"):
                        wall = ctx.scheduler.wall_s(duration)
                        await u.tool(code=f"import time; time.sleep({wall!r})",
                                     timeout_s=max(ctx.config.tools.timeout_s, 2 * wall + 5))
                    else:
                        await u.simulate(duration)
        return {
            "app": self.name,
            "seed": seed,
            "units": units,
            "llm_requests": n_req,
            "input_tokens": in_tok,
            "output_tokens": out_tok,
            "tool_s": tool_s,
        }


# ---------------------------------------------------------------------------------- registry
def _as_app(obj: Any, name: str | None = None) -> HostedApp:
    if isinstance(obj, HostedApp):
        return obj
    if isinstance(obj, type) and issubclass(obj, HostedApp):
        return obj()
    if callable(obj) and name:
        return FunctionApp(name, obj)
    raise TypeError(f"{obj!r} is not a hosted app")


def apps_from_module(module: str) -> list[HostedApp]:
    """The hosted apps a module defines (``HERMES_APPS`` or its module-level app objects)."""
    mod = importlib.import_module(module)
    listed = getattr(mod, "HERMES_APPS", None)
    if listed is not None:
        if isinstance(listed, dict):
            return [_as_app(v, k) for k, v in listed.items()]
        return [_as_app(v) for v in listed]
    found = [v for v in vars(mod).values() if isinstance(v, HostedApp)]
    if not found:
        raise ValueError(f"module {module!r} defines no hosted app (no HostedApp, no HERMES_APPS)")
    return found


class HostedRegistry:
    """The hosted apps of one gateway, by name."""

    def __init__(self, apps: Iterable[HostedApp] = ()) -> None:
        self.apps: dict[str, HostedApp] = {}
        for app in apps:
            self.add(app)

    def add(self, app: HostedApp) -> None:
        self.apps[app.name] = app

    def get(self, name: str) -> HostedApp | None:
        return self.apps.get(name)

    def names(self) -> list[str]:
        return sorted(self.apps)

    @classmethod
    def from_config(cls, config: GatewayConfig) -> HostedRegistry:
        reg = cls()
        if config.apps.benchmark:
            from hermes.workloads.registry import APPS

            for name in APPS:
                reg.add(BenchmarkApp(name))
        if config.apps.entry_points:
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                try:
                    reg.add(_as_app(ep.load(), ep.name))
                except Exception:
                    log.exception("hosted app entry point %s failed to load", ep.name)
        for module in config.apps.modules:
            for app in apps_from_module(module):
                reg.add(app)
        return reg


class HostedRuns(RunObserver):
    """The code of hosted runs, as asyncio tasks: started by :meth:`launch`, stopped when
    their run is cancelled (a :class:`~hermes.gateway.runs.RunObserver`) or the gateway
    stops (:meth:`close`)."""

    def __init__(self, scheduler: HostedScheduler, config: GatewayConfig) -> None:
        self.scheduler = scheduler
        self.config = config
        self._tasks: set[asyncio.Task[None]] = set()

    def launch(self, run: LiveRun, app: HostedApp, replay: Replay | None = None) -> None:
        """Start ``app``'s code for ``run`` (``replay``: resume it after a restart)."""
        launch(self.scheduler, run, app, self.config, replay)
        if run.task is not None:
            self._tasks.add(run.task)
            run.task.add_done_callback(self._tasks.discard)

    def run_ended(self, run: LiveRun) -> None:
        if run.status == "cancelled" and run.task is not None and not run.task.done():
            run.task.cancel()

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def launch(scheduler: HostedScheduler, run: LiveRun, app: HostedApp, config: GatewayConfig,
           replay: Replay | None = None) -> None:
    """Start a hosted run as an asyncio task; its end finishes (or fails) the run.
    ``replay``: resume a run from its durable journal after a restart."""
    ctx = HostedContext(scheduler, run, config, replay)

    async def _main() -> None:
        try:
            result = await app.run(ctx, run.input)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the app's failure is the run's failure, not the gateway's
            log.warning("hosted run %s of %s failed: %s", run.run_id, app.name, e)
            scheduler.fail_run(run.run_id, f"{type(e).__name__}: {e}")
            return
        if run.status in ("queued", "running"):
            scheduler.finish_run(run.run_id, result=result)

    run.task = asyncio.get_running_loop().create_task(_main(), name=f"hosted-{run.run_id}")

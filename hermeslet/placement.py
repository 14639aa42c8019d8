"""Serve a placement plan (``hermes plan placement --emit FILE``, :mod:`hermes.plan.placement`)
on a HermesLet, and change it live (issue 22 item 5).

A plan (format ``hermes-placement-plan/1``) lists GPU groups and one engine per (group,
service): its name (``g<i>-<service>``), the model it serves, its GPUs, the vLLM server's
arguments and the built-in engine's parameters (cluster model, device, tp: the planner's
iteration costs). :func:`load_placement` reads one; :func:`build_engines` makes the engines
(not started): ``sim`` (the built-in engine with those costs) or ``vllm`` (a supervised vLLM
server with the plan's arguments and ``CUDA_VISIBLE_DEVICES``).

A running node changes its engines with :meth:`hermeslet.agent.HermesLet.apply_placement`
(what changes: :func:`plan_change`): an engine whose name and model are in both sets is kept;
the others are drained (no new work: the node re-announces its engines to the gateway at once,
without them; their queued requests move to a kept or new engine of the same model, or wait on
the draining engine; requests in flight finish), then stopped; then the new engines start and
the node announces its engines again. Until a new engine has started, its requests wait in its
queue at the node. The engines are stopped before the new ones start, so that a new engine
can take the GPUs of an old one.

Command line (:mod:`hermeslet.cli`)::

    hermeslet run --placement FILE [--placement-engine sim|vllm] [--time-scale X]
                  [--max-inflight N] [--vllm-python PY] --scheduler tcp://HOST:PORT --node NAME

serves the plan's engines (instead of ``--engine``); ``kill -HUP <pid>`` makes the node read
FILE again and apply it (write the new plan over FILE first).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermeslet.engines.base import EngineAdapter
from hermeslet.engines.planned import builtin_cost, need, split_vllm_args

FORMAT = "hermes-placement-plan/1"
ENGINE_KINDS = ("sim", "vllm")


@dataclass(frozen=True, slots=True)
class EngineLaunch:
    """One engine of a plan: what it serves, where and how to start it."""

    name: str
    model: str  # the served model name (what requests ask for)
    gpus: tuple[int, ...]
    vllm_args: tuple[str, ...]
    builtin: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PlacementChange:
    """What :meth:`~hermeslet.agent.HermesLet.apply_placement` did (engine names)."""

    kept: tuple[str, ...]
    drained: tuple[str, ...]  # drained, then stopped
    started: tuple[str, ...]
    #: queued requests moved from a drained engine to one of the same model
    moved: int = 0
    #: engines that failed to start: name -> error (their queued requests failed)
    failed: dict[str, str] = field(default_factory=dict)
    #: requests a drained engine still held at the drain timeout, failed (retryable unless
    #: tokens had been streamed) so that the change goes on
    abandoned: int = 0


def plan_change(current: Mapping[str, str], new: Sequence[tuple[str, str]]) -> PlacementChange:
    """Engines kept (same name and model in both), drained (the rest of ``current``) and
    started (the rest of ``new``); ``current``: name -> model, ``new``: (name, model)."""
    names = [n for n, _ in new]
    if not new or len(set(names)) != len(names):
        raise ValueError(f"a placement needs at least one engine, with unique names: {names}")
    kept = tuple(n for n, m in new if current.get(n) == m)
    return PlacementChange(kept, tuple(n for n in current if n not in kept),
                           tuple(n for n in names if n not in kept))


def _need(d: Any, key: str, where: str) -> Any:
    return need(d, key, where, plan="placement plan")


def parse_placement(doc: Any) -> list[EngineLaunch]:
    """The engines of a ``hermes-placement-plan/1`` document; ``ValueError`` names what is
    wrong."""
    fmt = _need(doc, "format", "the document")
    if fmt != FORMAT:
        raise ValueError(f"placement plan: format {fmt!r}, expected {FORMAT!r}")
    n = int(_need(doc, "gpus", "the document"))
    out: list[EngineLaunch] = []
    groups = _need(doc, "groups", "the document")
    if not isinstance(groups, list) or not groups:
        raise ValueError("placement plan: no groups")
    for i, g in enumerate(groups):
        gpus = tuple(int(x) for x in _need(g, "gpus", f"group {i}"))
        if any(x < 0 or x >= n for x in gpus):
            raise ValueError(f"placement plan: group {i}: GPU ids outside 0..{n - 1}")
        for e in _need(g, "engines", f"group {i}"):
            name = str(_need(e, "name", f"an engine of group {i}"))
            out.append(EngineLaunch(name, str(_need(e, "model", f"engine {name!r}")),
                                    tuple(int(x) for x in e.get("gpus", gpus)),
                                    tuple(str(a) for a in e.get("vllm_args", ())),
                                    dict(e.get("builtin", {}))))
    names = [e.name for e in out]
    if not out or len(set(names)) != len(names):
        raise ValueError(f"placement plan: engine names must be present and unique: {names}")
    return out


def load_placement(path: str | Path) -> list[EngineLaunch]:
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"placement plan {path}: not JSON ({e})") from None
    return parse_placement(doc)


def sim_engine(e: EngineLaunch, *, time_scale: float = 1.0,
               max_inflight: int = 8) -> EngineAdapter:
    """The built-in engine of ``e`` with the planner's iteration costs (``builtin``)."""
    from hermeslet.engines.sim_engine import SimEngine

    cost = builtin_cost(e.builtin, where=f"engine {e.name!r}'s builtin", plan="placement plan",
                        default_tp=max(1, len(e.gpus)))
    return SimEngine(name=e.name, model=e.model, cost=cost, time_scale=time_scale,
                     max_inflight=max_inflight)


def vllm_engine(e: EngineLaunch, *, python: str | None = None,
                max_inflight: int = 8) -> EngineAdapter:
    """A supervised vLLM server with the plan's arguments on the engine's GPUs."""
    from hermeslet.engines.vllm import VLLMEngine

    model, rest = split_vllm_args(e.vllm_args, where=f"engine {e.name!r}",
                                  plan="placement plan")
    return VLLMEngine(name=e.name, model=model, served_model_name=e.model, python=python,
                      extra_args=rest, max_inflight=max_inflight,
                      env={"CUDA_VISIBLE_DEVICES": ",".join(map(str, e.gpus))})


def build_engines(launches: Sequence[EngineLaunch], kind: str = "sim", *,
                  time_scale: float = 1.0, max_inflight: int = 8,
                  python: str | None = None) -> list[EngineAdapter]:
    """The plan's engines (not started), of ``kind`` (:data:`ENGINE_KINDS`)."""
    if kind == "sim":
        return [sim_engine(e, time_scale=time_scale, max_inflight=max_inflight)
                for e in launches]
    if kind == "vllm":
        return [vllm_engine(e, python=python, max_inflight=max_inflight) for e in launches]
    raise ValueError(f"unknown engine kind {kind!r}; known: {', '.join(ENGINE_KINDS)}")

"""Engines as a plan file describes them: the parts shared by ``hermeslet run-plan`` (a
``hermes plan batch --emit`` batch plan, :mod:`hermeslet.plan_runner`) and ``hermeslet run
--placement`` (a ``hermes plan placement --emit`` placement plan, :mod:`hermeslet.placement`).

Both formats give each engine a ``builtin`` entry (the planner's model, device and TP, from
which the built-in engine's iteration costs follow) and ``vllm_args`` (the vLLM command line
the planner chose, ``--model`` and ``--served-model-name`` included). How an engine is
named, windowed and scheduled stays with each runner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hermes.core.costmodel import CostModel


def need(d: Any, key: str, where: str, *, plan: str) -> Any:
    """``d[key]``; ``ValueError`` naming the ``plan`` kind and ``where`` when it is missing."""
    if not isinstance(d, dict) or key not in d:
        raise ValueError(f"{plan}: {where} lacks {key!r}")
    return d[key]


def builtin_cost(builtin: Mapping[str, Any], *, where: str, plan: str,
                 default_tp: int) -> CostModel:
    """The built-in engine's cost model from a plan's ``builtin`` entry (``model``,
    ``device``, optional ``tp``, else ``default_tp``)."""
    from hermes.core.cluster.cost import to_cost_model
    from hermes.core.cluster.devices import get_device
    from hermes.core.cluster.models import get_model

    return to_cost_model(get_model(str(need(builtin, "model", where, plan=plan))),
                         get_device(str(need(builtin, "device", where, plan=plan))),
                         int(builtin.get("tp", default_tp)))


def split_vllm_args(args: Sequence[str], *, where: str, plan: str) -> tuple[str, list[str]]:
    """A plan's vLLM arguments as (the ``--model`` value, the other arguments without
    ``--model`` and ``--served-model-name``: the adapter sets the served name itself)."""
    rest = list(args)
    i = rest.index("--model") if "--model" in rest else -1
    if i < 0 or i + 1 >= len(rest):
        raise ValueError(f"{plan}: {where} has no --model in its vllm_args")
    model = rest[i + 1]
    rest = rest[:i] + rest[i + 2:]
    if "--served-model-name" in rest:
        j = rest.index("--served-model-name")
        rest = rest[:j] + rest[j + 2:]
    return model, rest

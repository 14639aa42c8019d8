"""A SeaLLM *service*: one model plus the length distribution of its requests, and its cost.

The reference execution time of a request (the L_N normaliser and the 5x SLO basis) is its
time alone on its service's reference engine (``ref_tp`` GPUs, batch of one): prefill of the
prompt, then one decode step per output token. The paper profiles it on the testbed; here it
comes from the cluster cost model (:func:`hermes.core.cluster.cost.to_cost_model`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from hermes.core.cluster.cost import to_cost_model
from hermes.core.cluster.devices import GIB, get_device
from hermes.core.cluster.models import BYTES_FP16, get_model
from hermes.core.costmodel import CostModel

#: memory kept per GPU for activations and the CUDA context (assumed; the paper profiles it)
ACTIVATION_RESERVE_GIB = 4.0
#: fraction of each GPU's memory an engine may use (vLLM's default)
GPU_MEMORY_UTILIZATION = 0.9


@lru_cache(maxsize=64)
def cost_model(model: str, device: str, tp: int) -> CostModel:
    """The iteration cost model of ``model`` on ``tp`` GPUs of ``device`` (cached)."""
    return to_cost_model(get_model(model), get_device(device), tp)


def weight_bytes(model: str) -> int:
    """Half-precision weight bytes of ``model``."""
    return int(BYTES_FP16 * get_model(model).params)


def kv_bytes_per_token(model: str) -> int:
    """KV cache bytes per token of ``model`` (all layers, K and V, all TP shards)."""
    return int(get_model(model).kv_bytes_per_token(1))


def group_kv_bytes(models: tuple[str, ...], device: str, tp: int) -> int:
    """KV pool bytes left on a ``tp``-GPU group holding ``models`` (may be negative)."""
    dev = get_device(device)
    budget = tp * (dev.memory_bytes * GPU_MEMORY_UTILIZATION - ACTIVATION_RESERVE_GIB * GIB)
    return int(budget - sum(weight_bytes(m) for m in models))


def group_fits(models: tuple[str, ...], device: str, tp: int, min_tokens: int = 4096) -> bool:
    """The models' weights fit the group with room for ``min_tokens`` of each model's KV."""
    if any(not get_model(m).valid_tp(tp) for m in models):
        return False
    need = sum(kv_bytes_per_token(m) * min_tokens for m in models)
    return group_kv_bytes(models, device, tp) >= need


def services_fit(models: Mapping[str, str], device: str) -> Callable[[tuple[str, ...], int], bool]:
    """The placement search's ``fits`` for services named in ``models`` (service -> model):
    whether a group of ``tp`` ``device`` GPUs holds those services' models together
    (:func:`group_fits`)."""
    def fits(members: tuple[str, ...], tp: int) -> bool:
        return group_fits(tuple(models[m] for m in members), device, tp)

    return fits


@dataclass(frozen=True)
class Service:
    """One LLM service: ``model`` and the (input, output) token lengths its requests draw from.

    ``input_lengths`` / ``output_lengths`` are paired samples (one row per profiled request).
    """

    name: str
    model: str
    input_lengths: np.ndarray = field(repr=False)
    output_lengths: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.input_lengths) == 0 or len(self.input_lengths) != len(self.output_lengths):
            raise ValueError(f"service {self.name!r}: need equal, non-empty input/output samples")
        if np.any(np.asarray(self.output_lengths) < 1) or np.any(np.asarray(self.input_lengths) < 1):
            raise ValueError(f"service {self.name!r}: lengths must be >= 1 token")
        get_model(self.model)  # clear error for an unknown model


def exec_times(model: str, device: str, tp: int, inputs: np.ndarray, outputs: np.ndarray) -> np.ndarray:
    """Seconds each request takes alone on ``model``/``tp`` (prefill, then batch-1 decode)."""
    i = np.asarray(inputs, dtype=float)[:, None]
    o = np.asarray(outputs, dtype=float)[:, None]
    return np.asarray(cost_model(model, device, tp).unit_service_s(i, o), dtype=float)


@dataclass(frozen=True)
class ServiceStats:
    """Profiled characteristics of a service: mean and standard deviation of execution time."""

    mean_s: float
    std_s: float

    @classmethod
    def of(cls, service: Service, device: str, tp: int = 1) -> ServiceStats:
        t = exec_times(service.model, device, tp, service.input_lengths, service.output_lengths)
        return cls(float(t.mean()), float(t.std()))

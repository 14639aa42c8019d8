"""The cluster model against measurements: one table of cells, model vs measured.

Pure: the caller reads the measurements (``hermes plan calibrate`` reads Vidur's published
profiles) and passes plain rows; this module prices each cell with the cluster model.

Cells:

- ``compute``: one model's per-token operators of all layers (Vidur's per-layer operators:
  norms, QKV / output projections, rope, MLP up / activation / down, residual add; summed per
  layer, times the layers) on one device at TP ``tp`` for ``tokens`` tokens, against
  :func:`~hermes.core.cluster.cost.linear_layer_s` x layers. Attention and the LM head are not
  in the profile and not in the cell.
- ``all_reduce`` / ``send_recv``: one collective of ``size_bytes`` among ``tp`` workers over the
  link class the measurement's topology maps to (:data:`NETWORK_LINKS`).

The target is 15% per cell (:data:`TOLERANCE`); cells beyond it are listed by
:func:`exceptions`, each with the reason the report gives.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from hermes.core.cluster.cost import linear_layer_s
from hermes.core.cluster.devices import DEVICES
from hermes.core.cluster.models import MODELS
from hermes.core.cluster.topology import LINKS

TOLERANCE = 0.15

#: Vidur's compute profile directories -> device types
PROFILE_DEVICES = {"a100": "A100-80", "h100": "H100", "a40": "A40"}
#: Vidur's model directories -> model specs
PROFILE_MODELS = {"Llama-2-7b-hf": "llama-2-7b", "Llama-2-70b-hf": "llama-2-70b"}
#: (network profile, collective, workers, devices per node) -> link class
NETWORK_LINKS: dict[tuple[str, str, int, int], str] = {
    ("a100_pairwise_nvlink", "all_reduce", 2, 2): "nvlink3-pair",
    ("a100_pairwise_nvlink", "all_reduce", 4, 4): "pcie4",
    ("a100_pairwise_nvlink", "send_recv", 2, 2): "nvlink3-pair",
    ("a100_dgx", "all_reduce", 2, 2): "nvlink3-switch",
    ("a100_dgx", "all_reduce", 4, 4): "nvlink3-switch",
    ("a100_dgx", "all_reduce", 8, 8): "nvlink3-switch",
    ("a100_dgx", "all_reduce", 2, 1): "inter-node",
    ("a100_dgx", "send_recv", 2, 2): "nvlink3-switch",
    ("a100_dgx", "send_recv", 2, 1): "inter-node",
    ("h100_dgx", "all_reduce", 2, 2): "nvlink4-switch",
    ("h100_dgx", "all_reduce", 4, 4): "nvlink4-switch",
    ("h100_dgx", "all_reduce", 8, 8): "nvlink4-switch",
    ("h100_dgx", "send_recv", 2, 2): "nvlink4-switch",
}

#: the cells of the default table
TABLE_TOKENS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096)
TABLE_SIZES = (1 << 16, 1 << 20, 1 << 23, 1 << 26)


@dataclass(frozen=True, slots=True)
class ComputeRow:
    """Measured: per-layer operator time (ms, median) of a model on a profiled device."""

    device: str  # profile key (a100, h100, a40)
    model: str  # profile key (Llama-2-7b-hf, ...)
    tp: int
    tokens: int
    layer_ms: float


@dataclass(frozen=True, slots=True)
class NetworkRow:
    """Measured: one collective's median time (ms)."""

    profile: str
    collective: str  # all_reduce | send_recv
    workers: int
    devices_per_node: int
    size_bytes: int
    ms: float


@dataclass(frozen=True, slots=True)
class Cell:
    kind: str  # compute | all_reduce | send_recv
    model: str  # the model (compute) or the link class (network)
    device: str  # the device (compute) or the measured topology (network)
    tp: int  # TP degree (compute) or workers (network)
    tokens: int  # iteration tokens (compute) or message bytes (network)
    model_ms: float
    measured_ms: float

    @property
    def rel_error(self) -> float:
        return (self.model_ms - self.measured_ms) / self.measured_ms

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rel_error"] = round(self.rel_error, 4)
        d["model_ms"] = round(self.model_ms, 4)
        d["measured_ms"] = round(self.measured_ms, 4)
        return d


def compute_cells(rows: Iterable[ComputeRow], tokens: Iterable[int] = TABLE_TOKENS) -> list[Cell]:
    """A cell per (device, model, tp, token count in ``tokens``) the rows measure."""
    want = set(tokens)
    cells = []
    for r in rows:
        if r.tokens not in want or r.device not in PROFILE_DEVICES or r.model not in PROFILE_MODELS:
            continue
        dev = DEVICES[PROFILE_DEVICES[r.device]]
        spec = MODELS[PROFILE_MODELS[r.model]]
        model_ms = spec.layers * linear_layer_s(dev, spec, r.tp, r.tokens) * 1e3
        cells.append(Cell("compute", spec.name, dev.name, r.tp, r.tokens, model_ms,
                          spec.layers * r.layer_ms))
    cells.sort(key=lambda c: (c.device, c.model, c.tp, c.tokens))
    return cells


def network_cells(rows: Iterable[NetworkRow]) -> list[Cell]:
    """A cell per row of a mapped topology (the caller picks the sizes: the measured sizes
    nearest :data:`TABLE_SIZES`)."""
    cells = []
    for r in rows:
        key = (r.profile, r.collective, r.workers, r.devices_per_node)
        if key not in NETWORK_LINKS:
            continue
        link = LINKS[NETWORK_LINKS[key]]
        s = (link.all_reduce_s(r.size_bytes, r.workers) if r.collective == "all_reduce"
             else link.send_recv_s(r.size_bytes))
        where = f"{r.profile}/{r.devices_per_node}per-node"
        cells.append(Cell(r.collective, link.name, where, r.workers, r.size_bytes, s * 1e3, r.ms))
    cells.sort(key=lambda c: (c.kind, c.device, c.tp, c.tokens))
    return cells


def exceptions(cells: Iterable[Cell], tolerance: float = TOLERANCE) -> list[Cell]:
    """The cells beyond ``tolerance``, worst first."""
    return sorted((c for c in cells if abs(c.rel_error) > tolerance),
                  key=lambda c: -abs(c.rel_error))

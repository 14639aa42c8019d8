"""GPU device types: spec-sheet peaks and the efficiencies measured on them.

A :class:`DeviceType` carries the datasheet figures (memory, HBM/GDDR bandwidth, dense fp16/bf16
tensor throughput) and the achieved fractions of them that the per-operator roofline of
:mod:`hermes.core.cluster.cost` uses (:class:`Efficiency`). The efficiencies of A100, H100 and
A40 are fitted to Vidur's measured per-layer operator times (``hermes plan calibrate --fit``
prints them; the table compares model and measurement per cell). Cards without a profile
borrow the fit of their architecture's profiled card (named in ``efficiency_from``).

Spec-sheet figures (dense, no sparsity; memory in GiB as the cards report it):

- A100-40GB SXM4: 40 GiB HBM2, 1,555 GB/s, 312 TFLOPS bf16 (NVIDIA A100 Tensor Core GPU
  datasheet, 2021).
- A100-80GB PCIe: 80 GiB HBM2e, 1,935 GB/s, 312 TFLOPS (same datasheet; the PCIe card is the
  one Vidur profiled and the SamuLLM paper's node: pairs bridged by NVLink).
- H100 SXM5: 80 GiB HBM3, 3,350 GB/s, 989 TFLOPS bf16 (NVIDIA H100 datasheet).
- H800 SXM5: as H100 (the export variant differs in NVLink bandwidth: 400 GB/s, see
  :mod:`hermes.core.cluster.topology`).
- A40: 48 GiB GDDR6, 696 GB/s, 149.7 TFLOPS fp16 tensor (NVIDIA A40 datasheet).
- RTX A6000: 48 GiB GDDR6, 768 GB/s, 154.8 TFLOPS fp16 tensor (datasheet: 309.7 with sparsity).
- RTX A5000: 24 GiB GDDR6, 768 GB/s, 111.1 TFLOPS (datasheet: 222.2 with sparsity).
- RTX 3090 Ti: 24 GiB GDDR6X, 1,008 GB/s, 80 TFLOPS fp16 tensor with fp32 accumulation (NVIDIA
  Ampere GA102 whitepaper: 160 with fp16 accumulation; inference GEMMs accumulate in fp32).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Achieved fractions of a card's peaks in inference operators (fitted, module doc).

    ``hbm``: of the memory bandwidth (weight and KV streaming, element-wise operators);
    ``flops``: of the tensor throughput (GEMMs in large batches); ``layer_overhead_s``: fixed
    time per transformer layer per iteration (kernel launches of ~9 operators); ``knee``: the
    exponent ``p`` of the smooth maximum ``(mem^p + comp^p)^(1/p)`` joining the memory-bound
    and compute-bound regimes of a GEMM (large ``p``: a sharp roofline)."""

    hbm: float
    flops: float
    layer_overhead_s: float
    knee: float
    source: str


#: fitted to Vidur's per-layer operator medians, LLaMA-2-7B and -70B, TP 1/2/4/8, 1..4,096
#: tokens (``hermes plan calibrate --fit``; least squares on the log ratio)
EFFICIENCY: dict[str, Efficiency] = {
    "a100": Efficiency(0.873, 0.703, 43.7e-6, 1.49, "vidur compute/a100 (A100-80GB PCIe)"),
    "h100": Efficiency(0.956, 0.665, 42.7e-6, 1.50, "vidur compute/h100 (H100 SXM)"),
    "a40": Efficiency(0.802, 0.752, 47.1e-6, 1.72, "vidur compute/a40 (A40)"),
}


@dataclass(frozen=True, slots=True)
class DeviceType:
    """One GPU model."""

    name: str
    memory_gib: float
    hbm_bytes_s: float  # peak memory bandwidth, bytes/s
    flops: float  # dense fp16/bf16 tensor FLOP/s
    efficiency_from: str  # key of :data:`EFFICIENCY`
    nvlink: bool = True  # can be bridged / switched with NVLink

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def eff(self) -> Efficiency:
        return EFFICIENCY[self.efficiency_from]

    @property
    def achieved_hbm(self) -> float:
        return self.hbm_bytes_s * self.eff.hbm

    @property
    def achieved_flops(self) -> float:
        return self.flops * self.eff.flops


DEVICES: dict[str, DeviceType] = {
    d.name: d
    for d in (
        DeviceType("A100-40", 40, 1555e9, 312e12, "a100"),
        DeviceType("A100-80", 80, 1935e9, 312e12, "a100"),
        DeviceType("H100", 80, 3350e9, 989e12, "h100"),
        DeviceType("H800", 80, 3350e9, 989e12, "h100"),
        DeviceType("A40", 48, 696e9, 149.7e12, "a40"),
        DeviceType("A6000", 48, 768e9, 154.8e12, "a40"),
        DeviceType("A5000", 24, 768e9, 111.1e12, "a40"),
        DeviceType("RTX3090Ti", 24, 1008e9, 80e12, "a40", nvlink=True),
    )
}

_ALIASES = {"a100": "A100-80", "a100-80gb": "A100-80", "a100-40gb": "A100-40",
            "rtx-3090-ti": "RTX3090Ti", "3090ti": "RTX3090Ti", "rtx3090ti": "RTX3090Ti",
            "rtx-a6000": "A6000", "rtx-a5000": "A5000"}


def get_device(name: str) -> DeviceType:
    """The device type called ``name`` (case-insensitive; a few common aliases)."""
    key = name.strip()
    for n, d in DEVICES.items():
        if n.lower() == key.lower():
            return d
    alias = _ALIASES.get(key.lower())
    if alias:
        return DEVICES[alias]
    raise ValueError(f"unknown device {name!r}; known: {', '.join(DEVICES)}")


_GPUS = re.compile(r"^\s*(\d+)\s*[xX]\s*([A-Za-z0-9][A-Za-z0-9_.-]*)\s*$")


def parse_gpus(spec: str) -> tuple[int, DeviceType]:
    """``"8xA100-80"`` -> ``(8, A100-80)``; anything else is a ``ValueError`` naming it."""
    m = _GPUS.match(spec)
    if not m:
        raise ValueError(f"malformed --gpus {spec!r}: expected COUNTxDEVICE, e.g. 8xA100-80")
    n = int(m.group(1))
    if n < 1:
        raise ValueError(f"--gpus {spec!r}: the GPU count must be >= 1")
    return n, get_device(m.group(2))

"""Links, nodes and clusters: who talks to whom, how fast.

A :class:`Link` prices a point-to-point transfer (``latency + bytes / bandwidth``) and a ring
all-reduce among ``n`` workers (``latency + 2 (n-1)/n bytes / bus bandwidth``). The figures of
the intra- and inter-node links are fitted to Vidur's measured NCCL collectives
(``network/*/{all_reduce,send_recv}.csv.gz``, ``hermes plan calibrate``), the inter-region
link is an assumption (no measurement here: 30 ms, 10 Gb/s WAN, as geo-distributed serving
papers such as HexGen assume).

A :class:`Node` is GPUs of one :class:`~hermes.core.cluster.devices.DeviceType` and an
interconnect: ``nvswitch`` (every pair over NVLink through switches: DGX/HGX), ``nvlink-pairs``
(GPUs ``2k`` and ``2k+1`` bridged, others over PCIe: the SamuLLM paper's 8 x A100-80GB
machine, Vidur's "pairwise NVLink" nodes) or ``pcie``. A :class:`Cluster` is nodes with
regions; GPUs are addressed globally as ``(node index, local index)`` pairs
(:class:`GpuId`). The link of a group is its slowest pairwise link (a ring runs at the
slowest hop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hermes.core.cluster.devices import DeviceType


@dataclass(frozen=True, slots=True)
class Link:
    """A link class: point-to-point and all-reduce costs (module doc)."""

    name: str
    p2p_latency_s: float
    p2p_bytes_s: float
    ar_latency_s: float
    ar_bus_bytes_s: float

    def send_recv_s(self, nbytes: float) -> float:
        return self.p2p_latency_s + nbytes / self.p2p_bytes_s

    def all_reduce_s(self, nbytes: float, workers: int) -> float:
        if workers <= 1:
            return 0.0
        return self.ar_latency_s + 2.0 * (workers - 1) / workers * nbytes / self.ar_bus_bytes_s


#: fitted to Vidur's medians (latency, bandwidth by least squares on the log ratio) unless noted
LINKS: dict[str, Link] = {
    lk.name: lk
    for lk in (
        # a100_pairwise_nvlink: send_recv within a pair; all_reduce over 2 workers
        Link("nvlink3-pair", 7.8e-6, 358e9, 42.7e-6, 199e9),
        # a100_dgx: send_recv and all_reduce (2..8 workers) within one node
        Link("nvlink3-switch", 13.4e-6, 280e9, 40e-6, 155e9),
        # h100_dgx (H100 SXM: NVLink 4 through NVSwitch)
        Link("nvlink4-switch", 7.7e-6, 357e9, 30e-6, 350e9),
        # H800: NVLink 4 capped at 400 GB/s (vs 900): the H100 figures scaled by 400/900
        Link("nvlink4-h800", 7.7e-6, 159e9, 30e-6, 156e9),
        # a100_pairwise_nvlink, 4 workers across two pairs: the PCIe 4.0 hop; p2p bandwidth
        # assumed at the same achieved ~24 GB/s (x16 PCIe 4.0: 32 GB/s peak)
        Link("pcie4", 10e-6, 24e9, 58e-6, 23.6e9),
        # a100_dgx across two nodes (devices_per_node 1): the inter-node network as measured
        Link("inter-node", 31e-6, 7.8e9, 78e-6, 5.9e9),
        # assumption (module doc)
        Link("inter-region", 30e-3, 1.25e9, 60e-3, 1.25e9),
    )
}

INTERCONNECTS = ("nvswitch", "nvlink-pairs", "pcie")


@dataclass(frozen=True, slots=True)
class Node:
    """GPUs of one type in one machine and their interconnect."""

    device: DeviceType
    n_gpus: int
    interconnect: str = "nvswitch"
    region: str = "r0"

    def __post_init__(self) -> None:
        if self.interconnect not in INTERCONNECTS:
            raise ValueError(f"unknown interconnect {self.interconnect!r}; known: "
                             f"{', '.join(INTERCONNECTS)}")
        if self.n_gpus < 1:
            raise ValueError("a node has at least one GPU")

    def _nvlink(self) -> Link:
        if self.device.name.startswith("H800"):
            return LINKS["nvlink4-h800"]
        if self.device.name.startswith("H100"):
            return LINKS["nvlink4-switch"]
        return LINKS["nvlink3-pair" if self.interconnect == "nvlink-pairs" else "nvlink3-switch"]

    def link(self, a: int, b: int) -> Link:
        """The link between local GPUs ``a`` and ``b``."""
        if self.interconnect == "nvswitch":
            return self._nvlink()
        if self.interconnect == "nvlink-pairs" and a // 2 == b // 2:
            return self._nvlink()
        return LINKS["pcie4"]

    def group_link(self, gpus: Sequence[int]) -> Link | None:
        """The slowest link inside a group (``None`` for one GPU)."""
        worst: Link | None = None
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                lk = self.link(a, b)
                if worst is None or lk.ar_bus_bytes_s < worst.ar_bus_bytes_s:
                    worst = lk
        return worst


@dataclass(frozen=True, slots=True, order=True)
class GpuId:
    node: int
    local: int


@dataclass(frozen=True, slots=True)
class Cluster:
    """Nodes (by index) in regions; the links between them are the inter-node / -region ones."""

    nodes: tuple[Node, ...]
    inter_node: Link = field(default_factory=lambda: LINKS["inter-node"])
    inter_region: Link = field(default_factory=lambda: LINKS["inter-region"])

    @classmethod
    def single(cls, device: DeviceType, n_gpus: int, interconnect: str = "nvswitch") -> Cluster:
        return cls((Node(device, n_gpus, interconnect),))

    def gpus(self) -> list[GpuId]:
        return [GpuId(i, j) for i, n in enumerate(self.nodes) for j in range(n.n_gpus)]

    def device(self, g: GpuId) -> DeviceType:
        return self.nodes[g.node].device

    def link(self, a: GpuId, b: GpuId) -> Link:
        if a.node == b.node:
            return self.nodes[a.node].link(a.local, b.local)
        if self.nodes[a.node].region == self.nodes[b.node].region:
            return self.inter_node
        return self.inter_region

    def group_link(self, gpus: Sequence[GpuId]) -> Link | None:
        """The slowest link inside a group of GPUs (``None`` for one GPU)."""
        worst: Link | None = None
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                lk = self.link(a, b)
                if worst is None or lk.ar_bus_bytes_s < worst.ar_bus_bytes_s:
                    worst = lk
        return worst

    def between(self, a: Sequence[GpuId], b: Sequence[GpuId]) -> Link:
        """The link a pipeline hand-off from group ``a`` to group ``b`` uses (the fastest
        pair: the sender picks its best peer)."""
        best: Link | None = None
        for x in a:
            for y in b:
                lk = self.link(x, y)
                if best is None or lk.p2p_bytes_s > best.p2p_bytes_s:
                    best = lk
        if best is None:
            raise ValueError("pipeline hand-off between empty GPU groups")
        return best

"""Several nodes that are not alike (issue 22): which models each kind of node places, and
for what part of the demand.

The gateway's placer (:mod:`hermes.gateway.placer`) places each kind of node (its GPUs and
their type, from the nodes' ``hello``) on its own with :func:`hermes.plan.placement.place`; this
module decides what each kind gets: a model goes only to the kinds whose GPUs can hold it, its
calls split between their nodes in proportion to each node's capacity. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from hermes.core.cluster.devices import get_device
from hermes.core.multillm.placement import usable_tps
from hermes.core.multillm.service import group_fits
from hermes.plan.placement import ServiceSpec


@dataclass(frozen=True)
class NodeKind:
    """``count`` nodes alike, each with ``gpus`` GPUs of ``device`` for placement plans."""

    gpus: int
    device: str
    count: int = 1


def node_capacity(gpus: int, device: str) -> float:
    """A node's serving capacity, to split demand between nodes: its GPUs times their achieved
    memory bandwidth (decoding, most of a served request's time, is bound by it)."""
    return gpus * get_device(device).achieved_hbm


def split_demand(services: Sequence[ServiceSpec], kinds: Sequence[NodeKind], *,
                 tps: Sequence[int] = (1, 2, 4), node_gpus: int = 8,
                 ) -> tuple[list[list[ServiceSpec]], list[ServiceSpec]]:
    """The services each kind of node places, with the rates of *one* of its nodes: a service
    goes only to the kinds whose GPUs can hold its model (a group of some TP size in ``tps``,
    :func:`group_fits`), its rate split between all their nodes in proportion to
    :func:`node_capacity`. Returns one list per kind (in ``kinds``' order) and the services
    that no kind can hold."""
    holds = [[any(group_fits((s.model,), k.device, t) for t in usable_tps(tps, k.gpus, node_gpus))
              for s in services] for k in kinds]
    cap = [node_capacity(k.gpus, k.device) for k in kinds]
    out: list[list[ServiceSpec]] = [[] for _ in kinds]
    homeless = []
    for j, s in enumerate(services):
        total = sum(c * k.count for c, k, h in zip(cap, kinds, holds, strict=True) if h[j])
        if total <= 0:
            homeless.append(s)
            continue
        for i, c in enumerate(cap):
            if holds[i][j]:
                out[i].append(replace(s, rate=s.rate * c / total))
    return out, homeless

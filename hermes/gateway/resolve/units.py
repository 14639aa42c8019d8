"""Units: the prompt template of a request, mined incrementally, with a readable name.

A unit (DESIGN.md: "all LLM requests sharing one system prompt/role") is identified within
its app by ``(instructions template, template of the last turn)``. The last turn's template
comes from :func:`hermes.gateway.resolve.templates.turn_skeleton`, and skeletons that differ
only in a few tokens of their fixed lines are merged by **drain3** (IBM's Drain log-template
miner, MIT): one ``Drain`` tree per tenant (no tenant's text ever shapes another's
templates), bounded by ``drain_max_clusters`` (LRU) and ``drain_max_children``, fed only
skeletons (a few dozen tokens at most), and only skeletons not seen before (a per-tenant LRU
cache answers the rest with one dictionary lookup). A cluster's template as first seen is the
unit's template for as long as the cluster lives, so a unit keeps its key and name while drain3
generalises it.
"""

from __future__ import annotations

from collections import OrderedDict
from hashlib import blake2b

from drain3.drain import Drain  # type: ignore[import-untyped]

from hermes.gateway.resolve.templates import (
    ASSISTANT_TURN,
    EMPTY_TURN,
    TOOL_TURN,
    WILDCARD,
    slug,
)

#: skeletons that are templates already (no mining)
FIXED_TURNS = frozenset((WILDCARD, TOOL_TURN, ASSISTANT_TURN, EMPTY_TURN))
_TURN_NAMES = {WILDCARD: "input", TOOL_TURN: "tool", ASSISTANT_TURN: "prefill",
               EMPTY_TURN: "empty"}


class _TenantMiner:
    __slots__ = ("drain", "cache", "first")

    def __init__(self, sim_th: float, depth: int, max_children: int, max_clusters: int) -> None:
        self.drain = Drain(sim_th=sim_th, depth=depth, max_children=max_children,
                           max_clusters=max_clusters, parametrize_numeric_tokens=True)
        #: skeleton -> unit template (LRU)
        self.cache: OrderedDict[str, str] = OrderedDict()
        #: cluster id -> its template as first seen (LRU)
        self.first: OrderedDict[int, str] = OrderedDict()


class TurnTemplates:
    """Skeleton -> turn template, through one drain3 tree per tenant (module docstring)."""

    def __init__(self, *, sim_th: float = 0.5, depth: int = 4, max_children: int = 16,
                 max_clusters: int = 1000, max_tenants: int = 1000) -> None:
        self._args = (sim_th, depth, max_children, max_clusters)
        self.max_clusters = max_clusters
        self.max_tenants = max_tenants
        self._miners: OrderedDict[str, _TenantMiner] = OrderedDict()
        self.mined = 0  # skeletons that went through drain3

    def template(self, tenant: str, skeleton: str) -> str:
        """The template of the unit whose last turn has this skeleton."""
        if skeleton in FIXED_TURNS:
            return skeleton
        miners = self._miners
        miner = miners.get(tenant)
        if miner is None:
            miner = miners[tenant] = _TenantMiner(*self._args)
            if len(miners) > self.max_tenants:
                miners.popitem(last=False)
        else:
            miners.move_to_end(tenant)
        hit = miner.cache.get(skeleton)
        if hit is not None:
            miner.cache.move_to_end(skeleton)
            return hit
        self.mined += 1
        cluster, _ = miner.drain.add_log_message(skeleton)
        cid = cluster.cluster_id
        tpl = miner.first.get(cid)
        if tpl is None:
            tpl = miner.first[cid] = skeleton
            if len(miner.first) > 2 * self.max_clusters:
                miner.first.popitem(last=False)
        miner.cache[skeleton] = tpl
        if len(miner.cache) > 4 * self.max_clusters:
            miner.cache.popitem(last=False)
        return tpl

    def stats(self) -> dict[str, int]:
        return {"tenants": len(self._miners),
                "clusters": sum(len(m.drain.id_to_cluster) for m in self._miners.values()),
                "cached": sum(len(m.cache) for m in self._miners.values()),
                "mined": self.mined}


def unit_key(app_id: str, instructions: bytes, turn_template: str) -> bytes:
    """The identity of a unit: its app, its instructions template, its last turn's template."""
    h = blake2b(digest_size=12, person=b"hermes-unit")
    h.update(app_id.encode() + b"\0" + instructions + b"\0" + turn_template.encode())
    return h.digest()


def turn_name(turn_template: str) -> str:
    """A short readable name of a last-turn template (``tool``, ``input``, ``question``)."""
    return _TURN_NAMES.get(turn_template) or slug(turn_template, words=2) or "turn"


class UnitBook:
    """Unit key -> readable unit name, unique within its app; bounded (LRU) in all."""

    def __init__(self, max_units: int = 100_000) -> None:
        self.max_units = max_units
        self._names: OrderedDict[bytes, tuple[str, str]] = OrderedDict()  # key -> (app, name)
        self._taken: dict[tuple[str, str], bytes] = {}

    def __len__(self) -> int:
        return len(self._names)

    def name(self, key: bytes, app_id: str, instructions_slug: str, turn_template: str) -> str:
        """The unit's name, made on first sight as ``<instructions>.<turn>`` (e.g.
        ``weather-agent.tool``), with a short hash when that name is another unit's."""
        hit = self._names.get(key)
        if hit is not None:
            self._names.move_to_end(key)
            return hit[1]
        name = f"{instructions_slug or 'chat'}.{turn_name(turn_template)}"
        if self._taken.get((app_id, name), key) != key:
            name = f"{name}-{key.hex()[:6]}"
        self._names[key] = (app_id, name)
        self._taken[(app_id, name)] = key
        if len(self._names) > self.max_units:
            _, (old_app, old_name) = self._names.popitem(last=False)
            self._taken.pop((old_app, old_name), None)
        return name

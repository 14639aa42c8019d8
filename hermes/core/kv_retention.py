"""What to do with a run's KV when its LLM unit hands over to a tool call (issue 19 item 3).

A decision of the core: no I/O, no clock. When an agent's LLM unit finishes and a tool call
of the same run starts, the run's prompt history (its KV on the engine that served it) is
reused by the run's next LLM unit only if that unit comes, and only if the KV is still there
when the tool returns. The driver describes the hand-over (:class:`Handover`: the KV's size,
the probability that an LLM unit of the run follows, samples of the tool's duration, the
engine's KV pressure, what recomputing or reloading the KV costs) and a
:class:`RetentionPolicy` answers with a :class:`Retention`:

- ``lru``: nothing (``none``): the engine's LRU keeps or evicts the KV like any other
  (today's behaviour, and vLLM's);
- ``ttl``: a Continuum-style rule: pin the KV for a TTL chosen from the tool's duration
  distribution (its ``quantile``, p90 by default), capped, whatever follows the tool;
- ``hermes``: from the run's PDGraph: drop the KV when no LLM unit is likely to follow (it
  only takes room that other runs' prefixes could use); keep it pinned for the tool's p90
  when the tool is short (its p90 within a few reloads' time) or the engine has room (KV
  pressure under ``low_pressure``); otherwise offload it to the host-memory tier and reload
  it asynchronously when the tool returns, so that the GPU room serves other runs while the
  tool runs, but only when the host tier has room for it beside the KV of other runs that
  are in a tool call and will reload theirs (``cpu_room_tokens``: offloading over them evicts
  a history that is coming back); without a host tier, or without that room, pin it only
  under ``high_pressure``, else leave it to LRU.

The engine model carries the decision out (:meth:`hermes.core.warm_models.PrefixCacheModel.
pin_until`, ``offload``, ``drop``, ``prefetch``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

Action = Literal["none", "keep", "offload", "drop"]


@dataclass(frozen=True, slots=True)
class Handover:
    """A run's LLM unit handed over to a tool call: what a retention policy knows."""

    #: tokens of the run's KV (its prompt history) on the engine
    prefix_tokens: int
    #: probability that an LLM unit of the run follows the tool (from the run's PDGraph)
    next_llm_p: float
    #: samples of the tool's duration, seconds (from the PDGraph; empty: unknown)
    tool_durations_s: Sequence[float]
    #: the engine's KV cache use over its capacity (0: empty, 1: full)
    kv_pressure: float
    #: seconds to reload the KV from the host-memory tier (0: no host tier)
    load_s: float = 0.0
    #: whether the engine has a host-memory tier to offload to
    has_cpu_tier: bool = False
    #: host-tier tokens not held by other runs' offloaded KV that is waiting for their tool
    #: calls to return (None: unknown). Offloading more than this evicts a run that will
    #: come back for its KV: a loss, where evicting an idle prefix is not
    cpu_room_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.prefix_tokens < 0:
            raise ValueError(f"prefix_tokens must be >= 0, got {self.prefix_tokens}")
        if not 0.0 <= self.next_llm_p <= 1.0:
            raise ValueError(f"next_llm_p must be in [0, 1], got {self.next_llm_p}")
        if self.kv_pressure < 0 or self.load_s < 0:
            raise ValueError(f"kv_pressure and load_s must be >= 0, got {self.kv_pressure}, "
                             f"{self.load_s}")
        if any(d < 0 for d in self.tool_durations_s):
            raise ValueError("tool_durations_s must be >= 0")

    def tool_quantile(self, q: float) -> float | None:
        """The ``q`` quantile of the tool's duration; ``None`` without samples."""
        if not len(self.tool_durations_s):
            return None
        return float(np.quantile(np.asarray(self.tool_durations_s, dtype=float), q))


@dataclass(frozen=True, slots=True)
class Retention:
    """A policy's answer: ``keep`` (pin on the GPU for ``ttl_s``), ``offload`` (to the host
    tier; ``reload`` it asynchronously when the tool returns), ``drop``, or ``none``."""

    action: Action = "none"
    ttl_s: float = 0.0
    reload: bool = False


class RetentionPolicy:
    """Decides what happens to a run's KV during its tool call (module docstring)."""

    name: ClassVar[str] = ""

    def decide(self, h: Handover) -> Retention:
        raise NotImplementedError


class LRURetention(RetentionPolicy):
    """Leave the KV to the engine's LRU (today's behaviour)."""

    name: ClassVar[str] = "lru"

    def decide(self, h: Handover) -> Retention:
        return Retention()


@dataclass
class TTLRetention(RetentionPolicy):
    """Continuum-style: pin for the tool's ``quantile`` duration (at most ``max_ttl_s``)."""

    name: ClassVar[str] = "ttl"
    quantile: float = 0.9
    max_ttl_s: float = 60.0

    def decide(self, h: Handover) -> Retention:
        q = h.tool_quantile(self.quantile)
        if q is None or h.prefix_tokens == 0:
            return Retention()
        return Retention("keep", ttl_s=min(q, self.max_ttl_s))


@dataclass
class HermesRetention(RetentionPolicy):
    """From the run's PDGraph (module docstring)."""

    name: ClassVar[str] = "hermes"
    quantile: float = 0.9
    max_ttl_s: float = 60.0
    #: below this probability of a following LLM unit the KV is dropped
    min_next_p: float = 0.2
    #: a tool is short when its p90 is within this many reload times (keeping is cheap)
    short_reloads: float = 4.0
    #: under this KV pressure keeping costs nothing: keep
    low_pressure: float = 0.5
    #: without a host tier, keep only under this pressure
    high_pressure: float = 0.9

    def decide(self, h: Handover) -> Retention:
        if h.prefix_tokens == 0:
            return Retention()
        if h.next_llm_p < self.min_next_p:
            return Retention("drop")
        q = h.tool_quantile(self.quantile)
        if q is None:
            return Retention()
        ttl = min(q, self.max_ttl_s)
        short = q <= self.short_reloads * h.load_s if h.has_cpu_tier else False
        if q <= self.max_ttl_s and (short or h.kv_pressure < self.low_pressure):
            return Retention("keep", ttl_s=ttl)
        if h.has_cpu_tier and (h.cpu_room_tokens is None
                               or h.prefix_tokens <= h.cpu_room_tokens):
            return Retention("offload", reload=True)
        if q <= self.max_ttl_s and h.kv_pressure < self.high_pressure:
            return Retention("keep", ttl_s=ttl)
        return Retention()


_REGISTRY: dict[str, Callable[[], RetentionPolicy]] = {
    "lru": LRURetention,
    "ttl": TTLRetention,
    "hermes": HermesRetention,
}


def retention_names() -> list[str]:
    return list(_REGISTRY)


def make_retention(name: str) -> RetentionPolicy:
    """The retention policy ``name`` (``lru`` | ``ttl`` | ``hermes``)."""
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown retention {name!r}; expected one of "
                         f"{', '.join(_REGISTRY)}") from None

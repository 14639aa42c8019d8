"""SeaLLM's adaptive replacement interval (§4.3, Eq. 8).

After interval ``t`` the real metric ``M_real`` is compared with the simulator's estimate
``M_est``: if they differ by more than ``β`` (relative to the estimate) the traffic moved and
the next interval is shorter, ``I ← (1−β)·I``; otherwise it is longer, ``I ← (1+β)·I``.
``β = 0.1`` (the paper's). Bounds ``[min_s, max_s]`` are ours (the paper gives none).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdaptiveInterval:
    """The rule; ``next(interval, estimated, real)`` gives the next interval in seconds."""

    beta: float = 0.1
    min_s: float = 10.0
    max_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0.0 < self.beta < 1.0:
            raise ValueError(f"beta must be in (0, 1), got {self.beta}")
        if not 0.0 < self.min_s <= self.max_s:
            raise ValueError(f"need 0 < min_s <= max_s, got {self.min_s}, {self.max_s}")

    def missed(self, estimated: float, real: float) -> bool:
        """The estimate missed by more than ``beta`` (relative)."""
        return abs(real - estimated) > self.beta * abs(estimated)

    def next(self, interval_s: float, estimated: float, real: float) -> float:
        if interval_s <= 0:
            raise ValueError(f"interval must be > 0, got {interval_s}")
        f = (1.0 - self.beta) if self.missed(estimated, real) else (1.0 + self.beta)
        return min(self.max_s, max(self.min_s, interval_s * f))

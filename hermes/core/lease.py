"""The scheduler lease, as decisions: am I the leader now, and when do I next talk to the store.

One active scheduler at a time holds a **lease** in a coordination store (Redis or etcd: a key
with a time to live that only its holder renews). Each acquisition takes a new **epoch**
(strictly increasing, from the store), and every message the holder sends carries it, so that
a receiver that has seen a higher epoch rejects a deposed holder's messages (fencing).

This module decides, without I/O and without a clock (every call takes ``now``, seconds on
a monotonic clock), what the holder may believe about its lease:

- the lease is **held** until ``sent + ttl - margin``, where ``sent`` is when the request
  that acquired or renewed it was *sent* (never when its answer arrived: a slow or paused
  answer must not stretch the holder's belief past the store's expiry), and ``margin`` covers
  clock-rate differences between this host and the store's;
- a holder renews every ``renew_s``; a candidate tries to acquire every ``retry_s``;
- a failed renewal (the store answered that someone else holds the key) or a held time that
  ran out is the end of the term: :meth:`LeaseState.held` is False from then on, whatever
  answers come later, so that a process that was paused past its lease and wakes up finds
  itself deposed before it sends anything.

The driver (:mod:`hermes.gateway.ha`) owns the store and the clock and asks this object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """How long a lease lives and how often its holder renews it (wall seconds)."""

    ttl_s: float = 1.5
    renew_s: float = 0.3
    retry_s: float = 0.1
    margin_s: float = 0.1

    def __post_init__(self) -> None:
        if not self.ttl_s > 0:
            raise ValueError(f"lease ttl_s must be > 0, got {self.ttl_s}")
        if not 0 < self.renew_s < self.ttl_s - self.margin_s:
            raise ValueError(f"lease renew_s must be > 0 and < ttl_s - margin_s "
                             f"({self.ttl_s - self.margin_s:g}), got {self.renew_s}")
        if not self.retry_s > 0:
            raise ValueError(f"lease retry_s must be > 0, got {self.retry_s}")
        if not 0 <= self.margin_s < self.ttl_s:
            raise ValueError(f"lease margin_s must be in [0, ttl_s), got {self.margin_s}")


Action = Literal["acquire", "renew", "wait"]


@dataclass(slots=True)
class LeaseState:
    """One participant's view of the lease (see the module doc)."""

    terms: LeaseTerms
    #: the epoch of the term this participant holds or held last; None: never held
    epoch: int | None = None
    #: held until then (monotonic s); -inf when not held
    valid_until: float = float("-inf")
    #: when the last acquire or renew was sent (monotonic s)
    last_sent: float = float("-inf")
    #: a term ended (lost or expired): this participant never holds that epoch again
    deposed: bool = False

    def held(self, now: float) -> bool:
        """Whether this participant may act as the leader at ``now``."""
        return self.epoch is not None and not self.deposed and now < self.valid_until

    def next_action(self, now: float) -> tuple[Action, float]:
        """What to do and when (``(action, at)``; ``at <= now``: now)."""
        if self.epoch is not None and not self.deposed:
            if now >= self.valid_until:
                return "wait", now  # expired: the driver calls expire()
            return "renew", self.last_sent + self.terms.renew_s
        return "acquire", self.last_sent + self.terms.retry_s

    def sending(self, now: float) -> None:
        """An acquire or renew request is being sent at ``now``."""
        self.last_sent = now

    def acquired(self, epoch: int, sent: float) -> None:
        """The store granted the lease with ``epoch`` to a request sent at ``sent``."""
        if self.epoch is not None and epoch <= self.epoch:
            raise ValueError(f"epoch {epoch} is not above the last one held ({self.epoch})")
        self.epoch = epoch
        self.deposed = False
        self.valid_until = sent + self.terms.ttl_s - self.terms.margin_s

    def renewed(self, sent: float) -> None:
        """The store extended the lease for a renew request sent at ``sent``. A renewal that
        comes back after the term ended (the participant was paused) does not revive it."""
        if self.deposed or self.epoch is None or sent >= self.valid_until:
            self.lost()
            return
        self.valid_until = max(self.valid_until,
                               sent + self.terms.ttl_s - self.terms.margin_s)

    def lost(self) -> None:
        """The store says another holds the lease (or ours is gone): the term is over."""
        if self.epoch is not None:
            self.deposed = True
        self.valid_until = float("-inf")

    def expired(self, now: float) -> bool:
        """A term this participant held has run out at ``now`` (no renewal in time): it ends
        (``deposed``); True once, when that happens."""
        if self.epoch is not None and not self.deposed and now >= self.valid_until:
            self.lost()
            return True
        return False


class EpochGate:
    """A receiver's fencing rule for messages from elected schedulers (an edge, a node).

    It keeps the highest epoch seen. A message of a lower epoch comes from a deposed
    scheduler (paused past its lease, its frames still in flight): it is **stale** and must
    not be applied. A higher epoch is a **new** leader (the receiver follows it: resends
    what the old one may have lost). ``None`` (a scheduler without election) is applied.
    """

    __slots__ = ("epoch", "stale_rejected")

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.stale_rejected = 0

    def judge(self, epoch: int | None) -> Literal["apply", "new", "stale"]:
        """What to do with a message stamped ``epoch`` (counts the stale ones)."""
        if epoch is None:
            return "apply"
        if self.epoch is not None and epoch < self.epoch:
            self.stale_rejected += 1
            return "stale"
        if self.epoch is None or epoch > self.epoch:
            self.epoch = epoch
            return "new"
        return "apply"

"""Which scheduler a node follows when schedulers are elected, and what it keeps for a new one.

Schedulers elected by a lease (:mod:`hermes.gateway.ha`) stamp every message with the lease's
**epoch**. A node (one or several scheduler addresses: ``hermeslet run --scheduler A
--scheduler B``) keeps the highest epoch it has seen and

- **rejects** a message with a lower epoch (a deposed scheduler that woke up after a pause):
  logged and counted (:attr:`LeaderFollower.stale_rejected`), never applied;
- **follows** the address a higher epoch came from (the new leader): its results go there;
- keeps the results of its recent requests (:attr:`LeaderFollower.RECENT_S` seconds) and those
  it could not deliver while no leader was reachable, and sends them to a new leader, so that
  a result the old leader received but did not live to act on (or never received) reaches the
  scheduler that adopts the request: its work is not run twice.

Messages without an epoch (a lone scheduler) are always applied. This object decides; the
agent (:mod:`hermeslet.agent`) owns the sockets.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Literal

from hermes import protocol as P

log = logging.getLogger("hermeslet.follow")

Verdict = Literal["apply", "follow", "stale"]


class LeaderFollower:
    """The node's view of the scheduler election (see the module doc)."""

    RECENT_S = 30.0
    RECENT_MAX = 4096
    UNDELIVERED_MAX = 16384

    def __init__(self, node: str, n_addresses: int) -> None:
        self.node = node
        #: the highest epoch seen; None: no elected scheduler has spoken
        self.epoch: int | None = None
        #: index of the address followed (one address: always 0)
        self.leader: int | None = 0 if n_addresses == 1 else None
        self.stale_rejected = 0
        self.followed = 0  # leader changes seen
        self._recent: deque[tuple[float, P.NodeMessage]] = deque(maxlen=self.RECENT_MAX)
        self._undelivered: deque[P.NodeMessage] = deque(maxlen=self.UNDELIVERED_MAX)

    def judge(self, source: int, msg: Any) -> Verdict:
        """What to do with a scheduler message that came from address ``source``."""
        epoch = getattr(msg, "epoch", None)
        if epoch is None:
            if self.leader is None:
                self.leader = source
            return "apply"
        if self.epoch is not None and epoch < self.epoch:
            self.stale_rejected += 1
            log.warning("hermeslet %s: rejected a %r message of stale epoch %d from scheduler "
                        "address #%d (following epoch %d; %d rejected so far)", self.node,
                        getattr(msg, "type", "?"), epoch, source, self.epoch,
                        self.stale_rejected)
            return "stale"
        if self.epoch is None or epoch > self.epoch:
            previous = self.epoch
            self.epoch, self.leader = epoch, source
            self.followed += 1
            log.warning("hermeslet %s: following the scheduler at address #%d, epoch %d "
                        "(was %s)", self.node, source, epoch, previous)
            return "follow"
        return "apply"

    # ------------------------------------------------------------------ results kept
    def sent(self, msg: P.NodeMessage, now: float) -> None:
        """``msg`` left for the leader: a result is kept for :attr:`RECENT_S` s."""
        if isinstance(msg, P.Done | P.ToolDone):
            self._recent.append((now, msg))
            cutoff = now - self.RECENT_S
            while self._recent and self._recent[0][0] < cutoff:
                self._recent.popleft()

    def undelivered(self, msg: P.NodeMessage) -> None:
        """``msg`` could not be sent (no leader reachable): a result waits for the next."""
        if isinstance(msg, P.Done | P.ToolDone | P.Failed):
            self._undelivered.append(msg)

    def for_new_leader(self, now: float) -> list[P.NodeMessage]:
        """What a newly followed leader gets: results it may have missed, oldest first (the
        undelivered ones leave the buffer; recent ones stay for a further change)."""
        cutoff = now - self.RECENT_S
        out: list[P.NodeMessage] = [m for t, m in self._recent if t >= cutoff]
        seen = {getattr(m, "request_id", None) for m in out}
        while self._undelivered:
            m = self._undelivered.popleft()
            if getattr(m, "request_id", None) not in seen:
                out.append(m)
        return out

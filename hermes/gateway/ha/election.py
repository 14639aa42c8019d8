"""Leader election: the lease decisions (:mod:`hermes.core.lease`) driven on a thread.

:class:`LeaderElection` tries to acquire the lease every ``retry_s`` while it does not hold
it, renews it every ``renew_s`` while it does, and calls back:

- ``on_elected(epoch)`` once, when a term begins (from the election thread: the callee hops
  to its own event loop);
- ``on_deposed(epoch, why)`` once, when the term ends: the store refused a renewal (another
  holder) or no renewal succeeded in time (the process was paused, the store was
  unreachable). Whoever held the lease must stop acting at once; the participant takes no
  further part (its process restarts as a standby: its memory is of a term that ended).

It runs on its own thread with a synchronous store client (Redis or etcd), so that an event loop busy with
requests (or a stall of seconds) cannot delay the renewals; :meth:`LeaderElection.held`,
read by the sending path before every message to a node, is a clock read and a comparison.
A store error is logged and retried; it never extends the lease.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from hermes.core.lease import LeaseState, LeaseTerms
from hermes.gateway.ha.base import LeaseStore, Term

log = logging.getLogger("hermes.gateway.ha")


class LeaderElection:
    """One participant of the election (see the module doc)."""

    def __init__(self, store: LeaseStore, terms: LeaseTerms, holder: str, *,
                 on_elected: Callable[[int], None],
                 on_deposed: Callable[[int, str], None],
                 record: dict[str, Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.terms = terms
        self.holder = holder
        self.record = dict(record or {})
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        self.clock = clock
        self.state = LeaseState(terms)
        self.term: Term | None = None
        self.store_errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._deposed_lock = threading.Lock()
        self._deposed_epochs: set[int] = set()

    # ------------------------------------------------------------------ reads (any thread)
    def held(self) -> bool:
        """Whether this participant may act as the leader now. A term found run out here
        (the renewals were late: a pause, a starved thread) ends here and now: a renewal
        answered later does not revive it (the process was already told it is deposed)."""
        if self.state.held(self.clock()):
            return True
        if self.state.epoch is not None and not self.state.deposed:  # a term that ran out
            self._deposed(f"the lease ran out (no renewal within {self.terms.ttl_s:g} s)")
        return False

    @property
    def epoch(self) -> int | None:
        return self.state.epoch

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hermes-election", daemon=True)
        self._thread.start()

    def stop(self, *, release: bool = True) -> None:
        """Stop taking part; with ``release``, give a held lease up so that a standby takes
        over at once instead of after the lease's time to live."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        if release and self.term is not None and self.held():
            try:
                self.store.release(self.term)
            except Exception as exc:
                log.warning("could not release the scheduler lease: %s", exc)
        self.store.close()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while not self._stop.is_set():
            now = self.clock()
            if self.state.expired(now):
                self._deposed(f"the lease ran out (no renewal within {self.terms.ttl_s:g} s)")
                continue
            action, at = self.state.next_action(now)
            if at > now:
                wake = at if action == "acquire" else min(at, self.state.valid_until)
                self._stop.wait(max(0.001, wake - now))
                continue
            self.state.sending(now)
            try:
                if action == "acquire":
                    term = self.store.try_acquire(self.holder, self.terms.ttl_s, **self.record)
                    if term is not None:
                        self.state.acquired(term.epoch, now)
                        self.term = term
                        log.warning("scheduler lease acquired: epoch %d, holder %s",
                                    term.epoch, self.holder)
                        self.on_elected(term.epoch)
                else:
                    assert self.term is not None
                    if self.store.renew(self.term, self.terms.ttl_s):
                        self.state.renewed(now)
                        if self.state.deposed:
                            self._deposed("the renewal came back after the lease had run out")
                    else:
                        self.state.lost()
                        self._deposed("the store says another scheduler holds the lease")
            except Exception as exc:  # unreachable store: retried; the lease is not extended
                self.store_errors += 1
                if self.store_errors in (1, 10) or self.store_errors % 100 == 0:
                    log.warning("election store error (%d so far): %s: %s", self.store_errors,
                                type(exc).__name__, exc)

    def _deposed(self, why: str) -> None:
        epoch = self.state.epoch if self.state.epoch is not None else -1
        with self._deposed_lock:  # from the election thread or a sender: told once
            if epoch in self._deposed_epochs:
                return
            self._deposed_epochs.add(epoch)
        self.state.lost()
        self.term = None
        log.error("scheduler lease lost (epoch %d): %s", epoch, why)
        self._stop.set()  # one term per participant: a deposed one restarts as a standby
        self.on_deposed(epoch, why)

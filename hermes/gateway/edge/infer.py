"""Runs inferred at the edge (split roles): the run resolver in front of the scheduler.

The all-in-one gateway binds a header-less request to an **inferred run** of an inferred app
(:mod:`hermes.gateway.identity`, :mod:`hermes.gateway.resolve`). With split roles the
resolver runs here, on the edge (parsing and evidence are per-request CPU that must stay off
the scheduler, whose CPU per request bounds the cluster), and the run lives where runs live,
in the scheduler's registry:

- :meth:`EdgeRuns.resolve` gives a header-less chat/completion its run id, app and unit; the
  edge sends them in the call (:class:`~hermes.gateway.edge.wire.Call` ``inferred``/``new``),
  and the scheduler joins that run or creates it (``inferred=True``), ranks it from its
  app's PDGraph and learns from it when it ends;
- the answer (:meth:`answered`) or failure (:meth:`abandoned`) is told to the resolver, so
  that the conversation's next turn finds the run;
- :meth:`sweep` closes the runs idle past their app's figure and returns them
  (:class:`~hermes.gateway.edge.wire.ClosedRun`) for one :class:`~hermes.gateway.edge.wire.
  Closed` message to the scheduler, which finishes each unless it has seen the run active
  since (:func:`close_due`: another edge's call of the same run). Runs an edge never closes
  (the edge died) are ended by the scheduler's idle reaping
  (``scheduler.run_idle_timeout_s``).

With ``[cluster] store`` the evidence index is the shared one
(:class:`~hermes.gateway.shared.evidence.RedisKeyIndex`): a conversation's next turn arriving
at another edge joins the same run (that edge adopts the run from the index's run info,
which the scheduler deletes when the run ends). Without a shared store every edge has its
own index: a turn that reaches another edge starts a new run of the same app.

**App names.** The operator's renames and merges of inferred apps (``hermes apps
rename|merge``, :class:`~hermes.gateway.resolve.apps.AppNames`) are made at the active
scheduler (the admin API; an edge proxies it there) and stored in its knowledge base. An edge
does not read the knowledge base: it **follows the active scheduler's mapping over the edge
link**. Every ping carries the digest of the mapping the edge follows; the scheduler answers
with the mapping itself (:class:`~hermes.gateway.edge.wire.Names`) only when the digest is
not its own (:meth:`EdgeRuns.follow_names` applies it to the edge's next new runs, as the
all-in-one gateway applies a rename). Why this design rather than each edge reading the
knowledge base:

- an edge needs no access to the knowledge base (the deployments give edges none);
- bounded: a rename or merge reaches every edge at its next ping (``SchedulerLink.PING_S``,
  0.2 s) plus one round trip, however many edges; an edge started later, or reconnecting,
  gets the mapping in the pong that makes it ready (``/readyz``), so it never serves a call
  under the old names;
- correct after a failover: the mapping is the **leader's**; an elected standby reads it again
  from the knowledge base (:meth:`~hermes.gateway.identity.RunIdentities.reload_names`)
  before it serves, and the edges converge to it at their next ping. The schedulers of an
  election must share the knowledge base (a ``redis://`` URL: a directory is read-only, what
  a gateway writes goes under its own state directory), as they must for their learned
  PDGraphs; a pong of a deposed scheduler is dropped with its stale epoch;
- nothing is lost to a dropped message: the edge asks again with every ping until its digest
  is the leader's (a push on each change would need acknowledgements to be as sure);
- the steady cost is one 16-character digest in each ping and none in the pong.

The scheduler learns the apps the edges infer from the first call of each new run (its app id,
:attr:`~hermes.gateway.edge.wire.Call.app_id`), so that ``hermes apps`` lists them there and
finds them by name to rename or merge. A newly elected scheduler learns them at once: each
edge sends it the apps its resolver knows (:meth:`EdgeRuns.apps_seen`, one
:class:`~hermes.gateway.edge.wire.Apps` message at the new leader's first pong), so that after
a failover they are listed, renamed and merged before their next new run. Why the edges: they
hold every app they inferred, in memory, and outlive the scheduler's death; the run documents a
standby restores do not have them (an inferred run is not stored at its start, and a stored
one names its app, not the app's id), and keeping the apps in the knowledge base would put a
write per new app on the scheduler, which a ``kill -9`` just after it could still lose.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hermes.fsutil import atomic_write_text
from hermes.gateway.config import IdentityConfig
from hermes.gateway.edge import wire
from hermes.gateway.resolve import AppNames, Identity, Resolver
from hermes.gateway.shared import StoreUnavailable
from hermes.gateway.state import ACTIVE, new_run_id

log = logging.getLogger("hermes.gateway.edge")

#: the resolver's evidence kinds of a request that is not in an inferred run
_NOT_INFERRED = frozenset({"header", "opt-out", "off"})


def close_due(edge_idle_s: float, sched_idle_s: float, in_flight: int,
              slack_s: float = 0.25) -> bool:
    """Whether the scheduler ends an inferred run an edge closed after ``edge_idle_s`` of
    idleness as that edge saw it: not while the run has requests in flight, nor when the
    scheduler saw activity of the run since (``sched_idle_s`` shorter than the edge's by
    more than ``slack_s``: a call or answer through another edge, whose resolver closes it
    later)."""
    return in_flight == 0 and sched_idle_s + slack_s >= edge_idle_s


class EdgeRuns:
    """The run resolver of one edge (module doc). ``index``: the shared evidence index
    (``[cluster] store``), or None (this edge's own, in memory)."""

    #: closed runs kept for the scheduler while none is reachable (oldest dropped past it:
    #: the scheduler's idle reaping ends those)
    MAX_PENDING = 10_000

    def __init__(self, config: IdentityConfig, index: Any | None = None) -> None:
        self.config = config
        self.index = index
        self.resolver = Resolver(config, new_run_id=new_run_id, index=index,
                                 adopt=self._adopt if index is not None else None)
        #: closed runs not yet told to a scheduler
        self.pending: list[wire.ClosedRun] = []
        self.closed = 0
        #: the tenant of the request being resolved (for :meth:`_adopt`)
        self._tenant: str | None = None
        self._names_digest = ""

    @property
    def enabled(self) -> bool:
        return self.config.infer

    @property
    def names_digest(self) -> str:
        """The digest of the app names followed ("" before the scheduler sent any)."""
        return self._names_digest

    def follow_names(self, names: wire.Names) -> None:
        """The active scheduler's app names (module doc, "App names"): applied to the runs
        this edge's resolver starts from now on (open runs keep their app, as at the
        all-in-one gateway)."""
        self.resolver.names = AppNames(renames=names.renames, merges=names.merges)
        self._names_digest = names.digest

    def apps_seen(self, now: float) -> list[wire.AppSeen]:
        """The apps this edge's resolver knows, for a newly elected scheduler
        (:class:`~hermes.gateway.edge.wire.Apps`; module doc, "App names")."""
        return [wire.AppSeen(a.app_id, a.name, a.tenant, a.model, list(a.tools),
                             a.instructions, max(0.0, now - a.first_seen), a.runs)
                for a in self.resolver.apps.apps()]

    def resolve(self, tenant: str, body: Mapping[str, Any], headers: Mapping[str, str],
                now: float, messages: Sequence[Any] | None = None) -> Identity | None:
        """The inferred run, app and unit of a request, or None when it is not in one (it
        names its run, opts out, or inference is off). Raises
        :class:`~hermes.gateway.shared.StoreUnavailable` when the shared index cannot
        answer and the store's policy refuses."""
        self._tenant = tenant
        try:
            ident = self.resolver.resolve(tenant, body, headers, now, messages=messages)
        finally:
            self._tenant = None
        if ident.evidence in _NOT_INFERRED or not ident.run:
            return None
        if ident.new_run and self.index is not None:
            self.index.remember_run(tenant, ident.run, ident.app, ident.app_id)
        return ident

    def _adopt(self, run_key: str) -> tuple[str, str, str] | None:
        """A run the shared evidence names that this edge's resolver does not track: joined
        while the index still has its run info (another edge opened it and the scheduler has
        not ended it). The tenant is the request's being resolved (:attr:`_tenant`)."""
        tenant = self._tenant
        if tenant is None or self.index is None:
            return None
        info = self.index.run_info(tenant, run_key)
        if info is None:
            return None
        app, app_id = info
        return tenant, app, app_id or app

    def answered(self, ident: Identity, replies: Any, now: float) -> None:
        """The call of ``ident`` was answered with ``replies`` (one assistant message per
        choice, or None): the conversation they complete leads to the run."""
        try:
            self.resolver.answered(ident, replies, now)
        except StoreUnavailable:
            pass  # the answer is out; its evidence is lost (the store logged and counts it)

    def abandoned(self, ident: Identity, now: float) -> None:
        self.resolver.abandoned(ident, now)

    def ended(self, ident: Identity, now: float) -> None:
        """The scheduler refused the call of ``ident``: its run has ended there (closed
        through another edge, reaped, finished through the API). The resolver forgets it,
        and so does the shared index (no edge adopts it any more), so that the call, resolved
        again, starts a new run (as the all-in-one gateway's binding does)."""
        self.resolver.abandoned(ident, now)
        self.resolver.forget(ident.run)
        if self.index is not None:
            try:
                self.index.forget_run(ident.tenant, ident.run)
            except StoreUnavailable:
                pass  # the store logged it; adoption then finds the run again and is refused

    def held(self, now: float) -> list[wire.HeldRun]:
        """The open runs, for a :class:`~hermes.gateway.edge.wire.Handover` at a clean stop."""
        return [wire.HeldRun(key, round(idle, 3), round(after, 3))
                for key, idle, after in self.resolver.held(now)]

    def save(self, path: Path) -> int:
        """Write the resolver's state (the index when it is this edge's own, the open runs,
        the apps' gaps) to ``path`` (a clean stop), so that the edge started again in its
        place joins continuing conversations to their runs. Returns the open runs saved."""
        data = self.resolver.snapshot()
        atomic_write_text(path, json.dumps(data, separators=(",", ":")))
        return len(data["open"])

    def load(self, path: Path) -> int:
        """Read what :meth:`save` wrote (a start) and delete it (a crash later must not bring
        back a stale state). The runs the scheduler has ended meanwhile are found out at
        their next call (:meth:`ended`). Returns the open runs restored."""
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as e:
            log.warning("ignoring the edge's saved run resolver state in %s: %s", path, e)
            return 0
        n = self.resolver.restore(data)
        path.unlink(missing_ok=True)
        return n

    def sweep(self, now: float) -> list[wire.ClosedRun]:
        """Close the idle runs; returns every closed run not yet told to a scheduler (kept
        in :attr:`pending` until :meth:`told`)."""
        for c in self.resolver.sweep(now):
            self.pending.append(wire.ClosedRun(c.run, round(c.idle_s, 3)))
            self.closed += 1
        if len(self.pending) > self.MAX_PENDING:
            del self.pending[:len(self.pending) - self.MAX_PENDING]
        return self.pending

    def told(self) -> None:
        """The closed runs :meth:`sweep` returned reached a scheduler."""
        self.pending = []


class HandedRuns:
    """The scheduler's side of a :class:`~hermes.gateway.edge.wire.Handover`: the inferred
    runs stopped edges held open, each closed once idle past its app's figure (as the edge's
    resolver would have), unless a call of it comes first (:meth:`pop`: the edge that sent
    it adopted the run and closes it). Without a handover such a run would stay open until
    the scheduler's idle reaping (``scheduler.run_idle_timeout_s``)."""

    def __init__(self) -> None:
        #: run -> idleness (model seconds) after which it closes
        self._after: dict[str, float] = {}

    def __bool__(self) -> bool:
        return bool(self._after)

    def __len__(self) -> int:
        return len(self._after)

    def take(self, held: Sequence[wire.HeldRun], runs: Mapping[str, Any], now: float,
             scale: float) -> None:
        """Keep the runs of a handover that are active here and were not active since the
        stopping edge last saw them (:func:`close_due`'s test: a call through another
        edge that overtook the handover means that edge holds the run now)."""
        for h in held:
            run = runs.get(h.run)
            if run is None or run.status not in ACTIVE:
                continue
            if close_due(h.idle_s, (now - run.last_activity) * scale, 0):
                self._after[h.run] = h.close_after_s

    def pop(self, run: str) -> None:
        self._after.pop(run, None)

    def due(self, runs: Mapping[str, Any], now: float, scale: float) -> list[wire.ClosedRun]:
        """The handed-over runs idle past their figure (model seconds: ``scale`` times the
        monotonic seconds from a run's ``last_activity`` to ``now``), for
        :attr:`hermes.gateway.edge.link.EdgeLink.closing`; runs ended meanwhile are dropped,
        runs with requests in flight wait."""
        out: list[wire.ClosedRun] = []
        for key, after in list(self._after.items()):
            run = runs.get(key)
            if run is None or run.status not in ACTIVE:
                del self._after[key]
                continue
            idle = (now - run.last_activity) * scale
            if idle > after and not run.pending:
                out.append(wire.ClosedRun(key, round(idle, 3)))
                del self._after[key]
        return out


def inferred_app_id(ident: Identity) -> str | None:
    """The app id a new run's first call carries (:attr:`~hermes.gateway.edge.wire.Call.
    app_id`): that of an app inferred from the request's fingerprint; None for a next call,
    or an app the client named (``X-Hermes-App``: not an inferred app, as at the all-in-one
    gateway)."""
    if not ident.new_run or not ident.app_id or "/" in ident.app_id:
        return None
    return ident.app_id


def run_headers(ident: Identity) -> dict[str, str]:
    """The headers an answer of an inferred run carries, as the all-in-one gateway's."""
    return {"X-Hermes-Run": ident.run, "X-Hermes-Unit": ident.unit, "X-Hermes-App": ident.app}

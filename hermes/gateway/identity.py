"""Inferred runs in the live gateway: the run resolver bound to the run registry (issue 17).

:class:`RunIdentities` is the one place where a request of the OpenAI edge becomes a run and a
unit: it asks the pure :class:`~hermes.gateway.resolve.Resolver` who the request belongs to
(Hermes headers, explicit ids, conversation continuation; see :mod:`hermes.gateway.resolve`)
and turns the answer into a :class:`~hermes.gateway.state.LiveRun` of the registry:

- ``X-Hermes-Run: ID``: that active run, as before;
- ``X-Hermes-Run: none`` or ``[identity] infer = false``: a one-request run of app
  ``default`` (or ``X-Hermes-App``), finished once its answer has left (the per-request
  behaviour of a gateway without inference);
- otherwise an **inferred** run (``LiveRun.inferred``, ``"inferred": true`` in ``GET
  /v1/runs/{id}``): created on its first request with the id the resolver chose, joined by
  every request that continues it, ranked like any run from its (inferred) app's PDGraph,
  and finished by :meth:`sweep` once idle past its app's gap figure, at the time of its last
  answer (so its ACT and record are the run's, not the wait for the close). A run ended by
  other means (``POST /v1/runs/{id}/finish``, cancel, failure) is forgotten by the resolver
  (:meth:`run_ended`), and a request that would have continued it starts a new run of the
  same app.

Apps: :meth:`apps` lists the inferred ones; :meth:`rename` and :meth:`merge` change what the
next runs of one are called (``hermes apps rename|merge``), stored in the knowledge base
(document ``app_names``) so that every gateway sharing it, and the next start, agree. With
split roles the apps are inferred at the edges: the scheduler learns them from their runs'
first calls (:meth:`noted`) and, once elected, from the edges' own books (:meth:`learned`:
a failover loses none), the edges follow its mapping (:attr:`names_digest`, sent over
the edge link: :mod:`hermes.gateway.edge.infer`), and an elected standby reads the mapping
again (:meth:`reload_names`). Elected all-in-one gateways have no edges to tell a new leader
their apps: the leader keeps the apps its resolver knows in the knowledge base (document
``inferred_apps``, written off the event loop once apps were added: :meth:`take_apps_doc`,
:meth:`store_apps`) and the one elected after it reads them at takeover
(:meth:`stored_apps`, :meth:`learned_stored`), so that they are listed, renamed and merged
there before their next new run.

The edge reports every answer (:meth:`answered`, with the reply messages, so that the next
turn of the conversation is found) or failure (:meth:`abandoned`). Restarts: the resolver's
index and open runs are written to ``identity.json`` in the state directory when the gateway
stops (:meth:`save`) and read when it starts (:meth:`load`), so that a continuation after a
restart still joins its run; after a crash the index since the last save is lost (such a
continuation starts a new run of the same app) and the recovered inferred runs it no longer
tracks are finished by the scheduler's idle sweep (``run_idle_timeout_s``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hermes.fsutil import atomic_write_text
from hermes.gateway.config import IdentityConfig
from hermes.gateway.context import SchedulerContext
from hermes.gateway.errors import SharedStateUnavailable
from hermes.gateway.resolve import AppInfo, AppNames, Identity, Resolver
from hermes.gateway.runs import RunObserver, RunRegistry
from hermes.gateway.shared import StoreUnavailable
from hermes.gateway.shared.evidence import RedisKeyIndex
from hermes.gateway.slices import SlicedQueue
from hermes.gateway.state import ACTIVE, LiveRun, new_run_id

log = logging.getLogger("hermes.gateway.identity")

SNAPSHOT_FILE = "identity.json"
#: the knowledge-base document of the operator's renames and merges of inferred apps
NAMES_DOC = "app_names"
#: the knowledge-base document of the apps an elected all-in-one leader's resolver knows
APPS_DOC = "inferred_apps"
APPS_DOC_VERSION = 1
#: an app as told to this process: app id, name, tenant, model, tools, instructions, age
#: (model s since first seen), runs started
AppRow = tuple[str, str, str, str, list[str], str, float, int]


class RunIdentities(RunObserver):
    """Requests -> runs and units, through the run resolver (see the module docstring)."""

    def __init__(self, ctx: SchedulerContext, registry: RunRegistry, config: IdentityConfig,
                 *, state_dir: Path | None = None, kb: Any | None = None,
                 shared_index: RedisKeyIndex | None = None) -> None:
        """``shared_index``: the evidence index in the shared store (``cluster.store``): a
        run's evidence then leads to it from any gateway process, and after a crash of this
        one (the recovered run is adopted: :meth:`_adopt`)."""
        self.ctx = ctx
        self.registry = registry
        self.kb = kb
        self.shared_index = shared_index
        self.resolver = Resolver(config, names=self._stored_names(), new_run_id=new_run_id,
                                 index=shared_index,
                                 adopt=self._adopt if shared_index is not None else None)
        self.path = None if state_dir is None else Path(state_dir) / SNAPSHOT_FILE
        #: :meth:`AppNames.digest` of the mapping now applied (edges follow it: split roles)
        self.names_digest = self.resolver.names.digest()
        #: requests by the kind of evidence that placed them (``header``, ``continuation``,
        #: ``session``, ``new``, ...), for ``/metrics``
        self.evidence: Counter[str] = Counter()
        #: inferred runs closed by the resolver, by reason (``idle``, ``evicted``)
        self.closed: Counter[str] = Counter()
        #: the app book's ``added`` count when :meth:`take_apps_doc` last made a document
        self._apps_taken = 0
        #: runs the resolver closed, waiting to be finished (:meth:`sweep`)
        self.closing: SlicedQueue[tuple[str, float]] = SlicedQueue(
            self._finish_closed, name="closing idle inferred runs")

    # ------------------------------------------------------------------ per request
    def bind(self, tenant: str, body: Mapping[str, Any], headers: Mapping[str, str], *,
             messages: Sequence[Any] | None = None, k: float | None = None,
             deadline_s: float | None = None) -> tuple[LiveRun, Identity]:
        """The run a request belongs to (created if it is the first of its run) and its
        identity (the unit is ``identity.unit``). ``messages``: the chat form of the request
        when the edge has it (a Responses request with its stored history). Raises the
        registry's errors for a named run that is unknown or no longer active."""
        now = self.ctx.now()
        resolver = self.resolver
        try:
            ident = resolver.resolve(tenant, body, headers, now, messages=messages)
        except StoreUnavailable as e:
            raise SharedStateUnavailable(f"{e}; retry later") from None
        self.evidence[ident.evidence.split(":", 1)[0]] += 1
        reg = self.registry
        if ident.evidence == "header":
            return reg.active_run(ident.run), ident
        if not ident.run:  # opt-out, or inference off: a one-request run
            return reg.create_run(ident.app, tenant=tenant, k=k, deadline_s=deadline_s,
                                  auto_finish=True), ident
        if not ident.new_run:
            run = reg.runs.get(ident.run)
            if run is not None and run.status in ACTIVE:
                return run, ident
            # ended by other means meanwhile: resolve again, which starts a new run
            resolver.abandoned(ident, now)
            resolver.forget(ident.run)
            ident = resolver.resolve(tenant, body, headers, now, messages=messages)
        # with this process's own evidence index, a crash loses the way to the run (the
        # next turn starts a new one): it is stored from its progress on, not at its
        # creation (LiveRun.lazy_store; durable's module doc)
        run = reg.create_run(ident.app, tenant=tenant, k=k, deadline_s=deadline_s,
                             run_id=ident.run, inferred=True,
                             lazy_store=self.shared_index is None)
        if self.shared_index is not None:
            self.shared_index.remember_run(tenant, ident.run, ident.app, ident.app_id)
        return run, ident

    def _adopt(self, run_key: str) -> tuple[str, str, str] | None:
        """``(tenant, app, app_id)`` of an inferred run the shared evidence names that the
        registry has active, for the resolver to join (the run lives where runs live: the
        registry; the resolver of this process did not open it)."""
        run = self.registry.runs.get(run_key)
        if run is None or run.status not in ACTIVE or not run.inferred:
            return None
        tenant = run.state.tenant
        assert self.shared_index is not None
        info = self.shared_index.run_info(tenant, run_key)
        app, app_id = info if info is not None else (run.app, run.app)
        return tenant, app, app_id

    def answered(self, ident: Identity, replies: Any, *, response_id: str | None = None) -> None:
        """Hermes returned ``replies`` (one assistant message per choice) for the request of
        ``ident``: the conversation they complete now leads to its run."""
        try:
            self.resolver.answered(ident, replies, self.ctx.now(), response_id=response_id)
        except StoreUnavailable:
            pass  # the answer is out; its evidence is lost (the store logged and counts it)

    def abandoned(self, ident: Identity) -> None:
        """The request of ``ident`` failed or its client went away."""
        self.resolver.abandoned(ident, self.ctx.now())

    # ------------------------------------------------------------------ run ends
    def sweep(self) -> int:
        """Finish the inferred runs the resolver closed (idle past their app's figure, or
        evicted by ``max_open_runs``), each at its last activity, a slice at a time on the
        event loop (:class:`~hermes.gateway.slices.SlicedQueue`: a sweep closes hundreds at
        once under load). Returns how many were queued."""
        now = self.ctx.now()
        closed = self.resolver.sweep(now)
        for c in closed:
            self.closed[c.reason] += 1
        self.closing.extend((c.run, now - c.idle_s) for c in closed)
        return len(closed)

    def _finish_closed(self, item: tuple[str, float]) -> None:
        run_id, at = item
        run = self.registry.runs.get(run_id)
        if run is None or run.status not in ACTIVE or not run.inferred:
            return  # ended meanwhile
        self.registry.finish_run(run_id, at=at)

    def closes_itself(self, run: LiveRun) -> bool:
        """The resolver will close ``run`` (the scheduler's idle sweep leaves it alone)."""
        return run.inferred and self.resolver.is_open(run.run_id)

    def run_ended(self, run: LiveRun) -> None:
        if run.inferred:
            self.resolver.forget(run.run_id)

    # ------------------------------------------------------------------ apps
    def apps(self) -> list[AppInfo]:
        """The apps inferred so far (names after the operator's renames)."""
        return self.resolver.app_list()

    def app_id(self, name: str) -> str:
        """The app id of the inferred app called ``name`` (``KeyError`` if none): after
        the merges (an app merged into another is listed under the other's name, and that
        name is the other's)."""
        for info in self.resolver.app_list():
            if info.name == name:
                return self.resolver.names.canonical(info.app_id)
        raise KeyError(name)

    def rename(self, name: str, to: str) -> str:
        """Name the inferred app ``name`` ``to`` from its next run on; stored with the
        knowledge base. Returns its app id. ``KeyError``: no such inferred app;
        ``ValueError``: a bad or taken name."""
        app_id = self.app_id(name)
        if to != name and any(i.name == to for i in self.resolver.app_list()):
            raise ValueError(f"app name {to!r} is taken by another inferred app")
        self.resolver.names.rename(app_id, to)
        self._store_names()
        return app_id

    def merge(self, name: str, into: str) -> str:
        """Runs fingerprinted as the inferred app ``name`` are runs of ``into`` (an inferred
        app) from now on; stored with the knowledge base. Returns ``into``'s app id.

        ``into``'s present name is kept in the mapping (as a rename to itself, when it has
        none): a resolver that has not seen ``into`` itself (an edge, or this gateway after a
        restart) names a merged run by the mapping alone."""
        app_id, target = self.app_id(name), self.app_id(into)
        if app_id == target:
            raise ValueError(f"{name!r} is {into!r} already (merged into it, or the same app)")
        names = self.resolver.names
        names.merge(app_id, target)
        names.renames.setdefault(target, into)
        self._store_names()
        return target

    def noted(self, app_id: str, name: str, tenant: str, model: str) -> None:
        """An inferred app an edge's resolver named (the first call of a new run, split
        roles): listed here, and renamed or merged here (``hermes apps``)."""
        self.resolver.apps.note(app_id, name=name, tenant=tenant, model=model,
                                now=self.ctx.now())

    def learned(self, apps: Iterable[Any]) -> None:
        """The apps an edge's resolver knows (:class:`~hermes.gateway.edge.wire.AppSeen`:
        ``app_id``, ``name``, ``tenant``, ``model``, ``tools``, ``instructions``, ``age_s``,
        ``runs``), told to this scheduler once it leads (split roles): listed, renamed and
        merged here at once after a failover, rather than from each app's next new run."""
        self._learn([(a.app_id, a.name, a.tenant, a.model, list(a.tools), a.instructions,
                      a.age_s, a.runs) for a in apps])

    def _learn(self, rows: Iterable[AppRow]) -> int:
        """Remember apps told as rows of ``app_id, name, tenant, model, tools,
        instructions, age_s, runs``; returns how many rows."""
        book = self.resolver.apps
        now = self.ctx.now()
        n = 0
        for app_id, name, tenant, model, tools, instructions, age_s, runs in rows:
            book.learn(AppInfo(app_id, name, tenant, model, list(tools), instructions,
                               now - age_s, runs))
            n += 1
        return n

    # ------------------------------------------------------------------ apps, persisted
    def take_apps_doc(self) -> str | None:
        """The ``inferred_apps`` document of the apps this resolver knows (module doc), when
        some were added since the last document taken; else None. On the event loop (it
        reads the book); :meth:`store_apps` writes it, off the loop. Ages, not times: the
        clocks of two processes differ at a time scale other than 1."""
        book = self.resolver.apps
        if book.added == self._apps_taken:
            return None
        self._apps_taken = book.added
        now = self.ctx.now()
        rows = [[a.app_id, a.name, a.tenant, a.model, a.tools, a.instructions,
                 round(max(0.0, now - a.first_seen), 3), a.runs] for a in book.apps()]
        return json.dumps({"version": APPS_DOC_VERSION, "apps": rows}, separators=(",", ":"))

    def apps_doc_not_stored(self) -> None:
        """The last document taken was not written: the next :meth:`take_apps_doc` makes one
        again."""
        self._apps_taken = -1

    def store_apps(self, doc: str) -> None:
        """Write an ``inferred_apps`` document to the knowledge base (a thread)."""
        if self.kb is not None:
            self.kb.put_doc(APPS_DOC, doc)

    def stored_apps(self) -> list[AppRow]:
        """The apps the ``inferred_apps`` document holds (a thread; a newly elected leader):
        rows for :meth:`learned_stored`. None stored, or a store that cannot answer: none,
        logged (they are listed again from their next new run)."""
        if self.kb is None:
            return []
        try:
            text = self.kb.get_doc(APPS_DOC)
            if text is None:
                return []
            doc = json.loads(text)
            if doc.get("version") != APPS_DOC_VERSION:
                raise ValueError(f"version {doc.get('version')!r}, not {APPS_DOC_VERSION}")
            rows = [(str(app_id), str(name), str(tenant), str(model),
                     [str(t) for t in tools], str(instructions), float(age_s), int(runs))
                    for app_id, name, tenant, model, tools, instructions, age_s, runs
                    in doc["apps"]]
        except Exception as e:  # a store that cannot answer now, or a damaged document
            log.warning("inferred apps not loaded from %s (document %s): %s", self.kb,
                        APPS_DOC, e)
            return []
        return rows

    def learned_stored(self, rows: Sequence[AppRow]) -> int:
        """Remember the apps of :meth:`stored_apps` (on the event loop); how many."""
        return self._learn(rows)

    def reload_names(self) -> bool:
        """Read the operator's renames and merges again from the knowledge base (a standby
        elected: the previous leader may have changed them since this process started).
        Returns whether they changed; a store that cannot answer keeps the ones held."""
        names = self._stored_names()
        if names is None or names.digest() == self.names_digest:
            return False
        self.resolver.names = names
        self.names_digest = names.digest()
        return True

    def _stored_names(self) -> AppNames | None:
        if self.kb is None:
            return None
        try:
            text = self.kb.get_doc(NAMES_DOC)
            return None if text is None else AppNames.model_validate_json(text)
        except Exception as e:  # a store that cannot answer now, or a damaged document
            log.warning("app names (renames, merges) not loaded from %s: %s", self.kb, e)
            return None

    def _store_names(self) -> None:
        self.names_digest = self.resolver.names.digest()
        if self.kb is not None:
            self.kb.put_doc(NAMES_DOC, self.resolver.names.model_dump_json())

    # ------------------------------------------------------------------ restarts
    def save(self) -> None:
        """Write the resolver's index and open runs (gateway stop)."""
        if self.path is None:
            return
        try:
            atomic_write_text(self.path, json.dumps(self.resolver.snapshot(),
                                                    separators=(",", ":")))
        except OSError as e:
            log.warning("could not save the run resolver's state to %s: %s", self.path, e)

    def load(self) -> int:
        """Read the state :meth:`save` wrote (gateway start, after recovery restored the runs):
        the open inferred runs the registry still has active. Returns how many."""
        if self.path is None or not self.path.exists():
            return 0
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as e:
            log.warning("ignoring the run resolver's state in %s: %s", self.path, e)
            return 0
        runs = self.registry.runs

        def active(key: str) -> bool:
            run = runs.get(key)
            return run is not None and run.inferred and run.status in ACTIVE

        n = self.resolver.restore(data, active=active)
        log.info("run resolver: %d open inferred runs and %d index entries restored from %s",
                 n, len(self.resolver.index), self.path)
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # a crash later must not restore this stale state
        return n

    def stats(self) -> dict[str, int]:
        """Sizes of the resolver's bounded structures (``/metrics``)."""
        return self.resolver.stats()


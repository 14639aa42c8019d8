"""Learning from finished runs: run records, the apps' profilers, the knowledge-base writer.

Every finished run becomes a :class:`~hermes.core.records.RunRecord`, appended to
``<state_dir>/records.jsonl`` and fed to the app's :class:`~hermes.core.profiler.Profiler`
(:class:`Learner` hears of it as a :class:`~hermes.gateway.runs.RunObserver`). At most every
``stores.learn_interval_s`` per app the learned PDGraph replaces the app's graph in the
policy's :class:`~hermes.core.estimator.EstimatorPool` (:meth:`Learner.refresh_graphs`), and
(every ``stores.kb_write_every`` runs) in the knowledge base, written from a worker thread,
off the event loop.

Cost per request must not grow with history: the learning loop feeds records to the
profilers, rebuilds graphs, builds their estimators and draws ahead the walks of the states
the previous estimator served most (:meth:`~hermes.gateway.sample_cache.CachingEstimatorPool.
prepare`) in a worker thread, then installs the results on the event loop in one step. An
app is rebuilt when its new runs reach ``stores.learn_growth`` of the runs it was built from
(every run at first), so a long-lived app changes version ever more rarely; at most
``stores.max_learned_apps`` apps keep a profiler, a graph and an estimator in memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from cachetools import TTLCache

from hermes.core.learn_sampling import RunSampler
from hermes.core.profiler import Profiler
from hermes.core.records import RequestRecord, RunRecord, UnitRecord
from hermes.gateway.config import resolve_state_dir
from hermes.gateway.context import SchedulerContext
from hermes.gateway.finished import RecordLine
from hermes.gateway.runs import RunObserver
from hermes.gateway.state import LiveRun
from hermes.kb.base import APP_NAME_RE

log = logging.getLogger("hermes.gateway.learning")

#: :meth:`Learner._kb_read`'s "not remembered" (None is a remembered answer: no graph)
_UNREAD = object()


def open_kb(url: str, state_dir: str) -> Any | None:
    """The knowledge base. A directory (the shipped ``pdgraphs/`` by default) is read-only to
    the gateway: what it learns goes to ``<state_dir>/pdgraphs`` on top of it."""
    if not url:
        return None
    from hermes.kb import open_store
    from hermes.kb.file import FileStore
    from hermes.kb.overlay import OverlayStore

    store = open_store(url)
    if isinstance(store, FileStore):
        return OverlayStore(FileStore(resolve_state_dir(state_dir) / "pdgraphs"), store)
    return store


class Learner(RunObserver):
    """Records finished runs and keeps the apps' learned PDGraphs (see the module doc)."""

    def __init__(self, ctx: SchedulerContext, kb: Any | None, records_path: Path) -> None:
        self.ctx = ctx
        self.kb = kb
        self.records_path = records_path
        #: app -> its profiler, least recently learned first (bounded: max_learned_apps)
        self.profilers: OrderedDict[str, Any] = OrderedDict()
        #: runs each app's profiler has learned from (admin: ``learned_runs``)
        self.profiled_runs: dict[str, int] = {}
        #: records not yet given to their profiler (the worker thread does), per app
        self._pending: dict[str, list[RunRecord]] = {}
        #: runs each app's current graph was built from (the rebuild cadence)
        self._built_runs: dict[str, int] = {}
        #: held while profilers learn or build (the worker thread, or a rebuild on demand)
        self._lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._kb_written: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._latest_graphs: dict[str, Any] = {}  # app -> the last PDGraph refresh_graphs built
        #: apps whose graph was learned from traffic alone, least recently learned first
        #: (bounded by ``identity.max_apps``: :meth:`_make_room`)
        self._learned_only: OrderedDict[str, None] = OrderedDict()
        #: records for the knowledge base's log, as their JSON lines (not pydantic models:
        #: a dozen objects each for the garbage collector to walk while they wait)
        self._kb_records: list[RecordLine] = []
        self._records_fh: Any = None
        #: app -> its knowledge-base graph or None, as the request path last read it
        #: (:meth:`_kb_read`): kept ``learn_interval_s``, at most ``max_learned_apps`` apps,
        #: least recently read out first
        st = ctx.config.stores
        self._kb_reads: TTLCache[str, Any | None] = TTLCache(
            maxsize=st.max_learned_apps, ttl=st.learn_interval_s, timer=time.monotonic)
        #: which runs of a busy app are learned (:meth:`_sampled_in`): apps with a profiler only
        self.sampler = RunSampler(st.learn_runs_per_s, st.learn_sample_after)
        self._clock = time.monotonic
        #: app -> values its profiler holds, as of its last learning pass (the worker
        #: thread writes it: :meth:`stats` reads it without the profilers' lock)
        self._held: dict[str, int] = {}

    # ------------------------------------------------------------------ records
    def run_ended(self, run: LiveRun) -> None:
        """A finished run is recorded once (the record before its durable end: a kill between
        the two leaves a run that resumes, and finds its record, :meth:`recorded_run_ids`)."""
        if run.status == "finished" and run.units and not run.recorded:
            app = run.state.app
            if not self.learns_from(app, run.state.tenant):
                self.ctx.stats["runs_not_learned"] = self.ctx.stats.get("runs_not_learned", 0) + 1
            elif self._sampled_in(app):
                self.learn(self.record(run))
            else:
                n = self.ctx.stats["runs_sampled_out"] = self.ctx.stats.get("runs_sampled_out", 0) + 1
                if n == 1:  # the operator is told once (then: hermes_runs_sampled_out_total)
                    log.info("learning %s from a sample of its runs: about %g a second "
                             "(stores.learn_runs_per_s; 0 learns every run), the others are "
                             "counted in hermes_runs_sampled_out_total and not recorded",
                             app, self.sampler.runs_per_s)
            run.recorded = True

    def _sampled_in(self, app: str) -> bool:
        """Whether this finished run of ``app`` is learned from: a busy app is learned from
        about ``stores.learn_runs_per_s`` of its runs a second, once this process has learned
        ``stores.learn_sample_after`` of them (:class:`~hermes.core.learn_sampling.RunSampler`,
        which says why that loses nothing its graph reads)."""
        return self.sampler.keep(app, self.profiled_runs.get(app, 0), self._clock())

    def learns_from(self, app: str, tenant: str | None) -> bool:
        """Whether a run of ``tenant`` may teach ``app``'s PDGraph. With authentication
        off, always (one trust domain). With it on: a tenant's own apps (``TENANT.NAME``,
        inferred apps included) learn from that tenant's runs only; shared apps learn from
        no tenant's runs unless the admin opted in (``identity.learn_shared_from_tenants``),
        so that one tenant cannot skew the demand model every other tenant is ranked by."""
        sec = self.ctx.config.security
        if not (sec.auth_file or sec.auth_redis):
            return True
        owner, dot, _ = app.rpartition(".")
        if dot and owner:
            return owner == tenant
        return bool(self.ctx.config.identity.learn_shared_from_tenants) or \
            tenant in (None, "", "default")

    def record(self, run: LiveRun) -> RunRecord:
        """The run's record: its units in order of start, with their requests' tokens or
        their duration."""
        units = []
        for inv in sorted(run.units, key=lambda u: u.started):
            results = inv.llm_results()
            finished = inv.finished if inv.finished is not None else inv.started
            if results:
                units.append(UnitRecord(
                    unit=inv.unit, backend=inv.backend, started=inv.started, finished=finished,
                    requests=[RequestRecord(input_tokens=d.input_tokens, output_tokens=d.output_tokens)
                              for d in results],
                    upstream=inv.upstream,
                ))
            else:
                backend = inv.backend if not inv.backend.startswith("llm:") else "api:client"
                units.append(UnitRecord(
                    unit=inv.unit, backend=backend, started=inv.started, finished=finished,
                    duration_s=float(inv.duration_s if inv.duration_s is not None else finished - inv.started),
                    upstream=inv.upstream,
                ))
        st = run.state
        return RunRecord(app=st.app, run_id=st.run_id, submitted=st.submitted,
                         finished=st.finished or self.ctx.now(), deadline=st.deadline, units=units)

    def recorded_run_ids(self, tail_bytes: int = 1 << 16) -> set[str]:
        """Run ids of the last records in records.jsonl (its last ``tail_bytes``): after a
        restart, a run whose record was written just before the kill but whose end was not
        stored resumes, and must not be recorded twice. Only the run being finished at the
        kill can be in that state (record and durable end are written in one synchronous
        step), so the tail is enough."""
        try:
            with self.records_path.open("rb") as fh:
                size = fh.seek(0, 2)
                fh.seek(max(0, size - tail_bytes))
                lines = fh.read().splitlines()
        except FileNotFoundError:
            return set()
        if size > tail_bytes:
            lines = lines[1:]  # cut through
        out: set[str] = set()
        for line in lines:
            try:
                out.add(json.loads(line)["run_id"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line
        return out

    def learn(self, rec: RunRecord) -> None:
        """Append the record and feed it to its app's profiler.

        Rebuilding the PDGraph (masks, sample lists) costs milliseconds, so it is done at most
        every ``learn_interval_s`` per app (:meth:`refresh_graphs`), and knowledge-base writes
        (which fsync) run in a worker thread, off the event loop.
        """
        if self._records_fh is None:
            self._records_fh = self.records_path.open("a")
        line = RecordLine.of(rec)  # queued for the knowledge base as its line, not a model
        self._records_fh.write(line.line + "\n")
        self._records_fh.flush()
        self.ctx.stats["records_written"] += 1
        self.profiler(rec.app)  # made here, on the event loop (the knowledge base's graph)
        with self._pending_lock:
            self._pending.setdefault(rec.app, []).append(rec)
        self._dirty.add(rec.app)
        self._kb_records.append(line)
        self.profiled_runs[rec.app] = self.profiled_runs.get(rec.app, 0) + 1

    def profiler(self, app: str) -> Any:
        prof = self.profilers.get(app)
        if prof is None:
            base = self.kb.get(app) if self.kb is not None else None
            if base is None:
                self._make_room()
                self._learned_only[app] = None  # a graph made from traffic alone
            prof = self.profilers[app] = Profiler(app, base)
            self._bound_apps()
        else:
            self.profilers.move_to_end(app)
            if app in self._learned_only:
                self._learned_only.move_to_end(app)
        return prof

    def _make_room(self) -> None:
        """Keep the apps learned from traffic alone within ``identity.max_apps``: the least
        recently learned is forgotten, its PDGraph file and record log too (13,000
        header-less apps wrote 13,000 files, and a restart read them all). Shipped and
        uploaded graphs stay."""
        cap = self.ctx.config.identity.max_apps
        while len(self._learned_only) >= cap:
            old, _ = self._learned_only.popitem(last=False)
            self.profilers.pop(old, None)
            self._held.pop(old, None)
            self.sampler.forget(old)
            self.profiled_runs.pop(old, None)
            self._kb_written.pop(old, None)
            self._latest_graphs.pop(old, None)
            self._dirty.discard(old)
            self._built_runs.pop(old, None)
            with self._pending_lock:
                self._pending.pop(old, None)
            if self.ctx.pool is not None and hasattr(self.ctx.pool, "forget"):
                self.ctx.pool.forget(old)
            self._kb_records = [r for r in self._kb_records if r.app != old]
            self._kb_reads.pop(old, None)
            self.ctx.stats["apps_evicted"] = self.ctx.stats.get("apps_evicted", 0) + 1
            if self.kb is not None:
                try:
                    self.kb.delete(old)
                    self.kb.clear_records(old)
                except Exception:
                    log.exception("knowledge base delete failed for %s", old)

    def _bound_apps(self) -> None:
        """Forget the least recently learned apps past ``stores.max_learned_apps``: their
        profiler, graph and estimator (the knowledge base keeps what was written)."""
        cap = self.ctx.config.stores.max_learned_apps
        while len(self.profilers) > cap:
            app = next(iter(self.profilers))
            self.profilers.pop(app, None)  # a build under way keeps its own reference
            self._held.pop(app, None)
            self.sampler.forget(app)
            with self._pending_lock:
                self._pending.pop(app, None)
            self._dirty.discard(app)
            self._latest_graphs.pop(app, None)
            self._built_runs.pop(app, None)
            self.profiled_runs.pop(app, None)
            self._kb_written.pop(app, None)
            if self.ctx.pool is not None and hasattr(self.ctx.pool, "forget"):
                self.ctx.pool.forget(app)

    def _absorb(self, app: str) -> Any | None:
        """Give ``app``'s pending records to its profiler (caller holds ``_lock``)."""
        with self._pending_lock:
            recs = self._pending.pop(app, [])
        prof = self.profilers.get(app)
        if prof is None:
            return None
        for rec in recs:
            try:
                prof.add(rec)
            except Exception:
                log.exception("profiler failed on run %s of %s", rec.run_id, rec.app)
        if recs and app in self.profilers:
            self._held[app] = prof.held_samples()
        return prof

    def stats(self) -> dict[str, int]:
        """Sizes of what the learner holds, for ``/metrics`` (``hermes_learner_size``): apps
        with a profiler (``stores.max_learned_apps``), the values their profilers hold (each
        list capped at 1000: this levels off once the apps' caps are reached), records
        waiting for the next learning pass, and learned graphs kept."""
        with self._pending_lock:
            pending = sum(len(v) for v in self._pending.values())
        held = 0
        for app, n in list(self._held.items()):
            if app in self.profilers:
                held += n
            else:  # forgotten while its pass ran
                self._held.pop(app, None)
        return {"apps": len(self.profilers), "held_samples": held,
                "pending_records": pending, "graphs": len(self._latest_graphs)}

    def _build(self, app: str) -> Any | None:
        """``app``'s PDGraph from every record so far (caller holds ``_lock``)."""
        prof = self._absorb(app)
        if prof is None or not prof.runs:
            return None
        try:
            graph = prof.graph
        except Exception:
            log.exception("PDGraph rebuild failed for %s", app)
            return None
        self._built_runs[app] = self.profiled_runs.get(app, 0)
        return graph

    # ------------------------------------------------------------------ graphs
    def refresh_graphs(self, apps: set[str] | None = None) -> dict[str, Any]:
        """Rebuild the learned PDGraphs of apps with new runs; hand them to the estimator."""
        todo = self._dirty if apps is None else (self._dirty & apps)
        graphs = {}
        for app in list(todo):
            self._dirty.discard(app)
            with self._lock:
                graph = self._build(app)
            if graph is None:
                continue
            graphs[app] = graph
            self._latest_graphs[app] = graph
            if self.ctx.pool is not None:
                self.ctx.pool.update(graph)
        return graphs

    def _due(self) -> list[str]:
        """Apps whose new runs reached the rebuild cadence (``stores.learn_growth``)."""
        st = self.ctx.config.stores
        due = []
        for app in self._dirty:
            built = self._built_runs.get(app, 0)
            new = self.profiled_runs.get(app, 0) - built
            need = 1 if built < st.learn_every_run_below else min(
                st.learn_max_new_runs, max(1, math.ceil(st.learn_growth * built)))
            if new >= need:
                due.append(app)
        return due

    def _rebuild_off_loop(self, apps: list[str], pool: Any, cpool: Any,
                          states: dict[str, list[Any]]) -> tuple[dict[str, Any], dict[str, Any],
                                                                 dict[str, Any]]:
        """Worker thread: graphs, their estimators and prepared memos (nothing the event
        loop reads is changed here but the profilers, under ``_lock``)."""
        graphs: dict[str, Any] = {}
        for app in apps:
            with self._lock:
                graph = self._build(app)
            if graph is not None:
                graphs[app] = graph
        with self._pending_lock:
            waiting = [app for app in self._pending if app not in graphs]
        for app in waiting:  # the others' records join their profilers (bounded) now too
            with self._lock:
                self._absorb(app)
        ests = {app: pool.build(g) for app, g in graphs.items()} if pool is not None else {}
        prepared = cpool.prepare(ests, states) if cpool is not None and ests else {}
        return graphs, ests, prepared

    async def refresh_off_loop(self) -> dict[str, Any]:
        """The learning loop's refresh: the apps due are rebuilt in a worker thread (see the
        module doc), then installed here at once. Returns the graphs installed."""
        apps = self._due()
        if not apps and not self._pending:
            return {}
        for app in apps:
            self._dirty.discard(app)
        pool = self.ctx.pool
        if pool is not None and not hasattr(pool, "build"):
            pool = None
        cpool: Any = getattr(self.ctx.policy, "estimators", None)
        if pool is None or not hasattr(cpool, "prepare"):
            cpool = None
        states = {app: cpool.hot_states(app) for app in apps} if cpool is not None else {}
        graphs, ests, prepared = await asyncio.to_thread(
            self._rebuild_off_loop, apps, pool, cpool, states)
        # (records wait in ``_pending`` at most one learning interval: the worker gives them
        # to their profilers, whose sample lists are bounded, whether or not a rebuild is due)
        live: Any = getattr(self.ctx.policy, "estimators", None)
        for app, graph in graphs.items():
            if app not in self.profilers:
                continue  # forgotten meanwhile (max_learned_apps)
            self._latest_graphs[app] = graph
            if self.ctx.pool is None:
                continue
            if self.ctx.pool is pool and app in ests:
                pool.install(graph, ests[app])
                if live is cpool and app in prepared:
                    live.adopt(app, prepared[app])
            else:  # the policy was switched meanwhile: its own pool, built lazily
                self.ctx.pool.update(graph)
        return graphs

    def app_graph(self, app: str) -> Any | None:
        """The current PDGraph of ``app``: learned online if any run finished, else the KB's.

        The learned graph is the one the last :meth:`refresh_graphs` built (the learner
        refreshes every ``stores.learn_interval_s``); it is rebuilt here only if none was
        built yet. Rebuilding on every call put a PDGraph rebuild (and a new estimator) on the
        path of every unit start (the prewarm planner asks at each one)."""
        graph = self._latest_graphs.get(app)
        if graph is not None:
            return graph
        if not APP_NAME_RE.fullmatch(app):
            return None  # not a storable app name: no app can have it (callers answer 404)
        if app in self.profilers:
            self._dirty.add(app)
            return self.refresh_graphs({app}).get(app)
        return self.kb.get(app) if self.kb is not None else None

    def serving_graph(self, app: str) -> Any | None:
        """:meth:`app_graph` for the request path (the prewarm planner and dispatch ask at
        every unit start): never a rebuild. An app whose runs were learned but whose graph
        the learning loop has not built yet has none for up to ``learn_interval_s`` (a build
        on the event loop cost every new app's first request tens of milliseconds).

        An app this process has not learned (no profiler: its first runs have not ended,
        its runs teach no graph, :meth:`learns_from`, or it was evicted) is read from the
        knowledge base at most once every ``learn_interval_s``, found or not
        (:meth:`_kb_read`): asked at every unit start, twice, a Redis knowledge base (what
        schedulers of an election share) cost two round trips on the event loop per call
        (~170 us each, ~110 us of CPU, measured), a directory four ``stat`` calls."""
        graph = self._latest_graphs.get(app)
        if graph is not None or app in self.profilers:
            return graph
        if not APP_NAME_RE.fullmatch(app):
            return None
        return self._kb_read(app)

    def _kb_read(self, app: str) -> Any | None:
        """``kb.get(app)``, remembered for ``learn_interval_s`` (the learning loop's own
        cadence: a graph another process writes, or this learner's write-back, is seen as
        late as a learned one is), for at most ``stores.max_learned_apps`` apps (least
        recently read dropped first). An upload (:meth:`put_graph`) and an eviction
        (:meth:`_make_room`) forget the app's entry at once."""
        if self.kb is None:
            return None
        graph = self._kb_reads.get(app, _UNREAD)
        if graph is _UNREAD:
            graph = self._kb_reads[app] = self.kb.get(app)
        return graph

    def put_graph(self, graph: Any) -> None:
        """Install an uploaded PDGraph: knowledge base, estimator, and the online profiler."""
        if self.kb is not None:
            self.kb.put(graph)
        self._kb_reads.pop(graph.app, None)
        with self._lock:
            with self._pending_lock:
                self._pending.pop(graph.app, None)  # the upload replaces what was learned
            self.profilers[graph.app] = Profiler(graph.app, graph)
        self._learned_only.pop(graph.app, None)  # uploaded: the operator's, never evicted
        self._built_runs[graph.app] = self.profiled_runs.get(graph.app, 0)
        self._bound_apps()
        self._latest_graphs[graph.app] = graph
        self._dirty.discard(graph.app)
        if self.ctx.pool is not None:
            self.ctx.pool.update(graph)

    def app_names(self) -> list[str]:
        names = set(self.profilers)
        if self.kb is not None:
            names.update(self.kb.list_apps())
        return sorted(names)

    # ------------------------------------------------------------------ knowledge base
    def _kb_batch(self, graphs: dict[str, Any]) -> tuple[list[RecordLine], list[Any]]:
        """What to write to the knowledge base now: new records, graphs due (kb_write_every)."""
        recs, self._kb_records = self._kb_records, []
        every = self.ctx.config.stores.kb_write_every
        due = []
        if every:
            for app, graph in graphs.items():
                if self.profiled_runs.get(app, 0) - self._kb_written.get(app, 0) >= every:
                    self._kb_written[app] = self.profiled_runs.get(app, 0)
                    due.append(graph)
        return recs, due

    def _kb_write(self, recs: list[RecordLine], graphs: list[Any]) -> None:
        if self.kb is None:
            return
        if recs and hasattr(self.kb, "append_records"):
            try:  # one write and one fsync per app for the batch
                self.kb.append_records(recs)  # stores read .app, .model_dump_json()
                recs = []
            except Exception:  # one by one: a bad record must not lose the others
                pass
        for rec in recs:
            if hasattr(self.kb, "append_record"):
                try:
                    self.kb.append_record(rec)
                except Exception:
                    log.exception("knowledge base record log failed for %s", rec.app)
        for graph in graphs:
            if graph.app not in self.profilers:  # evicted meanwhile (_make_room)
                continue
            try:
                self.kb.put(graph)
            except Exception:
                log.exception("knowledge base write failed for %s", graph.app)

    async def learn_loop(self) -> None:
        """Every ``stores.learn_interval_s``: refresh the graphs, write the knowledge base."""
        interval = self.ctx.config.stores.learn_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                recs, due = self._kb_batch(await self.refresh_off_loop())
                if recs or due:
                    await asyncio.to_thread(self._kb_write, recs, due)
            except Exception:
                log.exception("learning loop failed")

    def flush(self) -> None:
        """Rebuild every pending graph and write the knowledge base now (shutdown, tests)."""
        self._kb_write(*self._kb_batch(self.refresh_graphs()))

    def close(self) -> None:
        if self._records_fh is not None:
            self._records_fh.close()
            self._records_fh = None

"""The registry of live runs and their unit invocations: their lifecycle, and the events the
rest of the gateway reacts to.

:class:`RunRegistry` creates runs, opens and closes their unit invocations, credits the
service they receive and ends them (finish, fail, cancel, idle reaping), calling the policy
hooks exactly where the simulator does (``on_arrival``, ``on_unit_start``, ``on_unit_finish``,
``on_service``, ``on_finish``). It knows nothing of nodes, requests on the wire, stores or
hosted apps: it announces what happened to its :class:`RunObserver` s, in the order they were
added, and they act (dispatch re-keys queued requests and cancels a stopping run's, the
prewarm planner plans, learning records a finished run, durability writes, hosted apps stop
a cancelled run's code).

Units: hosted apps and ``/events`` open and close unit invocations explicitly. Otherwise a
request for unit ``U`` joins the open invocation of ``U`` if that one still has requests in
flight (fan-out) and starts a new invocation otherwise (a loop, or the next unit); an
implicitly opened invocation closes when its last request completes.

Finished runs are kept (``scheduler.keep_finished_runs``, oldest dropped) so that ``GET
/v1/runs/{id}``, listings and idempotent retries still find them; how they are kept is
:meth:`RunRegistry._retire`'s business alone (with :meth:`get_run`, :meth:`recent_runs` and
:meth:`restore` the only readers and writers of that history): compactly, as their documents
(:mod:`hermes.gateway.finished`), not as live object graphs that every full garbage
collection would walk (issue 16), and with their reference cycles broken once every observer
has seen them end (:meth:`_end`), so that their objects are freed without a collection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from hermes.core.state import RunState, UnitObservation
from hermes.gateway.context import SchedulerContext
from hermes.gateway.errors import RunCancelled, RunNotActive, RunNotFound, SchedulerError
from hermes.gateway.finished import FinishedRun, FinishedRuns
from hermes.gateway.state import ACTIVE, LiveRun, UnitInvocation, new_run_id
from hermes.gateway.tenancy import visible

log = logging.getLogger("hermes.gateway.runs")

#: makes the error a stopping run's pending requests fail with (one per request)
StopReason = Callable[[], SchedulerError]


class RunObserver:
    """What the registry tells the rest of the gateway about runs; every hook does nothing
    by default. Hooks run synchronously, in the order the observers were added."""

    def run_created(self, run: LiveRun) -> None:
        """A run was accepted (before its creator answers)."""

    def unit_started(self, run: LiveRun, inv: UnitInvocation, now: float) -> None:
        """``inv`` was opened."""

    def unit_closed(self, run: LiveRun, inv: UnitInvocation, now: float) -> None:
        """``inv`` was closed (its demand observed)."""

    def ranks_changed(self, run: LiveRun, now: float) -> None:
        """The policy may rank ``run`` (or, per ``policy.key_scope``, others) differently."""

    def run_progress(self, run: LiveRun) -> None:
        """One of an active run's invocations closed."""

    def run_stopping(self, run: LiveRun, reason: StopReason) -> None:
        """``run`` is about to end: its pending requests should fail with ``reason()``."""

    def run_ended(self, run: LiveRun) -> None:
        """``run`` finished, failed or was cancelled (its status says which)."""


class RunRegistry:
    """Live runs by id, their unit invocations and their lifecycle (see the module doc)."""

    def __init__(self, ctx: SchedulerContext) -> None:
        self.ctx = ctx
        #: active runs by id, oldest first; ended ones move to ``finished``
        self.runs: dict[str, LiveRun] = {}
        self.finished = FinishedRuns(ctx.config.scheduler.keep_finished_runs)
        #: (tenant, Idempotency-Key) -> run id (rebuilt from the run documents on restart)
        self._idempotency: dict[tuple[str, str], str] = {}
        self._no_graph_warned: set[str] = set()  # apps whose missing PDGraph was logged
        self.observers: list[RunObserver] = []
        #: the per-unit hooks (several per call of an inferred run) of the observers that
        #: define them, in the order added: most observers leave them as RunObserver's no-ops
        self._unit_started: list[Callable[[LiveRun, UnitInvocation, float], None]] = []
        self._unit_closed: list[Callable[[LiveRun, UnitInvocation, float], None]] = []
        self._ranks_changed_hooks: list[Callable[[LiveRun, float], None]] = []
        self._run_progress: list[Callable[[LiveRun], None]] = []

    def add_observer(self, observer: RunObserver) -> None:
        """Tell ``observer`` of runs from now on, after those added before. Which of the
        per-unit hooks (``unit_started``, ``unit_closed``, ``ranks_changed``,
        ``run_progress``) it defines is looked at here, once: the others are not called."""
        self.observers.append(observer)
        for hook, hooks in (("unit_started", self._unit_started),
                            ("unit_closed", self._unit_closed),
                            ("ranks_changed", self._ranks_changed_hooks),
                            ("run_progress", self._run_progress)):
            own = getattr(observer, "__dict__", {})
            if hook in own or getattr(type(observer), hook) is not getattr(RunObserver, hook):
                hooks.append(getattr(observer, hook))

    # ------------------------------------------------------------------ lookups
    def get_run(self, run_id: str) -> LiveRun | FinishedRun:
        """An active run, or a kept finished one (a read-only :class:`FinishedRun`)."""
        run: LiveRun | FinishedRun | None = self.runs.get(run_id)
        if run is None:
            run = self.finished.get(run_id)
        if run is None or not visible(run.state.tenant):  # other tenants' runs: 404
            raise RunNotFound(f"run {run_id!r} not found")
        return run

    def active_run(self, run_id: str) -> LiveRun:
        run = self.get_run(run_id)
        if run.status not in ACTIVE or not isinstance(run, LiveRun):
            raise RunNotActive(f"run {run_id!r} is {run.status}")
        return run

    def recent_runs(self, match: Callable[[Any], bool],
                    limit: int) -> list[LiveRun | FinishedRun]:
        """Up to ``limit`` runs for which ``match`` holds, newest (submitted) first, active
        and kept finished ones (the run listings of the runs API and the admin API)."""
        out: list[LiveRun | FinishedRun] = []
        for run in reversed(self.runs.values()):
            if len(out) >= limit:
                break
            if match(run):
                out.append(run)
        done = self.finished.recent(match, limit)
        if not done:
            return out
        out += done
        out.sort(key=lambda r: r.state.submitted, reverse=True)  # stable: ties keep order
        return out[:limit]

    def active(self) -> Iterator[LiveRun]:
        """The runs still taking requests (queued or running)."""
        return (r for r in self.runs.values() if r.status in ACTIVE)

    def count_active(self, tenant: str) -> int:
        """Active runs of ``tenant`` that its active-run quota counts: the runs it started
        (``POST /v1/runs``, hosted runs). Inferred runs and one-request runs are the gateway's
        own bookkeeping of plain traffic: they end by themselves (an inferred run only after
        its app's idle gap), plain requests are already bounded by the rate and concurrency
        limits, and counting them would let plain traffic refuse the tenant's hosted runs."""
        return sum(1 for r in self.active() if (r.state.tenant or "default") == tenant
                   and not r.inferred and not r.auto_finish)

    # ------------------------------------------------------------------ idempotency keys
    def remember_idempotency(self, run: LiveRun) -> None:
        """Index a run created with an ``Idempotency-Key`` (its ``idempotency``)."""
        idem = run.idempotency
        if not isinstance(idem, dict) or "key" not in idem:
            return
        self._idempotency[(run.state.tenant, str(idem["key"]))] = run.run_id
        if len(self._idempotency) > 2 * self.ctx.config.scheduler.keep_finished_runs + 1024:
            runs, done = self.runs, self.finished  # keys live as long as their runs are kept
            self._idempotency = {k: r for k, r in self._idempotency.items()
                                 if r in runs or r in done}

    def idempotent_run(self, tenant: str, key: str) -> tuple[LiveRun | FinishedRun, str] | None:
        """The run ``tenant`` created with ``key`` and the hash of that request's body, or
        None when the key is new (or its run is no longer kept)."""
        rid = self._idempotency.get((tenant, key))
        if rid is None:
            return None
        run: LiveRun | FinishedRun | None = self.runs.get(rid) or self.finished.get(rid)
        if run is None or run.idempotency is None:
            del self._idempotency[(tenant, key)]
            return None
        return run, str(run.idempotency["body"])

    # ------------------------------------------------------------------ lifecycle
    def create_run(
        self,
        app: str,
        *,
        deadline_s: float | None = None,
        tenant: str | None = None,
        k: float | None = None,
        input: Any = None,
        hosted: bool = False,
        auto_finish: bool = False,
        idempotency: dict[str, str] | None = None,
        run_id: str | None = None,
        inferred: bool = False,
        lazy_store: bool = False,
    ) -> LiveRun:
        """A new run, announced to the observers (durability commits it) before it is
        returned. ``idempotency``: ``{"key", "body"}`` of an ``Idempotency-Key`` request,
        stored with the run (:meth:`idempotent_run` finds it again, also after a restart).
        ``run_id``: the id the run resolver chose for an ``inferred`` run (default: a new
        one)."""
        ctx = self.ctx
        now = ctx.now()
        rid = run_id or new_run_id()
        if rid in self.runs:
            raise SchedulerError(f"run {rid!r} exists already")
        state = RunState(
            run_id=rid,
            app=app,
            submitted=now,
            tenant=tenant or "default",
            deadline=None if deadline_s is None else now + deadline_s,
            k=k,
        )
        run = LiveRun(state=state, hosted=hosted, auto_finish=auto_finish, input=input,
                      inferred=inferred, lazy_store=lazy_store)
        self.runs[rid] = run
        if idempotency is not None:
            run.idempotency = idempotency
            self.remember_idempotency(run)
        pool = ctx.pool
        if (pool is not None and not inferred and app not in self._no_graph_warned
                and app != "default" and len(self._no_graph_warned) < 1024
                and pool.get(app) is None):
            # once per app ("default": plain OpenAI requests, no app to model)
            self._no_graph_warned.add(app)
            log.warning("no PDGraph for app %r in the knowledge base (stores.kb = %r): its runs "
                        "get rank 0 until it learns from finished runs", app, ctx.config.stores.kb)
        ctx.policy.on_arrival(state, now)
        if ctx.metrics is not None:
            ctx.metrics.on_run_created(run)
        for obs in self.observers:
            obs.run_created(run)
        return run

    def finish_run(self, run_id: str, *, result: Any = None, at: float | None = None) -> LiveRun:
        """The run is done: close its units; observers record it, learn from it, store it.
        ``at``: when it ended, if earlier than now (an inferred run closed for idleness ended
        with its last answer)."""
        run = self.active_run(run_id)
        now = self.ctx.now() if at is None else min(at, self.ctx.now())
        self._stop(run, lambda: RunNotActive(f"run {run_id!r} finished"))
        for inv in list(run.open):
            self.close_unit(run, inv, now)
        if result is not None:
            run.result = result
        run.status = "finished"
        run.state.finished = now
        self.ctx.policy.on_finish(run.state, now)
        self.ctx.stats["runs_finished"] += 1
        self._end(run)
        return run

    def fail_run(self, run_id: str, error: str) -> None:
        run = self.runs.get(run_id)
        if run is None or run.status not in ACTIVE:
            return
        now = self.ctx.now()
        self._stop(run, lambda: RunNotActive(f"run {run_id!r} failed"))
        for inv in list(run.open):
            self.close_unit(run, inv, now)
        run.status = "failed"
        run.error = error
        run.state.finished = now
        self.ctx.policy.on_finish(run.state, now)
        self._end(run)

    def cancel_run(self, run_id: str) -> LiveRun:
        """Cancel: queued requests are dropped and in-flight ones aborted at the engines."""
        run = self.active_run(run_id)
        now = self.ctx.now()
        self._stop(run, lambda: RunCancelled(f"run {run_id!r} was cancelled"))
        run.status = "cancelled"
        run.state.finished = now
        for inv in list(run.open):
            inv.closed = True
            inv.finished = now
        run.open.clear()
        self.ctx.policy.on_finish(run.state, now)
        self._end(run)
        return run

    def reap_idle(self, closes_itself: Callable[[LiveRun], bool] | None = None) -> None:
        """Finish client-driven runs without requests for ``run_idle_timeout_s``, except those
        for which ``closes_itself`` holds (inferred runs the run resolver closes by their
        app's own idle figure)."""
        limit = self.ctx.config.scheduler.run_idle_timeout_s
        cutoff = time.monotonic() - limit
        for run in list(self.runs.values()):
            if (run.status in ACTIVE and not run.hosted and not run.pending
                    and run.last_activity < cutoff
                    and (closes_itself is None or not closes_itself(run))):
                log.info("run %s idle for %.0f s: finishing it", run.run_id, limit)
                self.finish_run(run.run_id)

    def _stop(self, run: LiveRun, reason: Callable[[], SchedulerError]) -> None:
        for obs in self.observers:
            obs.run_stopping(run, reason)

    def _end(self, run: LiveRun) -> None:
        self._retire(run)
        for obs in self.observers:
            obs.run_ended(run)
        _break_cycles(run)

    def _retire(self, run: LiveRun) -> None:
        """An ended run joins the finished-run history (the one place that keeps it; the
        oldest are dropped past ``keep_finished_runs``), as its document."""
        if self.ctx.metrics is not None:
            self.ctx.metrics.on_run_end(run)
        # kept before it leaves the active runs: a reader on another thread (a test, a
        # debugger) never finds it in neither
        self.finished.add_run(run, self.ctx.now())
        self.runs.pop(run.run_id, None)

    def restore(self, run: LiveRun, *, ended: bool) -> None:
        """Put back a run stored before a restart (recovery); ``ended`` ones join the
        finished-run history as they were (restore them with their unit invocations)."""
        if run.idempotency is not None:
            self.remember_idempotency(run)
        if ended:
            self.finished.add_run(run, run.state.finished or run.state.submitted)
            _break_cycles(run)
        else:
            self.runs[run.run_id] = run

    # ------------------------------------------------------------------ units
    def begin_unit(
        self,
        run: LiveRun,
        unit: str,
        backend: str,
        *,
        explicit: bool = True,
        upstream: str | None = None,
        at: float | None = None,
    ) -> UnitInvocation:
        """Open a unit invocation (hosted apps, ``/events`` start, or implicitly)."""
        now = self.ctx.now() if at is None else at
        for inv in list(run.open):  # implicitly opened, already complete: close before the next
            if not inv.explicit and inv.in_flight == 0:
                self.close_unit(run, inv, now)
        inv = UnitInvocation(unit=unit, backend=backend, started=now, explicit=explicit,
                             upstream=upstream)
        run.units.append(inv)
        run.open.append(inv)
        if run.status == "queued":
            run.status = "running"
        st = run.state
        st.begin_unit(unit)
        self.ctx.policy.on_unit_start(st, unit, now)
        for started in self._unit_started:
            started(run, inv, now)
        self._ranks_changed(run, now)
        return inv

    def end_unit(self, run: LiveRun, inv: UnitInvocation, *,
                 duration_s: float | None = None) -> None:
        """Close an explicitly opened invocation (its requests have completed)."""
        if inv.closed:
            return
        if duration_s is not None:
            inv.duration_s = duration_s
        self.close_unit(run, inv, self.ctx.now())

    def unit_for_request(self, run: LiveRun, unit: str, backend: str) -> UnitInvocation:
        """The invocation a new request of ``unit`` belongs to (see the module docstring)."""
        for inv in reversed(run.open):
            if inv.unit == unit and (inv.explicit or inv.in_flight > 0):
                return inv
        return self.begin_unit(run, unit, backend, explicit=False)

    def unit_event(self, run: LiveRun, unit: str, event: str, *, backend: str | None = None,
                   at: float | None = None) -> UnitInvocation | None:
        """A client-reported unit boundary (``POST /v1/runs/{id}/events`` or a node event)."""
        if event == "start":
            return self.begin_unit(run, unit, backend or "api:client", explicit=True, at=at)
        for inv in reversed(run.open):
            if inv.unit == unit:
                now = self.ctx.now() if at is None else at
                if not inv.requests and inv.duration_s is None:
                    inv.duration_s = max(0.0, now - inv.started)
                    self.credit(run, inv.duration_s, 0, now)
                self.close_unit(run, inv, now)
                return inv
        return None

    def close_unit(self, run: LiveRun, inv: UnitInvocation, now: float) -> None:
        """Close ``inv``: the policy observes the unit's demand (its requests' tokens, or
        its duration)."""
        if inv.closed:
            return
        inv.closed = True
        done = inv.last_done()
        inv.finished = max(inv.started, done if done is not None and inv.explicit is False else now)
        if inv in run.open:
            run.open.remove(inv)
        results = inv.llm_results()
        duration = float(inv.duration_s if inv.duration_s is not None else inv.finished - inv.started)
        if results:
            obs = UnitObservation.from_requests(
                inv.unit,
                [d.input_tokens for d in results],
                [d.output_tokens for d in results],
                self.ctx.cost,
                duration_s=duration,
                started=inv.started,
                finished=inv.finished,
            )
        else:
            obs = UnitObservation(
                unit=inv.unit,
                duration_s=duration,
                service_s=0.0,  # a tool call uses no engine service (estimator: time away)
                started=inv.started,
                finished=inv.finished,
            )
        st = run.state
        st.end_unit(obs, run.open[-1].unit if run.open else None)
        self.ctx.policy.on_unit_finish(st, obs, now)
        for closed in self._unit_closed:
            closed(run, inv, now)
        self._ranks_changed(run, now)
        if run.status in ACTIVE:
            for progress in self._run_progress:
                progress(run)

    def request_done(self, run: LiveRun, inv: UnitInvocation) -> None:
        """A request of ``inv`` completed: an implicitly opened invocation closes with its
        last one. A one-request run's is closed by :meth:`finish_run` once the answer has
        left (off the request's path; the invocation's end is its last result's time either
        way)."""
        if self.closes_with(run, inv):
            self.close_unit(run, inv, self.ctx.now())

    @staticmethod
    def closes_with(run: LiveRun, inv: UnitInvocation) -> bool:
        """Whether :meth:`request_done` closes ``inv`` now (its requests have all
        completed; implicitly opened, in an active run that does not finish itself)."""
        return (not run.auto_finish and not inv.explicit and not inv.closed
                and inv.in_flight == 0 and run.status in ACTIVE)

    # ------------------------------------------------------------------ service accounting
    def credit(self, run: LiveRun, seconds: float, tokens: int, now: float, *,
               closing: bool = False) -> None:
        """Service ``run`` received; observers hear of it when its rank moved. ``closing``:
        the service completes a unit that :meth:`request_done` closes next (the policy's
        :meth:`~hermes.core.policies.base.SchedulingPolicy.on_closing_service`: the rank
        is refreshed once, when the unit closes)."""
        st = run.state
        st.credit(seconds, tokens)
        before = st.rank
        if closing:
            self.ctx.policy.on_closing_service(st, seconds, tokens, now)
        else:
            self.ctx.policy.on_service(st, seconds, tokens, now)
        if st.rank != before:
            self._ranks_changed(run, now)

    def credit_tool_time(self, run: LiveRun, seconds: float) -> None:
        """Service delivered by a tool the gateway did not dispatch (simulated tool steps)."""
        self.credit(run, seconds, 0, self.ctx.now())

    def _ranks_changed(self, run: LiveRun, now: float) -> None:
        for changed in self._ranks_changed_hooks:
            changed(run, now)


def _break_cycles(run: LiveRun) -> None:
    """An ended run's requests point back at it and at their invocation: cut those edges
    (nothing reads them once the run has ended and every observer has seen it), so that the
    run's objects are freed when its last holder lets go, not by a garbage collection (at
    ~30 objects a run, that kept the collector busy and full collections long)."""
    for inv in run.units:
        for req in inv.requests:
            req.run = req.inv = None  # type: ignore[assignment]

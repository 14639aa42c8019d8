"""Durable run state: accepted runs, their unit progress and hosted-call results survive a
scheduler restart (SIGKILL included); on restart every run is resumed or failed with a reason
(:mod:`hermes.gateway.recovery`).

:class:`DurableState` is a :class:`~hermes.gateway.runs.RunObserver`: it writes when the run
registry says something happened, and the registry does not know it exists. What is stored
(:class:`~hermes.gateway.run_store.RunStore`; SQLite in WAL mode in the state directory by
default, Redis with ``--redis URL``):

- a **run document** per accepted run, written (committed) before ``POST /v1/runs`` answers,
  again whenever one of its unit invocations closes and when it ends (state, result or error);
- a **unit document** per closed unit invocation (with the token counts of its requests, so
  that the PDGraph still learns resumed runs), stored by index next to the run document and in
  the same transaction: a write carries only the invocations that closed (or gained results)
  since the last one, so that a run's n-th unit costs O(1), not O(n) (an agent loop of a
  thousand LLM calls would otherwise rewrite its whole history at every call);
- a **call journal** per hosted run: for the n-th LLM/tool call of the app's code, the request
  id it was sent as, the node, and once done its result (:meth:`DurableState.call`, written by
  :mod:`hermes.gateway.hosted`);
- with the run document, the run's **idempotency key** (``Idempotency-Key`` of the
  ``POST /v1/runs`` that created it, and a hash of that request's body): a retry with the
  same key finds the run, also after a restart
  (:meth:`~hermes.gateway.runs.RunRegistry.idempotent_run`). Keys are per tenant and live as
  long as their run is kept.

A one-request run (an OpenAI request without headers) is stored only when it ends, right after
its answer has left, batched with the other runs ending within ``durability.batch_s`` (10 ms:
one transaction, or one Redis round trip, for all of them; at one client a transaction per
request was ~40 us of the gateway's CPU and five system calls): such a run has nothing to
resume, and if the gateway dies before its answer the client sees the connection drop; a
crash between the answer and the write loses only its history entry. The window applies
to ended runs only: writes of active runs go out on the next loop iteration.

An **inferred** run (header-less requests the run resolver joined) is stored once every
:data:`INFERRED_PROGRESS_EVERY` of its invocations closed, when it ends, and on a clean stop:
its code runs in the client, so there is nothing to resume but the run itself and what it has
done (learning). Its next turn joins it after a clean restart (the resolver's index is saved
at the stop, :mod:`hermes.gateway.identity`, and so is the run). Its end is batched in the
``durability.batch_s`` window.

It is not written at its creation (:attr:`~hermes.gateway.state.LiveRun.lazy_store`) unless
the resolver's index is shared (``[cluster] store``, below): with this process's own index, a
crash loses the way to the run (its next turn starts a new one, whether or not the run was
stored), and a run written at its start had none of its units in the store yet, so what a
crash then left was an empty run that would idle out. Not writing it saved ~0.06 ms of the
gateway's CPU per header-less request at one client (1.18-1.19 -> 1.12-1.13 ms, three
alternated rounds after 10,000 agent requests): a creation in the batch, and an end written
as a run document and unit documents built and encoded again. What a crash loses is the
history entries of the runs that ended in the last window, and the runs still going with
fewer than :data:`INFERRED_PROGRESS_EVERY` unwritten invocations (most: conversations of a
few turns), with their units (the learner has not seen them either: it learns a run when it
ends). With ``[cluster] store`` the index is in Redis and survives a crash: the creation is
then written before the first answer leaves (on the next loop iteration), so that the next
turn, through this process restarted or another, joins it. Writing it at every request cost
a header-less request ~0.2 ms of the gateway's CPU, a sixth of all it spends on one; its
creation written on its own, before the first answer, was a transaction for every new
conversation (~0.46 a request of the agent mix at one client; with the real state database
and the CPU caches cold, as between requests, ~40-60 us of CPU each). An edge's inferred run
(split roles) is not written at its creation either: after a failover its next call
re-creates it under its id.

A run not written at its creation that ends without ever having been written (most: one-turn
conversations) leaves only history, and its **history entry** is the finished document the
registry has just kept, written as those bytes (:meth:`DurableState._as_history`, ``history``
of :meth:`~hermes.gateway.run_store.RunStore.put_runs`) in the batch window, rather than a run
document and unit documents built and encoded again; a new leader (or this gateway restarted)
keeps it as it was kept (:mod:`hermes.gateway.recovery`), so ``GET /v1/runs/{id}`` answers the
same there.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from hermes.gateway.context import SchedulerContext
from hermes.gateway.finished import FinishedRuns
from hermes.gateway.run_store import HistoryWrite, RunStore, RunWrite
from hermes.gateway.runs import RunObserver
from hermes.gateway.state import LiveRun, PendingRequest, UnitInvocation
from hermes.protocol import Done, Submit, ToolDone

log = logging.getLogger("hermes.gateway.durable")

#: an active inferred run is written once this many of its invocations are unwritten
INFERRED_PROGRESS_EVERY = 16
#: a batch of writes this long is written at once (its window not waited out)
MAX_BATCH = 512


# ---------------------------------------------------------------------------------- documents
def _req_doc(req: PendingRequest) -> dict[str, Any] | None:
    r = req.result
    if isinstance(r, Done):
        done = dict(vars(r))  # its fields (flat values: model_dump's, without its cost)
        done.pop("response", None)
        return {"request_id": req.request_id, "kind": "llm", "node": req.node, "engine": req.engine,
                "sent": req.sent_at, "finished": req.finished_at, "done": done}
    if isinstance(r, ToolDone):
        return {"request_id": req.request_id, "kind": "tool", "node": req.node,
                "sent": req.sent_at, "finished": req.finished_at, "tool_done": dict(vars(r))}
    return None


def _inv_doc(inv: UnitInvocation) -> dict[str, Any]:
    return {"unit": inv.unit, "backend": inv.backend, "started": inv.started,
            "finished": inv.finished, "explicit": inv.explicit, "upstream": inv.upstream,
            "duration_s": inv.duration_s, "closed": inv.closed,
            "requests": [d for d in (_req_doc(r) for r in inv.requests) if d is not None]}


def run_doc(run: LiveRun) -> dict[str, Any]:
    """The run's own document; its unit invocations are stored separately (``n_units`` of
    them, see :func:`_inv_doc`)."""
    s = run.state
    return {"run_id": s.run_id, "app": s.app, "tenant": s.tenant, "submitted": s.submitted,
            "deadline": s.deadline, "k": s.k, "finished": s.finished, "status": run.status,
            "hosted": run.hosted, "auto_finish": run.auto_finish, "inferred": run.inferred,
            "input": run.input,
            "result": run.result, "error": run.error, "recovered": run.recovered,
            "n_units": len(run.units), "idempotency": run.idempotency}


def _inv_version(inv: UnitInvocation) -> int:
    """Changes whenever the stored document of a closed invocation would: requests with a
    result (a unit closed by the client's event may still get results after it)."""
    return sum(1 for r in inv.requests if r.result is not None)


# ---------------------------------------------------------------------------------- state
@dataclass(slots=True)
class _StoredUnits:
    """Invocations ``< lo`` are stored final; ``versions``: index -> stored version."""

    lo: int = 0
    versions: dict[int, int] = field(default_factory=dict)


class DurableState(RunObserver):
    """Writes run documents and call journals as runs progress (see the module doc)."""

    def __init__(self, store: RunStore | None, ctx: SchedulerContext,
                 finished: FinishedRuns | None = None) -> None:
        """``finished``: the registry's finished runs, whose kept document of a run that
        ends without ever having been stored is written as its history entry
        (:meth:`run_ended`)."""
        self.store = store
        self.ctx = ctx
        self.finished = finished
        self._write_errors = 0
        #: writes nobody waits on, waiting for :meth:`flush` (``durability.batch_s``), one
        #: per run: a later write of a run in the same batch (an inferred run created and
        #: ended in one window) replaces its document and adds its units
        self._batch: dict[str, RunWrite] = {}
        #: history entries waiting for :meth:`flush` alike (:meth:`run_ended`)
        self._history: dict[str, HistoryWrite] = {}
        self._batch_s = ctx.config.durability.batch_s
        #: an inferred run's creation may wait for the window: only when the resolver's
        #: index is this process's own (lost in a crash, so a stored run would not be joined
        #: anyway); with ``[cluster] store`` the index survives in Redis, and the next turn
        #: after a crash joins the run only if it was stored before the first answer
        self._creation_waits = not ctx.config.cluster.store
        self._flush_at: asyncio.TimerHandle | None = None  # the window's end
        self._flush_soon: asyncio.Handle | None = None  # the next loop iteration
        #: set while recovery puts stored runs back (their documents are not written again)
        self.restoring = False
        self._ended = 0
        #: per active run: what of its invocations is stored (see :meth:`_put`)
        self._stored: dict[str, _StoredUnits] = {}

    # ------------------------------------------------------------------ writes
    def _put(self, run: LiveRun, *, batched: bool = False, wait: bool = False) -> None:
        """Write the run document with the invocations that closed or gained results since
        the last write. Invocations below ``lo`` are closed with every request answered and
        stored so: the scan starts there, so a sequential run's write is O(1).

        ``batched`` (a write nobody waits on: an ended one-request run, an inferred run; see
        :meth:`run_ended`): the documents are taken now and written together, in one
        transaction (:meth:`flush`), on the next loop iteration; with ``wait`` (an ended
        run, whose answer has left, or an inferred run just created: only a history entry
        and learning are at stake, see the module doc) the write may wait up to
        ``durability.batch_s`` for others (and rides along with any write due sooner).
        :data:`MAX_BATCH` writes are written at once. A failed batch is counted and logged,
        not retried."""
        if self.store is None or self.restoring:
            return
        st = self._stored.setdefault(run.run_id, _StoredUnits())
        units: dict[int, dict[str, Any]] = {}
        versions: dict[int, int] = {}
        for i in range(st.lo, len(run.units)):
            inv = run.units[i]
            if inv.closed:
                v = _inv_version(inv)
                if st.versions.get(i) != v:
                    units[i], versions[i] = _inv_doc(inv), v
        if batched:
            units = self._with_batched(run.run_id, units, take=False)
            self._batch[run.run_id] = (run.run_id, run.status, run_doc(run), units)
            self._due(wait)
        else:
            units = self._with_batched(run.run_id, units, take=True)  # (superseded)
            try:
                self.store.put_run(run.run_id, run.status, run_doc(run), units)
            except Exception:
                self._write_errors += 1
                log.exception("durable write of run %s failed", run.run_id)
                return
        st.versions.update(versions)
        while st.lo < len(run.units):
            inv = run.units[st.lo]
            if not inv.closed or st.versions.get(st.lo) != len(inv.requests):
                break
            st.versions.pop(st.lo, None)
            st.lo += 1

    def _due(self, wait: bool) -> None:
        """A batched write was added: flush at once past :data:`MAX_BATCH`, else on the next
        loop iteration, or (``wait``) at the end of the ``durability.batch_s`` window."""
        if len(self._batch) + len(self._history) >= MAX_BATCH:
            self.flush()
        elif self._flush_soon is None:
            loop = asyncio.get_running_loop()
            if not wait or not self._batch_s:
                self._flush_soon = loop.call_soon(self.flush)
            elif self._flush_at is None:
                self._flush_at = loop.call_later(self._batch_s, self.flush)

    def _with_batched(self, run_id: str, units: dict[int, dict[str, Any]], *,
                      take: bool) -> dict[int, dict[str, Any]]:
        """``units`` with those of the run's write waiting in the batch (``take``: that write
        leaves the batch, the caller writing the run now)."""
        earlier = self._batch.pop(run_id, None) if take else self._batch.get(run_id)
        return units if earlier is None else {**earlier[3], **units}

    def run_created(self, run: LiveRun) -> None:
        # one-request runs: stored when they end (see the module doc); so is an inferred
        # run until its progress, unless the resolver's index is shared (LiveRun.lazy_store)
        if not run.auto_finish and not run.lazy_store:
            batched = run.inferred and _in_loop()
            self._put(run, batched=batched, wait=batched and self._creation_waits)

    def run_progress(self, run: LiveRun) -> None:
        if run.auto_finish:
            return
        if not run.inferred:
            self._put(run)
            return
        st = self._stored.get(run.run_id)
        if len(run.units) - (st.lo if st is not None else 0) >= INFERRED_PROGRESS_EVERY:
            self._put(run, batched=_in_loop())

    def save_active(self, runs: Any) -> None:
        """On a clean stop: write what the active inferred runs among ``runs`` did since
        their last write (then :meth:`close`)."""
        for run in runs:
            if run.inferred and not run.auto_finish and (run.run_id in self._stored
                                                         or run.lazy_store):
                self._put(run)

    def run_ended(self, run: LiveRun) -> None:
        # a one-request run ends after its answer has left (api.openai_api): its only write is
        # batched; so is an inferred run's (the resolver's idle sweep ends many at once: one
        # transaction), a finish of one through the API included, which may answer just
        # before the write; any other run whose end is acknowledged (finish, cancel) is
        # written before that
        if run.transient:  # an edge's one-request call: nothing stored (LiveRun.transient)
            return
        if not (run.lazy_store and run.run_id not in self._stored and self.store is not None
                and not self.restoring and self._as_history(run)):
            self._put(run, batched=(run.auto_finish or run.inferred) and _in_loop(), wait=True)
        self._stored.pop(run.run_id, None)
        if self.store is None:
            return
        try:
            if run.hosted:
                self.store.drop_calls(run.run_id)
            self._ended += 1
            if self._ended % 100 == 0:  # bounded on disk like the finished runs in memory
                # (every 100: ~1 ms each with the index, instead of ~15 ms every 1,000)
                self.store.prune_ended(self.ctx.config.scheduler.keep_finished_runs)
        except Exception:
            log.exception("durable cleanup after run %s failed", run.run_id)

    def _as_history(self, run: LiveRun) -> bool:
        """Batch the history entry of ``run``, an inferred run that ends without ever having
        been stored (``lazy_store``, nothing written since): what it leaves is only
        history (its calls were answered; nothing would resume it), and the finished
        document the registry has just kept (:meth:`FinishedRuns.encoded`) is that history,
        so it is written as those bytes rather than as a run document and unit documents
        built and encoded again. A new leader restores it as it was kept here
        (:mod:`hermes.gateway.recovery`). At the active scheduler, 4,000 one-turn calls/s,
        the run's end and its share of the batch flush took ~36 us of a call's ~235 as a
        run and a unit document (building, encoding, the transaction's commands), ~13 us
        so. False when it cannot be (no loop, or no kept document): the caller writes the
        run as any other."""
        if self.finished is None or not _in_loop():
            return False
        got = self.finished.encoded(run.run_id)
        if got is None:
            return False
        self._history[run.run_id] = (run.run_id, run.state.submitted, got[0], got[1])
        self._due(True)
        return True

    def flush(self) -> None:
        """Write the batched run documents and history entries (one transaction or round
        trip)."""
        for handle in (self._flush_at, self._flush_soon):
            if handle is not None:  # (written now: nothing left for it)
                handle.cancel()
        self._flush_at = self._flush_soon = None
        batch, self._batch = self._batch, {}
        history, self._history = self._history, {}
        if not (batch or history) or self.store is None:
            return
        try:
            if history:
                self.store.put_runs(list(batch.values()), history=list(history.values()))
            else:  # (the call of every store: one that keeps no history takes no ``history``)
                self.store.put_runs(list(batch.values()))
        except Exception:
            self._write_errors += len(batch) + len(history)
            log.exception("durable write of %d ended runs failed", len(batch) + len(history))

    def call(self, run: LiveRun, seq: int, entry: dict[str, Any]) -> None:
        if self.store is None:
            return
        try:
            self.store.put_call(run.run_id, seq, entry)
        except Exception:
            self._write_errors += 1
            log.exception("durable journal write of run %s failed", run.run_id)

    def close(self) -> None:
        self.flush()
        if self.store is not None:
            self.store.close()


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def call_entry(req: PendingRequest, state: str) -> dict[str, Any]:
    """A journal entry for a hosted call (``state``: sent | done)."""
    if isinstance(req.msg, Submit):
        req.msg.engine_body()  # (a body left encoded is journalled as the object it is)
    entry: dict[str, Any] = {"request_id": req.request_id, "kind": req.kind, "node": req.node,
                             "sent": req.sent_at, "state": state,
                             "msg": req.msg.model_dump() if req.msg is not None else None}
    if state == "done" and req.result is not None:
        entry["result"] = req.result.model_dump(exclude={"response"})
    return entry

"""Recovery after a restart: every stored run is restored, resumed or failed with a reason.

:meth:`Recovery.recover` runs when the gateway starts (the app's lifespan, through
:meth:`hermes.gateway.scheduler.LiveScheduler.recover`), on what
:mod:`hermes.gateway.durable` stored:

- ended runs are restored as they were (``GET /v1/runs/{id}`` answers; nothing runs again);
- hosted runs are **resumed by deterministic replay**: the app's code runs again from the
  start, but every unit invocation that had closed and every call that had completed is
  answered from the store (no engine work, no sleeping: :class:`Replay`); the first call that
  had not completed is adopted if a HermesLet reports it still holds it (its result is
  awaited, or taken if it already arrived: :meth:`Recovery.adopt`), otherwise an LLM call is
  sent again (a retry, which is safe: generations have no side effects) and a tool call fails
  the run with a reason (tool code may have side effects, so it is never run twice). Apps
  whose control flow depends on something else than their input and the results of their
  calls (clocks, randomness without a seed) are not replay-safe; the benchmark apps are;
- client-driven runs keep their closed units and stay active (the client may continue with
  ``X-Hermes-Run``; idle ones finish after ``run_idle_timeout_s``); requests that were in
  flight are lost with the client's connection; a one-request run in flight is failed (its
  client's connection was lost);
- HermesLets reconnect by themselves: the node table answers their first message with
  ``resync``, they say ``hello`` with the request ids they hold (``holding``), and what no
  recovered run claims within ``recovery_grace_s`` is cancelled at the node, freeing its slot.

Hosted apps are resumed through two callables the scheduler passes in (the app of a name,
and how to launch it), so that recovery does not depend on :mod:`hermes.gateway.hosted`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from hermes.core.state import RunState
from hermes.gateway.context import SchedulerContext
from hermes.gateway.dispatch import Dispatcher
from hermes.gateway.durable import DurableState
from hermes.gateway.learning import Learner
from hermes.gateway.nodes import NodeTable
from hermes.gateway.run_store import HISTORY, HISTORY_PARSED
from hermes.gateway.runs import RunRegistry
from hermes.gateway.state import TERMINAL, LiveRun, PendingRequest, UnitInvocation
from hermes.protocol import EDGE_REQUEST_PREFIX, Cancel, Done, Submit, Tool, ToolDone

log = logging.getLogger("hermes.gateway.recovery")

#: the hosted app of a name, or None when no such app is registered
FindApp = Callable[[str], Any | None]
#: start the code of a hosted run again: (run, app, its replay)
Launch = Callable[[LiveRun, Any, "Replay"], None]


class Replay:
    """The journal of one hosted run, consumed in call order while its code runs again."""

    def __init__(self, calls: dict[int, dict[str, Any]], units: list[UnitInvocation | None]) -> None:
        self.calls = calls
        self.units = units  # closed invocations restored from the run document, by index
        self.call_seq = 0
        self.unit_seq = 0

    @property
    def replaying(self) -> bool:
        """Still before the point where the crash interrupted the run."""
        return self.call_seq < len(self.calls) or self.unit_seq < len(self.units)


class Recovery:
    """Restores stored runs and resumes or fails them (see the module doc)."""

    def __init__(self, ctx: SchedulerContext, durable: DurableState, runs: RunRegistry,
                 dispatch: Dispatcher, nodes: NodeTable, learner: Learner) -> None:
        self.ctx = ctx
        self.durable = durable
        self.runs = runs
        self.dispatch = dispatch
        self.nodes = nodes
        self.learner = learner
        self.grace_s = ctx.config.durability.recovery_grace_s
        #: results of requests nobody waits for yet (arrived before their run was replayed)
        self.orphans: OrderedDict[str, Any] = OrderedDict()
        self.recovering = False
        self.recovered_ready = asyncio.Event()
        #: restore ended runs after the active ones have been launched, in the background
        #: (a new leader among elected schedulers: the first dispatch comes sooner), and
        #: set when they are all back (at once when not deferred)
        self.defer_ended = False
        #: the stored documents, read beforehand off the event loop (a new leader reads
        #: them on a thread); None: read them in :meth:`recover`
        self.prefetched: list[dict[str, Any]] | None = None
        #: with ``prefetched`` holding the active runs only: the ended runs, in chunks
        #: (restored in the background)
        self.fetch_rest: Callable[[], Iterator[list[dict[str, Any]]]] | None = None
        self.ended_ready = asyncio.Event()
        #: set while ended runs are being restored in the background: a lookup that misses
        #: answers "retry" (503), not "not found"
        self.restoring_ended = False
        self._task: asyncio.Task[None] | None = None
        self._ended_task: asyncio.Task[None] | None = None
        #: the nodes to wait for before resuming (a new leader: those its predecessor
        #: served, :mod:`hermes.gateway.ha`); None: any node, then one heartbeat
        self.expect_nodes: set[str] | None = None
        #: shared with the scheduler's stats (``/healthz`` shows them)
        self.stats = ctx.stats
        self.stats.update({"recovered_hosted": 0, "recovered_client": 0, "restored_ended": 0,
                           "failed_on_recovery": 0, "adopted": 0, "resent": 0,
                           "orphans_cancelled": 0})
        dispatch.on_orphan = self.on_orphan

    def on_orphan(self, msg: Any) -> bool:
        """A result for a request the scheduler does not know: keep it for a replayed run."""
        rid = getattr(msg, "request_id", None)
        if rid is None or not self.recovering:
            return False
        self.orphans[rid] = msg
        while len(self.orphans) > 10_000:
            self.orphans.popitem(last=False)
        return True

    # ------------------------------------------------------------------ recovery
    def recover(self, find_app: FindApp, launch: Launch) -> None:
        """Restore stored runs into the registry and schedule the replays (see module doc)."""
        store = self.durable.store
        keep = self.ctx.config.scheduler.keep_finished_runs
        docs = (self.prefetched if self.prefetched is not None
                else store.runs() if store is not None else [])
        self.prefetched = None
        if store is not None and sum(d["status"] in TERMINAL for d in docs) > keep:
            store.prune_ended(keep)  # (it reads every document again: only when needed)
            docs = store.runs()
        if not docs:
            self.recovered_ready.set()
            if self.fetch_rest is not None:
                self.restoring_ended = True
                self._ended_task = asyncio.get_running_loop().create_task(
                    self._restore_ended(None), name="hermes-recover-ended")
            else:
                self.ended_ready.set()
            return
        assert store is not None
        high = max(max(d.get("submitted") or 0.0, d.get("finished") or 0.0) for d in docs)
        self.ctx.clock.not_before(high)  # keep the scheduler clock monotonic across restarts
        self.recovering = True
        replays: list[tuple[LiveRun, Any, Replay]] = []
        recorded: set[str] | None = None
        ended = [d for d in docs if d["status"] in TERMINAL] if self.defer_ended else []
        for d in (docs if not self.defer_ended else
                  [d for d in docs if d["status"] not in TERMINAL]):
            if HISTORY in d:  # (ended: kept as it was kept)
                self._restore_history(d)
                continue
            self.durable.restoring = True
            try:
                run, restored = self._restore(d)
            finally:
                self.durable.restoring = False
            if d["status"] in TERMINAL:
                self.stats["restored_ended"] += 1
                continue
            run.recovered = int(d.get("recovered", 0)) + 1
            if recorded is None:
                recorded = self.learner.recorded_run_ids()
            run.recorded = run.run_id in recorded
            if run.hosted:
                app = find_app(run.app)
                if app is None:
                    self._fail(run, f"the gateway restarted and hosted app {run.app!r} is no "
                                    "longer registered")
                    continue
                units = [u if u is not None and u.closed else None for u in restored]
                replays.append((run, app, Replay(store.calls(run.run_id), units)))
            elif run.auto_finish:
                self._fail(run, "the gateway restarted while this request was in flight; the "
                                "client's connection was lost")
            else:
                self.stats["recovered_client"] += 1
                self.durable.run_progress(run)
        log.warning("recovered %d runs from %s: %d hosted to resume, %d client-driven active, "
                    "%d ended", len(docs), store.describe(), len(replays),
                    self.stats["recovered_client"], self.stats["restored_ended"])
        loop = asyncio.get_running_loop()

        async def resume_all() -> None:
            await self._wait_for_nodes()
            for run, app, replay in replays:
                if run.status in ("queued", "running"):
                    self.stats["recovered_hosted"] += 1
                    launch(run, app, replay)
            self.recovered_ready.set()
            await asyncio.sleep(max(self.grace_s, 1.0))
            self.recovering = False
            self._cancel_unclaimed()

        self._task = loop.create_task(resume_all(), name="hermes-recover")
        if ended or self.fetch_rest is not None:
            self.restoring_ended = True
            self._ended_task = loop.create_task(self._restore_ended(ended or None),
                                                name="hermes-recover-ended")
        else:
            self.ended_ready.set()

    async def _restore_ended(self, docs: list[dict[str, Any]] | None) -> None:
        """Ended runs, restored after the active ones are resuming (``defer_ended``), a
        chunk per loop iteration: a new leader dispatches first; it reports ready (and
        answers for ended runs) once they are all back. ``None``: read them, a chunk at a
        time on a thread, with :attr:`fetch_rest`, once the active runs are resuming."""
        try:
            if docs is None:
                assert self.fetch_rest is not None
                await self.recovered_ready.wait()  # the resumed runs dispatch first
                chunks = iter(self.fetch_rest())
                while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
                    if chunk:
                        self.ctx.clock.not_before(max(d.get("finished") or 0.0 for d in chunk))
                    self._restore_chunk(chunk)
                    await asyncio.sleep(0)
            else:
                for k in range(0, len(docs), 200):
                    self._restore_chunk(docs[k:k + 200])
                    await asyncio.sleep(0)
        except Exception:  # lookups of the rest answer 404 again rather than 503 for ever
            log.exception("restoring the ended runs failed")
        finally:
            self.restoring_ended = False
            self.ended_ready.set()

    def _restore_chunk(self, docs: list[dict[str, Any]]) -> None:
        for d in docs:
            if d["run_id"] in self.runs.runs or d["run_id"] in self.runs.finished:
                continue  # a resumed run that has ended meanwhile: already here
            if HISTORY in d:
                self._restore_history(d)
                continue
            self.durable.restoring = True
            try:
                self._restore(d)
            finally:
                self.durable.restoring = False
            self.stats["restored_ended"] += 1

    async def _wait_for_nodes(self) -> None:
        """Give HermesLets ``grace_s`` to reconnect and report what they hold."""
        deadline = time.monotonic() + self.grace_s
        if self.expect_nodes:  # each said hello (with what it holds): nothing more to wait for
            while (not self.expect_nodes <= self.nodes.nodes.keys()
                   and time.monotonic() < deadline):
                await asyncio.sleep(0.01)
            return
        await self.nodes.wait_for_nodes(self.grace_s)
        # a node reports its holdings in its hello; wait for its first heartbeat as well
        await asyncio.sleep(min(1.5, max(0.0, deadline - time.monotonic())))

    def _restore_history(self, d: dict[str, Any]) -> None:
        """A history entry (:func:`hermes.gateway.run_store.history_doc`): the finished
        document the previous scheduler kept, kept as it was (no run to rebuild)."""
        doc, extra = d[HISTORY]
        try:
            self.runs.finished.add_encoded(doc, extra, parsed=d.get(HISTORY_PARSED))
        except ValueError as e:
            log.warning("run %s not restored: %s", d.get("run_id"), e)
            return
        self.stats["restored_ended"] += 1

    def _restore(self, d: dict[str, Any]) -> tuple[LiveRun, list[UnitInvocation | None]]:
        """The run of a stored document, back in the registry, and its invocations by index
        (None: one that had not closed)."""
        state = RunState(run_id=d["run_id"], app=d["app"], submitted=d["submitted"],
                         tenant=d.get("tenant") or "default", deadline=d.get("deadline"), k=d.get("k"))
        run = LiveRun(state=state, hosted=bool(d.get("hosted")),
                      auto_finish=bool(d.get("auto_finish")), inferred=bool(d.get("inferred")),
                      input=d.get("input"),
                      idempotency=d.get("idempotency") or None)
        run.result, run.error = d.get("result"), d.get("error")
        terminal = d["status"] in TERMINAL
        if terminal:
            run.status = d["status"]
            state.finished = d.get("finished")
        else:
            self.runs.restore(run, ended=False)
            self.ctx.policy.on_arrival(state, d["submitted"])
        restored: list[UnitInvocation | None] = []
        for u in d.get("units", []):
            if not u.get("closed"):
                restored.append(None)
                continue
            restored.append(self._restore_unit(run, u, replay_policy=not terminal))
        if terminal:  # kept as its document: with its invocations
            self.runs.restore(run, ended=True)
        return run, restored

    def _restore_unit(self, run: LiveRun, u: dict[str, Any], *,
                      replay_policy: bool) -> UnitInvocation:
        inv = UnitInvocation(unit=u["unit"], backend=u["backend"], started=u["started"],
                             explicit=True, upstream=u.get("upstream"))
        loop = asyncio.get_running_loop()
        for rd in u.get("requests", []):
            result: Any = Done(**rd["done"]) if "done" in rd else ToolDone(**rd["tool_done"])
            fut = loop.create_future()
            fut.set_result(result)
            inv.requests.append(PendingRequest(
                request_id=rd["request_id"], run=run, inv=inv, kind=rd["kind"], msg=None,
                view=None, key=(), future=fut, node=rd.get("node"), engine=rd.get("engine"),  # type: ignore[arg-type]
                sent_at=rd.get("sent") or u["started"], result=result,
                finished_at=rd.get("finished") or u["finished"]))
        if not replay_policy:
            inv.closed, inv.finished, inv.duration_s = True, u["finished"], u.get("duration_s")
            run.units.append(inv)
            return inv
        # through the registry's own transitions, so the policy sees the run's progress
        ctx = self.ctx
        run.units.append(inv)
        run.open.append(inv)
        run.status = "running"
        run.state.begin_unit(inv.unit)
        ctx.policy.on_unit_start(run.state, inv.unit, inv.started)
        service = 0.0
        tokens = 0
        for req in inv.requests:
            if isinstance(req.result, Done):
                service += float(ctx.cost.unit_service_s(
                    np.array([[req.result.input_tokens]]), np.array([[req.result.output_tokens]]))[0])
                tokens += req.result.input_tokens + req.result.output_tokens
        if u.get("duration_s") is not None and not any(isinstance(r.result, Done) for r in inv.requests):
            service += float(u["duration_s"])
        inv.duration_s = u.get("duration_s")
        if service or tokens:
            run.state.credit(service, tokens)
            ctx.policy.on_service(run.state, service, tokens, u["finished"])
        self.runs.close_unit(run, inv, u["finished"])
        inv.finished = u["finished"]
        return inv

    def _fail(self, run: LiveRun, reason: str) -> None:
        self.stats["failed_on_recovery"] += 1
        run.status = "running"
        self.runs.fail_run(run.run_id, reason)

    def _cancel_unclaimed(self) -> None:
        """Requests nodes still hold that no recovered run adopted: cancel (frees slots).
        An edge's call is left alone: its node answers the edge, which still waits for it
        (its client cancels it through the edge if it goes away)."""
        by_node: dict[str, list[str]] = {}
        for rid, (holder, _) in list(self.nodes.held.items()):
            if rid not in self.dispatch.requests and not rid.startswith(EDGE_REQUEST_PREFIX):
                by_node.setdefault(holder, []).append(rid)
        for node_name, rids in by_node.items():
            node = self.nodes.nodes.get(node_name)
            if node is not None:
                self.nodes.send(node, Cancel(request_ids=rids))
                self.stats["orphans_cancelled"] += len(rids)
        self.orphans.clear()

    # ------------------------------------------------------------------ adoption
    def adopt(self, run: LiveRun, inv: UnitInvocation, entry: dict[str, Any]) -> Any:
        """A journaled call that had been sent but not completed: its result if it arrived,
        a pending request re-attached to the node that holds it, or None (send it again)."""
        rid = entry["request_id"]
        msg = self.orphans.pop(rid, None)
        if isinstance(msg, Done | ToolDone):
            self.stats["adopted"] += 1
            return msg
        held = self.nodes.held.get(rid)
        if held is None or held[0] not in self.nodes.nodes:
            return None
        node = self.nodes.nodes[held[0]]
        kind = entry["kind"]
        m: Any = Submit(**entry["msg"]) if kind == "llm" else Tool(**entry["msg"])
        now = self.ctx.now()
        view = self.dispatch.request_view(run, inv, rid, 0, None, now)
        req = PendingRequest(request_id=rid, run=run, inv=inv, kind=kind, msg=m, view=view,
                             key=tuple(m.key), future=asyncio.get_running_loop().create_future(),
                             model=getattr(m, "model", None), node=node.name,
                             engine=getattr(m, "engine", None),
                             tokens=None, sent_at=entry.get("sent", now))
        self.dispatch.register(req)
        if kind == "llm" and req.engine:
            node.outstanding[req.engine] = node.outstanding.get(req.engine, 0) + 1
        elif kind == "tool":
            node.tools_outstanding += 1
        self.stats["adopted"] += 1
        return req

    def close(self) -> None:
        for task in (self._task, self._ended_task):
            if task is not None:
                task.cancel()

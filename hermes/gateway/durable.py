"""Durable run state: accepted runs, their unit progress and hosted-call results survive a
scheduler restart (SIGKILL included); on restart every run is resumed or failed with a reason.

What is stored (:class:`RunStore`; SQLite in WAL mode in the state directory by default,
Redis with ``--redis URL``):

- a **run document** per accepted run, written (committed) before ``POST /v1/runs`` answers,
  again whenever one of its unit invocations closes and when it ends (state, result or error);
- a **unit document** per closed unit invocation (with the token counts of its requests, so
  that the PDGraph still learns resumed runs), stored by index next to the run document and in
  the same transaction: a write carries only the invocations that closed (or gained results)
  since the last one, so that a run's n-th unit costs O(1), not O(n) (an agent loop of a
  thousand LLM calls would otherwise rewrite its whole history at every call);
- a **call journal** per hosted run: for the n-th LLM/tool call of the app's code, the request
  id it was sent as, the node, and once done its result;
- with the run document, the run's **idempotency key** (``Idempotency-Key`` of the
  ``POST /v1/runs`` that created it, and a hash of that request's body): a retry with the
  same key finds the run, also after a restart (:meth:`DurableState.idempotent_run`). Keys are
  per tenant and live as long as their run is kept.

Recovery (:meth:`DurableState.recover`, when the gateway starts):

- ended runs are restored as they were (``GET /v1/runs/{id}`` answers; nothing runs again);
- hosted runs are **resumed by deterministic replay**: the app's code runs again from the
  start, but every unit invocation that had closed and every call that had completed is
  answered from the store (no engine work, no sleeping); the first call that had not
  completed is adopted if a HermesLet reports it still holds it (its result is awaited, or
  taken if it already arrived), otherwise an LLM call is sent again (a retry, which is safe:
  generations have no side effects) and a tool call fails the run with a reason (tool code may
  have side effects, so it is never run twice). Apps whose control flow depends on something
  else than their input and the results of their calls (clocks, randomness without a seed)
  are not replay-safe; the benchmark apps are;
- client-driven runs keep their closed units and stay active (the client may continue with
  ``X-Hermes-Run``; idle ones finish after ``run_idle_timeout_s``); requests that were in
  flight are lost with the client's connection. A one-request run (an OpenAI request without
  headers) is stored only when it ends, right after its answer has left, batched with the
  other runs ending in the same event-loop iteration (one transaction): such a run has
  nothing to resume, and if the gateway dies before its answer the client sees the
  connection drop; a crash between the answer and the write loses only its history entry;
- HermesLets reconnect by themselves: the scheduler answers their first message with
  ``resync``, they say ``hello`` with the request ids they hold (``holding``), and what no
  recovered run claims within ``recovery_grace_s`` is cancelled at the node, freeing its slot.

Node faults (:meth:`DurableState.redispatch`): when a node falls silent, requests it had
queued (as of its last report) are sent to other nodes; an LLM request that was in flight is
retried once, a second loss fails it; a tool call that was (or may have been) running fails
with a reason rather than run twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hermes.gateway.config import resolve_state_dir
from hermes.protocol import Done, ToolDone

if TYPE_CHECKING:
    from hermes.gateway.scheduler import LiveRun, LiveScheduler, PendingRequest, UnitInvocation

log = logging.getLogger("hermes.gateway.durable")

TERMINAL = ("finished", "failed", "cancelled")

#: one :meth:`RunStore.put_run`: (run_id, status, run document, unit documents by index)
RunWrite = tuple[str, str, dict[str, Any], dict[int, dict[str, Any]]]


# ---------------------------------------------------------------------------------- stores
class RunStore(ABC):
    """Run documents and hosted-call journals."""

    @abstractmethod
    def put_run(self, run_id: str, status: str, doc: dict[str, Any],
                units: dict[int, dict[str, Any]] | None = None) -> None:
        """Store the run document and, atomically with it, the unit documents ``units``
        (invocation index -> document; other stored units are kept)."""

    def put_runs(self, batch: list[RunWrite]) -> None:
        """Several :meth:`put_run` writes at once (one transaction / round trip where the
        store can); used for the ended one-request runs of one loop iteration."""
        for w in batch:
            self.put_run(*w)

    @abstractmethod
    def put_call(self, run_id: str, seq: int, entry: dict[str, Any]) -> None: ...

    @abstractmethod
    def runs(self) -> list[dict[str, Any]]:
        """Every stored run document, oldest first, with its stored unit documents as
        ``doc["units"]``: a list of ``doc["n_units"]`` entries in invocation order, where an
        invocation never stored (still open) is ``{"closed": False}``."""

    @abstractmethod
    def calls(self, run_id: str) -> dict[int, dict[str, Any]]: ...

    @abstractmethod
    def drop_calls(self, run_id: str) -> None:
        """Forget a run's call journal (it ended: nothing will replay it)."""

    @abstractmethod
    def prune_ended(self, keep: int) -> int:
        """Delete all but the newest ``keep`` ended runs; returns how many were deleted."""

    def close(self) -> None:  # noqa: B027 - optional
        pass

    def describe(self) -> str:
        return type(self).__name__


class SqliteRunStore(RunStore):
    """SQLite in WAL mode; ``synchronous=NORMAL``: a commit is in the WAL before the call
    returns, so it survives the process being killed (an OS crash may lose the last ones)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, seq INTEGER, "
                        "status TEXT, doc TEXT)")
        self.db.execute("CREATE TABLE IF NOT EXISTS calls (run_id TEXT, seq INTEGER, doc TEXT, "
                        "PRIMARY KEY (run_id, seq))")
        self.db.execute("CREATE TABLE IF NOT EXISTS units (run_id TEXT, idx INTEGER, doc TEXT, "
                        "PRIMARY KEY (run_id, idx))")
        self._lock = threading.Lock()
        row = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM runs").fetchone()
        self._seq = int(row[0])

    def put_run(self, run_id: str, status: str, doc: dict[str, Any],
                units: dict[int, dict[str, Any]] | None = None) -> None:
        self.put_runs([(run_id, status, doc, units or {})])

    def put_runs(self, batch: list[RunWrite]) -> None:
        encoded = [(run_id, status, json.dumps(doc, default=str),
                    [(run_id, i, json.dumps(u, default=str)) for i, u in units.items()])
                   for run_id, status, doc, units in batch]
        one = len(encoded) == 1 and not encoded[0][3]  # one statement: its own transaction
        with self._lock:
            if not one:
                self.db.execute("BEGIN")
            try:
                for run_id, status, text, rows in encoded:
                    self._seq += 1
                    self.db.execute(
                        "INSERT INTO runs(run_id, seq, status, doc) VALUES (?, ?, ?, ?) ON "
                        "CONFLICT(run_id) DO UPDATE SET status=excluded.status, doc=excluded.doc",
                        (run_id, self._seq, status, text))
                    if rows:
                        self.db.executemany(
                            "INSERT OR REPLACE INTO units(run_id, idx, doc) VALUES (?, ?, ?)",
                            rows)
                if not one:
                    self.db.execute("COMMIT")
            except BaseException:
                if not one:
                    self.db.execute("ROLLBACK")
                raise

    def put_call(self, run_id: str, seq: int, entry: dict[str, Any]) -> None:
        with self._lock:
            self.db.execute("INSERT OR REPLACE INTO calls(run_id, seq, doc) VALUES (?, ?, ?)",
                            (run_id, seq, json.dumps(entry, default=str)))

    def drop_calls(self, run_id: str) -> None:
        with self._lock:
            self.db.execute("DELETE FROM calls WHERE run_id = ?", (run_id,))

    def prune_ended(self, keep: int) -> int:
        with self._lock:
            cur = self.db.execute(
                "DELETE FROM runs WHERE status IN ('finished', 'failed', 'cancelled') AND seq < "
                "COALESCE((SELECT seq FROM runs WHERE status IN ('finished', 'failed', 'cancelled')"
                " ORDER BY seq DESC LIMIT 1 OFFSET ?), -1)", (max(0, keep - 1),))
            deleted = cur.rowcount
            if deleted:
                self.db.execute("DELETE FROM units WHERE run_id NOT IN (SELECT run_id FROM runs)")
            return deleted

    def runs(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self.db.execute("SELECT run_id, doc FROM runs ORDER BY seq").fetchall()
            units: dict[str, dict[int, dict[str, Any]]] = {}
            for run_id, idx, doc in self.db.execute("SELECT run_id, idx, doc FROM units"):
                units.setdefault(run_id, {})[int(idx)] = json.loads(doc)
        return [_with_units(json.loads(d), units.get(r, {})) for r, d in rows]

    def calls(self, run_id: str) -> dict[int, dict[str, Any]]:
        with self._lock:
            rows = self.db.execute("SELECT seq, doc FROM calls WHERE run_id = ?", (run_id,)).fetchall()
        return {int(s): json.loads(d) for s, d in rows}

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def describe(self) -> str:
        return f"sqlite:{self.path}"


class RedisRunStore(RunStore):
    """Redis: ``<p>runs`` (hash run_id -> doc), ``<p>order`` (sorted set by acceptance),
    ``<p>calls:<run_id>`` (hash seq -> entry). Every write (or batch) is one round trip."""

    def __init__(self, url: str, prefix: str = "hermes:state:") -> None:
        import redis

        self.url = url
        self.r = redis.Redis.from_url(url, decode_responses=True)
        self.p = prefix
        self.r.ping()

    def put_run(self, run_id: str, status: str, doc: dict[str, Any],
                units: dict[int, dict[str, Any]] | None = None) -> None:
        self.put_runs([(run_id, status, doc, units or {})])

    def put_runs(self, batch: list[RunWrite]) -> None:
        pipe = self.r.pipeline(transaction=True)
        for run_id, _status, doc, units in batch:
            pipe.hset(self.p + "runs", run_id, json.dumps(doc, default=str))
            pipe.zadd(self.p + "order", {run_id: float(doc.get("submitted", 0.0))}, nx=True)
            if units:
                pipe.hset(f"{self.p}units:{run_id}",
                          mapping={str(i): json.dumps(u, default=str) for i, u in units.items()})
        pipe.execute()

    def put_call(self, run_id: str, seq: int, entry: dict[str, Any]) -> None:
        self.r.hset(f"{self.p}calls:{run_id}", str(seq), json.dumps(entry, default=str))

    def drop_calls(self, run_id: str) -> None:
        self.r.delete(f"{self.p}calls:{run_id}")

    def prune_ended(self, keep: int) -> int:
        docs = self.runs()
        ended = [d["run_id"] for d in docs if d.get("status") in TERMINAL]
        old = ended[: max(0, len(ended) - keep)]
        if old:
            pipe = self.r.pipeline()
            pipe.hdel(self.p + "runs", *old)
            pipe.zrem(self.p + "order", *old)
            pipe.delete(*(f"{self.p}units:{r}" for r in old))
            pipe.execute()
        return len(old)

    def runs(self) -> list[dict[str, Any]]:
        ids = self.r.zrange(self.p + "order", 0, -1)
        if not ids:
            return []
        docs = self.r.hmget(self.p + "runs", ids)
        pipe = self.r.pipeline()
        for run_id in ids:
            pipe.hgetall(f"{self.p}units:{run_id}")
        units = pipe.execute()
        return [_with_units(json.loads(d), {int(k): json.loads(v) for k, v in u.items()})
                for d, u in zip(docs, units, strict=True) if d is not None]

    def calls(self, run_id: str) -> dict[int, dict[str, Any]]:
        return {int(k): json.loads(v) for k, v in self.r.hgetall(f"{self.p}calls:{run_id}").items()}

    def close(self) -> None:
        self.r.close()

    def describe(self) -> str:
        return f"redis:{self.url}"


def open_run_store(config: Any) -> RunStore | None:
    d = config.durability
    if not d.durable:
        return None
    if d.state_redis:
        return RedisRunStore(d.state_redis)
    return SqliteRunStore(resolve_state_dir(config.stores.state_dir) / "state.sqlite3")


# ---------------------------------------------------------------------------------- documents
def _req_doc(req: PendingRequest) -> dict[str, Any] | None:
    r = req.result
    if isinstance(r, Done):
        return {"request_id": req.request_id, "kind": "llm", "node": req.node, "engine": req.engine,
                "sent": req.sent_at, "finished": req.finished_at, "done": r.model_dump(exclude={"response"})}
    if isinstance(r, ToolDone):
        return {"request_id": req.request_id, "kind": "tool", "node": req.node,
                "sent": req.sent_at, "finished": req.finished_at, "tool_done": r.model_dump()}
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
            "hosted": run.hosted, "auto_finish": run.auto_finish, "input": run.input,
            "result": run.result, "error": run.error, "recovered": getattr(run, "recovered", 0),
            "n_units": len(run.units), "idempotency": getattr(run, "idempotency", None)}


def _inv_version(inv: UnitInvocation) -> int:
    """Changes whenever the stored document of a closed invocation would: requests with a
    result (a unit closed by the client's event may still get results after it)."""
    return sum(1 for r in inv.requests if r.result is not None)


def _with_units(doc: dict[str, Any], units: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """A stored run document with its unit documents as ``doc["units"]`` (see RunStore.runs);
    documents written before units were stored apart carry theirs inline."""
    if "units" not in doc:
        n = max(int(doc.get("n_units", 0)), max(units, default=-1) + 1)
        doc["units"] = [units.get(i, {"closed": False}) for i in range(n)]
    return doc


# ---------------------------------------------------------------------------------- replay
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


# ---------------------------------------------------------------------------------- state
@dataclass(slots=True)
class _StoredUnits:
    """Invocations ``< lo`` are stored final; ``versions``: index -> stored version."""

    lo: int = 0
    versions: dict[int, int] = field(default_factory=dict)


class DurableState:
    """The scheduler's durable side: writes on run/unit events, recovery on start."""

    def __init__(self, store: RunStore | None, scheduler: LiveScheduler, grace_s: float = 5.0) -> None:
        self.store = store
        self.sched = scheduler
        self.grace_s = grace_s
        #: results of requests nobody waits for yet (arrived before their run was replayed)
        self.orphans: OrderedDict[str, Any] = OrderedDict()
        #: request id -> (node, "queued"|"inflight"), from hellos and heartbeats
        self.held: dict[str, tuple[str, str]] = {}
        self.recovering = False
        self.recovered_ready = asyncio.Event()
        #: shared with the scheduler's stats (``/healthz`` shows them)
        self.stats = scheduler.stats
        self.stats.update({"recovered_hosted": 0, "recovered_client": 0, "restored_ended": 0,
                           "failed_on_recovery": 0, "adopted": 0, "resent": 0,
                           "orphans_cancelled": 0})
        self._write_errors = 0
        #: writes of ended one-request runs waiting for :meth:`flush` (end of loop iteration)
        self._batch: list[RunWrite] = []
        self._restoring = False
        self._ended = 0
        #: per active run: what of its invocations is stored (see :meth:`_put`)
        self._stored: dict[str, _StoredUnits] = {}
        #: (tenant, Idempotency-Key) -> run id (rebuilt from the run documents on restart)
        self._idempotency: dict[tuple[str, str], str] = {}

    # ------------------------------------------------------------------ idempotency keys
    def remember_idempotency(self, run: LiveRun) -> None:
        """Index a run created with an ``Idempotency-Key`` (its ``idempotency`` attribute)."""
        idem = getattr(run, "idempotency", None)
        if not isinstance(idem, dict) or "key" not in idem:
            return
        self._idempotency[(run.state.tenant, str(idem["key"]))] = run.run_id
        if len(self._idempotency) > 2 * self.sched.config.scheduler.keep_finished_runs + 1024:
            runs = self.sched.runs  # keys live as long as their runs are kept
            self._idempotency = {k: r for k, r in self._idempotency.items() if r in runs}

    def idempotent_run(self, tenant: str, key: str) -> tuple[LiveRun, str] | None:
        """The run ``tenant`` created with ``key`` and the hash of that request's body, or
        None when the key is new (or its run is no longer kept)."""
        rid = self._idempotency.get((tenant, key))
        if rid is None:
            return None
        run = self.sched.runs.get(rid)
        if run is None:
            del self._idempotency[(tenant, key)]
            return None
        return run, str(run.idempotency["body"])  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ writes
    def _put(self, run: LiveRun, *, batched: bool = False) -> None:
        """Write the run document with the invocations that closed or gained results since
        the last write. Invocations below ``lo`` are closed with every request answered and
        stored so: the scan starts there, so a sequential run's write is O(1).

        ``batched`` (an ended run that nobody waits on to be stored: see :meth:`run_ended`):
        the documents are taken now and written with the others of this loop iteration, in
        one transaction, on the next one (:meth:`flush`)."""
        if self.store is None or self._restoring:
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
            self._batch.append((run.run_id, run.status, run_doc(run), units))
            if len(self._batch) == 1:
                asyncio.get_running_loop().call_soon(self.flush)
            return
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

    def run_created(self, run: LiveRun) -> None:
        if not run.auto_finish:  # one-request runs: stored when they end (see the module doc)
            self._put(run)

    def run_progress(self, run: LiveRun) -> None:
        if not run.auto_finish:
            self._put(run)

    def run_ended(self, run: LiveRun) -> None:
        # a one-request run ends after its answer has left (openai_api): its only write is
        # batched; a run whose end is acknowledged (finish, cancel) is written before that
        self._put(run, batched=run.auto_finish and _in_loop())
        self._stored.pop(run.run_id, None)
        if self.store is None:
            return
        try:
            if run.hosted:
                self.store.drop_calls(run.run_id)
            self._ended += 1
            if self._ended % 1000 == 0:  # bounded on disk like the finished runs in memory
                self.store.prune_ended(self.sched.config.scheduler.keep_finished_runs)
        except Exception:
            log.exception("durable cleanup after run %s failed", run.run_id)

    def flush(self) -> None:
        """Write the batched run documents (one transaction or round trip)."""
        batch, self._batch = self._batch, []
        if not batch or self.store is None:
            return
        try:
            self.store.put_runs(batch)
        except Exception:
            self._write_errors += len(batch)
            log.exception("durable write of %d ended runs failed", len(batch))

    def call(self, run: LiveRun, seq: int, entry: dict[str, Any]) -> None:
        if self.store is None:
            return
        try:
            self.store.put_call(run.run_id, seq, entry)
        except Exception:
            self._write_errors += 1
            log.exception("durable journal write of run %s failed", run.run_id)

    # ------------------------------------------------------------------ node reports
    def on_holding(self, node: str, holding: dict[str, str]) -> None:
        for rid in [r for r, (n, _) in self.held.items() if n == node and r not in holding]:
            del self.held[rid]
        for rid, state in holding.items():
            self.held[rid] = (node, state)

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
    def recover(self, hosted_registry: Any, config: Any) -> None:
        """Restore stored runs into the scheduler and schedule the replays (see module doc)."""
        from hermes.gateway import hosted

        sched = self.sched
        self.start_monitor()
        if self.store is not None:
            self.store.prune_ended(sched.config.scheduler.keep_finished_runs)
        docs = self.store.runs() if self.store is not None else []
        if not docs:
            self.recovered_ready.set()
            return
        high = max(max(d.get("submitted") or 0.0, d.get("finished") or 0.0) for d in docs)
        if sched.now() < high:  # keep the scheduler clock monotonic across restarts
            sched._t0_wall += high - sched.now() + 1e-3
        self.recovering = True
        replays: list[tuple[LiveRun, Any, Replay]] = []
        recorded: set[str] | None = None
        for d in docs:
            self._restoring = True
            try:
                run = self._restore(d)
            finally:
                self._restoring = False
            if d["status"] in TERMINAL:
                self.stats["restored_ended"] += 1
                continue
            run.recovered = int(d.get("recovered", 0)) + 1
            if recorded is None:
                recorded = sched.recorded_run_ids()
            run.recorded = run.run_id in recorded
            if run.hosted:
                app = hosted_registry.get(run.app)
                if app is None:
                    self._fail(run, f"the gateway restarted and hosted app {run.app!r} is no "
                                    "longer registered")
                    continue
                units = [u if u is not None and u.closed else None for u in run._restored_units]
                assert self.store is not None
                replays.append((run, app, Replay(self.store.calls(run.run_id), units)))
            elif run.auto_finish:
                self._fail(run, "the gateway restarted while this request was in flight; the "
                                "client's connection was lost")
            else:
                self.stats["recovered_client"] += 1
                self._put(run)
        log.warning("recovered %d runs from %s: %d hosted to resume, %d client-driven active, "
                    "%d ended", len(docs), self.store.describe(), len(replays),
                    self.stats["recovered_client"], self.stats["restored_ended"])
        loop = asyncio.get_running_loop()

        async def resume_all() -> None:
            await self._wait_for_nodes()
            for run, app, replay in replays:
                if run.status in ("queued", "running"):
                    self.stats["recovered_hosted"] += 1
                    hosted.launch(sched, run, app, config, replay=replay)
            self.recovered_ready.set()
            await asyncio.sleep(max(self.grace_s, 1.0))
            self.recovering = False
            self._cancel_unclaimed()

        self._task = loop.create_task(resume_all(), name="hermes-recover")

    async def _wait_for_nodes(self) -> None:
        """Give HermesLets ``grace_s`` to reconnect and report what they hold."""
        deadline = time.monotonic() + self.grace_s
        await self.sched.wait_for_nodes(self.grace_s)
        # a node reports its holdings in its hello; wait for its first heartbeat as well
        await asyncio.sleep(min(1.5, max(0.0, deadline - time.monotonic())))

    def _restore(self, d: dict[str, Any]) -> LiveRun:
        from hermes.core.state import RunState
        from hermes.gateway.scheduler import LiveRun

        sched = self.sched
        state = RunState(run_id=d["run_id"], app=d["app"], submitted=d["submitted"],
                         tenant=d.get("tenant") or "default", deadline=d.get("deadline"), k=d.get("k"))
        run = LiveRun(state=state, hosted=bool(d.get("hosted")),
                      auto_finish=bool(d.get("auto_finish")), input=d.get("input"))
        run.result, run.error = d.get("result"), d.get("error")
        if d.get("idempotency"):
            run.idempotency = d["idempotency"]  # type: ignore[attr-defined]
            self.remember_idempotency(run)
        sched.runs[run.run_id] = run
        terminal = d["status"] in TERMINAL
        if not terminal:
            sched.policy.on_arrival(state, d["submitted"])
        restored: list[UnitInvocation | None] = []
        for u in d.get("units", []):
            if not u.get("closed"):
                restored.append(None)
                continue
            restored.append(self._restore_unit(run, u, replay_policy=not terminal))
        run._restored_units = restored
        if terminal:
            run.status = d["status"]
            state.finished = d.get("finished")
            run.finished_event.set()
            sched._finished_order[run.run_id] = None
        return run

    def _restore_unit(self, run: LiveRun, u: dict[str, Any], *, replay_policy: bool) -> UnitInvocation:
        from hermes.gateway.scheduler import PendingRequest, UnitInvocation

        sched = self.sched
        inv = UnitInvocation(unit=u["unit"], backend=u["backend"], started=u["started"],
                             explicit=True, upstream=u.get("upstream"))
        loop = asyncio.get_running_loop()
        for rd in u.get("requests", []):
            result: Any = Done(**rd["done"]) if "done" in rd else ToolDone(**rd["tool_done"])
            fut = loop.create_future()
            fut.set_result(result)
            inv.requests.append(PendingRequest(
                request_id=rd["request_id"], run=run, inv=inv, kind=rd["kind"], msg=None,  # type: ignore[arg-type]
                view=None, key=(), future=fut, node=rd.get("node"), engine=rd.get("engine"),  # type: ignore[arg-type]
                sent_at=rd.get("sent") or u["started"], result=result,
                finished_at=rd.get("finished") or u["finished"]))
        if not replay_policy:
            inv.closed, inv.finished, inv.duration_s = True, u["finished"], u.get("duration_s")
            run.units.append(inv)
            return inv
        # through the scheduler's own transitions, so the policy sees the run's progress
        run.units.append(inv)
        run.open.append(inv)
        run.status = "running"
        run.state.begin_unit(inv.unit)
        sched.policy.on_unit_start(run.state, inv.unit, inv.started)
        service = 0.0
        tokens = 0
        for req in inv.requests:
            if isinstance(req.result, Done):
                service += float(sched.cost.unit_service_s(
                    np.array([[req.result.input_tokens]]), np.array([[req.result.output_tokens]]))[0])
                tokens += req.result.input_tokens + req.result.output_tokens
        if u.get("duration_s") is not None and not any(isinstance(r.result, Done) for r in inv.requests):
            service += float(u["duration_s"])
        inv.duration_s = u.get("duration_s")
        if service or tokens:
            run.state.credit(service, tokens)
            sched.policy.on_service(run.state, service, tokens, u["finished"])
        sched._close_unit(run, inv, u["finished"])
        inv.finished = u["finished"]
        return inv

    def _fail(self, run: LiveRun, reason: str) -> None:
        self.stats["failed_on_recovery"] += 1
        run.status = "running"
        self.sched.fail_run(run.run_id, reason)

    def _cancel_unclaimed(self) -> None:
        """Requests nodes still hold that no recovered run adopted: cancel (frees slots)."""
        from hermes.protocol import Cancel

        by_node: dict[str, list[str]] = {}
        for rid, (node, _) in list(self.held.items()):
            if rid not in self.sched.requests:
                by_node.setdefault(node, []).append(rid)
        for node_name, rids in by_node.items():
            node = self.sched.nodes.get(node_name)
            if node is not None:
                self.sched._send(node, Cancel(request_ids=rids))
                self.stats["orphans_cancelled"] += len(rids)
        self.orphans.clear()

    # ------------------------------------------------------------------ adoption
    def adopt(self, run: LiveRun, inv: UnitInvocation, entry: dict[str, Any]) -> Any:
        """A journaled call that had been sent but not completed: its result if it arrived,
        a pending request re-attached to the node that holds it, or None (send it again)."""
        from hermes.gateway.scheduler import PendingRequest
        from hermes.protocol import Submit, Tool

        rid = entry["request_id"]
        msg = self.orphans.pop(rid, None)
        if isinstance(msg, Done | ToolDone):
            self.stats["adopted"] += 1
            return msg
        held = self.held.get(rid)
        if held is None or held[0] not in self.sched.nodes:
            return None
        sched = self.sched
        node = sched.nodes[held[0]]
        kind = entry["kind"]
        m: Any = Submit(**entry["msg"]) if kind == "llm" else Tool(**entry["msg"])
        now = sched.now()
        view = sched._view(run, inv, rid, 0, None, now)
        req = PendingRequest(request_id=rid, run=run, inv=inv, kind=kind, msg=m, view=view,
                             key=tuple(m.key), future=asyncio.get_running_loop().create_future(),
                             model=getattr(m, "model", None), node=node.name,
                             engine=getattr(m, "engine", None),
                             tokens=None, sent_at=entry.get("sent", now))
        sched._register(req)
        if kind == "llm" and req.engine:
            node.outstanding[req.engine] = node.outstanding.get(req.engine, 0) + 1
        elif kind == "tool":
            node.tools_outstanding += 1
        self.stats["adopted"] += 1
        return req

    # ------------------------------------------------------------------ node faults
    def start_monitor(self, suspect_s: float = 2.0) -> None:
        """Watch the ROUTER for TCP disconnects: a node that disconnected and then missed a
        heartbeat (``suspect_s``) is treated as dead at once, rather than after the
        scheduler's silence timeout, so that its work moves elsewhere in seconds."""
        sock = self.sched._socket
        if sock is None or getattr(self, "_monitor", None) is not None:
            return
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        mon = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._monitor = mon

        async def watch() -> None:
            try:
                while True:
                    await recv_monitor_message(mon)  # type: ignore[arg-type]
                    await asyncio.sleep(suspect_s)
                    self.reap_silent(suspect_s)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("socket monitor stopped")

        self._monitor_task = asyncio.get_running_loop().create_task(watch(), name="hermes-monitor")

    def reap_silent(self, silent_s: float) -> list[str]:
        """Drop nodes silent for ``silent_s`` and re-dispatch their work; returns their names."""
        sched = self.sched
        cutoff = time.monotonic() - silent_s
        gone = [name for name, n in sched.nodes.items() if n.last_seen < cutoff]
        for name in gone:
            log.warning("node %s disconnected and silent for %.1f s: re-dispatching", name, silent_s)
            del sched.nodes[name]
            self.redispatch(name)
        if not sched.nodes:
            sched._node_ready.clear()
        return gone

    def redispatch(self, node_name: str) -> None:
        """A node fell silent: re-dispatch or fail what it held (see the module doc)."""
        from hermes.gateway.scheduler import RequestFailed

        sched = self.sched
        seen: dict[str, int] = {}
        for req in list(sched.requests.values()):
            if req.node != node_name:
                continue
            state = self.held.get(req.request_id, (node_name, "unknown"))[1]
            seen[state] = seen.get(state, 0) + 1
            req.node = None
            if state == "queued":
                (sched._send_llm if req.kind == "llm" else sched._send_tool)(req)
            elif req.kind == "llm" and getattr(req, "fault_retries", 0) < 1:
                req.fault_retries = 1  # type: ignore[attr-defined]
                self.stats["resent"] += 1
                sched._send_llm(req)
            elif req.kind == "llm":
                sched._fail_request(req, RequestFailed(
                    f"request {req.request_id} was in flight on node {node_name!r} when it died, "
                    "for the second time; not retried again"))
            else:
                sched._fail_request(req, RequestFailed(
                    f"tool call {req.request_id} was running on node {node_name!r} when it died; "
                    "tool calls are not retried (they may have side effects)"))
        for rid in [r for r, (n, _) in self.held.items() if n == node_name]:
            del self.held[rid]
        log.warning("node %s gone: its requests by last reported state %s", node_name, seen)

    def close(self) -> None:
        task = getattr(self, "_monitor_task", None)
        if task is not None:
            task.cancel()
        mon = getattr(self, "_monitor", None)
        if mon is not None:
            mon.close(linger=0)
        for t in (getattr(self, "_task", None),):
            if t is not None:
                t.cancel()
        self.flush()
        if self.store is not None:
            self.store.close()


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def attach(scheduler: LiveScheduler) -> DurableState:
    """The scheduler's :class:`DurableState` (its store per ``[durability]``; node-fault
    handling works with durability off as well)."""
    cfg = scheduler.config
    return DurableState(open_run_store(cfg), scheduler, cfg.durability.recovery_grace_s)


def call_entry(req: PendingRequest, state: str) -> dict[str, Any]:
    """A journal entry for a hosted call (``state``: sent | done)."""
    entry: dict[str, Any] = {"request_id": req.request_id, "kind": req.kind, "node": req.node,
                             "sent": req.sent_at, "state": state,
                             "msg": req.msg.model_dump() if req.msg is not None else None}
    if state == "done" and req.result is not None:
        entry["result"] = req.result.model_dump(exclude={"response"})
    return entry

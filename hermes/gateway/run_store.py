"""Where durable run state is kept: run documents, their unit documents and the call
journals of hosted runs (:mod:`hermes.gateway.durable` decides what is written when).

:class:`SqliteRunStore` (WAL mode, in the state directory) by default, :class:`RedisRunStore`
with ``--redis URL`` (``durability.state_redis``); :func:`open_run_store` picks per
``[durability]``. A run's unit documents are stored by invocation index next to its run
document and in the same transaction, so that a write carries only the invocations that
changed.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hermes.gateway.config import resolve_state_dir
from hermes.gateway.state import TERMINAL, encode_plain_doc, encode_run_doc

log = logging.getLogger("hermes.gateway.run_store")

#: one :meth:`RunStore.put_run`: (run_id, status, run document, unit documents by index)
RunWrite = tuple[str, str, dict[str, Any], dict[int, dict[str, Any]]]
#: one history entry of :meth:`RunStore.put_runs` (``history``): (run_id, when it was
#: submitted, its finished document as ``GET /v1/runs/{id}`` answers it, its extras or None),
#: both JSON bytes as :meth:`hermes.gateway.finished.FinishedRuns.encoded` keeps them
HistoryWrite = tuple[str, float, bytes, "bytes | None"]
#: the key of a history entry read back (:func:`history_doc`): its two JSON texts
HISTORY = "history"
#: ... and its document, decoded once (for :meth:`~hermes.gateway.finished.FinishedRuns.
#: add_encoded`, which would otherwise decode it again)
HISTORY_PARSED = "history_parsed"
#: between a history entry's document and its extras in one stored value (compact JSON text
#: has no raw newline: JSON escapes it inside strings and its encoders here add no whitespace)
_SEP = b"\n"


def history_doc(doc: bytes, extra: bytes | None = None) -> dict[str, Any]:
    """A history entry as :meth:`RunStore.runs` returns it: the fields recovery reads of every
    stored run (``run_id``, ``status``, ``submitted``, ``finished``, ``app``, ``tenant``)
    and, under :data:`HISTORY`, the document and extras as stored (under
    :data:`HISTORY_PARSED` the document decoded), for
    :meth:`~hermes.gateway.finished.FinishedRuns.add_encoded`. ``ValueError``: not a run's
    finished document."""
    try:
        d = json.loads(doc)
        return {"run_id": str(d["run_id"]), "status": str(d["state"]),
                "submitted": float(d["submitted"]), "finished": d.get("finished"),
                "app": str(d["app"]), "tenant": d.get("tenant"), HISTORY: (doc, extra),
                HISTORY_PARSED: d}
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"a damaged history entry: {e!r}") from None


def _history_value(doc: bytes, extra: bytes | None) -> bytes:
    return doc if extra is None else doc + _SEP + extra


def _history_of(run_id: str, value: bytes | str) -> dict[str, Any] | None:
    """:func:`_history_or_none` of a value of ``<p>history`` (document, then extras)."""
    raw = value.encode() if isinstance(value, str) else value
    doc, sep, extra = raw.partition(_SEP)
    return _history_or_none(run_id, doc, extra if sep else None)


def _history_or_none(run_id: str, doc: bytes, extra: bytes | None) -> dict[str, Any] | None:
    """:func:`history_doc`, or None (logged) for a damaged entry: one entry must not stop a
    new leader from reading every other run."""
    try:
        return history_doc(doc, extra)
    except ValueError as e:
        log.warning("history entry of run %s skipped: %s", run_id, e)
        return None


# ---------------------------------------------------------------------------------- stores
class RunStore(ABC):
    """Run documents and hosted-call journals."""

    @abstractmethod
    def put_run(self, run_id: str, status: str, doc: dict[str, Any],
                units: dict[int, dict[str, Any]] | None = None) -> None:
        """Store the run document and, atomically with it, the unit documents ``units``
        (invocation index -> document; other stored units are kept). The run document may
        hold a client's values (:func:`encode_run_doc`); unit documents are plain JSON values
        (``durable._inv_doc``: :func:`encode_plain_doc`)."""

    def put_runs(self, batch: list[RunWrite], history: Sequence[HistoryWrite] = ()) -> None:
        """Several :meth:`put_run` writes at once (one transaction / round trip where the
        store can); used for the ended one-request runs of one loop iteration.

        ``history``: history entries of runs that ended without ever being stored (lazily
        stored inferred runs, :attr:`~hermes.gateway.state.LiveRun.lazy_store`): the
        finished document the scheduler keeps, written as its bytes are, in the same
        transaction; a stored document of the same run (written by an earlier leader) is
        dropped with it. :meth:`runs` returns them as :func:`history_doc` dicts; they count
        as ended runs for :meth:`prune_ended`."""
        if history:
            raise NotImplementedError(f"{type(self).__name__} keeps no history entries")
        for w in batch:
            self.put_run(*w)

    @abstractmethod
    def put_call(self, run_id: str, seq: int, entry: dict[str, Any]) -> None: ...

    @abstractmethod
    def runs(self) -> list[dict[str, Any]]:
        """Every stored run document, oldest first, with its stored unit documents as
        ``doc["units"]``: a list of ``doc["n_units"]`` entries in invocation order, where an
        invocation never stored (still open) is ``{"closed": False}``; a history entry
        (:meth:`put_runs`, ``history``) as :func:`history_doc`."""

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
        # history entries (put_runs' ``history``): a finished document and its extras as kept
        self.db.execute("CREATE TABLE IF NOT EXISTS history (run_id TEXT PRIMARY KEY, "
                        "seq INTEGER, doc BLOB, extra BLOB)")
        self.db.execute("CREATE INDEX IF NOT EXISTS history_seq ON history(seq)")
        # ended runs by acceptance order: prune_ended reads the newest ``keep`` and deletes
        # below (without it, a scan and sort of every run on the event loop: 13-24 ms at 10,000)
        self.db.execute("CREATE INDEX IF NOT EXISTS runs_ended_seq ON runs(seq) "
                        "WHERE status IN ('finished', 'failed', 'cancelled')")
        self._lock = threading.Lock()
        row = self.db.execute("SELECT MAX(COALESCE((SELECT MAX(seq) FROM runs), 0), "
                              "COALESCE((SELECT MAX(seq) FROM history), 0))").fetchone()
        self._seq = int(row[0])

    def put_run(self, run_id: str, status: str, doc: dict[str, Any],
                units: dict[int, dict[str, Any]] | None = None) -> None:
        self.put_runs([(run_id, status, doc, units or {})])

    def put_runs(self, batch: list[RunWrite], history: Sequence[HistoryWrite] = ()) -> None:
        encoded = [(run_id, status, encode_run_doc(doc).decode(),
                    [(run_id, i, encode_plain_doc(u).decode()) for i, u in units.items()])
                   for run_id, status, doc, units in batch]
        # one statement: its own transaction
        one = len(encoded) == 1 and not encoded[0][3] and not history
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
                if history:
                    ids = [(w[0],) for w in history]
                    self.db.executemany("DELETE FROM runs WHERE run_id = ?", ids)
                    self.db.executemany("DELETE FROM units WHERE run_id = ?", ids)
                    rows_h = []
                    for run_id, _, doc, extra in history:
                        self._seq += 1
                        rows_h.append((run_id, self._seq, doc, extra))
                    self.db.executemany("INSERT OR REPLACE INTO history(run_id, seq, doc, extra) "
                                        "VALUES (?, ?, ?, ?)", rows_h)
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
        ended = "status IN ('finished', 'failed', 'cancelled')"
        with self._lock:
            row = self.db.execute(f"SELECT seq FROM (SELECT seq FROM runs WHERE {ended} "
                                  "UNION ALL SELECT seq FROM history) ORDER BY seq DESC "
                                  "LIMIT 1 OFFSET ?", (max(0, keep - 1),)).fetchone()
            if row is None:
                return 0
            self.db.execute("BEGIN")
            try:
                self.db.execute("DELETE FROM units WHERE run_id IN (SELECT run_id FROM runs "
                                f"WHERE {ended} AND seq < ?)", (row[0],))
                deleted = self.db.execute(f"DELETE FROM runs WHERE {ended} AND seq < ?",
                                          (row[0],)).rowcount
                deleted += self.db.execute("DELETE FROM history WHERE seq < ?",
                                           (row[0],)).rowcount
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            return int(deleted)

    def runs(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self.db.execute("SELECT seq, run_id, doc, NULL, 0 FROM runs UNION ALL "
                                   "SELECT seq, run_id, doc, extra, 1 FROM history "
                                   "ORDER BY 1").fetchall()
            units: dict[str, dict[int, dict[str, Any]]] = {}
            for run_id, idx, doc in self.db.execute("SELECT run_id, idx, doc FROM units"):
                units.setdefault(run_id, {})[int(idx)] = json.loads(doc)
        out = []
        for _, r, d, x, h in rows:
            if not h:
                out.append(_with_units(json.loads(d), units.get(r, {})))
            elif (got := _history_or_none(r, bytes(d), None if x is None else bytes(x))):
                out.append(got)
        return out

    def calls(self, run_id: str) -> dict[int, dict[str, Any]]:
        with self._lock:
            rows = self.db.execute("SELECT seq, doc FROM calls WHERE run_id = ?", (run_id,)).fetchall()
        return {int(s): json.loads(d) for s, d in rows}

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def describe(self) -> str:
        return f"sqlite:{self.path}"


#: the most ended runs one run of :data:`_PRUNE_SCRIPT` drops (Redis runs a script alone: a
#: first prune of a large backlog is done in several short ones)
PRUNE_CHUNK = 1000

#: :meth:`RedisRunStore.prune_ended` inside Redis. KEYS: the order (sorted set by acceptance),
#: the active index (set), the run documents (hash), the units written at runs' ends (hash),
#: the history entries (hash);
#: ARGV: keep, the prefix of the unit documents' keys, the most to drop. Returns how many
#: were dropped. (It deletes the unit documents' keys, which it cannot declare in KEYS: a
#: single Redis, not a Redis Cluster, as every transaction of this store already assumes.)
_PRUNE_SCRIPT = """
local total = redis.call('ZCARD', KEYS[1])
local excess = total - redis.call('SCARD', KEYS[2]) - tonumber(ARGV[1])
if excess <= 0 then return 0 end
excess = math.min(excess, tonumber(ARGV[3]))
local old, units = {}, {}
local start = 0
while #old < excess and start < total do
  local chunk = redis.call('ZRANGE', KEYS[1], start, start + (excess - #old) + 63)
  if #chunk == 0 then break end
  start = start + #chunk
  local active = redis.call('SMISMEMBER', KEYS[2], unpack(chunk))
  for i, id in ipairs(chunk) do
    if active[i] == 0 and #old < excess then
      old[#old + 1] = id
      units[#units + 1] = ARGV[2] .. id
    end
  end
end
if #old == 0 then return 0 end
redis.call('HDEL', KEYS[3], unpack(old))
redis.call('HDEL', KEYS[4], unpack(old))
redis.call('HDEL', KEYS[5], unpack(old))
redis.call('ZREM', KEYS[1], unpack(old))
redis.call('DEL', unpack(units))
return #old
"""


class RedisRunStore(RunStore):
    """Redis: ``<p>runs`` (hash run_id -> doc), ``<p>order`` (sorted set by acceptance),
    ``<p>active`` (set of the runs not ended), a run's unit documents in ``<p>units:<run_id>``
    (hash index -> doc) while it runs and those its end wrote in ``<p>end_units`` (hash
    run_id -> JSON object index -> doc), ``<p>calls:<run_id>`` (hash seq -> entry), the
    history entries of runs never stored while they ran in ``<p>history`` (hash run_id ->
    finished document and extras). Every write (or batch) is one round trip."""

    def __init__(self, url: str, prefix: str = "hermes:state:") -> None:
        import redis

        self.url = url
        self.r = redis.Redis.from_url(url, decode_responses=True)
        self.p = prefix
        self._prune: Any = None  # the registered prune script (redis.commands.core.Script)
        self.r.ping()
        if not self.r.exists(self.p + "active_index"):  # a store from before the index
            self._index_active()

    def _index_active(self) -> None:
        """``<p>active``: the ids of the runs not ended (kept by every write), so that a new
        leader reads those first (:meth:`active_runs`) and the ended ones after."""
        live = [d["run_id"] for d in self.runs() if d.get("status") not in TERMINAL]
        pipe = self.r.pipeline(transaction=True)
        if live:
            pipe.sadd(self.p + "active", *live)
        pipe.set(self.p + "active_index", "1")
        pipe.execute()

    def put_run(self, run_id: str, status: str, doc: dict[str, Any],
                units: dict[int, dict[str, Any]] | None = None) -> None:
        self.put_runs([(run_id, status, doc, units or {})])

    def put_runs(self, batch: list[RunWrite], history: Sequence[HistoryWrite] = ()) -> None:
        """One transaction. The documents of the whole batch go in one ``HSET``, its
        acceptance order in one ``ZADD NX`` and the active index in one ``SREM`` and one
        ``SADD`` (a run's last write in the batch decides). The unit documents of a run
        still going go in its own hash (one ``HSET`` each); those of a run's last write, when
        it ended, in one ``HSET`` of ``<p>end_units`` for the whole batch. The state after
        it is that of the writes one by one in batch order, in a few commands instead of 4N:
        encoding the commands was most of a batch's cost, and most runs that end (one-turn
        conversations at thousands a second) have their units written only then.
        History entries (``history``) go in one ``HSET`` of ``<p>history`` (their bytes as
        given), with their order; a document of the same run an earlier leader stored, and
        its units written at its end, are dropped in the same transaction."""
        docs: dict[str, bytes] = {}
        order: dict[str, float] = {}
        status_of: dict[str, str] = {}
        end_units: dict[str, dict[str, dict[str, Any]]] = {}
        pipe = self.r.pipeline(transaction=True)
        for run_id, status, doc, units in batch:
            docs[run_id] = encode_run_doc(doc)  # (a later write of the same run replaces it)
            status_of[run_id] = status
            order.setdefault(run_id, float(doc.get("submitted", 0.0)))
            if not units:
                continue
            if status in TERMINAL:  # (a run's last write: nothing follows it but its end's)
                end_units.setdefault(run_id, {}).update((str(i), u) for i, u in units.items())
            else:
                pipe.hset(f"{self.p}units:{run_id}",
                          mapping={str(i): encode_plain_doc(u) for i, u in units.items()})
        if history:
            hist: dict[str, bytes] = {}
            for run_id, submitted, doc, extra in history:
                hist[run_id] = _history_value(doc, extra)
                order.setdefault(run_id, submitted)
            gone = list(hist)
            pipe.hdel(self.p + "runs", *gone)
            pipe.hdel(self.p + "end_units", *gone)
            pipe.srem(self.p + "active", *gone)
            pipe.hset(self.p + "history", mapping=hist)  # type: ignore[arg-type]
        elif not docs:
            return
        if docs:
            pipe.hset(self.p + "runs", mapping=docs)  # type: ignore[arg-type]
        if end_units:
            pipe.hset(self.p + "end_units", mapping={  # type: ignore[arg-type]
                r: encode_plain_doc(u) for r, u in end_units.items()})
        ended = [r for r, st in status_of.items() if st in TERMINAL]
        live = [r for r, st in status_of.items() if st not in TERMINAL]
        if ended:
            pipe.srem(self.p + "active", *ended)
        if live:
            pipe.sadd(self.p + "active", *live)
        pipe.zadd(self.p + "order", order, nx=True)  # type: ignore[arg-type]
        pipe.execute()

    def put_call(self, run_id: str, seq: int, entry: dict[str, Any]) -> None:
        self.r.hset(f"{self.p}calls:{run_id}", str(seq), json.dumps(entry, default=str))

    def drop_calls(self, run_id: str) -> None:
        self.r.delete(f"{self.p}calls:{run_id}")

    def prune_ended(self, keep: int) -> int:
        """Drop the oldest ended runs past the newest ``keep``, found from the acceptance
        order and the active index alone (a run is ended iff it is not in ``<p>active``,
        which every write keeps): the oldest ids are read in chunks and those not active
        are dropped, without reading a document. Reading every document to find them cost
        O(stored runs) per prune, once ``keep`` was reached: at 2,500 calls/s of inferred
        runs, 60% of the active scheduler's CPU after 20 s (``run_scheduler_rate``).

        Done by Redis itself (:data:`_PRUNE_SCRIPT`, one ``EVALSHA`` per
        :data:`PRUNE_CHUNK` runs dropped): the same steps from here were four round trips
        a prune, ~11 us of the scheduler's CPU per ended run at a prune every 100 (5% of
        its CPU per one-turn inferred call at 4,000 calls/s), against ~1 us."""
        if self._prune is None:
            self._prune = self.r.register_script(_PRUNE_SCRIPT)
        keys = [self.p + "order", self.p + "active", self.p + "runs", self.p + "end_units",
                self.p + "history"]
        dropped = 0
        while True:
            n = int(self._prune(keys=keys, args=[max(0, keep), self.p + "units:", PRUNE_CHUNK]))
            dropped += n
            if n < PRUNE_CHUNK:
                return dropped

    def active_runs(self) -> list[dict[str, Any]]:
        """The runs not ended, in acceptance order (a new leader's first read)."""
        ids = list(self.r.smembers(self.p + "active"))
        if not ids:
            return []
        scores = self.r.zmscore(self.p + "order", ids)
        ids = [i for _, i in sorted(zip([s or 0.0 for s in scores], ids, strict=True))]
        return [d for d in self._docs(ids) if d.get("status") not in TERMINAL]

    def runs(self) -> list[dict[str, Any]]:
        return self._docs(self.r.zrange(self.p + "order", 0, -1))

    def ended_runs_chunks(self, chunk: int = 256) -> Iterator[list[dict[str, Any]]]:
        """The ended runs, ``chunk`` documents a read (a new leader restores them in the
        background: short reads leave Redis and the event loop to the resumed runs)."""
        active = self.r.smembers(self.p + "active")
        ids = [i for i in self.r.zrange(self.p + "order", 0, -1) if i not in active]
        for k in range(0, len(ids), chunk):
            yield [d for d in self._docs(ids[k:k + chunk]) if d.get("status") in TERMINAL]

    def _docs(self, ids: list[str]) -> list[dict[str, Any]]:
        if not ids:
            return []
        pipe = self.r.pipeline()
        pipe.hmget(self.p + "runs", ids)
        pipe.hmget(self.p + "end_units", ids)
        pipe.hmget(self.p + "history", ids)
        for run_id in ids:
            pipe.hgetall(f"{self.p}units:{run_id}")
        docs, at_end, history, *units = pipe.execute()
        out = []
        for run_id, d, e, h, u in zip(ids, docs, at_end, history, units, strict=True):
            if d is None:
                if h is not None and (got := _history_of(run_id, h)) is not None:
                    out.append(got)
                continue
            stored = {int(k): json.loads(v) for k, v in u.items()}
            if e is not None:  # written at the run's end: the newest of each index
                stored.update((int(k), v) for k, v in json.loads(e).items())
            out.append(_with_units(json.loads(d), stored))
        return out

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


def _with_units(doc: dict[str, Any], units: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """A stored run document with its unit documents as ``doc["units"]`` (see RunStore.runs);
    documents written before units were stored apart carry theirs inline."""
    if "units" not in doc:
        n = max(int(doc.get("n_units", 0)), max(units, default=-1) + 1)
        doc["units"] = [units.get(i, {"closed": False}) for i in range(n)]
    return doc

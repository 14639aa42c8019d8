"""Finished runs, kept compactly (issue 16).

The gateway keeps the last ``scheduler.keep_finished_runs`` (10,000) finished runs so that
``GET /v1/runs/{id}``, the run listings and idempotent retries still find them. Kept as
live object graphs (a ``LiveRun`` with its ``RunState``, unit invocations, pending requests,
futures, messages: dozens of objects each), 10,000 of them made every full garbage
collection walk hundreds of thousands of objects: a 0.36-0.55 s stop of the event loop
every ~2.5 s under load.

:class:`FinishedRuns` keeps each finished run as **one tuple of atomic values**: the fields
the listings filter on and the run's JSON document (what ``GET /v1/runs/{id}`` answers) as
``bytes``. The collector untracks such tuples at their first collection, so the history
costs a full collection nothing but the walk of one dict. Reads build a
:class:`FinishedRun`, a small read-only view with the surface of a finished ``LiveRun``
that the HTTP layers read (``run_id``, ``app``, ``status``, ``hosted``, ``state.tenant``,
``state.submitted``, ``act_s(now)``, ``to_json(now)``, the admin row's fields and
``idempotency``).

Interface: :meth:`FinishedRuns.add` (a document, once the run has ended), :meth:`get`,
:meth:`recent` (newest first, filtered), ``len``, ``in``; the oldest is dropped past ``keep``.
:meth:`FinishedRuns.encoded` gives a kept run's bytes (the durable store writes them as the
run's history entry) and :meth:`FinishedRuns.add_encoded` keeps a run from them again (a new
leader restoring that entry).

:class:`RecordLine` is the same idea for the learner's queue of run records waiting for the
knowledge-base writer: one object per record (its JSON line) instead of a pydantic model tree.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from hermes.gateway.state import encode_run_doc

#: entry: (status, app, tenant, submitted, hosted, document bytes, extra bytes or None)
_Entry = tuple[str, str, str, float, bool, bytes, "bytes | None"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class FinishedProgress(NamedTuple):
    """``state.progress`` of a finished run as the admin rows read it."""

    current: str | None
    finished: tuple[str, ...]  # the units that ended, in order (len: units done)


class FinishedRun:
    """A finished run read back from :class:`FinishedRuns`: read-only, built per read.

    ``state`` is the view itself (``run.state.tenant`` and ``run.tenant`` are the same), so
    code written for a ``LiveRun`` (``run.state.submitted``, ``run.status``, ...) reads it
    unchanged."""

    __slots__ = ("_doc", "_entry", "_extra", "run_id")

    def __init__(self, run_id: str, entry: _Entry) -> None:
        self.run_id = run_id
        self._entry = entry
        self._doc: dict[str, Any] | None = None
        self._extra: dict[str, Any] | None = None

    # ---------------------------------------------------------------- the indexed fields
    @property
    def status(self) -> str:
        return self._entry[0]

    @property
    def app(self) -> str:
        return self._entry[1]

    @property
    def tenant(self) -> str:
        return self._entry[2]

    @property
    def submitted(self) -> float:
        return self._entry[3]

    @property
    def hosted(self) -> bool:
        return self._entry[4]

    @property
    def state(self) -> FinishedRun:
        return self

    # ---------------------------------------------------------------- from the document
    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """The run's document as it was when it ended (a fresh dict per call)."""
        doc: dict[str, Any] = json.loads(self._entry[5])
        return doc

    @property
    def doc(self) -> dict[str, Any]:
        """The document, decoded once per view (do not modify it)."""
        if self._doc is None:
            self._doc = self.to_json()
        return self._doc

    def act_s(self, now: float | None = None) -> float:
        return float(self.doc.get("act_s") or 0.0)

    @property
    def finished(self) -> float | None:
        return self.doc.get("finished")

    @property
    def deadline(self) -> float | None:
        return self.doc.get("deadline")

    @property
    def k(self) -> float | None:
        return self.doc.get("k")

    @property
    def rank(self) -> float:
        r = self.doc.get("rank")
        return math.inf if r is None else float(r)

    @property
    def attained_s(self) -> float:
        return float(self.doc.get("attained_s") or 0.0)

    @property
    def attained_tokens(self) -> int:
        return int(self.doc.get("attained_tokens") or 0)

    @property
    def result(self) -> Any:
        return self.doc.get("result")

    @property
    def error(self) -> str | None:
        return self.doc.get("error")

    @property
    def pending(self) -> Mapping[str, Any]:
        return _EMPTY

    # ---------------------------------------------------------------- extras
    @property
    def extra(self) -> dict[str, Any]:
        extra = self._extra
        if extra is None:
            blob = self._entry[6]
            extra = self._extra = json.loads(blob) if blob is not None else {}
        return extra

    @property
    def progress(self) -> FinishedProgress:
        return FinishedProgress(self.doc.get("current_unit"),
                                tuple(self.extra.get("units_done", ())))

    @property
    def idempotency(self) -> dict[str, str] | None:
        return self.extra.get("idempotency")

    def __repr__(self) -> str:
        return f"FinishedRun({self.run_id!r}, {self.app!r}, {self.status!r})"


class FinishedRuns:
    """The newest ``keep`` finished runs, oldest dropped first (see the module docstring)."""

    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        # insertion (= end) order; values are tuples of atomic values: untracked by the GC
        self._runs: dict[str, _Entry] = {}

    def add(self, doc: Mapping[str, Any], *, units_done: list[str] | tuple[str, ...] = (),
            idempotency: Mapping[str, str] | None = None) -> None:
        """Keep an ended run: ``doc`` is its JSON document (``LiveRun.to_json``: ``run_id``,
        ``state``, ``app``, ``tenant``, ``submitted``, ``hosted``, ...); ``units_done``: the
        units it ended, in order (``state.progress.finished``); ``idempotency``: the
        ``{"key", "body"}`` of the request that created it. A run kept already is replaced
        (and becomes the newest)."""
        extra: dict[str, Any] = {}
        if units_done:
            extra["units_done"] = list(units_done)
        if idempotency:
            extra["idempotency"] = dict(idempotency)
        self._keep(doc, encode_run_doc(doc), encode_run_doc(extra) if extra else None)

    def add_run(self, run: Any, now: float) -> None:
        """:meth:`add` for a ``LiveRun`` that has just ended (its document at ``now``)."""
        self.add(run.to_json(now),
                 units_done=[o.unit if hasattr(o, "unit") else str(o)  # (no repr per unit)
                             for o in run.state.progress.finished],
                 idempotency=getattr(run, "idempotency", None))

    def encoded(self, run_id: str) -> tuple[bytes, bytes | None] | None:
        """The kept run's document and extras as stored here (JSON bytes each; extras None
        when it has none), or None: what :meth:`add_encoded` takes back. A run's history
        entry in the durable store (:meth:`hermes.gateway.run_store.RunStore.put_runs`,
        ``history``) is these bytes, so that a run ended here reads the same after a failover
        without its document being built and encoded a second time."""
        entry = self._runs.get(run_id)
        return None if entry is None else (entry[5], entry[6])

    def add_encoded(self, doc: bytes, extra: bytes | None = None, *,
                    parsed: Mapping[str, Any] | None = None) -> str:
        """Keep a run from :meth:`encoded`'s bytes (read back from the durable store);
        returns its id. ``parsed``: ``doc`` decoded already (the store's reader decodes it
        to list the run), else decoded here. ``ValueError`` names what a damaged entry
        lacks."""
        try:
            return self._keep(json.loads(doc) if parsed is None else parsed, bytes(doc),
                              None if extra is None else bytes(extra))
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"not a finished run's document: {e!r}") from None

    def _keep(self, doc: Mapping[str, Any], encoded: bytes, extra: bytes | None) -> str:
        """Keep the run whose document is ``doc`` (``encoded``: its bytes, ``extra``: its
        extras' bytes) as the newest, dropping the oldest past ``keep``; returns its id.
        The one place an entry is built (:meth:`add`, :meth:`add_encoded`)."""
        run_id = str(doc["run_id"])
        entry: _Entry = (str(doc["state"]), str(doc["app"]), str(doc.get("tenant") or "default"),
                         float(doc["submitted"]), bool(doc.get("hosted")), encoded, extra)
        runs = self._runs
        runs.pop(run_id, None)
        runs[run_id] = entry
        while len(runs) > self.keep:
            del runs[next(iter(runs))]
        return run_id

    def get(self, run_id: str) -> FinishedRun | None:
        entry = self._runs.get(run_id)
        return None if entry is None else FinishedRun(run_id, entry)

    def recent(self, match: Callable[[FinishedRun], bool] | None = None,
               limit: int = 100) -> list[FinishedRun]:
        """Up to ``limit`` runs for which ``match`` holds, the most recently ended first."""
        out: list[FinishedRun] = []
        if limit < 1:
            return out
        for run_id, entry in reversed(self._runs.items()):
            run = FinishedRun(run_id, entry)
            if match is None or match(run):
                out.append(run)
                if len(out) >= limit:
                    break
        return out

    def discard(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    def __iter__(self) -> Iterator[str]:
        """Run ids, oldest first."""
        return iter(self._runs)


class RecordLine:
    """A run record as its JSON line, for the knowledge base's record log.

    The learner queues each finished run's :class:`~hermes.core.records.RunRecord` for the
    knowledge-base writer (a worker thread, every ``learn_interval_s``). A queued pydantic
    record is about a dozen objects (the record, its units and requests, their dicts and
    field sets) for every collection to walk while it waits; at 1,000 runs a second that
    was most of what a full collection walked. The line is one object, already written to
    ``records.jsonl``, and it is what the stores write: they read only ``app`` and
    ``model_dump_json(exclude_none=True)`` of a record."""

    __slots__ = ("app", "line", "run_id")

    def __init__(self, app: str, run_id: str, line: str) -> None:
        self.app = app
        self.run_id = run_id
        self.line = line

    @classmethod
    def of(cls, record: Any) -> RecordLine:
        """The line of a ``RunRecord`` (``model_dump_json(exclude_none=True)``)."""
        return cls(record.app, record.run_id, record.model_dump_json(exclude_none=True))

    def model_dump_json(self, *, exclude_none: bool = True) -> str:
        """The record's JSON (always without its None fields, as the stores write it)."""
        return self.line

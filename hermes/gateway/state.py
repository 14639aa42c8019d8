"""What the live gateway keeps about runs, unit invocations, requests and nodes.

Plain records, no behaviour beyond reading themselves: :class:`LiveRun` (the core's
:class:`~hermes.core.state.RunState` plus what the live driver needs), :class:`UnitInvocation`
(one invocation of a unit inside a run), :class:`PendingRequest` (an LLM request or tool call
sent to a node) and :class:`Node` (a connected HermesLet). The services that change them are
the run registry (:mod:`hermes.gateway.runs`), dispatch (:mod:`hermes.gateway.dispatch`) and
the node table (:mod:`hermes.gateway.nodes`).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from hermes.core.policies.fair_share import policy_rank
from hermes.core.state import RequestView, RunState
from hermes.gateway.waiting import wake
from hermes.protocol import Done, EngineInfo, Submit, Token, Tool, ToolDone

RunStatus = Literal["queued", "running", "finished", "failed", "cancelled"]
#: the states of a run that still takes requests
ACTIVE: frozenset[str] = frozenset({"queued", "running"})
#: the states of a run that has ended
TERMINAL: tuple[str, ...] = ("finished", "failed", "cancelled")


def new_id(prefix: str) -> str:
    """A new id: ``prefix``, then 16 random hex digits (os.urandom, as uuid4 draws them,
    without building a UUID: ~1 us less each; runs, requests, tool calls, edge calls)."""
    return f"{prefix}{os.urandom(8).hex()}"


def new_run_id() -> str:
    """A new run's id: ``run-`` and 16 random hex digits (runs API, inferred runs, the
    registry)."""
    return new_id("run-")


@dataclass(eq=False)
class PendingRequest:
    """An LLM request or tool call the scheduler sent to a node and waits for."""

    request_id: str
    run: LiveRun
    inv: UnitInvocation
    kind: Literal["llm", "tool"]
    msg: Submit | Tool | None  # None once an LLM request is done (not re-sent)
    view: RequestView
    key: tuple[float, ...]
    future: asyncio.Future[Done | ToolDone]
    model: str | None = None
    node: str | None = None
    engine: str | None = None
    tokens: asyncio.Queue[Token | None] | None = None  # streamed chunks, None: the end
    sent_at: float = 0.0  # scheduler clock
    credited_s: float = 0.0  # service already credited from streamed tokens
    #: part of the answer went to the client (a streamed chunk): a resend would stream it
    #: again, so the request is no longer retried
    streamed: bool = False
    retries: int = 0
    #: times it was re-sent because the node it ran on died (an LLM request: once at most)
    fault_retries: int = 0
    result: Done | ToolDone | None = None
    error: str | None = None
    finished_at: float | None = None
    #: the future a handler task sleeps on while it waits for ``future`` (woken by
    #: :meth:`settle`; :mod:`hermes.gateway.waiting`)
    waiter: asyncio.Future[None] | None = None

    def settle(self, result: Done | ToolDone | None = None,
               exc: BaseException | None = None) -> None:
        """Set ``future`` to ``result`` (or ``exc``) unless it is done, and wake the task
        waiting for it; an exception is marked retrieved (nobody may be waiting)."""
        fut = self.future
        if not fut.done():
            if exc is not None:
                fut.set_exception(exc)
                fut.exception()
            else:
                fut.set_result(result)  # type: ignore[arg-type]
        wake(self)


@dataclass(eq=False)
class UnitInvocation:
    """One invocation of a unit inside a run: its requests or its tool call."""

    unit: str
    backend: str
    started: float
    explicit: bool
    upstream: str | None = None
    finished: float | None = None
    requests: list[PendingRequest] = field(default_factory=list)
    duration_s: float | None = None  # tool units
    closed: bool = False

    @property
    def in_flight(self) -> int:
        return sum(1 for r in self.requests if r.finished_at is None)

    def last_done(self) -> float | None:
        ends = [r.finished_at for r in self.requests if r.finished_at is not None]
        return max(ends) if ends else None

    def llm_results(self) -> list[Done]:
        return [r.result for r in self.requests if r.kind == "llm" and isinstance(r.result, Done)]

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "backend": self.backend,
            "started": self.started,
            "finished": self.finished,
            "duration_s": self.duration_s,
            "requests": [
                {
                    "request_id": r.request_id,
                    "kind": r.kind,
                    "node": r.node,
                    "engine": r.engine,
                    "state": "done" if r.result is not None else ("failed" if r.error else "pending"),
                    "input_tokens": getattr(r.result, "input_tokens", None),
                    "output_tokens": getattr(r.result, "output_tokens", None),
                    "queue_s": getattr(r.result, "queue_s", None),
                    "ttft_s": getattr(r.result, "ttft_s", None),  # first token, from release
                    "service_s": getattr(r.result, "service_s", None)
                    if isinstance(r.result, Done)
                    else getattr(r.result, "duration_s", None),
                    "sent": r.sent_at,
                    "finished": r.finished_at,
                    # its queue key at the node, as last sent: the run's rank first
                    "key": [finite(k) for k in r.key],
                }
                for r in self.requests
            ],
        }


@dataclass(eq=False)
class LiveRun:
    """A run as the gateway tracks it: the core's RunState plus what the driver needs."""

    state: RunState
    status: RunStatus = "queued"
    units: list[UnitInvocation] = field(default_factory=list)
    open: list[UnitInvocation] = field(default_factory=list)
    pending: dict[str, PendingRequest] = field(default_factory=dict)
    hosted: bool = False
    auto_finish: bool = False  # one-request runs (no headers): finish when the request does
    #: found by the run resolver in plain traffic (no ``X-Hermes-Run``): it closes it
    inferred: bool = False
    input: Any = None
    result: Any = None
    error: str | None = None
    task: asyncio.Task[None] | None = None  # a hosted run's code
    last_activity: float = field(default_factory=time.monotonic)
    #: its record is in records.jsonl (written by this gateway, or by the one before a restart
    #: that was killed between the record and the durable end): it is not written again
    recorded: bool = False
    #: ``{"key", "body"}`` of the ``Idempotency-Key`` request that created it, if one did
    idempotency: dict[str, str] | None = None
    #: how many gateway restarts this run was recovered from
    recovered: int = 0
    #: not written to the durable run store: a one-request call of an edge (split roles),
    #: whose run id no client ever sees and which has nothing to resume
    transient: bool = False
    #: not written to the durable run store at its start (an inferred run whose resolver's
    #: index is not shared: an edge's, whose next call re-creates it under its id after a
    #: failover, or an all-in-one gateway's own, which a crash loses; written with its
    #: progress and at its end like any inferred run, as a history entry when it was never
    #: written before: :mod:`hermes.gateway.durable`)
    lazy_store: bool = False

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def app(self) -> str:
        return self.state.app

    def act_s(self, now: float) -> float:
        end = self.state.finished if self.state.finished is not None else now
        return end - self.state.submitted

    def to_json(self, now: float) -> dict[str, Any]:
        s = self.state
        return {
            "run_id": s.run_id,
            "app": s.app,
            "tenant": s.tenant,
            "state": self.status,
            "hosted": self.hosted,
            "inferred": self.inferred,
            "submitted": s.submitted,
            "finished": s.finished,
            "deadline": s.deadline,
            "k": s.k,  # the run's own prewarming knob (None: the tenant's, app's or default)
            "act_s": self.act_s(now),
            "rank": finite(policy_rank(s)),
            "attained_s": s.attained_s,
            "attained_tokens": s.attained_tokens,
            "current_unit": s.progress.current,
            "pending_requests": len(self.pending),
            "units": [u.to_json() for u in self.units],
            "input": self.input,
            "result": self.result,
            "error": self.error,
        }


def finite(x: float) -> float | None:
    """``x`` as a float, or None when it is not finite (JSON has no infinity)."""
    return float(x) if math.isfinite(x) else None  # (numpy's isfinite: ~1 us a scalar)


_DOC_ENCODER = msgspec.json.Encoder()
_DOC_DECODER = msgspec.json.Decoder()


def encode_doc(doc: Any) -> bytes:
    """A run's (or unit's) JSON document as stored and served, with the values that
    ``json.dumps(doc, default=str)`` writes (compact, UTF-8).

    msgspec writes it several times faster, but differs where the document is not plain
    JSON: a non-finite float becomes ``null`` (json: ``Infinity``/``NaN``), and a set, tuple,
    dataclass, ``bytes``, date or enum its own way (json: an array, or ``str(obj)``). Its
    output is used only when it reads back equal to ``doc`` (a decode and one comparison, in
    C: still about half of json's time for a run's document), which holds exactly for plain
    JSON values (``null`` != NaN, a list != a tuple or set, a dict != a dataclass, a string
    != bytes or a date); anything else is written by :mod:`json` as before."""
    try:
        out = _DOC_ENCODER.encode(doc)
        if _DOC_DECODER.decode(out) == doc:
            return out
    except Exception:  # noqa: BLE001  (a type or value msgspec refuses: json's turn)
        pass
    return _json_doc(doc)


def _json_doc(doc: Any) -> bytes:
    """``doc`` as :mod:`json` writes it (compact, ``default=str``): the encoders' fallback."""
    return json.dumps(doc, separators=(",", ":"), default=str).encode()


def encode_plain_doc(doc: Any) -> bytes:
    """:func:`encode_doc` for a document its writer builds of plain JSON values only
    (strings, ints, floats, bools, None, lists, and dicts with string keys): a unit
    invocation's (``durable._inv_doc``: the scheduler's own fields and its requests'
    results, never a client's object). msgspec's output without the read-back check, which
    was two thirds of :func:`encode_doc`'s time for such a document (2.8 -> 0.75 us): for
    these values the two spell the same JSON, except a non-finite float, which msgspec writes
    ``null`` (json ``Infinity``, which no JSON parser but Python's reads). A value msgspec
    refuses (a lone surrogate in a string) is written by :mod:`json`."""
    try:
        return _DOC_ENCODER.encode(doc)
    except Exception:  # noqa: BLE001  (json's turn, as in encode_doc)
        return _json_doc(doc)


#: the keys of a run's document (``LiveRun.to_json``, ``durable.run_doc``) whose values are a
#: client's (a hosted run's input and result, what a failure said, an idempotent request's
#: key and body); every other value the scheduler builds of plain JSON values itself
CLIENT_KEYS = ("input", "result", "error", "idempotency")


def encode_run_doc(doc: Mapping[str, Any]) -> bytes:
    """:func:`encode_doc` for a run's document: the read-back check only on the values under
    :data:`CLIENT_KEYS`, the rest written as :func:`encode_plain_doc` writes it.

    Every ended run is encoded two or three times (its finished document, its durable
    writes), and for most (an agent's header-less conversations, one-request runs) no client
    value is there at all: the read-back of the whole document was ~70% of each encoding
    (4.3 -> 1.35 us for a one-unit run's served document). Where a client's value is not
    plain JSON (a NaN, a date, a set: what only a hosted run's input or result can hold), the
    whole document is :func:`encode_doc`'s, as before. The scheduler's own values are plain
    (ranks and keys pass :func:`finite`); were one of its floats not finite, it would be
    written ``null``, as in a unit's document, where json wrote ``Infinity``."""
    for k in CLIENT_KEYS:
        v = doc.get(k)
        if v is not None and not _plain_json(v):
            return encode_doc(doc)
    return encode_plain_doc(doc)


def _plain_json(v: Any) -> bool:
    """Whether msgspec writes ``v`` as json wrote it (strings, bools and ints at once; a
    float when finite; anything else by its read-back)."""
    t = type(v)
    if t is str or t is bool or t is int:
        return True  # (what msgspec refuses, a lone surrogate or a huge int, is json's anyway)
    if t is float:
        return math.isfinite(v)
    try:
        return bool(_DOC_DECODER.decode(_DOC_ENCODER.encode(v)) == v)
    except Exception:  # noqa: BLE001  (a type or value msgspec refuses)
        return False


@dataclass(eq=False)
class Node:
    """A connected HermesLet."""

    name: str
    identity: bytes
    engines: dict[str, EngineInfo]
    tools: list[str]
    last_seen: float  # wall monotonic
    outstanding: dict[str, int] = field(default_factory=dict)  # engine -> our requests there
    tools_outstanding: int = 0
    queued: dict[str, int] = field(default_factory=dict)  # engine -> node-reported queue
    kv_usage: dict[str, float | None] = field(default_factory=dict)  # engine -> KV use (0..1)
    #: the node applies placement plans (its hello said so; :mod:`hermes.gateway.placer`)
    accepts_placement: bool = False
    #: the GPUs such a node has for plans, and their type (None: ``[placement]`` gpus/device)
    gpus: int | None = None
    device: str | None = None

"""The edge <-> scheduler messages (``hermes serve --role edge|scheduler``).

One msgpack frame a message (msgspec: typed decoding at C speed; the scheduler's CPU per
request bounds a whole cluster, so this wire is kept compact). An edge sends one
:class:`Call` per LLM call and a :class:`Ping` every few hundred milliseconds; the scheduler
answers a ping with a :class:`Pong` and a call only when it fails (:class:`CallFailed`): the
call's tokens and answer come from the node, straight to the edge (``reply_to``). An edge's
run resolver tells the scheduler the inferred runs it closed (:class:`Closed`, one message
per sweep) and, on a clean stop, hands over the ones it holds open (:class:`Handover`). Every
scheduler message carries the lease epoch; an edge that has seen a higher one drops it
(:class:`hermes.core.lease.EpochGate`). The operator's app names (``hermes apps
rename|merge``) reach the edges in the pongs: a ping carries the digest of the mapping the edge
follows, and the pong carries the scheduler's mapping (:class:`Names`) only when the digests
differ (:mod:`hermes.gateway.edge.infer`, "App names"); the models the connected engines
serve reach them the same way (:class:`Models`: an edge answers Anthropic's ``count_tokens``
itself from them). A new leader is told the apps an edge's resolver knows (:class:`Apps`,
once per leader), so that it lists them before their next new run. Fields are added with
defaults (and omitted when at their default), so that a message of the previous layout still
decodes (a scheduler of the previous layout drops an :class:`Apps` as a bad message).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from hermes.gateway.prefixes import shared_prefix
from hermes.protocol import EncodedBody, max_output_tokens


def encode_body(body: dict[str, Any]) -> EncodedBody:
    """An engine body as an edge sends it (:attr:`Call.body_json`, :attr:`Call.prefix`,
    :attr:`Call.max_tokens`): its JSON text, encoded once here and forwarded by the scheduler
    as it is, and the two things the scheduler reads of it."""
    return EncodedBody(msgspec.json.encode(body), shared_prefix(body), max_output_tokens(body))


class Settled(msgspec.Struct, array_like=True):
    """A header-less call answered by its node (the edge tells the scheduler, which frees the
    engine slot and counts it in its metrics)."""

    rid: str
    node: str
    engine: str
    queue_s: float
    service_s: float


class Call(msgspec.Struct, tag="call", omit_defaults=True):
    """One LLM call of a client of the edge: what the scheduler needs to rank, route and
    dispatch it. ``rid`` is the request id (the edge's; nodes answer under it);
    ``reply_to`` the edge's address for the node; ``run`` the run header
    (``X-Hermes-Run``: a run id, ``none``), ``None`` for a one-request run; ``body`` the
    engine body (without ``model`` and ``stream``), sent once and forwarded to the node.
    ``inferred``: ``run``, ``app`` and ``unit`` are what the edge's run resolver found for a
    header-less call (:mod:`hermes.gateway.edge.infer`): the scheduler joins that inferred
    run, creating it on its first call (``new``); a run the scheduler has ended meanwhile is
    refused (:class:`CallFailed` with code :data:`RUN_ENDED`: the edge resolves the call
    again, so that its answer names the run it was counted in). ``k`` and ``deadline_s``:
    ``X-Hermes-K`` and ``X-Hermes-Deadline-S`` for the run the call creates (checked at the
    edge); ``authed``: ``tenant`` is the API key's (authentication on), so the scheduler
    hides other tenants' runs from it, as the all-in-one gateway does (404). ``endpoint``
    ``embeddings`` goes to an engine that embeds (``task = "embed"``); ``native``: the request
    in the client's API (Anthropic's Messages) for an engine that serves it itself
    (:attr:`hermes.protocol.Submit.native`), beside its chat form in ``body``."""

    rid: str
    reply_to: str
    model: str
    endpoint: Literal["chat", "completions", "embeddings"]
    #: the engine body as an object (empty when ``body_json`` carries it)
    body: dict[str, Any]
    prompt_tokens: int
    #: the engine body as JSON text (an edge encodes it once; the scheduler forwards these
    #: bytes to the node without decoding them), with what the scheduler reads of it:
    #: ``prefix`` (the unit's shared prompt prefix, for KV prewarming) and ``max_tokens``
    body_json: bytes | None = None
    prefix: str | None = None
    max_tokens: int | None = None
    tenant: str = "default"
    app: str | None = None
    unit: str | None = None
    run: str | None = None
    stream: bool = False
    inferred: bool = False
    new: bool = False
    k: float | None = None
    deadline_s: float | None = None
    authed: bool = False
    #: the app id of ``app`` (:func:`~hermes.gateway.resolve.apps.app_fingerprint`, after
    #: the operator's merges), on a new inferred run's first call only: the scheduler lists
    #: the app and lets the operator rename or merge it (``hermes apps``)
    app_id: str | None = None
    #: Anthropic's request as the client sent it, for an engine that serves ``/v1/messages``
    #: itself (left off the wire when empty)
    native: dict[str, Any] | None = None
    #: calls of this edge answered since its last message (piggybacked: no message of their
    #: own under load)
    settled: list[Settled] = []

    @property
    def direct(self) -> bool:
        """Without run or app headers: the scheduler's fast path
        (:mod:`hermes.gateway.edge.direct`), which the edge reports settled."""
        return self.run is None and self.app is None

    @property
    def task(self) -> Literal["generate", "embed"]:
        """The engine task the call needs (an embeddings call goes to an embedding model)."""
        return "embed" if self.endpoint == "embeddings" else "generate"

    def engine_body(self) -> dict[str, Any] | EncodedBody:
        """The body for :meth:`hermes.gateway.dispatch.Dispatcher.submit_llm`: left encoded
        when the edge sent it so (:class:`~hermes.protocol.EncodedBody`)."""
        if self.body_json is None:
            return self.body
        return EncodedBody(self.body_json, self.prefix, self.max_tokens)


class Report(msgspec.Struct, tag="report"):
    """Calls answered, when no call came to carry them within a few milliseconds."""

    settled: list[Settled]


class ClosedRun(msgspec.Struct, array_like=True):
    """An inferred run an edge's resolver closed, idle for ``idle_s`` (edge seconds)."""

    run: str
    idle_s: float


class Closed(msgspec.Struct, tag="closed"):
    """The inferred runs one sweep of an edge's resolver closed (one message per sweep): the
    scheduler finishes each, unless it saw activity of the run since (another edge's call)."""

    runs: list[ClosedRun]


class HeldRun(msgspec.Struct, array_like=True):
    """An inferred run a stopping edge's resolver held open: idle for ``idle_s`` and due to
    close after ``close_after_s`` of idleness (its app's figure), edge seconds."""

    run: str
    idle_s: float
    close_after_s: float


class Handover(msgspec.Struct, tag="handover"):
    """A stopping edge's open inferred runs (one message, on a clean stop): the scheduler
    closes each once idle past its figure, unless a call of it comes first (then the edge
    that sent that call holds it: its resolver adopted it from the shared index)."""

    runs: list[HeldRun]


class Cancel(msgspec.Struct, tag="cancel"):
    """The client of a call went away: cancel it at its node."""

    rid: str


class Ping(msgspec.Struct, tag="ping", omit_defaults=True):
    """An edge says it is there (and learns the scheduler's epoch from the pong).
    ``names``: the :attr:`Names.digest` of the app names the edge follows ("" for none
    yet); ``models``: the :attr:`Models.digest` of the served-model set it holds ("" for
    none yet)."""

    edge: str
    names: str = ""
    models: str = ""


class Names(msgspec.Struct, array_like=True):
    """The operator's renames and merges of inferred apps
    (:class:`~hermes.gateway.resolve.apps.AppNames`, app id -> name, app id -> app id), and
    their digest."""

    digest: str
    renames: dict[str, str]
    merges: dict[str, str]


class Models(msgspec.Struct, array_like=True):
    """The models the scheduler's connected engines serve, by task (``generate``,
    ``embed``; each in the scheduler's order: the first is the default where no
    ``default_model`` is set), with the scheduler's routing settings
    (``[scheduler] default_model``, ``route_unknown_models``), and their digest: what
    :func:`hermes.gateway.served.resolve_served` needs to answer as the scheduler would."""

    digest: str
    served: dict[str, list[str]]
    default_model: str
    route_unknown: bool
    #: nodes connected (with none, a request waits a while for one, as at the scheduler)
    nodes: int

    def models(self, task: str | None) -> list[str]:
        """The models served for ``task`` (``None``: for any task)."""
        if task is not None:
            return self.served.get(task, [])
        return list(dict.fromkeys(m for ms in self.served.values() for m in ms))


class Pong(msgspec.Struct, tag="pong", omit_defaults=True):
    """The active scheduler's answer to a ping: its epoch, and its app names and served
    models, each only when the ping's digest is not theirs (else omitted)."""

    epoch: int | None
    names: Names | None = None
    models: Models | None = None


class AppSeen(msgspec.Struct, array_like=True):
    """An app an edge's resolver inferred (:class:`~hermes.gateway.resolve.AppInfo`, its
    name before the operator's renames; ``age_s``: model seconds since the edge first saw it
    (clocks differ between processes, ages do not); ``runs``: the runs this edge started of
    it)."""

    app_id: str
    name: str
    tenant: str
    model: str
    tools: list[str]
    instructions: str
    age_s: float
    runs: int


class Apps(msgspec.Struct, tag="apps"):
    """The apps an edge's resolver knows, sent once to each new leader (at its first pong):
    the leader lists them (``hermes apps``) and finds them to rename or merge at once,
    rather than from each app's next new run."""

    apps: list[AppSeen]


class CallFailed(msgspec.Struct, tag="failed"):
    """A call the scheduler could not serve: the HTTP status and error the client gets."""

    rid: str
    epoch: int | None
    status: int
    code: str | None
    message: str
    param: str | None = None


#: :attr:`CallFailed.code` of an inferred call whose run the scheduler has already ended
RUN_ENDED = "inferred_run_ended"

EdgeMessage = Call | Cancel | Ping | Report | Closed | Handover | Apps
SchedulerMessage = Pong | CallFailed

_ENCODER = msgspec.msgpack.Encoder()
_EDGE = msgspec.msgpack.Decoder(EdgeMessage)
_SCHED = msgspec.msgpack.Decoder(SchedulerMessage)


def encode(msg: EdgeMessage | SchedulerMessage) -> bytes:
    return _ENCODER.encode(msg)


def decode_edge(frame: bytes) -> EdgeMessage:
    """An edge's message (:class:`msgspec.ValidationError` / ``DecodeError`` if bad)."""
    msg: EdgeMessage = _EDGE.decode(frame)
    return msg


def decode_scheduler(frame: bytes) -> SchedulerMessage:
    msg: SchedulerMessage = _SCHED.decode(frame)
    return msg

"""The scheduler <-> HermesLet wire protocol (ZeroMQ ROUTER/DEALER, one JSON frame a message).

Transport: the scheduler binds a ROUTER (default ``tcp://127.0.0.1:5557``; in-process
``inproc://hermes-nodes`` with a shared ``zmq.asyncio.Context``); each HermesLet connects a
DEALER whose identity is its node name. Every message is one frame holding a JSON object with a
``type`` field; :func:`encode` and :func:`decode` are the only ways in and out, and
:func:`decode` rejects anything that is not one of the models below (:class:`ProtocolError`).

Keys (``key``, ``rekey.keys``) are computed only by the scheduler (``policy.request_key``)
and compared as tuples on the node: lower is served first.

Compatibility: fields may be added (with defaults) but never removed or retyped; unknown
fields from a newer peer are ignored, unknown ``type`` values are rejected. Fields beyond the
original design note are marked "(additive)".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

PROTOCOL_VERSION = 1
#: (additive) the prefix of the request ids an edge mints (split roles): such a request is
#: answered to its edge (``submit.reply_to``), which cancels it if its client goes away; a
#: newly elected scheduler that finds one held by a node leaves it running
EDGE_REQUEST_PREFIX = "edge-"
DEFAULT_SCHEDULER_ADDRESS = "tcp://127.0.0.1:5557"
INPROC_ADDRESS = "inproc://hermes-nodes"

Key = list[float]
EngineKind = Literal["sim", "openai", "vllm"]


class ProtocolError(ValueError):
    """A frame that is not a valid protocol message."""


class _Msg(BaseModel):
    # ranks may be infinite: JSON gets Infinity/NaN (stdlib json reads them back)
    model_config = ConfigDict(extra="ignore", ser_json_inf_nan="constants")


# ----------------------------------------------------------------------------------------------
# HermesLet -> scheduler
# ----------------------------------------------------------------------------------------------


class KVBlockSpec(_Msg):
    """(additive) How an engine names its prefix-cache blocks, so that the gateway can hash a
    prompt's blocks as the engine does (:class:`hermes.core.kv_blocks.BlockHashing`) and look
    them up in the engine's block index (``kv_summary``). ``tokenizer``: ``"builtin"`` when
    the engine tokenizes as :func:`hermes.core.kv_blocks.builtin_chat_token_ids` (the built-in
    engine), so the gateway can find a text prompt's token ids; ``None``: only a prompt given
    as token ids can be looked up."""

    block_size: int = Field(ge=1)
    hash_algo: str = "sha256"
    seed: str = "vllm-none-hash"
    tokenizer: Literal["builtin"] | None = None


class EngineInfo(_Msg):
    """One engine a node serves: requests for ``model`` (or one of ``loras``) go to it."""

    name: str
    model: str
    kind: EngineKind
    loras: list[str] = Field(default_factory=list)
    max_inflight: int = Field(ge=1)
    #: (additive) ``generate`` (chat/completions) or ``embed`` (embeddings)
    task: Literal["generate", "embed"] = "generate"
    #: (additive) the engine publishes KV events: its blocks are named so (``kv_summary``)
    kv_blocks: KVBlockSpec | None = None


class Hello(_Msg):
    """First message of a node (and again after a reconnect): what it can serve."""

    type: Literal["hello"] = "hello"
    node: str
    engines: list[EngineInfo]
    tools: list[str] = Field(default_factory=list)  # backend kinds, e.g. ["subprocess", "docker"]
    version: int = PROTOCOL_VERSION
    #: (additive) request ids the node holds: "queued" or "inflight" (after a reconnect)
    holding: dict[str, str] | None = None
    #: (additive) the node applies placement plans the scheduler sends (``place``)
    placement: bool = False
    #: (additive) the GPUs such a node places engines on, and their type (a name of
    #: ``hermes.core.cluster.devices``); None: the gateway's ``[placement] gpus`` / ``device``
    gpus: int | None = Field(default=None, ge=1)
    device: str | None = None


class EngineLoad(_Msg):
    queued: int = Field(ge=0)
    inflight: int = Field(ge=0)
    kv_usage: float | None = None  # 0..1 when the engine reports it


class Heartbeat(_Msg):
    """Sent every second: queue and engine state. ``time`` is the node's wall clock."""

    type: Literal["heartbeat"] = "heartbeat"
    node: str
    engines: dict[str, EngineLoad]
    time: float
    tools_queued: int = 0  # (additive)
    tools_running: int = 0  # (additive)
    holding: dict[str, str] | None = None  # (additive) request id -> "queued" | "inflight"


class Token(_Msg):
    """A streamed chunk of a request's output (only when ``submit.stream``).

    ``chunk`` (additive) is the engine's chunk object as the client should see it (every
    field of every choice: tool-call deltas, logprobs, ...); the gateway rewrites only its id,
    model and usage. ``None``: an engine that produced text alone (the gateway builds the
    chunk from ``text``). ``text`` is the first choice's text in it."""

    type: Literal["token"] = "token"
    request_id: str
    text: str
    n_tokens: int = Field(ge=0)
    chunk: dict[str, Any] | None = None


class Done(_Msg):
    """A request finished. ``queue_s``: time in the node's queue; ``service_s``: at the engine."""

    type: Literal["done"] = "done"
    request_id: str
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    text: str
    finish_reason: str | None = None
    engine: str
    queue_s: float = Field(ge=0)
    service_s: float = Field(ge=0)
    ttft_s: float | None = None  # (additive) first token, from release to the engine
    response: dict[str, Any] | None = None  # (additive) the engine's full JSON (non-streamed)


class Failed(_Msg):
    """A request or tool call failed. ``retryable``: the scheduler may resubmit it elsewhere."""

    type: Literal["failed"] = "failed"
    request_id: str
    error: str
    retryable: bool = False
    status: int | None = None  # (additive) HTTP status from the engine when there was one


class ToolDone(_Msg):
    type: Literal["tool_done"] = "tool_done"
    request_id: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float = Field(ge=0)
    cold: bool
    timed_out: bool
    queue_s: float = 0.0  # (additive)


class UnitEvent(_Msg):
    type: Literal["unit_event"] = "unit_event"
    run_id: str
    unit: str
    event: Literal["start", "finish"]
    time: float


class PrewarmAck(_Msg):
    """(additive) The node's answer to a ``prewarm`` signal."""

    type: Literal["prewarm_ack"] = "prewarm_ack"
    backend: str
    action: Literal["start", "release"]
    ok: bool
    detail: str = ""


class KVSummary(_Msg):
    """(additive) What changed in one engine's prefix-cache block index (the node follows the
    engine's KV events, :mod:`hermeslet.kv_events`): per medium (``GPU``, ``CPU``), the block
    hashes (vLLM's 64-bit event form) stored and removed since the node's previous summary for
    the engine, net. Sent with the heartbeat when something changed, never one per block.
    ``full``: the whole index (after ``hello``: the gateway replaces its copy). ``seq`` counts
    an engine's summaries from the ``full`` one (0): a gateway that sees one missing asks for
    ``resync`` (a new ``hello`` and a ``full`` summary). ``blocks``: the node's index size per
    medium after this summary (a check on the gateway's copy)."""

    type: Literal["kv_summary"] = "kv_summary"
    node: str
    engine: str
    seq: int = Field(ge=0)
    full: bool = False
    stored: dict[str, list[int]] = Field(default_factory=dict)
    removed: dict[str, list[int]] = Field(default_factory=dict)
    blocks: dict[str, int] = Field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# scheduler -> HermesLet
# ----------------------------------------------------------------------------------------------


class _FromScheduler(_Msg):
    """(additive) ``epoch``: the scheduler lease's epoch of the sender when schedulers are
    elected (``[ha] election``; None: a lone scheduler). A node that has seen a higher epoch
    rejects the message: a deposed scheduler that wakes up cannot act (fencing)."""

    epoch: int | None = None


class Submit(_FromScheduler):
    """An LLM request to queue. ``engine`` None: the node picks the engine serving ``model``.

    ``body`` is the OpenAI request body without ``model`` and ``stream`` (they are set by the
    node). ``priority`` (additive) overrides the vLLM ``priority`` the node derives from ``key``.
    """

    type: Literal["submit"] = "submit"
    request_id: str
    run_id: str
    unit: str
    engine: str | None = None
    model: str
    endpoint: Literal["chat", "completions", "embeddings"]  # (additive) embeddings
    body: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    key: Key
    priority: int | None = None
    #: (additive) the gateway's estimate of the prompt's tokens: what the node's KV gate
    #: counts (None: the node estimates it from ``body``)
    prompt_tokens: int | None = Field(default=None, ge=0)
    #: (additive) the request in the API the client spoke when ``body`` is its translation:
    #: ``{"endpoint": "messages", "body": {...}}`` (Anthropic's, without ``model``/``stream``).
    #: An engine that serves that endpoint itself gets it instead of ``body``; its chunks and
    #: answer are then that API's (Anthropic's events and ``message``)
    native: dict[str, Any] | None = None
    #: (additive) the W3C trace context of the request's span (tracing on): the node sends it
    #: as the ``traceparent`` header of its request to an OpenAI-compatible engine
    traceparent: str | None = None
    #: (additive) split roles (``hermes serve --role edge``): the ZeroMQ address of the edge
    #: that holds the client's connection. The node sends the request's ``token`` messages
    #: and its full ``done`` there, and the scheduler only a ``done`` without text or
    #: response (the counts the ranking and learning need): per-token and per-byte work
    #: stays off the scheduler. ``None``: everything to the scheduler, as before
    reply_to: str | None = None
    #: (additive) with ``reply_to``: the node tells the scheduler nothing of this request's
    #: success (the edge reports it, batched with its next call); a failure still goes to
    #: the scheduler, which retries or tells the edge
    reply_only: bool = False
    # ``body`` as the JSON text an edge encoded it in (:meth:`with_json_body`) is kept in
    # the instance's ``__dict__`` under ``_body_json``, not as a field nor a pydantic private
    # attribute (which would cost every submit its initialisation): ``body`` is empty until
    # :meth:`engine_body` decodes it, and :func:`encode` writes these bytes as the frame's
    # ``body`` as they are. The active scheduler of split roles never decodes nor re-encodes a
    # call's body (a 12 KB agent conversation was ~30 us of its CPU per call, growing with
    # the conversation): per-byte work stays off it. Serialisers and copies see the fields
    # only; ``model_copy`` keeps it.

    @classmethod
    def with_json_body(cls, body_json: bytes, **fields: Any) -> Submit:
        """A submit whose ``body`` is ``body_json``, JSON text (an object), left encoded."""
        msg = cls(**fields)
        msg.__dict__["_body_json"] = body_json
        return msg

    @property
    def encoded_body(self) -> bytes | None:
        """The body's JSON text while it is left encoded (:meth:`with_json_body`), else None."""
        raw: bytes | None = self.__dict__.get("_body_json")
        return raw

    def engine_body(self) -> dict[str, Any]:
        """``body``; one left encoded (:meth:`with_json_body`) is decoded the first time, for
        what reads it here (a router that reads prompts, tracing, an in-process node)."""
        raw = self.__dict__.pop("_body_json", None)
        if raw is not None:
            self.body = msgspec.json.decode(raw)
        return self.body

    def prompt_estimate(self) -> int:
        """The prompt's tokens as the gateway estimated them, else estimated from ``body``."""
        if self.prompt_tokens is not None:
            return self.prompt_tokens
        return estimate_tokens(self.endpoint, self.engine_body())


@dataclass(frozen=True, slots=True)
class EncodedBody:
    """A request body the scheduler forwards without decoding it (an edge's call): its JSON
    text (an object, as the engine gets it) and what the scheduler reads of it, taken by the
    edge: the unit's shared prompt prefix (:func:`hermes.gateway.prefixes.shared_prefix`) and
    ``max_tokens`` (or ``max_completion_tokens``)."""

    json: bytes
    prefix: str | None = None
    max_tokens: int | None = None


def max_output_tokens(body: dict[str, Any]) -> int | None:
    """The output limit a request body sets (``max_tokens``, else ``max_completion_tokens``),
    ``None`` for none: what the policy's request view and tracing read of it."""
    mt = body.get("max_tokens") or body.get("max_completion_tokens")
    return mt if type(mt) is int else None


def estimate_tokens(endpoint: str, body: dict[str, Any]) -> int:
    """A cheap prompt-length estimate (4 characters a token) for ordering and the node's KV
    gate; the engine reports the exact count."""
    if endpoint == "chat":
        text = " ".join(str(m.get("content", "")) for m in body.get("messages", [])
                        if isinstance(m, dict))
    else:
        p = body.get("prompt", "")
        text = p if isinstance(p, str) else " ".join(map(str, p))
    return max(1, len(text) // 4)


class Place(_FromScheduler):
    """(additive) A placement plan (``hermes-placement-plan/1``) for the node to serve: it
    re-places the models the plan names as on ``SIGHUP`` (its engines of other models stay).
    Sent only to nodes whose ``hello`` says ``placement``."""

    type: Literal["place"] = "place"
    plan: dict[str, Any]


class Rekey(_FromScheduler):
    """Rank changes: new keys for queued requests (unknown or already released ids are ignored)."""

    type: Literal["rekey"] = "rekey"
    keys: dict[str, Key]


class Cancel(_FromScheduler):
    """Drop queued requests/tool calls and abort in-flight ones at the engine."""

    type: Literal["cancel"] = "cancel"
    request_ids: list[str]


class Tool(_FromScheduler):
    """A tool call. ``code``: Python source; ``command``: an argv. Exactly one of the two."""

    type: Literal["tool"] = "tool"
    request_id: str
    run_id: str
    unit: str
    backend: str
    code: str | None = None
    command: list[str] | None = None
    timeout_s: float = Field(default=30.0, gt=0)
    key: Key

    def model_post_init(self, __context: Any) -> None:
        if (self.code is None) == (self.command is None):
            raise ValueError("tool needs exactly one of 'code' and 'command'")
        if self.command is not None and not self.command:
            raise ValueError("tool 'command' must not be empty")


class Prewarm(_FromScheduler):
    """Warm (``start``) or give up (``release``) a backend ahead of a run's next unit.

    ``backend`` is the resource: ``docker:IMAGE``, ``lora:BASE@ADAPTER``,
    ``kv:MODEL/TENANT/APP/UNIT`` or ``dnn:NAME``. ``params`` (all optional): ``run_id``,
    ``unit`` (the next unit) and ``pid`` (the planner's prewarm id, which a ``release`` repeats);
    for ``kv``, ``prefix`` (the shared prompt to prefill), ``model`` (an adapter to prefill it
    with) and ``key`` (the queue key the unit's own request would get: the node queues the
    prewarm with it); for ``lora``, ``path``. The node answers each with ``prewarm_ack``."""

    type: Literal["prewarm"] = "prewarm"
    backend: str
    action: Literal["start", "release"]
    params: dict[str, Any] = Field(default_factory=dict)


class Resync(_FromScheduler):
    """(additive) Ask a node to send ``hello`` again (e.g. after a scheduler restart)."""

    type: Literal["resync"] = "resync"


class Leader(_FromScheduler):
    """(additive) The scheduler holding the lease (``epoch``) answers a node's ``hello`` with
    it: a node with several scheduler addresses follows the one with the highest epoch."""

    type: Literal["leader"] = "leader"


NodeMessage = (Hello | Heartbeat | Token | Done | Failed | ToolDone | UnitEvent | PrewarmAck
               | KVSummary)
SchedulerMessage = Submit | Rekey | Cancel | Tool | Prewarm | Resync | Place | Leader
Message = Annotated[NodeMessage | SchedulerMessage, Field(discriminator="type")]

_ADAPTER: TypeAdapter[NodeMessage | SchedulerMessage] = TypeAdapter(Message)


def encode(msg: BaseModel) -> bytes:
    """One frame (UTF-8 JSON) for a message; a submit's body left encoded
    (:meth:`Submit.with_json_body`) is written as its bytes are."""
    if type(msg) is Submit:
        raw = msg.__dict__.get("_body_json")
        if raw is not None:
            head = msg.model_dump_json(exclude={"body"}, exclude_none=False).encode()
            return b"".join((head[:-1], b',"body":', raw, b"}"))
    return msg.model_dump_json(exclude_none=False).encode()


def decode(frame: bytes | str) -> NodeMessage | SchedulerMessage:
    """Parse and validate one frame; :class:`ProtocolError` names what is wrong."""
    try:  # valid frames: parsed and validated in one pass (pydantic-core), the hot path
        return _ADAPTER.validate_json(frame)
    except ValidationError:
        pass  # say what is wrong the same way whatever the frame: the two-step path below
    try:
        obj = json.loads(frame)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"frame is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"frame is not a JSON object: {type(obj).__name__}")
    try:
        return _ADAPTER.validate_python(obj)
    except ValidationError as e:
        raise ProtocolError(f"bad {obj.get('type', '<no type>')!r} message: {e}") from None


def key_to_priority(key: Key | tuple[float, ...], scale: float = 1000.0) -> int:
    """vLLM ``priority`` (lower served first) from a scheduler key: its first component scaled.

    vLLM's priority is an int fixed at submission, so it only orders what is already inside
    the engine; the node's own queue does the real ordering. Infinite/NaN ranks map to the
    ends of a signed 63-bit range.
    """
    if not key:
        return 0
    first = float(key[0])
    limit = 2**62
    if first != first:  # NaN
        return limit
    scaled = first * scale
    if scaled >= limit:
        return limit
    if scaled <= -limit:
        return -limit
    return int(round(scaled))

"""vLLM's KV-cache events on the wire: publish them (the built-in engine), subscribe to them
(every engine), keep each engine's block index (issue 19).

Wire format (vLLM ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": ..., "replay_endpoint": ..., "topic": ...}'``, vLLM 0.32): a ZeroMQ PUB socket
sends three-frame messages ``(topic, seq, payload)``: ``seq`` an 8-byte big-endian counter from
0, ``payload`` a msgpack ``EventBatch`` as an array ``[ts, events, data_parallel_rank]`` whose
events are maps tagged by ``"type"``: ``BlockStored`` (``block_hashes``,
``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id``, ``medium``, ``lora_name``,
and optional ``extra_keys``, ``group_idx``, ...), ``BlockRemoved`` (``block_hashes``,
``medium``) and ``AllBlocksCleared``. Block hashes are 64-bit ints (vLLM's default) or the
digest bytes (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``: reduced to the int form here). A
ROUTER ``replay_endpoint``, when configured, answers ``[b"", start_seq]`` from a DEALER with the
buffered batches from ``start_seq`` on, then ``(b"", -1 as 8 signed bytes, b"")``.

The structs below are ours, written to that format and decoded with msgspec (vLLM's own
choice); a test decodes what :class:`KVEventPublisher` sends with vLLM's own schema.

:class:`KVEventSubscriber` follows one engine's publisher into a
:class:`~hermes.core.kv_index.BlockIndex`. A gap in ``seq`` (a slow subscriber past the
publisher's high-water mark, a restarted engine) is filled from the replay endpoint when there
is one; without one, or when the replay cannot fill it, the index is cleared and rebuilt from
the following events (it may then miss blocks the engine still holds, never the reverse).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import zmq
import zmq.asyncio

from hermes import protocol as P
from hermes.core.kv_index import BlockIndex

log = logging.getLogger("hermeslet.kv_events")

#: the replay endpoint's end-of-replay sequence number
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """One batch; ``ValueError`` naming what is wrong with a payload that is not one."""
    try:
        return _DECODER.decode(payload)
    except msgspec.DecodeError as e:
        raise ValueError(f"not a KV event batch: {e}") from None


def as_int_hash(h: int | bytes) -> int:
    """A block hash in the events' int form (bytes: their low 64 bits, as vLLM converts)."""
    if isinstance(h, bytes):
        return int.from_bytes(h, "big") & 0xFFFF_FFFF_FFFF_FFFF
    return h


def apply_events(index: BlockIndex, events: Iterable[KVEvent]) -> None:
    """Apply decoded events to a block index, in order."""
    for ev in events:
        if isinstance(ev, BlockStored):
            index.stored([as_int_hash(h) for h in ev.block_hashes], ev.medium, ev.lora_name)
        elif isinstance(ev, BlockRemoved):
            index.removed([as_int_hash(h) for h in ev.block_hashes], ev.medium)
        else:
            index.cleared()


# ----------------------------------------------------------------------------------------------
# publisher (the built-in engine)
# ----------------------------------------------------------------------------------------------


class KVEventPublisher:
    """Publishes event batches as vLLM does (module docstring): a PUB socket bound at
    ``endpoint`` and, with ``replay_endpoint``, a ROUTER serving the last ``buffer_steps``
    batches. Sends never block (the PUB socket drops past ``hwm``, as vLLM's)."""

    def __init__(self, endpoint: str, *, replay_endpoint: str | None = None, topic: str = "",
                 buffer_steps: int = 10_000, hwm: int = 100_000,
                 ctx: zmq.Context[Any] | None = None) -> None:
        self.ctx = ctx or zmq.Context.instance()
        self.topic = topic.encode()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.set_hwm(hwm)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(endpoint)
        #: the bound address (a ``tcp://HOST:0`` endpoint gets its port here)
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay: zmq.Socket[Any] | None = None
        self.replay_endpoint: str | None = None
        if replay_endpoint is not None:
            self.replay = self.ctx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.bind(replay_endpoint)
            self.replay_endpoint = self.replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0

    @property
    def next_seq(self) -> int:
        return self._seq

    def publish(self, events: list[KVEvent], ts: float | None = None) -> int:
        """Send one batch; returns its sequence number."""
        self.serve_replay()
        payload = encode_batch(KVEventBatch(ts=time.time() if ts is None else ts,
                                            events=events))
        seq = self._seq
        self._seq += 1
        with contextlib.suppress(zmq.Again):
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload),
                                    flags=zmq.NOBLOCK)
        self._buffer.append((seq, payload))
        return seq

    def serve_replay(self) -> None:
        """Answer the replay requests waiting (called on each publish: a request made while
        the engine publishes nothing waits for its next batch, or times out at the
        subscriber, which then clears its index)."""
        sock = self.replay
        while sock is not None and sock.poll(0):
            frames = sock.recv_multipart()
            if len(frames) != 3:
                log.warning("kv events: bad replay request of %d frames", len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in self._buffer:
                if seq >= first:
                    sock.send_multipart((client, b"", self.topic, seq.to_bytes(8, "big"),
                                         payload))
            sock.send_multipart((client, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        self.pub.close(linger=0)
        if self.replay is not None:
            self.replay.close(linger=0)


# ----------------------------------------------------------------------------------------------
# subscriber (every engine with KV events)
# ----------------------------------------------------------------------------------------------


class KVEventSubscriber:
    """Follows one engine's KV events into ``index`` (module docstring). Run :meth:`run` as a
    task; ``batches``/``events``/``gaps``/``resets`` count what it saw."""

    def __init__(self, endpoint: str, index: BlockIndex, *, replay_endpoint: str | None = None,
                 topic: str = "", ctx: zmq.asyncio.Context | None = None,
                 replay_timeout_s: float = 2.0) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.index = index
        self.ctx = ctx or zmq.asyncio.Context.instance()
        self.replay_timeout_s = replay_timeout_s
        self.last_seq: int | None = None
        self.batches = 0
        self.events = 0
        self.gaps = 0
        self.resets = 0
        #: set once the SUB socket is connected
        self.connected = asyncio.Event()

    async def run(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.connect(self.endpoint)
        self.connected.set()
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    log.warning("kv events from %s: message of %d frames dropped",
                                self.endpoint, len(frames))
                    continue
                _, seq_b, payload = frames
                await self._on_batch(int.from_bytes(seq_b, "big"), payload)
        finally:
            sub.close(linger=0)

    async def _on_batch(self, seq: int, payload: bytes) -> None:
        last = self.last_seq
        if last is not None and seq <= last:  # the publisher restarted: a new, empty cache
            self._reset(f"sequence went back from {last} to {seq}")
        elif last is not None and seq > last + 1:
            self.gaps += 1
            if not await self._replay(last + 1, seq):
                self._reset(f"missed batches {last + 1}..{seq - 1}")
        elif last is None and seq > 0:  # joined late: what came before is in the replay
            await self._replay(0, seq)
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except ValueError as e:
            log.warning("kv events from %s: %s", self.endpoint, e)
            return
        apply_events(self.index, batch.events)
        self.last_seq = seq
        self.batches += 1
        self.events += len(batch.events)

    def _reset(self, why: str) -> None:
        log.warning("kv events from %s: %s; index cleared", self.endpoint, why)
        self.resets += 1
        self.index.cleared()

    async def _replay(self, first: int, upto: int) -> bool:
        """Fetch batches ``first..upto-1`` from the replay endpoint: whether all came."""
        if self.replay_endpoint is None:
            return False
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.replay_endpoint)
        want = first
        try:
            await sock.send_multipart((b"", first.to_bytes(8, "big")))
            while True:
                async with asyncio.timeout(self.replay_timeout_s):  # (a cancel is not lost)
                    frames = await sock.recv_multipart()
                if len(frames) != 4 or frames[2] == END_SEQ:
                    break
                seq = int.from_bytes(frames[2], "big")
                if seq == want and seq < upto:
                    self._apply(seq, frames[3])
                    want += 1
        except TimeoutError:
            log.warning("kv events: replay from %s timed out", self.replay_endpoint)
        finally:
            sock.close(linger=0)
        return want >= upto


@dataclass(frozen=True, slots=True)
class KVEventsSource:
    """Where an engine publishes vLLM's KV-cache events (:mod:`hermeslet.kv_events`) and how
    it names its blocks (:class:`hermes.core.kv_blocks.BlockHashing`): the node subscribes
    at ``endpoint`` and tells the gateway the naming (``EngineInfo.kv_blocks``).
    ``tokenizer="builtin"``: the engine tokenizes as the built-in engine does, so that the
    gateway can hash a text prompt's blocks itself."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    block_size: int = 16
    hash_algo: str = "sha256"
    seed: str = "vllm-none-hash"
    tokenizer: Literal["builtin"] | None = None


# ----------------------------------------------------------------------------------------------
# the node's summaries to the gateway
# ----------------------------------------------------------------------------------------------


class EngineKVFollower:
    """One engine's block index on its node, followed from the engine's events
    (:attr:`subscriber`: run it as a task) and told to the gateway as
    :class:`~hermes.protocol.KVSummary` messages (:meth:`summary`, with each heartbeat): the
    first one, and the first after :meth:`restart` (the node said ``hello`` again), is the
    whole index (``full``, ``seq`` 0), the others what changed since, net."""

    def __init__(self, node: str, engine: str, source: KVEventsSource, *,
                 ctx: zmq.asyncio.Context | None = None, max_blocks: int | None = None) -> None:
        self.node = node
        self.engine = engine
        self.source = source
        self.index = BlockIndex(max_blocks)
        self.subscriber = KVEventSubscriber(source.endpoint, self.index,
                                            replay_endpoint=source.replay_endpoint,
                                            topic=source.topic, ctx=ctx)
        self._seq = 0
        self._full_due = True

    def block_spec(self) -> P.KVBlockSpec:
        """How the engine names its blocks, for its ``EngineInfo.kv_blocks``."""
        s = self.source
        return P.KVBlockSpec(block_size=s.block_size, hash_algo=s.hash_algo, seed=s.seed,
                             tokenizer=s.tokenizer)

    def restart(self) -> None:
        """The gateway will rebuild its copy: the next summary is the whole index."""
        self._full_due = True

    def summary(self) -> P.KVSummary | None:
        """What changed since the last summary (None: nothing)."""
        full = self._full_due
        stored, removed = self.index.take_delta(full=full)
        if not full and not stored and not removed:
            return None
        seq = 0 if full else self._seq
        self._seq, self._full_due = seq + 1, False
        return P.KVSummary(node=self.node, engine=self.engine, seq=seq, full=full,
                           stored=stored, removed=removed,
                           blocks={m: self.index.count(m) for m in self.index.media()})

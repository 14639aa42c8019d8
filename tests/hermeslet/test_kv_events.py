"""vLLM KV events (issue 19): the wire format, the built-in engine's publisher, the
subscriber's block index (gaps, replay, restarts), and vLLM's own schema decoding ours."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.asyncio

from hermes.core.kv_blocks import BlockHashing, builtin_message_token_ids
from hermes.core.kv_index import BlockIndex
from hermeslet.engines.base import GenResult
from hermeslet.engines.sim_engine import SimEngine
from hermeslet.engines.sim_kv_events import PrefixEventTracker
from hermeslet.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventPublisher,
    KVEventSubscriber,
    apply_events,
    decode_batch,
    encode_batch,
)

pytestmark = pytest.mark.timeout(60)

VLLM_PY = Path(os.environ.get("HERMES_VLLM_PYTHON",
                              "/root/.cache/hermes-vllm/venv/bin/python"))


def test_batch_roundtrip_and_bad_payload() -> None:
    ev = [BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=[5] * 4,
                      block_size=2, lora_id=None, medium="GPU", lora_name=None),
          BlockRemoved(block_hashes=[1], medium="GPU"), AllBlocksCleared()]
    raw = encode_batch(KVEventBatch(ts=1.5, events=ev))
    assert msgspec.msgpack.decode(raw)[1][1] == {"type": "BlockRemoved", "block_hashes": [1],
                                                 "medium": "GPU"}  # vLLM's tagged maps
    assert decode_batch(raw).events == ev
    with pytest.raises(ValueError, match="not a KV event batch"):
        decode_batch(b"\x01\x02")
    idx = BlockIndex()
    apply_events(idx, ev[:2])
    assert idx.hashes() == {2}
    # a digest-bytes hash (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) is reduced to the int form
    apply_events(idx, [BlockStored(block_hashes=[b"\xff" * 24 + (7).to_bytes(8, "big")],
                                   parent_block_hash=None, token_ids=[], block_size=2,
                                   lora_id=None, medium=None, lora_name=None)])
    assert idx.hashes() == {2, 7}


def test_tracker_shares_blocks_and_announces_tails() -> None:
    tr = PrefixEventTracker(BlockHashing(block_size=4))
    a, b = "A" * 40, "A" * 20 + "B" * 60  # b's first two blocks are a's
    tr.note(a, "system")
    tr.note(b, "system")
    ha, hb = tr.block_hashes(a), tr.block_hashes(b)
    assert len(ha) == (10 + 4) // 4 and len(hb) == 6 and hb[:2] == ha[:2] and hb[2] != ha[2]
    ev = tr.diff({"GPU": [a]})
    assert len(ev) == 1 and isinstance(ev[0], BlockStored)
    assert ev[0].block_hashes == ha and ev[0].parent_block_hash is None
    assert ev[0].token_ids == builtin_message_token_ids("system", a)[:len(ha) * 4]
    ev = tr.diff({"GPU": [a, b]})  # only b's new tail, chained to its parent
    first_new = next(i for i, h in enumerate(hb) if h not in ha)
    assert ev[0].block_hashes == hb[first_new:]
    assert ev[0].parent_block_hash == hb[first_new - 1]
    ev = tr.diff({"GPU": [b], "CPU": [a]})  # a leaves the GPU: only its unshared blocks go
    removed = [e for e in ev if isinstance(e, BlockRemoved)]
    assert removed[0].block_hashes == [h for h in ha if h not in hb]
    assert [e.medium for e in ev if isinstance(e, BlockStored)] == ["CPU"]
    assert tr.diff({"GPU": [b], "CPU": [a]}) == []  # nothing changed
    assert tr.diff({"GPU": ["never noted"]})[0].medium == "CPU"  # unknown: skipped; CPU gone


async def _wait(cond, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.01)


def _stored(*hs: int) -> BlockStored:
    return BlockStored(block_hashes=list(hs), parent_block_hash=None, token_ids=[],
                       block_size=16, lora_id=None, medium="GPU", lora_name=None)


async def test_subscriber_follows_replays_gaps_and_resets_on_restart() -> None:
    pub = KVEventPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0")
    idx = BlockIndex()
    sub = KVEventSubscriber(pub.endpoint, idx, replay_endpoint=pub.replay_endpoint,
                            ctx=zmq.asyncio.Context.instance())
    task = asyncio.create_task(sub.run())
    try:
        await sub.connected.wait()
        # a slow-joining SUB misses early messages: publish until one arrives
        for _ in range(200):
            pub.publish([_stored(1)])
            await asyncio.sleep(0.01)
            if sub.batches:
                break
        await _wait(lambda: idx.hashes() == {1})
        # a batch lost on the wire (sent to the replay buffer only) is fetched from the replay
        pub._buffer.append((pub._seq, encode_batch(KVEventBatch(ts=0, events=[_stored(2)]))))
        pub._seq += 1
        replay = asyncio.get_running_loop().run_in_executor(None, _serve_replay, pub)
        pub.pub.send_multipart((b"", pub._seq.to_bytes(8, "big"), encode_batch(
            KVEventBatch(ts=0, events=[BlockRemoved(block_hashes=[1], medium="GPU")]))))
        pub._seq += 1
        await _wait(lambda: idx.hashes() == {2})
        await replay
        assert sub.gaps == 1 and sub.resets == 0
        # the engine restarted: its sequence starts again from 0 with an empty cache
        pub2_seq = (0).to_bytes(8, "big")
        pub.pub.send_multipart((b"", pub2_seq, encode_batch(
            KVEventBatch(ts=0, events=[_stored(5)]))))
        await _wait(lambda: idx.hashes() == {5})
        assert sub.resets == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        pub.close()


def _serve_replay(pub: KVEventPublisher) -> None:
    assert pub.replay is not None
    if pub.replay.poll(3000):
        pub.serve_replay()


async def test_subscriber_without_replay_clears_on_gap() -> None:
    pub = KVEventPublisher("tcp://127.0.0.1:0")
    idx = BlockIndex()
    sub = KVEventSubscriber(pub.endpoint, idx)
    task = asyncio.create_task(sub.run())
    try:
        await sub.connected.wait()
        for _ in range(200):
            pub.publish([_stored(1)])
            await asyncio.sleep(0.01)
            if sub.batches:
                break
        pub._seq += 3  # three batches lost
        pub.publish([_stored(9)])
        await _wait(lambda: sub.resets == 1)
        assert idx.hashes() == {9}  # may miss blocks the engine holds, never claims lost ones
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        pub.close()


def system(i: int) -> str:
    return (f"prompt {i:03d} " + "x" * 1600)[:1600]


async def ask(eng: SimEngine, i: int, rid: str) -> None:
    body = {"messages": [{"role": "system", "content": system(i)},
                         {"role": "user", "content": "go"}], "max_tokens": 1}
    out = [o async for o in eng.generate("chat", body, False, request_id=rid)]
    assert isinstance(out[-1], GenResult)


def expected_index(eng: SimEngine) -> dict[str, set[int]]:
    """The block hashes of the prefixes the engine's pool holds, per medium."""
    tr = eng.kv_tracker
    assert tr is not None
    pool = eng.prefix_cache
    return {m: {h for p in prefixes for h in tr.block_hashes(p)}
            for m, prefixes in (("GPU", pool.gpu), ("CPU", pool.cpu))}  # type: ignore[union-attr]


async def test_sim_engine_publishes_and_index_matches_after_evictions() -> None:
    eng = SimEngine(time_scale=1000, kv_cache_gb=1.0, cpu_cache_gb=0.5,
                    kv_events_endpoint="tcp://127.0.0.1:0")
    await eng.start()
    assert eng.kv_events is not None and eng.kv_events.tokenizer == "builtin"
    idx = BlockIndex()
    sub = KVEventSubscriber(eng.kv_events.endpoint, idx)
    task = asyncio.create_task(sub.run())
    try:
        await sub.connected.wait()
        await asyncio.sleep(0.2)  # let the SUB connect before the first event
        for n, i in enumerate([0, 0, 1, 2, 3, 4, 5, 0, 6]):
            await ask(eng, i, f"r{n}")
        eng.publish_kv_events()
        want = expected_index(eng)
        await _wait(lambda: idx.hashes("GPU") == want["GPU"] and idx.hashes("CPU") == want["CPU"])
        assert eng.prefix_cache.stats.evictions >= 1  # type: ignore[union-attr]
        assert want["CPU"] and sub.resets == 0
        # the gateway hashes a request's prompt itself and finds its prefix's blocks
        hashing = BlockHashing(block_size=16)
        toks = builtin_message_token_ids("system", system(6)) + [1, 4, 2, 2]
        assert set(hashing.external_hashes(toks)[:25]) <= idx.hashes("GPU")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await eng.close()


_VLLM_DECODE = r"""
import json, sys
import msgspec
from vllm.distributed.kv_events import KVEventBatch, BlockStored, BlockRemoved
dec = msgspec.msgpack.Decoder(type=KVEventBatch)
out = []
for hexed in json.load(sys.stdin):
    b = dec.decode(bytes.fromhex(hexed))
    out.append([[type(e).__name__, list(getattr(e, "block_hashes", [])),
                 getattr(e, "parent_block_hash", None), getattr(e, "medium", None),
                 getattr(e, "block_size", None)] for e in b.events])
print(json.dumps(out))
"""


async def test_vllm_schema_decodes_the_built_in_engines_events() -> None:
    if not VLLM_PY.exists():
        pytest.skip(f"no vLLM venv at {VLLM_PY}")
    eng = SimEngine(time_scale=1000, kv_cache_gb=1.0, cpu_cache_gb=0.5,
                    kv_events_endpoint="tcp://127.0.0.1:0")
    await eng.start()
    assert eng.kv_events is not None
    ctx = zmq.asyncio.Context.instance()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(eng.kv_events.endpoint)
    await asyncio.sleep(0.3)
    payloads: list[bytes] = []
    try:
        for n, i in enumerate([0, 1, 2, 3, 4, 5, 0]):
            await ask(eng, i, f"r{n}")
        while await sock.poll(200):
            topic, seq, payload = await sock.recv_multipart()
            payloads.append(payload)
    finally:
        sock.close(linger=0)
        await eng.close()
    ours = [[[type(e).__name__, list(getattr(e, "block_hashes", [])),
              getattr(e, "parent_block_hash", None), getattr(e, "medium", None),
              getattr(e, "block_size", None)] for e in decode_batch(p).events]
            for p in payloads]
    kinds = {e[0] for b in ours for e in b}
    assert {"BlockStored", "BlockRemoved"} <= kinds
    proc = await asyncio.to_thread(
        subprocess.run, [str(VLLM_PY), "-c", _VLLM_DECODE], capture_output=True, text=True,
        timeout=240, input=json.dumps([p.hex() for p in payloads]))
    if proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr:
        pytest.skip("vllm is not importable there")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ours


def test_follower_summaries_full_then_incremental_then_full_after_restart() -> None:
    from hermeslet.kv_events import EngineKVFollower, KVEventsSource

    f = EngineKVFollower("n1", "sim", KVEventsSource("tcp://127.0.0.1:1", block_size=32,
                                                      tokenizer="builtin"))
    assert f.block_spec().block_size == 32 and f.block_spec().tokenizer == "builtin"
    f.index.stored([1, 2])
    s0 = f.summary()
    assert s0 is not None and s0.full and s0.seq == 0 and s0.stored == {"GPU": [1, 2]}
    assert f.summary() is None  # nothing changed
    f.index.removed([1])
    f.index.stored([3], medium="CPU")
    s1 = f.summary()
    assert s1 is not None and not s1.full and s1.seq == 1
    assert s1.removed == {"GPU": [1]} and s1.stored == {"CPU": [3]}
    assert s1.blocks == {"GPU": 1, "CPU": 1}
    f.restart()
    s2 = f.summary()
    assert s2 is not None and s2.full and s2.seq == 0 and s2.stored == {"GPU": [2], "CPU": [3]}


def test_vllm_launcher_passes_kv_events_config() -> None:
    from hermeslet.engines.vllm import VLLMEngine, vllm_argv

    argv = vllm_argv("py", "m", 8000, kv_events_endpoint="ipc:///tmp/x.sock", kv_block_size=32)
    cfg = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert cfg == {"enable_kv_cache_events": True, "publisher": "zmq",
                   "endpoint": "ipc:///tmp/x.sock"}
    assert argv[argv.index("--block-size") + 1] == "32"
    assert "--kv-events-config" not in vllm_argv("py", "m", 8000)
    eng = VLLMEngine(model="m", python="py", kv_events=True, env={"PYTHONHASHSEED": "7"})
    assert eng.kv_events is not None and eng.kv_events.endpoint.startswith("ipc://")
    assert eng.kv_events.seed == "7" and eng.kv_events.tokenizer is None
    attached = VLLMEngine("http://h:1", kv_events="tcp://*:5557")
    assert attached.kv_events is not None
    assert attached.kv_events.endpoint == "tcp://h:5557" and attached.argv == []
    with pytest.raises(ValueError, match="publisher's endpoint"):
        VLLMEngine("http://h:1", kv_events=True)


def test_cli_kv_events_flags_configure_the_sim_engine() -> None:
    from hermeslet.cli import _parser, build_agent

    args = _parser().parse_args(["run", "--scheduler", "tcp://127.0.0.1:1", "--kv-events",
                                 "--kv-block-size", "32", "--kv-cache-gb", "1"])
    eng = next(iter(build_agent(args).slots.values())).engine
    assert isinstance(eng, SimEngine) and eng.kv_tracker is not None
    assert eng.kv_tracker.hashing.block_size == 32
    plain = _parser().parse_args(["run", "--scheduler", "tcp://127.0.0.1:1"])
    eng = next(iter(build_agent(plain).slots.values())).engine
    assert isinstance(eng, SimEngine) and eng.kv_tracker is None


async def test_sim_engine_without_a_pool_publishes_its_prefix_lru() -> None:
    from hermeslet.engines.sim_kv_events import held_prefixes

    eng = SimEngine(time_scale=1000, kv_events_endpoint="tcp://127.0.0.1:0")
    await eng.start()
    try:
        await ask(eng, 1, "a")
        assert list(held_prefixes(eng.prefix_cache)) == ["GPU"]
        assert held_prefixes(eng.prefix_cache)["GPU"] == [system(1)]
        assert eng.kv_publisher is not None and eng.kv_publisher.next_seq >= 1
    finally:
        await eng.close()
    assert eng.kv_publisher is None

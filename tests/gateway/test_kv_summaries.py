"""The gateway's copy of each engine's block index from ``kv_summary`` messages (issue 19):
full, incremental, a missing summary -> ``resync``; and the exact look-up the routers read."""

from __future__ import annotations

from types import SimpleNamespace

import zmq.asyncio

from hermes.core.kv_blocks import BlockHashing, builtin_chat_token_ids
from hermes.core.routing import RouteRequest
from hermes.gateway.nodes import NodeTable
from hermes.gateway.prefixes import prompt_prefixes, prompt_token_ids
from hermes.protocol import EngineInfo, Hello, KVBlockSpec, KVSummary, Resync


def _table(router: str = "prefix") -> NodeTable:
    sc = SimpleNamespace(router=router, router_index_tokens=100_000)
    ctx = SimpleNamespace(config=SimpleNamespace(scheduler=sc), metrics=None, now=lambda: 0.0)
    return NodeTable(ctx, zmq.asyncio.Context.instance(), "inproc://kv-summaries-test")


def _hello(node: str, kv: bool = True) -> Hello:
    spec = KVBlockSpec(block_size=16, tokenizer="builtin") if kv else None
    return Hello(node=node, engines=[EngineInfo(name="sim", model="m", kind="sim",
                                                max_inflight=4, kv_blocks=spec)])


def _summary(seq: int, *, full: bool = False, stored=None, removed=None) -> KVSummary:  # noqa: ANN001
    return KVSummary(node="n1", engine="sim", seq=seq, full=full, stored=stored or {},
                     removed=removed or {})


async def test_full_incremental_and_gap_resyncs() -> None:
    t = _table()
    link = t.inproc_link("n1")
    t.observe(b"n1", _hello("n1"))
    t.observe(b"n1", _summary(0, full=True, stored={"GPU": [1, 2], "CPU": [3]}))
    idx = t.kv_indexes["n1/sim"]
    assert idx.hashes() == {1, 2} and idx.hashes("CPU") == {3}
    t.observe(b"n1", _summary(1, stored={"GPU": [4]}, removed={"GPU": [1]}))
    assert t.kv_indexes["n1/sim"].hashes() == {2, 4}
    assert not link._inbox
    t.observe(b"n1", _summary(3, stored={"GPU": [9]}))  # summary 2 was lost
    assert "n1/sim" not in t.kv_indexes and isinstance(link._inbox[-1], Resync)
    # the node says hello again and sends the whole index
    t.observe(b"n1", _hello("n1"))
    t.observe(b"n1", _summary(0, full=True, stored={"GPU": [2, 4, 9]}))
    assert t.kv_indexes["n1/sim"].hashes() == {2, 4, 9}
    # a summary of an engine the node did not declare is ignored
    t.observe(b"n1", KVSummary(node="n1", engine="nope", seq=0, full=True,
                               stored={"GPU": [5]}))
    assert "n1/nope" not in t.kv_indexes


def test_prompt_token_ids() -> None:
    msgs = [{"role": "system", "content": "s" * 100}, {"role": "user", "content": "hi"}]
    assert prompt_token_ids("chat", {"messages": msgs}, "builtin") == builtin_chat_token_ids(msgs)
    assert prompt_token_ids("chat", {"messages": msgs}, None) is None  # no tokenizer here
    assert prompt_token_ids("completions", {"prompt": [5, 6, 7]}, None) == [5, 6, 7]
    assert prompt_token_ids("completions", {"prompt": [[5, 6]]}, None) == [5, 6]
    assert prompt_token_ids("completions", {"prompt_token_ids": [1]}, None) == [1]
    assert prompt_token_ids("completions", {"prompt": "text"}, None) is None
    assert prompt_token_ids("completions", {"prompt": [True]}, None) is None


async def test_exact_lookup_beats_the_approximate_index() -> None:
    """Two engines; the approximate index was told the prompt went to n2, but n1's block
    index holds its blocks: the prefix router reads the blocks and picks n1."""
    t = _table()
    for n in ("n1", "n2"):
        t.inproc_link(n)
        t.observe(n.encode(), _hello(n))
    msgs = [{"role": "system", "content": "You answer. " * 40},
            {"role": "user", "content": "q"}]
    ids = builtin_chat_token_ids(msgs)
    held = BlockHashing(block_size=16).external_hashes(ids)
    t.observe(b"n1", _summary(0, full=True, stored={"GPU": held}))
    t.observe(b"n2", KVSummary(node="n2", engine="sim", seq=0, full=True))
    body = {"messages": msgs}
    prefixes = prompt_prefixes("chat", body)
    t.router.index.record("n2/sim", prefixes)
    # without the prompt (no exact look-up) the approximate index decides
    node, _ = t.pick_engine("m", route=RouteRequest("r0", prefixes, len(ids)))
    assert node.name == "n2"
    matched = t.router_stats.matched_tokens
    node, _ = t.pick_engine("m", route=RouteRequest("r", prefixes, len(ids)),
                            prompt=("chat", body))
    assert node.name == "n1"
    assert t.router_stats.matched_tokens - matched == len(held) * 16

"""KV events end to end (issue 19): two HermesLets with built-in engines publishing vLLM KV
events behind one gateway; after requests that force evictions, the gateway's block index of
each engine (rebuilt from the nodes' ``kv_summary`` messages) equals what the engine's cache
holds, and the ``prefix`` and ``hermes`` routers send a prompt to the engine holding its blocks."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from threaded_node import ThreadedNode

from hermes.gateway.server import gateway_state
from hermes.procs import free_port

# hermeslet is imported inside the helpers (see test_prewarm_gateway.py)

MODEL = "kv-model"


def system(i: int) -> str:
    return (f"prompt {i:03d} " + "x" * 1600)[:1600]


class _Node(ThreadedNode):
    """A HermesLet with one built-in engine (a 1 GB KV pool, 0.5 GB host tier) publishing KV
    events, on its own event loop in a thread."""

    def __init__(self, name: str, address: str) -> None:
        self.name = name
        self.engine: Any = None
        super().__init__(address)

    def make(self, address: str) -> Any:
        from hermeslet.agent import HermesLet
        from hermeslet.engines.sim_engine import SimEngine

        self.engine = SimEngine(name="sim", model=MODEL, time_scale=50.0, kv_cache_gb=1.0,
                                cpu_cache_gb=0.5, kv_events_endpoint="tcp://127.0.0.1:0")
        return HermesLet(self.name, address, [self.engine], heartbeat_s=0.1)

    def cache(self) -> dict[str, set[int]]:
        """The block hashes of the prefixes the engine's pool holds, per medium."""
        eng = self.engine
        assert eng is not None and eng.kv_tracker is not None
        pool = eng.prefix_cache
        return {m: {h for p in list(prefixes) for h in eng.kv_tracker.block_hashes(p)}
                for m, prefixes in (("GPU", pool.gpu), ("CPU", pool.cpu))}



def _wait(pred, why, timeout: float = 10.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, why()
        time.sleep(0.02)


def _ask(http: httpx.Client, i: int) -> str:
    """A one-turn chat with system prompt ``i``: the engine (``node/sim``) that served it."""
    r = http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 1, "messages": [
        {"role": "system", "content": system(i)}, {"role": "user", "content": "go"}]})
    assert r.status_code == 200, r.text
    run = http.get(f"/v1/runs/{r.headers['x-hermes-run']}").json()
    req = run["units"][0]["requests"][0]
    return f"{req['node']}/{req['engine']}" if "node" in req else req["engine"]


@pytest.mark.parametrize("router", ["prefix", "hermes"])
def test_gateway_index_matches_engine_caches_after_evictions(make_gateway, router: str) -> None:  # noqa: ANN001
    address = f"tcp://127.0.0.1:{free_port()}"
    srv = make_gateway(bind=address, embedded_node=False, router=router)
    sched = gateway_state(srv).scheduler
    table = sched.node_table
    nodes = [_Node("n1", address), _Node("n2", address)]
    try:
        _wait(lambda: len(sched.nodes) == 2, lambda: "the HermesLets did not connect", 20)
        infos = [e for n in sched.nodes.values() for e in n.engines.values()]
        assert all(e.kv_blocks is not None and e.kv_blocks.tokenizer == "builtin"
                   for e in infos)
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            # 12 prompts of 404 tokens (4,848) overflow the two 2,048-token pools together,
            # however the router spreads them (8 did only when it put 6 on one engine)
            for i in range(12):
                _ask(http, i)
            for i in range(12):
                _ask(http, i)

            def matches() -> bool:
                return all(table.kv_indexes.get(f"{n.name}/sim") is not None
                           and table.kv_indexes[f"{n.name}/sim"].hashes("GPU") == n.cache()["GPU"]
                           and table.kv_indexes[f"{n.name}/sim"].hashes("CPU") == n.cache()["CPU"]
                           for n in nodes)

            _wait(matches, lambda: {n.name: (n.cache(), {
                m: table.kv_indexes.get(f"{n.name}/sim", None) and
                table.kv_indexes[f"{n.name}/sim"].hashes(m) for m in ("GPU", "CPU")})
                for n in nodes})
            evictions = [n.engine.prefix_cache.stats.evictions for n in nodes]
            assert sum(evictions) >= 1, evictions
            assert any(n.cache()["GPU"] for n in nodes) and any(n.cache()["CPU"] for n in nodes)
            # once the gateway sees both engines idle (no request out, no KV in use: a
            # heartbeat taken during the last request reports its KV, which the hermes router
            # weighs against a hit), a prompt whose prefix only one engine holds on its GPU
            # goes there
            _wait(lambda: all(not any(node.outstanding.values())
                              and not any(node.kv_usage.get(e) for e in node.engines)
                              for node in sched.nodes.values()),
                  lambda: {k: (v.outstanding, v.kv_usage) for k, v in sched.nodes.items()})
            for n in nodes:
                gpu = n.engine.prefix_cache.gpu
                other = [m for m in nodes if m is not n][0]
                only = [p for p in gpu if p not in other.engine.prefix_cache.gpu
                        and p not in other.engine.prefix_cache.cpu]
                if only:
                    i = int(only[0].split()[1])
                    before = dict(table.router_stats.by_engine)
                    matched = table.router_stats.matched_tokens
                    _ask(http, i)
                    after = table.router_stats.by_engine
                    assert after.get(f"{n.name}/sim", 0) == before.get(f"{n.name}/sim", 0) + 1
                    # read from the blocks: the system prompt's 25 full blocks of 16 tokens
                    # (404 tokens), not the whole 410-token prompt the approximate index had
                    assert table.router_stats.matched_tokens - matched == 25 * 16
                    break
            else:
                raise AssertionError("no prompt held by one engine only")
    finally:
        for n in nodes:
            n.stop()

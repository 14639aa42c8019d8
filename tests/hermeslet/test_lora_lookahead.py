"""The HermesLet's LoRA queue lookahead against a real sim-engine HTTP server (vLLM's API:
``/v1/load_lora_adapter``, ``unload_lora_adapter``, loaded adapters listed in ``/v1/models``).

The sim engine, like vLLM, answers 404 for a request whose adapter is not loaded: a LoRA
request released to it succeeds only when its adapter was loaded before its release.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
import zmq
import zmq.asyncio

from hermeslet.agent import HermesLet
from hermeslet.engines.openai_http import OpenAIHTTPEngine
from hermeslet.lora_lookahead import LoraLookahead
from hermeslet.prewarmers import LoraPrewarmer, NodePrewarmer
from tests.hermeslet.test_agent import FakeScheduler, submit

pytestmark = pytest.mark.timeout(30)

BASE = "sim-7b"


def adapters(url: str) -> set[str]:
    """The adapters the server has loaded now (its ``/v1/models`` minus the base model)."""
    data = httpx.get(url + "/v1/models", timeout=5).json()["data"]
    return {m["id"] for m in data if m["id"] != BASE}


def node(url: str, *, slots: int, paths: dict[str, str], lookahead: bool = True) -> NodePrewarmer:
    n = NodePrewarmer(loras={BASE: LoraPrewarmer(url, max_loras=slots, paths=paths)})
    if lookahead:
        n.lora_lookahead = LoraLookahead(n)
    return n


@contextlib.asynccontextmanager
async def agent_on(url: str, prewarmer: NodePrewarmer, on_release=None, window: int = 1):
    """A HermesLet with one HTTP engine (in-flight window ``window``) in front of ``url``;
    ``on_release(rid)`` runs when the agent releases a request to the engine."""
    ctx = zmq.asyncio.Context()
    sched = FakeScheduler(ctx)
    engine = OpenAIHTTPEngine(url, name="http", max_inflight=window)
    agent = HermesLet("node-l", sched.address, [engine], ctx=ctx, heartbeat_s=0.5,
                      prewarmer=prewarmer,
                      release_log=lambda _eng, rid: on_release and on_release(rid))
    task = asyncio.create_task(agent.run())
    try:
        await sched.recv("hello")
        yield sched, agent
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)
        sched.sock.close(linger=0)
        ctx.term()


def lora_submit(rid: str, key: float, model: str, max_tokens: int = 12):
    return submit(rid, [key], model=model, prompt="p" * 40, max_tokens=max_tokens)


async def results(sched: FakeScheduler, n: int) -> dict:
    return {m.request_id: m for m in await sched.collect({"done", "failed"}, n, timeout=20)}


async def test_next_requests_adapters_are_loaded_before_their_release(url):
    """Window 1, host slots 2, four queued requests of four adapters behind a base-model
    request: each adapter is on the server when its request is released (so every request
    succeeds), never more than 2 are loaded, and the loads count as lookahead, not prewarm."""
    paths = {a: f"/adapters/{a}" for a in "abcd"}
    pn = node(url, slots=2, paths=paths)
    at_release: dict[str, set[str]] = {}

    def on_release(rid: str) -> None:  # blocks the loop for one loopback GET: fine in a test
        at_release[rid] = adapters(url)

    async with agent_on(url, pn, on_release) as (sched, _):
        await sched.send(lora_submit("r0", 0, BASE, max_tokens=30))
        for i, a in enumerate("abcd", start=1):
            await sched.send(lora_submit(f"r{i}", i, a))
        res = await results(sched, 5)
    assert {rid: m.type for rid, m in res.items()} == {f"r{i}": "done" for i in range(5)}
    assert list(at_release) == ["r0", "r1", "r2", "r3", "r4"]  # released in key order
    for i, a in enumerate("abcd", start=1):
        assert a in at_release[f"r{i}"], (a, at_release)
    assert all(len(s) <= 2 for s in at_release.values())
    # while r0 ran, the head was the first two adapters (not c, d: they would evict a, b)
    assert at_release["r1"] == {"a", "b"}
    pw = pn.loras[BASE]
    assert pw.lookahead.loads == 4 and pw.lookahead.failed == 0
    assert pw.counters.started == 0  # no scheduler prewarm happened
    assert pn.stats()[f"lora_{BASE}_lookahead_loads"] == 4


async def test_lookahead_load_never_unloads_an_inflight_requests_adapter(url):
    """Slots 2 holding ``a`` (least recently used) and ``x``; a long request of ``a`` is in
    flight when a request of ``b`` queues: the lookahead load of ``b`` evicts ``x``, not the
    LRU ``a``; the scheduler's release of ``a`` is refused while its request runs."""
    pn = node(url, slots=2, paths={n: f"/adapters/{n}" for n in "abx"})
    pw = pn.loras[BASE]
    async with agent_on(url, pn) as (sched, agent):
        await pw.load("a")
        await pw.load("x")
        assert adapters(url) == {"a", "x"} and list(pw.loaded) == ["a", "x"]
        await sched.send(lora_submit("ra", 0, "a", max_tokens=40))
        await sched.send(lora_submit("rb", 1, "b"))
        await asyncio.sleep(0.2)
        await pn.lora_lookahead.idle()
        assert "ra" in agent.slots["http"].inflight  # a is still in use
        assert adapters(url) == {"a", "b"}
        ok, _ = await pn.handle(f"lora:{BASE}@a", "release")
        assert not ok and "a" in adapters(url)
        res = await results(sched, 2)
    assert res["ra"].type == "done" and res["rb"].type == "done"
    assert pw.lookahead.loads == 1 and pw.counters.started == 2


async def test_lookahead_is_off_by_default(url):
    """A LoRA prewarmer without the lookahead loads nothing for queued requests: while a
    base-model request holds the window, the queued LoRA requests' adapters stay unloaded;
    each is loaded when its request is released (a cold start the request waits for), and
    the requests succeed."""
    pn = node(url, slots=2, paths={a: f"/adapters/{a}" for a in "ab"}, lookahead=False)
    async with agent_on(url, pn) as (sched, agent):
        await sched.send(lora_submit("r0", 0, BASE, max_tokens=40))
        await sched.send(lora_submit("r1", 1, "a"))
        await sched.send(lora_submit("r2", 2, "b"))
        await asyncio.sleep(0.2)
        assert "r0" in agent.slots["http"].inflight
        assert adapters(url) == set() and not pn.loras[BASE].loaded  # nothing ahead
        res = await results(sched, 3)
    assert {r.type for r in res.values()} == {"done"}
    pw = pn.loras[BASE]
    assert adapters(url) == {"a", "b"}
    assert pw.counters.cold_starts == 2 and pw.lookahead.loads == 0 and pw.counters.started == 0
    assert f"lora_{BASE}_lookahead_loads" not in pn.stats()

    from hermeslet.cli import _parser, build_agent
    args = _parser().parse_args(["run", "--scheduler", "tcp://127.0.0.1:1", "--engine",
                                 f"openai:{url}", "--model", BASE, "--prewarm", "--enable-lora"])
    assert build_agent(args).prewarmer.lora_lookahead is None


async def test_unknown_path_is_skipped_and_failed_load_is_counted(url):
    """An adapter with no known path is skipped (counted once), the others still load; a load
    that fails (the engine refuses the connection) is counted, and the agent keeps serving."""
    pn = node(url, slots=3, paths={"a": "/adapters/a"})
    async with agent_on(url, pn) as (sched, _):
        await sched.send(lora_submit("r0", 0, BASE, max_tokens=30))
        await sched.send(lora_submit("r1", 1, "nopath"))
        await sched.send(lora_submit("r2", 2, "a"))
        res = await results(sched, 3)
    pw = pn.loras[BASE]
    assert res["r0"].type == "done" and res["r2"].type == "done"
    assert res["r1"].type == "failed" and res["r1"].status == 404  # never loaded
    assert adapters(url) == {"a"}
    assert pw.lookahead.no_path == 1 and pw.lookahead.loads == 1 and pw.lookahead.failed == 0

    dead = httpx.URL(url).copy_with(port=1)  # nothing listens on port 1
    bad = node(str(dead), slots=2, paths={"a": "/adapters/a"})
    async with agent_on(url, bad) as (sched, _):
        await sched.send(lora_submit("s0", 0, BASE, max_tokens=20))
        await sched.send(lora_submit("s1", 1, "a"))
        await asyncio.sleep(0.1)
        await bad.lora_lookahead.idle()
        res = await results(sched, 2)
    assert res["s0"].type == "done" and res["s1"].type == "done"  # a is still loaded on url
    assert bad.loras[BASE].lookahead.failed == 1 and bad.loras[BASE].lookahead.loads == 0


def test_cli_flags_build_the_lookahead_and_reject_bad_values(url, capsys):
    from hermeslet.cli import _parser, build_agent

    base = ["run", "--scheduler", "tcp://127.0.0.1:1", "--engine", f"openai:{url}",
            "--model", BASE]
    pw = build_agent(_parser().parse_args(
        [*base, "--lora-lookahead", "--lora-path", "a=/x/a", "--lora-path", "b=/x/b",
         "--max-loras", "2", "--max-cpu-loras", "5"])).prewarmer
    assert pw is not None and isinstance(pw.lora_lookahead, LoraLookahead)
    assert pw.loras[BASE].paths == {"a": "/x/a", "b": "/x/b"}
    assert pw.loras[BASE].max_loras == 5
    pw = build_agent(_parser().parse_args([*base, "--lora-lookahead", "--max-loras", "3"]))
    assert pw.prewarmer.loras[BASE].max_loras == 3  # --max-cpu-loras defaults to --max-loras
    for bad in (["--lora-path", "a/x"], ["--lora-path", "=/x"], ["--lora-path", "a="],
                ["--max-cpu-loras", "0"]):
        with pytest.raises(SystemExit) as e:
            _parser().parse_args([*base, *bad])
        assert e.value.code == 2
        assert f"argument {bad[0]}" in capsys.readouterr().err

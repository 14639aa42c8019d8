"""The HermesLet against a real ROUTER socket: a tiny fake scheduler built on the protocol."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import zmq
import zmq.asyncio

from hermes import protocol as P
from hermes.core.costmodel import get_cost_model
from hermeslet.agent import HermesLet
from hermeslet.engines.sim_engine import SimEngine
from hermeslet.tools import SubprocessSandbox, ToolRunner

pytestmark = pytest.mark.timeout(30)


class FakeScheduler:
    """ROUTER bound on a free loopback port; records every decoded message per type."""

    def __init__(self, ctx: zmq.asyncio.Context) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.seen: list = []
        self.node_id: bytes | None = None

    async def recv(self, type_: str, timeout: float = 10.0, pred=lambda m: True):
        """The next message of ``type_`` (other types are kept in ``seen``)."""
        async def _next():
            while True:
                ident, frame = await self.sock.recv_multipart()
                self.node_id = ident
                msg = P.decode(frame)
                self.seen.append(msg)
                if msg.type == type_ and pred(msg):
                    return msg
        return await asyncio.wait_for(_next(), timeout)

    async def send(self, msg) -> None:
        assert self.node_id is not None
        await self.sock.send_multipart([self.node_id, P.encode(msg)])

    async def collect(self, types: set[str], n: int, timeout: float = 15.0) -> list:
        out = []
        async def _go():
            while len(out) < n:
                ident, frame = await self.sock.recv_multipart()
                msg = P.decode(frame)
                self.seen.append(msg)
                if msg.type in types:
                    out.append(msg)
        await asyncio.wait_for(_go(), timeout)
        return out


@contextlib.asynccontextmanager
async def running(engines, **kw):
    ctx = zmq.asyncio.Context()
    sched = FakeScheduler(ctx)
    released: list[str] = []
    agent = HermesLet("node-a", sched.address, engines, ctx=ctx, heartbeat_s=0.2,
                      release_log=lambda eng, rid: released.append(rid), **kw)
    task = asyncio.create_task(agent.run())
    try:
        hello = await sched.recv("hello")
        yield sched, agent, hello, released
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)
        sched.sock.close(linger=0)
        ctx.term()


def submit(rid: str, key: list[float], *, prompt: str = "x" * 40, max_tokens: int = 5,
           stream: bool = False, model: str = "m7b", endpoint: str = "completions") -> P.Submit:
    body = ({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True} if endpoint == "completions"
            else {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "ignore_eos": True})
    return P.Submit(request_id=rid, run_id="run-" + rid, unit="u", model=model,
                    endpoint=endpoint, body=body, stream=stream, key=key)


def sim(max_inflight: int = 4, time_scale: float = 20.0, **kw) -> SimEngine:
    return SimEngine(name="sim", model="m7b", max_inflight=max_inflight,
                     time_scale=time_scale, **kw)


async def test_hello_heartbeat_and_done_with_token_counts():
    async with running([sim()]) as (sched, agent, hello, _):
        assert hello.node == "node-a"
        assert [(e.name, e.model, e.kind, e.max_inflight) for e in hello.engines] == [
            ("sim", "m7b", "sim", 4)]
        assert "subprocess" in hello.tools
        hb = await sched.recv("heartbeat")
        assert hb.engines["sim"].queued == 0 and hb.engines["sim"].inflight == 0
        # 40 chars -> 10 tokens (ceil(chars/4)); chat adds 4 per message
        await sched.send(submit("r1", [1.0], prompt="y" * 41, max_tokens=7))
        await sched.send(submit("r2", [1.0], prompt="z" * 8, max_tokens=3, endpoint="chat"))
        done = {m.request_id: m for m in await sched.collect({"done", "failed"}, 2)}
        assert (done["r1"].input_tokens, done["r1"].output_tokens) == (11, 7)
        assert (done["r2"].input_tokens, done["r2"].output_tokens) == (2 + 4, 3)
        assert len(done["r1"].text.split()) == 7
        assert done["r1"].engine == "sim" and done["r1"].finish_reason == "length"
        assert done["r1"].service_s > 0


async def test_streaming_tokens_add_up_to_the_done_message():
    async with running([sim(time_scale=1.0)]) as (sched, _, _, _):
        await sched.send(submit("s", [0.0], max_tokens=12, stream=True))
        msgs: list = []
        while not msgs or msgs[-1].type != "done":
            msgs += await sched.collect({"token", "done"}, 1)
        toks = [m for m in msgs if m.type == "token"]
        assert len(toks) >= 2
        assert sum(t.n_tokens for t in toks) == msgs[-1].output_tokens == 12
        assert "".join(t.text for t in toks) == msgs[-1].text


async def test_rekey_changes_release_order_when_window_is_saturated():
    async with running([sim(max_inflight=1, time_scale=1.0)]) as (sched, _, _, released):
        await sched.send(submit("busy", [0.0], max_tokens=30))  # ~0.35 s in the only slot
        for i, k in enumerate([1.0, 2.0, 3.0, 4.0]):
            await sched.send(submit(f"q{i}", [k, float(i)], max_tokens=2))
        await asyncio.sleep(0.05)
        assert released == ["busy"]
        # q3's run gets a better rank than everything queued; q0 becomes the worst
        await sched.send(P.Rekey(keys={"q3": [0.5, 3.0], "q0": [9.0, 0.0], "ghost": [0.0]}))
        done = await sched.collect({"done"}, 5)
        assert [m.request_id for m in done] == ["busy", "q3", "q1", "q2", "q0"]
        assert released == ["busy", "q3", "q1", "q2", "q0"]
        assert done[1].queue_s < done[-1].queue_s


async def test_without_rekey_release_follows_submitted_keys():
    async with running([sim(max_inflight=1, time_scale=10.0)]) as (sched, _, _, released):
        await sched.send(submit("busy", [0.0], max_tokens=20))
        for rid, k in [("a", 3.0), ("b", 1.0), ("c", 2.0)]:
            await sched.send(submit(rid, [k], max_tokens=2))
        await sched.collect({"done"}, 4)
        assert released == ["busy", "b", "c", "a"]


async def test_cancel_drops_queued_and_aborts_inflight():
    engine = sim(max_inflight=1, time_scale=1.0)
    async with running([engine]) as (sched, _, _, released):
        await sched.send(submit("long", [0.0], max_tokens=2000))  # ~25 s if not aborted
        await sched.send(submit("queued", [1.0], max_tokens=2))
        await sched.send(submit("after", [2.0], max_tokens=2))
        await asyncio.sleep(0.1)
        await sched.send(P.Cancel(request_ids=["queued"]))
        f = await sched.recv("failed")
        assert f.request_id == "queued" and f.error == "cancelled"
        await sched.send(P.Cancel(request_ids=["long"]))
        msgs = await sched.collect({"failed", "done"}, 2, timeout=5)
        assert [(m.type, m.request_id) for m in msgs] == [("failed", "long"), ("done", "after")]
        assert "queued" not in released
        assert "long" not in engine.core.requests  # aborted in the engine, KV freed
        assert engine.core.kv_used == 0


async def test_engine_choice_by_model_and_unknown_model_fails():
    a = SimEngine(name="a", model="alpha", time_scale=50)
    b = SimEngine(name="b", model="beta", time_scale=50)
    b.load_lora("beta-lora")
    async with running([a, b]) as (sched, _, hello, _):
        assert {e.name: e.loras for e in hello.engines} == {"a": [], "b": ["beta-lora"]}
        await sched.send(submit("x", [0.0], model="beta-lora"))
        await sched.send(submit("y", [0.0], model="alpha"))
        await sched.send(submit("z", [0.0], model="gamma"))
        msgs = {m.request_id: m for m in await sched.collect({"done", "failed"}, 3)}
        assert msgs["x"].engine == "b" and msgs["y"].engine == "a"
        assert msgs["z"].type == "failed" and "gamma" in msgs["z"].error
        assert not msgs["z"].retryable


async def test_engine_errors_are_reported_not_fatal():
    cost = get_cost_model().with_overrides(kv_capacity_tokens=100)
    async with running([sim(cost=cost)]) as (sched, _, _, _):
        await sched.send(submit("big", [0.0], prompt="w" * 800, max_tokens=5))
        await sched.sock.send_multipart([sched.node_id, b'{"type": "nonsense"}'])
        await sched.send(submit("ok", [0.0], max_tokens=2))
        msgs = {m.request_id: m for m in await sched.collect({"done", "failed"}, 2)}
        assert msgs["big"].type == "failed" and "capacity" in msgs["big"].error
        assert msgs["ok"].type == "done"


async def test_tool_calls_run_in_key_order_and_report_output():
    tools = ToolRunner(SubprocessSandbox())
    async with running([sim()], tools=tools, tool_concurrency=1) as (sched, _, _, _):
        await sched.send(P.Tool(request_id="t0", run_id="r", unit="u", backend="docker:py",
                                code="import time; time.sleep(0.3)", timeout_s=5, key=[0.0]))
        await sched.send(P.Tool(request_id="late", run_id="r", unit="u", backend="docker:py",
                                code="print('late')", timeout_s=5, key=[5.0]))
        await sched.send(P.Tool(request_id="early", run_id="r", unit="u", backend="docker:py",
                                command=["sh", "-c", "echo early; exit 4"], timeout_s=5,
                                key=[1.0]))
        msgs = await sched.collect({"tool_done"}, 3)
        assert [m.request_id for m in msgs] == ["t0", "early", "late"]
        assert (msgs[1].stdout, msgs[1].exit_code) == ("early\n", 4)
        assert msgs[2].stdout == "late\n" and msgs[2].queue_s >= 0.25


async def test_in_process_over_inproc_with_shared_context():
    """The `hermes serve` embedding: shared zmq.asyncio.Context and an inproc address."""
    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(P.INPROC_ADDRESS)
    agent = HermesLet("local", P.INPROC_ADDRESS, [sim(time_scale=50)], ctx=ctx)
    task = asyncio.create_task(agent.run())
    try:
        ident, frame = await asyncio.wait_for(router.recv_multipart(), 5)
        assert ident == b"local" and P.decode(frame).type == "hello"
        await router.send_multipart([ident, P.encode(submit("i", [0.0], max_tokens=3))])
        while True:
            _, frame = await asyncio.wait_for(router.recv_multipart(), 5)
            msg = P.decode(frame)
            if msg.type == "done":
                break
        assert msg.request_id == "i" and msg.output_tokens == 3
    finally:
        agent.stop()
        await asyncio.wait_for(task, 5)
        router.close(linger=0)
        ctx.term()


def gated_sim(gate: bool) -> SimEngine:
    """A built-in engine with 4,000 KV tokens; with ``gate``, the node's KV gate at that."""
    eng = sim(max_inflight=4, time_scale=1.0,
              cost=get_cost_model("llama2-7b-a100").with_overrides(kv_capacity_tokens=4_000))
    if gate:
        eng.set_kv_gate()
    return eng


async def test_kv_gate_holds_a_prompt_until_it_fits_and_keeps_the_order():
    async with running([gated_sim(True)]) as (sched, _, _, released):
        await sched.send(submit("a", [0.0], prompt="x" * 10_000, max_tokens=40))  # 2,500 tok
        await sched.send(submit("b", [1.0], prompt="x" * 10_000, max_tokens=5))
        await sched.send(submit("c", [2.0], prompt="x" * 400, max_tokens=5))  # 100 tokens
        await asyncio.sleep(0.05)
        # b does not fit beside a (2,500 + 2,500 > 4,000); c would, but waits behind b
        assert released == ["a"]
        done = {m.request_id: m for m in await sched.collect({"done"}, 3)}
        assert released == ["a", "b", "c"]
        assert done["b"].queue_s > 0.05


async def test_without_the_kv_gate_the_window_releases_by_count():
    async with running([gated_sim(False)]) as (sched, _, _, released):
        await sched.send(submit("a", [0.0], prompt="x" * 10_000, max_tokens=40))
        await sched.send(submit("b", [1.0], prompt="x" * 10_000, max_tokens=5))
        await sched.send(submit("c", [2.0], prompt="x" * 400, max_tokens=5))
        await asyncio.sleep(0.05)
        assert released == ["a", "b", "c"]
        await sched.collect({"done"}, 3)


async def test_kv_gate_counts_the_gateways_prompt_estimate():
    """``Submit.prompt_tokens`` (the gateway's estimate) is what the gate counts."""
    async with running([gated_sim(True)]) as (sched, _, _, released):
        await sched.send(submit("a", [0.0], prompt="x" * 400, max_tokens=40).model_copy(
            update={"prompt_tokens": 3_000}))
        await sched.send(submit("b", [1.0], prompt="x" * 400, max_tokens=5).model_copy(
            update={"prompt_tokens": 1_500}))
        await asyncio.sleep(0.05)
        assert released == ["a"]
        await sched.collect({"done"}, 2)
        assert released == ["a", "b"]


VLLM_METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2271"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
"""


async def test_kv_gate_budget_from_vllm_metrics_or_given() -> None:
    """An OpenAI-compatible engine learns its KV capacity from vLLM's ``cache_config_info``
    (GPU blocks x block size): a gate asked for without a budget starts then; an adapter
    that can never know it needs one."""
    from hermeslet.engines.base import EngineAdapter
    from hermeslet.engines.openai_http import OpenAIHTTPEngine, parse_prometheus_load

    m = parse_prometheus_load(VLLM_METRICS)
    assert m.kv_capacity_tokens == 2271 * 16 and m.kv_usage == 0.25
    assert parse_prometheus_load(VLLM_METRICS.replace('num_gpu_blocks="2271"',
                                                      'num_gpu_blocks="None"')).kv_capacity_tokens is None
    eng = OpenAIHTTPEngine("http://127.0.0.1:9", name="ext", model="m")
    eng.set_kv_gate()
    assert eng.kv_gate_pending and eng.kv_gate_tokens is None  # not known yet: no gate yet
    eng.last_metrics = m  # as a heartbeat's /metrics read left it (the server is not there)
    await eng.metrics()
    assert not eng.kv_gate_pending and eng.kv_gate_tokens == 2271 * 16
    eng.set_kv_gate(30_000)
    assert eng.kv_gate_tokens == 30_000
    with pytest.raises(ValueError, match="must be >= 1"):
        eng.set_kv_gate(0)
    assert gated_sim(True).kv_gate_tokens == 4_000

    class Opaque(EngineAdapter):
        kind = "openai"

        def generate(self, *a, **k):  # noqa: ANN002, ANN003, ANN202
            raise NotImplementedError

    with pytest.raises(ValueError, match="opaque: the KV gate needs a budget"):
        Opaque(name="opaque", model="m").set_kv_gate()


def test_hermeslet_run_kv_gate_flags() -> None:
    """``hermeslet run --kv-gate [--kv-gate-tokens N]`` gives every engine the gate."""
    from hermeslet.cli import _parser, build_agent

    def budgets(*flags: str) -> list[int | None]:
        args = _parser().parse_args(["run", "--scheduler", "tcp://127.0.0.1:1",
                                     "--setup", "llama2-7b-a100", *flags])
        return [s.engine.kv_gate_tokens for s in build_agent(args).slots.values()]

    assert budgets() == [None]
    assert budgets("--kv-gate") == [get_cost_model("llama2-7b-a100").kv_capacity_tokens]
    assert budgets("--kv-gate-tokens", "12000") == [12_000]


async def test_place_message_re_places_the_named_models_only_when_accepted() -> None:
    """A ``place`` plan: a node started without a builder ignores it (its hello says it does
    not take plans); one with a builder starts the plan's engines, drains its own engine of a
    model the plan names and keeps the others."""
    from hermes.plan.placement import emit_placement, parse_services, place
    from hermeslet.placement import build_engines

    services = parse_services([{"name": "m7b", "model": "llama-2-7b", "rate": 1.0}])
    plan, score = place(services, 1, "A100-80", tps=(1,))
    doc = emit_placement(services, plan, "A100-80", 1, score)
    async with running([sim(), sim().__class__(name="other", model="m13b")]) as (
            sched, agent, hello, _):
        assert hello.placement is False
        await agent.handle(P.Place(plan=doc))
        await asyncio.sleep(0.1)
        assert set(agent.slots) == {"sim", "other"}  # ignored
    async with running([sim(), sim().__class__(name="other", model="m13b")],
                       placement_builder=lambda ls: build_engines(ls, "sim", time_scale=20.0)
                       ) as (sched, agent, hello, _):
        assert hello.placement is True
        await agent.handle(P.Place(plan=doc))
        again = await sched.recv("hello", 10,
                                 pred=lambda m: {e.name for e in m.engines} == {"g0-m7b", "other"})
        assert {(e.name, e.model) for e in again.engines} == {("g0-m7b", "m7b"), ("other", "m13b")}


def test_hermeslet_run_accept_placement_flag() -> None:
    from hermeslet.cli import _parser, build_agent

    base = ["run", "--scheduler", "tcp://127.0.0.1:1"]
    assert build_agent(_parser().parse_args(base)).hello().placement is False
    agent = build_agent(_parser().parse_args([*base, "--accept-placement"]))
    assert agent.hello().placement is True and agent.placement_builder is not None
    # --kv-gate reaches the engines a plan starts later too
    from hermes.plan.placement import emit_placement, parse_services, place
    from hermeslet.placement import parse_placement

    services = parse_services([{"name": "m7b", "model": "llama-2-7b", "rate": 1.0}])
    plan, score = place(services, 1, "A100-80", tps=(1,))
    launches = parse_placement(emit_placement(services, plan, "A100-80", 1, score))
    gated = build_agent(_parser().parse_args([*base, "--accept-placement", "--kv-gate"]))
    assert gated.placement_builder is not None
    (eng,) = gated.placement_builder(launches)
    assert eng.kv_gate_tokens == eng.kv_capacity_tokens() > 0


async def test_a_stop_ends_a_task_that_outlives_its_first_cancel(monkeypatch) -> None:  # noqa: ANN001
    """The node's stop cancels its tasks again until they end: a loop that goes on after a
    cancel (Python 3.11's ``asyncio.wait_for`` returns a result that completed as the cancel
    came, losing it) does not keep the node from stopping."""
    import hermeslet.agent as agent_mod

    ctx = zmq.asyncio.Context()
    agent = HermesLet("stopper", "tcp://127.0.0.1:1", [sim()], ctx=ctx)
    cancels = 0

    async def stubborn() -> None:
        nonlocal cancels
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancels += 1
                if cancels == 1:
                    continue  # the first cancel is lost, as wait_for lost it
                raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    monkeypatch.setattr(agent_mod, "CANCEL_WAIT_S", 0.05)
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(agent._shutdown([task]), 5)
    finally:
        ctx.term()
    assert task.cancelled() and cancels == 2
    assert time.monotonic() - t0 < 1.0

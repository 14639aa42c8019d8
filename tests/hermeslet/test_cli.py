"""`hermeslet run` as a separate process over TCP, with a sim and an HTTP engine."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import pytest
import zmq
import zmq.asyncio

from tests.hermeslet.test_agent import FakeScheduler, submit

pytestmark = pytest.mark.timeout(60)


async def test_hermeslet_run_process(sim_url):
    ctx = zmq.asyncio.Context()
    sched = FakeScheduler(ctx)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermeslet.cli", "run", "--scheduler", sched.address,
         "--node", "cli-node", "--engine", "sim", "--engine", f"openai:{sim_url}",
         "--model", "sim-7b", "--max-inflight", "3", "--time-scale", "50"],
        stderr=subprocess.PIPE,
    )
    try:
        hello = await sched.recv("hello", timeout=20)
        assert hello.node == "cli-node"
        assert [(e.name, e.kind, e.max_inflight) for e in hello.engines] == [
            ("sim0", "sim", 3), ("openai1", "openai", 3)]
        for i in range(6):
            eng = "sim0" if i % 2 else "openai1"
            msg = submit(f"r{i}", [float(i)], model="sim-7b", max_tokens=i + 1)
            await sched.send(msg.model_copy(update={"engine": eng}))
        done = await sched.collect({"done", "failed"}, 6)
        got = {m.request_id: (m.type, m.engine, m.output_tokens) for m in done}
        assert got == {f"r{i}": ("done", "sim0" if i % 2 else "openai1", i + 1)
                       for i in range(6)}
        hb = await sched.recv("heartbeat")
        assert set(hb.engines) == {"sim0", "openai1"}
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 10)
        sched.sock.close(linger=0)
        ctx.term()
    assert rc == 0, proc.stderr.read().decode()


@pytest.mark.parametrize("argv, says", [
    (["--tool-concurrency", "0"], "argument --tool-concurrency: expected a positive integer"),
    (["--heartbeat-s", "0"], "argument --heartbeat-s: expected a number > 0, got '0'"),
    (["--max-inflight", "0"], "argument --max-inflight: expected a positive integer"),
    (["--kv-gate", "--kv-gate-tokens", "-3"], "argument --kv-gate-tokens: expected a positive"),
    (["--time-scale", "inf"], "argument --time-scale: expected a number > 0, got 'inf'"),
    (["--max-loras", "0"], "argument --max-loras: expected a positive integer"),
])
def test_hermeslet_run_refuses_values_it_cannot_run_with(argv, says, capsys):
    """A node started with no tool slots (its tool calls would wait for ever) or a zero
    heartbeat (a busy loop) is refused at the command line, exit 2, the flag named."""
    from hermeslet.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["run", *argv])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_hermeslet_run_messages_api_native_for_openai_engines() -> None:
    """``--messages-api native``: an openai engine serves Anthropic's /v1/messages as sent;
    a sim engine beside it still gets it translated."""
    from hermeslet.cli import _parser, build_agent

    args = _parser().parse_args(["run", "--engine", "openai:http://127.0.0.1:9",
                                 "--engine", "sim", "--messages-api", "native"])
    agent = build_agent(args)
    by_kind = {s.engine.kind: s.engine.native_endpoints for s in agent.slots.values()}
    assert by_kind == {"openai": frozenset({"messages"}), "sim": frozenset()}
    plain = build_agent(_parser().parse_args(["run", "--engine", "openai:http://127.0.0.1:9"]))
    assert [s.engine.native_endpoints for s in plain.slots.values()] == [frozenset()]

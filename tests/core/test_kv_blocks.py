"""Block hashing as vLLM's prefix cache does it (issue 19), and the built-in tokenizer."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
from pathlib import Path

import pytest

from hermes.core.kv_blocks import (
    DEFAULT_NONE_HASH_SEED,
    BlockHashing,
    builtin_chat_token_ids,
    builtin_message_token_ids,
    builtin_text_token_ids,
    external_hash,
)

VLLM_PY = Path(os.environ.get("HERMES_VLLM_PYTHON",
                              "/root/.cache/hermes-vllm/venv/bin/python"))


def _sha(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def test_chain_follows_vllm_rule_by_hand() -> None:
    h = BlockHashing(block_size=2)
    none = _sha(DEFAULT_NONE_HASH_SEED)
    b0 = _sha((none, (1, 2), None))
    b1 = _sha((b0, (3, 4), None))
    assert h.block_hashes([1, 2, 3, 4, 5]) == [b0, b1]  # the partial last block has none
    assert h.block_hashes([1]) == []
    # a different first block changes every later hash (a chain, not per-block)
    assert h.block_hashes([9, 2, 3, 4])[1] != b1


def test_extra_keys_lora_every_block_salt_first_only() -> None:
    h = BlockHashing(block_size=2)
    none = _sha(DEFAULT_NONE_HASH_SEED)
    lora = ("lora", "ad", "/p")
    b0 = _sha((none, (1, 2), (lora, ("cache_salt", "s"))))
    b1 = _sha((b0, (3, 4), (lora,)))
    assert h.block_hashes([1, 2, 3, 4], lora=("ad", "/p"), cache_salt="s") == [b0, b1]


def test_seed_changes_hashes_and_external_is_low_64_bits() -> None:
    a = BlockHashing(block_size=2).block_hashes([1, 2])[0]
    b = BlockHashing(block_size=2, seed="42").block_hashes([1, 2])[0]
    assert a != b
    assert external_hash(a) == int.from_bytes(a[-8:], "big")
    assert BlockHashing(block_size=2).external_hashes([1, 2]) == [external_hash(a)]


def test_bad_config_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="block_size"):
        BlockHashing(block_size=0)
    with pytest.raises(ValueError, match="xxhash"):
        BlockHashing(hash_algo="xxhash")


def test_builtin_tokenizer_counts_as_the_engine_does() -> None:
    from hermeslet.engines.sim_output import prompt_tokens  # the built-in engine's own count

    text = "You are a helpful assistant for tests."
    ids = builtin_text_token_ids(text)
    assert len(ids) == -(-len(text) // 4)
    assert ids == builtin_text_token_ids(text)  # deterministic
    assert all(16 <= t < 32_000 for t in ids)
    msgs = [{"role": "system", "content": text}, {"role": "user", "content": "hi there"}]
    n, prefix, prefix_n = prompt_tokens("chat", {"messages": msgs})
    toks = builtin_chat_token_ids(msgs)
    assert len(toks) == n  # the engine's own count
    assert prefix == text and len(builtin_message_token_ids("system", text)) == prefix_n
    assert builtin_chat_token_ids(msgs, max_tokens=5) == toks[:5]
    # roles are distinct tokens: the same text as user is another prompt
    assert builtin_message_token_ids("user", text) != builtin_message_token_ids("system", text)


_VLLM_SCRIPT = r"""
import json, sys
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils as u
args = json.loads(sys.argv[1])
fn = get_hash_fn_by_name(args["algo"])
u.init_none_hash(fn)
out, parent = [], None
toks, bs = args["tokens"], args["block_size"]
for i in range(0, len(toks) - bs + 1, bs):
    keys = []
    if args.get("lora"):
        keys.append(("lora", *args["lora"]))
    if i == 0 and args.get("salt"):
        keys.append(("cache_salt", args["salt"]))
    parent = u.hash_block_tokens(fn, parent, toks[i:i + bs], tuple(keys) or None)
    out.append(u.maybe_convert_block_hash(parent))
print(json.dumps(out))
"""


@pytest.mark.parametrize("case", [
    {"algo": "sha256", "block_size": 16, "tokens": list(range(100, 150))},
    {"algo": "sha256", "block_size": 4, "tokens": list(range(10)), "lora": ["a", "/x"],
     "salt": "tenant-1"},
])
def test_hashes_equal_vllms_own(case: dict) -> None:
    """vLLM's own functions (its venv, in a subprocess) give the same int block hashes."""
    if not VLLM_PY.exists():
        pytest.skip(f"no vLLM venv at {VLLM_PY}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    proc = subprocess.run([str(VLLM_PY), "-c", _VLLM_SCRIPT, json.dumps(case)],
                          capture_output=True, text=True, timeout=240, env=env)
    if proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr:
        pytest.skip("vllm is not importable there")
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    lora = tuple(case["lora"]) if case.get("lora") else None
    ours = BlockHashing(block_size=case["block_size"], hash_algo=case["algo"]).external_hashes(
        case["tokens"], lora=lora, cache_salt=case.get("salt"))
    assert ours == theirs and len(ours) == len(case["tokens"]) // case["block_size"]

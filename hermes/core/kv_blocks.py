"""Prefix-cache block hashes as vLLM computes them, and the built-in engine's token ids.

vLLM's prefix cache (v1, ``--enable-prefix-caching``) names each *full* block of
``block_size`` prompt tokens by a chained hash: block ``i``'s hash is ``hash_fn((parent,
tuple(token_ids of block i), extra_keys))`` where ``parent`` is block ``i-1``'s hash, and for
the first block ``NONE_HASH = hash_fn(seed)``. ``hash_fn`` is ``--prefix-caching-hash-algo``:
``sha256`` (the default: SHA-256 of the object's pickle at the highest protocol) or
``sha256_cbor`` (SHA-256 of its canonical CBOR; needs ``cbor2``). The seed is
``PYTHONHASHSEED`` when the engine's process has one, else (for those cryptographic
algorithms, vLLM 0.32) the fixed ``"vllm-none-hash"``; vLLM's non-cryptographic ``xxhash``
algorithms use a random per-process seed and cannot be reproduced (refused here).
``extra_keys`` is ``None`` for a plain text request; a LoRA request adds ``("lora", name,
path)`` to every block and a ``cache_salt`` adds ``("cache_salt", salt)`` to the first block.
vLLM's KV events carry a block's hash as the low 64 bits of the digest read big-endian
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, its default): :func:`external_hash`.

So a prompt's token ids are enough to name the blocks any engine with the same block size,
algorithm and seed would hold for it (:meth:`BlockHashing.block_hashes`), and a router can
look them up in that engine's block index before it sends the request.

The gateway has no tokenizer. The built-in engine (``hermeslet``'s ``sim`` engine) therefore
tokenizes with a rule the gateway can repeat (:func:`builtin_chat_token_ids`): per chat
message four template tokens (start, role, two separators) then one token per four characters
of its text (the engine's own count: ``ceil(chars / 4) + 4`` per message), each token id a
hash of its four characters. For other engines the gateway only knows a prompt's token ids
when the request carries them (a completion prompt of token ids).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

#: vLLM's NONE_HASH seed for cryptographic algorithms without ``PYTHONHASHSEED`` (0.32)
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
#: vLLM's default ``block_size``
DEFAULT_BLOCK_SIZE = 16
#: the algorithms whose hashes can be reproduced outside the engine
HASH_ALGOS = ("sha256", "sha256_cbor")

#: the built-in tokenizer: characters per token, template tokens per chat message
BUILTIN_CHARS_PER_TOKEN = 4
BUILTIN_TEMPLATE_TOKENS = 4
#: the built-in tokenizer's vocabulary: ids below ``_BUILTIN_SPECIAL`` are template tokens
BUILTIN_VOCAB = 32_000
_BUILTIN_SPECIAL = 16
_MSG_START, _MSG_SEP = 1, 2
_ROLE_IDS = {"system": 3, "user": 4, "assistant": 5, "tool": 6, "developer": 7, "function": 8}
_OTHER_ROLE = 9


def _sha256_pickle(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    try:  # an optional dependency: only engines run with sha256_cbor need it
        cbor2 = importlib.import_module("cbor2")
    except ImportError:
        raise ValueError("hash_algo 'sha256_cbor' needs the cbor2 package "
                         "(pip install cbor2)") from None
    digest: bytes = hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()
    return digest


_HASH_FNS: dict[str, Callable[[Any], bytes]] = {"sha256": _sha256_pickle,
                                               "sha256_cbor": _sha256_cbor}


def external_hash(block_hash: bytes) -> int:
    """A block hash as vLLM's KV events carry it: the digest's low 64 bits (big-endian)."""
    return int.from_bytes(block_hash, "big") & 0xFFFF_FFFF_FFFF_FFFF


@dataclass(frozen=True, slots=True)
class BlockHashing:
    """How an engine names its prefix-cache blocks: ``block_size`` tokens a block, vLLM's
    ``hash_algo`` and NONE_HASH ``seed`` (the engine's ``PYTHONHASHSEED``, or vLLM's fixed
    default)."""

    block_size: int = DEFAULT_BLOCK_SIZE
    hash_algo: str = "sha256"
    seed: str = DEFAULT_NONE_HASH_SEED
    _none: list[bytes] = field(default_factory=list, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive int, not {self.block_size!r}")
        if self.hash_algo not in _HASH_FNS:
            raise ValueError(f"hash_algo {self.hash_algo!r} cannot be reproduced outside the "
                             f"engine; use one of {', '.join(HASH_ALGOS)}")

    @property
    def none_hash(self) -> bytes:
        """The first block's parent: ``hash_fn(seed)``."""
        if not self._none:
            self._none.append(_HASH_FNS[self.hash_algo](self.seed))
        return self._none[0]

    def hash_block(self, parent: bytes | None, token_ids: Sequence[int],
                   extra_keys: tuple[Any, ...] | None = None) -> bytes:
        """One block's hash from its parent's (``None``: the first block)."""
        return _HASH_FNS[self.hash_algo](
            (parent or self.none_hash, tuple(token_ids), extra_keys))

    def iter_hashes(self, token_ids: Sequence[int], *, lora: tuple[str, str] | None = None,
                    cache_salt: str | None = None) -> Iterator[bytes]:
        """The hashes of the full blocks of ``token_ids``, first block first, computed as they
        are taken (a caller that stops early pays only for the blocks it read).

        ``lora``: the request's adapter ``(name, path)``; ``cache_salt``: its salt."""
        lora_keys: tuple[Any, ...] = (("lora", lora[0], lora[1]),) if lora else ()
        salt_keys: tuple[Any, ...] = (("cache_salt", cache_salt),) if cache_salt else ()
        bs = self.block_size
        parent: bytes | None = None
        for i, start in enumerate(range(0, len(token_ids) - bs + 1, bs)):
            keys = lora_keys + (salt_keys if i == 0 else ())
            parent = self.hash_block(parent, token_ids[start:start + bs], keys or None)
            yield parent

    def block_hashes(self, token_ids: Sequence[int], *, lora: tuple[str, str] | None = None,
                     cache_salt: str | None = None) -> list[bytes]:
        """All full blocks' hashes of ``token_ids`` (a partial last block has none)."""
        return list(self.iter_hashes(token_ids, lora=lora, cache_salt=cache_salt))

    def external_hashes(self, token_ids: Sequence[int], **kw: Any) -> list[int]:
        """:meth:`block_hashes` in the KV events' integer form."""
        return [external_hash(h) for h in self.iter_hashes(token_ids, **kw)]


# ----------------------------------------------------------------------------------------------
# the built-in engine's tokenizer
# ----------------------------------------------------------------------------------------------


def builtin_text_token_ids(text: str) -> list[int]:
    """One token id per four characters of ``text`` (a hash of those characters)."""
    n = BUILTIN_CHARS_PER_TOKEN
    out = []
    for i in range(0, len(text), n):
        d = hashlib.blake2b(text[i:i + n].encode(), digest_size=4).digest()
        out.append(_BUILTIN_SPECIAL + int.from_bytes(d, "big") % (BUILTIN_VOCAB - _BUILTIN_SPECIAL))
    return out


def builtin_message_text(message: Any) -> str:
    """The text of a chat message as the built-in engine counts it: its content (a string or
    the ``text`` of its parts), then its tool calls' JSON."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and isinstance(p.get("text", ""), str))
    else:
        text = ""
    for key in ("tool_calls", "function_call"):
        if message.get(key):
            text += json.dumps(message[key], separators=(",", ":"))
    return text


def builtin_message_token_ids(role: str, text: str) -> list[int]:
    """A chat message's tokens: ``[start, role, sep, sep]`` then its text's."""
    head = [_MSG_START, _ROLE_IDS.get(role, _OTHER_ROLE), _MSG_SEP, _MSG_SEP]
    return head + builtin_text_token_ids(text)


def builtin_chat_token_ids(messages: Sequence[Any], *, max_tokens: int | None = None) -> list[int]:
    """A chat prompt's tokens (OpenAI messages), stopping once ``max_tokens`` are reached."""
    out: list[int] = []
    for m in messages:
        role = m.get("role") if isinstance(m, dict) else None
        out += builtin_message_token_ids(role if isinstance(role, str) else "",
                                         builtin_message_text(m))
        if max_tokens is not None and len(out) >= max_tokens:
            return out[:max_tokens]
    return out

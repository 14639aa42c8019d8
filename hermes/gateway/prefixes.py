"""The prompt prefixes of an OpenAI request, as the router's prefix index keys them.

A chat request's prefixes are its message lists ``messages[:1]``, ``messages[:2]``, ...: each
keyed by a rolling BLAKE2b digest over the canonical messages
(:func:`hermes.gateway.resolve.canon.canonical_message`, the system prompt included: engines
cache it) with the prompt tokens it spans (``ceil(chars / 4) + 4`` per message, the built-in
engine's count). An agent's next turn repeats its previous request's messages plus the reply,
so its longest indexed prefix is the previous request's prompt. A completion's prompt is cut
into 1,024-character blocks, chained the same way.

For an engine that publishes KV events (issue 19) the router looks the prompt up exactly, by
vLLM's block hashes of its token ids (:func:`prompt_token_ids`). Pure: no I/O.
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Any

from hermes.core.kv_blocks import builtin_chat_token_ids, builtin_text_token_ids
from hermes.core.routing import PrefixKey
from hermes.gateway.resolve.canon import canonical_message

#: characters per block of a completion prompt
PROMPT_BLOCK_CHARS = 1024


def shared_prefix(body: dict[str, Any]) -> str | None:
    """The prompt prefix a unit's requests share, as KV prefix prewarming prefills it: the
    system message of a chat request that has more than that message (else ``None``). An
    edge sends it with each call, so that the scheduler does not read the body."""
    msgs = body.get("messages")
    if isinstance(msgs, list) and len(msgs) > 1 and isinstance(msgs[0], dict):
        first = msgs[0]
        if first.get("role") == "system" and isinstance(first.get("content"), str):
            content: str = first["content"]
            return content
    return None


def prompt_prefixes(endpoint: str, body: dict[str, Any]) -> list[PrefixKey]:
    """``[(digest, cumulative prompt tokens)]`` of the request's prefixes, shortest first."""
    h = blake2b(digest_size=16, person=b"hermes-prefix")
    out: list[PrefixKey] = []
    tokens = 0
    if endpoint == "chat":
        msgs = body.get("messages")
        for m in msgs if isinstance(msgs, list) else ():
            b = canonical_message(m)
            h.update(b)
            tokens += (len(b) + 3) // 4 + 4
            out.append((h.copy().digest(), tokens))
        return out
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return out
    for i in range(0, len(prompt), PROMPT_BLOCK_CHARS):
        block = prompt[i:i + PROMPT_BLOCK_CHARS]
        h.update(block.encode())
        tokens += (len(block) + 3) // 4
        out.append((h.copy().digest(), tokens))
    return out


def prompt_token_ids(endpoint: str, body: dict[str, Any], tokenizer: str | None) -> list[int] | None:
    """The prompt's token ids as an engine tokenizing with ``tokenizer`` sees them: a prompt
    given as token ids for any engine; a chat or text prompt for the built-in tokenizer
    (``"builtin"``, :mod:`hermes.core.kv_blocks`); None when the gateway cannot know them."""
    if endpoint == "chat":
        msgs = body.get("messages")
        if tokenizer == "builtin" and isinstance(msgs, list):
            return builtin_chat_token_ids(msgs)
        return None
    ids = body.get("prompt_token_ids")
    prompt = body.get("prompt") if ids is None else ids
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list | str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    if isinstance(prompt, str) and tokenizer == "builtin":
        return builtin_text_token_ids(prompt)
    return None

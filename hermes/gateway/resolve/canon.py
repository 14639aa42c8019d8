"""Canonical form of chat messages and the rolling digests of a conversation.

Conversation continuation (issue 17) asks: does this request's message list begin with a
conversation Hermes answered (its messages plus the reply Hermes returned)? Both sides are
reduced to digests of message prefixes, so the answer is one dictionary lookup per candidate
prefix: O(messages), whatever the number of open runs.

What a message contributes (and why):

- ``role``, ``content``, each tool call's ``id``, ``function.name`` and ``function.arguments``,
  ``tool_call_id`` (and ``name`` of a legacy ``function`` message): what the client sends back
  of what Hermes returned. Everything else (``refusal``, ``reasoning_content``, ``annotations``,
  provider extensions) is ignored: frameworks drop or rewrite it when they send history back.
- Normalised so that the same message echoed by different frameworks gives the same bytes:
  ``None`` content is ``""``; content of text parts only is their text (LangChain and the
  Agents SDK send parts where the reply had a string); content is stripped; tool-call
  arguments lose their whitespace, and ``\\uXXXX`` escapes are decoded first (LangChain parses
  the arguments and re-serialises them with ``json.dumps``: other spacing, ASCII escapes).
- ``system`` and ``developer`` messages are left out of the digests: agent frameworks rewrite
  the instructions between turns (a handoff to another agent keeps the history under the new
  agent's instructions; dynamic instructions carry the date or memory), and the Responses API
  does not carry ``instructions`` over ``previous_response_id``. The instructions still decide
  the app and the unit (:mod:`hermes.gateway.resolve.templates`).

Each field is length-prefixed, so no content can forge a message boundary. The digest is
BLAKE2b-128 seeded with the tenant: two tenants' identical conversations have unrelated keys,
and the digests are stable across processes (an index can be stored and reloaded).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from hashlib import blake2b
from typing import Any

#: roles left out of conversation digests (see the module docstring)
INSTRUCTION_ROLES = frozenset(("system", "developer"))
_TEXT_PARTS = frozenset(("text", "input_text", "output_text"))


def content_text(content: Any) -> str:
    """A message's content as one string: text parts joined, anything else (images, audio)
    as canonical JSON. Not stripped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out: list[str] = []
        for part in content:
            if (isinstance(part, dict) and part.get("type") in _TEXT_PARTS
                    and isinstance(part.get("text"), str)):
                out.append(part["text"])
            else:
                return json.dumps(content, sort_keys=True, separators=(",", ":"),
                                  ensure_ascii=False)
        return "".join(out)
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


def canonical_arguments(args: Any) -> str:
    """Tool-call arguments as compared across echoes: JSON text without whitespace, with
    ``\\u`` escapes decoded (an object given as such is serialised first)."""
    if not isinstance(args, str):
        args = json.dumps(args, separators=(",", ":"), ensure_ascii=False, default=str)
    elif "\\u" in args:
        try:
            args = json.dumps(json.loads(args), separators=(",", ":"), ensure_ascii=False)
        except ValueError:
            pass
    return "".join(args.split())


def _field(s: str) -> str:
    return f"{len(s)}:{s}"


def canonical_message(msg: Any) -> bytes:
    """The bytes a message contributes to conversation digests (module docstring)."""
    if not isinstance(msg, dict):
        return _field(json.dumps(msg, sort_keys=True, default=str)).encode()
    role = msg.get("role")
    if not isinstance(role, str):
        role = ""
    content = msg.get("content")
    text = (content if isinstance(content, str) else content_text(content)).strip()
    out = f"{len(role)}:{role}{len(text)}:{text}"
    calls = msg.get("tool_calls")
    if calls and isinstance(calls, list):
        for call in calls:
            if not isinstance(call, dict):
                continue
            fn = call.get("function")
            if not isinstance(fn, dict):
                fn = {}
            cid = str(call.get("id") or "")
            name = str(fn.get("name") or "")
            args = canonical_arguments(fn.get("arguments") or "")
            out += f"c{len(cid)}:{cid}{len(name)}:{name}{len(args)}:{args}"
    call_id = msg.get("tool_call_id")
    if call_id:
        cid = str(call_id)
        out += f"t{len(cid)}:{cid}"
    if role == "function" and msg.get("name"):
        out += "n" + _field(str(msg["name"]))
    return out.encode()


def conversation_hasher(tenant: str) -> Any:
    """A fresh rolling hasher for one tenant's conversations (BLAKE2b-128, tenant first)."""
    h = blake2b(digest_size=16, person=b"hermes-conv")
    h.update(_field(tenant).encode())
    return h


#: what marks an *asked* digest (a request's messages without the reply): it can never equal
#: the digest of a message sequence, whose fields all begin with a length
_ASKED = b"\x00asked"


def conversation_digests(tenant: str, messages: Sequence[Any]) -> tuple[Any, list[bytes]]:
    """Hash a request's messages in one pass.

    Returns the hasher after the last message (the edge extends a copy of it with the reply
    Hermes returns: :func:`answered_digest`) and the digests of the *proper* prefixes that end
    with an assistant message, shortest first: the only prefixes that can be an answered
    conversation (which always ends with the reply) continued by this request.
    """
    h, candidates, _ = conversation_prefixes(tenant, messages)
    return h, candidates


def conversation_prefixes(tenant: str, messages: Sequence[Any], *, max_splits: int = 32,
                          max_split_chars: int = 8192) -> tuple[Any, list[bytes], list[bytes]]:
    """:func:`conversation_digests`, plus the *asked* digests (:func:`asked_digest`) of the
    proper prefixes that an assistant message *without structured tool calls* follows,
    shortest first: the requests Hermes may have answered with tool calls that this history
    holds in another form (smolagents rewrites earlier tool calls as assistant text and their
    results as user ``Observation:`` messages, keeping the messages it sent). Last come the
    asked digests of the request with its last user message cut at each of its first
    ``max_splits`` line breaks within ``max_split_chars`` characters (bounded hashing): a client that merges consecutive messages of one role joins
    them with a line break (smolagents appends an ``Error:`` turn to the task turn when a
    step's tool calls failed, and drops the calls)."""
    h = conversation_hasher(tenant)
    candidates: list[bytes] = []
    asked: list[bytes] = []
    last = len(messages) - 1
    seen = False
    before_last = None
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role in INSTRUCTION_ROLES:
            continue
        if role == "assistant" and seen and not msg.get("tool_calls"):
            asked.append(asked_digest(h))
        if i == last and role == "user":
            before_last = h.copy()
        h.update(canonical_message(msg))
        seen = True
        if role == "assistant" and i < last:
            candidates.append(h.copy().digest())
    if before_last is not None and max_splits > 0:
        text = content_text(messages[last].get("content"))
        at = text.find("\n")
        n = 0
        while 0 < at <= max_split_chars and n < max_splits:
            cut = before_last.copy()
            cut.update(canonical_message({"role": "user", "content": text[:at]}))
            asked.append(asked_digest(cut))
            at = text.find("\n", at + 1)
            n += 1
    return h, candidates, asked


def asked_digest(hasher: Any) -> bytes:
    """The digest of a request's conversation as asked (before any reply): another key space
    than :func:`answered_digest`'s (the hasher is copied)."""
    h = hasher.copy()
    h.update(_ASKED)
    digest: bytes = h.digest()
    return digest


def answered_digest(hasher: Any, reply: Any) -> bytes:
    """The digest of a request's conversation followed by ``reply`` (the hasher is copied,
    so one request's hasher serves every choice of an ``n > 1`` answer)."""
    h = hasher.copy()
    h.update(canonical_message(reply))
    digest: bytes = h.digest()
    return digest


def key_digest(tenant: str, kind: str, *values: str) -> bytes:
    """The index key of an explicit id (a session, a response id, an affinity value),
    seeded with the tenant and the kind so that no two namespaces collide."""
    h = blake2b(digest_size=16, person=b"hermes-key")
    h.update(("".join(_field(v) for v in (tenant, kind, *values))).encode())
    return h.digest()

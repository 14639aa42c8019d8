"""What a request says about its own identity, read from its body and headers.

Pure functions over one request (no state, no clock): the chat form of any OpenAI body,
the explicit ids it carries (session ids, weak ids, the tool-call ids it quotes), whether it
carries history, and whether a reply asks for tool calls. The :class:`~hermes.gateway.resolve.resolver.Resolver` weighs
this evidence against what it remembers; the sources of every id are listed in
:mod:`hermes.gateway.resolve`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from hermes.gateway.config import IdentityConfig
from hermes.gateway.resolve.canon import content_text


def request_messages(body: Mapping[str, Any]) -> list[Any]:
    """The chat messages of a chat body, or the equivalent of a Responses body (its
    ``instructions``, ``input`` items: messages, function calls, function call outputs) or
    of a completions ``prompt`` (one user message)."""
    msgs = body.get("messages")
    if isinstance(msgs, list):
        return msgs
    out: list[Any] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    inp = body.get("input", body.get("prompt"))
    if isinstance(inp, str):
        out.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        for item in inp:
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind in (None, "message"):
                out.append({"role": item.get("role", "user"), "content": item.get("content")})
            elif kind == "function_call":
                call = {"id": item.get("call_id"), "type": "function",
                        "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
                if out and out[-1].get("role") == "assistant" and out[-1].get("tool_calls"):
                    out[-1]["tool_calls"].append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                            "content": item.get("output")})
    return out


def asks_tools(reply: Any) -> bool:
    """An assistant reply that calls tools (chat ``tool_calls``, or a Responses
    ``function_call`` output item): its client is expected back with the results."""
    if not isinstance(reply, dict):
        return False
    return bool(reply.get("tool_calls")) or reply.get("type") == "function_call"


def has_history(msgs: Sequence[Any], body: Mapping[str, Any]) -> bool:
    """The request continues something: a ``previous_response_id``, or an assistant or tool
    message in its conversation (a first turn has neither)."""
    if body.get("previous_response_id"):
        return True
    return any(isinstance(m, dict) and m.get("role") in ("assistant", "tool", "function")
               for m in msgs)


def usable_id(v: Any, max_len: int) -> str | None:
    """``v`` stripped, when it is a non-empty string of at most ``max_len`` characters (an
    id longer than that is not evidence: it would only fill the index)."""
    if isinstance(v, str):
        s = v.strip()
        if 0 < len(s) <= max_len:
            return s
    return None


def session_of(body: Mapping[str, Any], headers: Mapping[str, str], cfg: IdentityConfig
               ) -> tuple[str, str] | None:
    """``(source, session id)`` of the first configured session evidence present:
    ``cfg.session_headers`` (``headers`` lower-cased), ``cfg.session_fields`` of the body
    (a ``{"id"}`` object taken by its id), ``cfg.metadata_keys`` of ``metadata``, then the
    session part of a ``metadata.user_id`` / ``user`` carrying ``cfg.user_session_marker``."""
    n = cfg.max_id_len
    # (asked of every header-less request, most of which carry none of these: an absent
    # one costs a look-up, not a call)
    for name in cfg.session_headers:
        raw = headers.get(name)
        if raw is not None and (v := usable_id(raw, n)) is not None:
            return name, v
    for name in cfg.session_fields:
        raw = body.get(name)
        if raw is None:
            continue
        if isinstance(raw, dict):
            raw = raw.get("id")
        v = usable_id(raw, n)
        if v is not None:
            return f"body:{name}", v
    meta = body.get("metadata")
    marker = cfg.user_session_marker
    if isinstance(meta, dict):
        for name in cfg.metadata_keys:
            v = usable_id(meta.get(name), n)
            if v is not None:
                return f"metadata:{name}", v
        uid = meta.get("user_id")
        if marker and isinstance(uid, str) and marker in uid:
            v = usable_id(uid.rsplit(marker, 1)[1], n)
            if v is not None:
                return "metadata:user_id", v
    user = body.get("user")
    if marker and isinstance(user, str) and marker in user:
        v = usable_id(user.rsplit(marker, 1)[1], n)
        if v is not None:
            return "user", v
    return None


def affinity_of(body: Mapping[str, Any], cfg: IdentityConfig) -> tuple[str, str] | None:
    """``(field, id)`` of the first weak id present (``cfg.affinity_fields``: ``user``,
    ``safety_identifier``, ``prompt_cache_key``)."""
    for name in cfg.affinity_fields:
        raw = body.get(name)
        if raw is not None and (v := usable_id(raw, cfg.max_id_len)) is not None:
            return name, v
    return None


def reply_call_ids(reply: Any) -> list[str]:
    """The ids of the tool calls an assistant reply makes (chat ``tool_calls[].id``; a
    Responses ``function_call`` item's ``call_id``)."""
    if not isinstance(reply, dict):
        return []
    if reply.get("type") == "function_call":
        cid = reply.get("call_id")
        return [cid] if isinstance(cid, str) and cid else []
    calls = reply.get("tool_calls")
    return [c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)
            and c["id"]] if isinstance(calls, list) else []


def quoted_call_ids(msgs: Sequence[Any], pattern: re.Pattern[str], *, max_ids: int,
                    max_chars: int) -> list[str]:
    """Tool-call ids a request quotes, most recent first, at most ``max_ids``: an assistant
    message's ``tool_calls[].id``, a tool message's ``tool_call_id``, and ids matching
    ``pattern`` in the text of assistant and user messages (a framework that rewrites its
    history as text, e.g. smolagents' ``Calling tools: [{'id': 'call_...', ...}]``), of which
    the last ``max_chars`` characters of each message are read. Instructions are not read."""
    out: list[str] = []
    seen: set[str] = set()

    def add(cid: Any) -> bool:
        if isinstance(cid, str) and cid and cid not in seen:
            seen.add(cid)
            out.append(cid)
        return len(out) >= max_ids

    for m in reversed(msgs):
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role in ("tool", "function"):
            if add(m.get("tool_call_id")):
                break
            continue
        if role not in ("assistant", "user"):
            continue
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            for c in reversed(calls):
                if isinstance(c, dict) and add(c.get("id")):
                    return out
        text = content_text(m.get("content"))[-max_chars:]
        if text:
            found = pattern.findall(text)
            for cid in reversed(found):
                if add(cid):
                    return out
    return out

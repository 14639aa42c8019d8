"""Anthropic's Messages API bodies as the gateway's edge checks them, and what the run resolver
reads of them.

The bodies, their translation to chat completions and back, the event stream and the error
shape are :mod:`hermes.anthropic_wire` (the built-in engine's server speaks them too); the
edge adds what only it checks: :func:`parse_body` (the body, then :func:`check_tools`:
client tools with an object ``input_schema`` checked as chat tools' ``parameters`` are,
unique names, a ``tool_choice`` that names one of them), :func:`check_version` (the
``anthropic-version`` header) and :func:`resolver_body` (the evidence the run resolver reads).
"""

from __future__ import annotations

import re
from typing import Any

from hermes.anthropic_wire import (
    TOOL_NAME,
    MessagesBody,
    MessagesError,
    RequestBody,
    validate_body,
)
from hermes.gateway.toolspec import ToolSpecError, check_parameters

#: an ``anthropic-version`` header value (a date)
VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_body(raw: bytes, cls: type[RequestBody]) -> RequestBody:
    """The body as ``cls`` (:func:`hermes.anthropic_wire.validate_body`), its tools checked
    (:func:`check_tools`), or the :class:`MessagesError` (400) naming the field at fault."""
    body = validate_body(raw, cls)
    check_tools(body)
    return body


def check_tools(body: RequestBody) -> None:
    """``tools`` are client tools with a name and an object ``input_schema`` (server tools,
    e.g. ``web_search_20250305``, run on Anthropic's side and are refused), no name twice;
    ``tool_choice`` ``tool`` names one of them, ``any`` needs tools."""
    names: set[str] = set()
    for i, tool in enumerate(body.tools or ()):
        where = f"tools.{i}"
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise MessagesError(f"the server tool {kind!r} is not available here: only client "
                                "tools (name, description, input_schema) are", param=f"{where}.type")
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise MessagesError("a name of 1 to 128 letters, digits, '_' or '-' is required, "
                                f"got {name!r}", param=f"{where}.name")
        if name in names:
            raise MessagesError(f"tool names must be unique: {name!r} is given twice",
                                param=f"{where}.name")
        names.add(name)
        desc = tool.get("description")
        if desc is not None and not isinstance(desc, str):
            raise MessagesError("must be a string", param=f"{where}.description")
        if "input_schema" not in tool:
            raise MessagesError("Field required", param=f"{where}.input_schema")
        try:
            check_parameters(f"{where}.input_schema", tool["input_schema"])
        except ToolSpecError as e:
            raise MessagesError(e.message, param=e.param) from None
        if tool["input_schema"].get("type") != "object":
            raise MessagesError("must be a JSON Schema with 'type': 'object'",
                                param=f"{where}.input_schema.type")
    choice = body.tool_choice
    if choice is None:
        return
    if choice.type == "tool":
        if choice.name is None:
            raise MessagesError("Field required for type 'tool'", param="tool_choice.name")
        if choice.name not in names:
            raise MessagesError(f"{choice.name!r} names no tool of the request",
                                param="tool_choice.name")
    elif choice.type == "any" and not names:
        raise MessagesError("'any' needs tools", param="tool_choice.type")


def check_version(value: str | None) -> None:
    """An ``anthropic-version`` header, when sent, is a date such as ``2023-06-01`` (the
    gateway speaks that version's protocol, the one every SDK sends)."""
    if value is not None and not VERSION.match(value.strip()):
        raise MessagesError(f"anthropic-version: expected a date such as 2023-06-01, got "
                            f"{value!r}")




def resolver_body(body: RequestBody, chat: dict[str, Any]) -> dict[str, Any]:
    """What the run resolver reads of the request: its chat form (the app's tools in chat's
    shape), the model, and ``metadata`` as sent (Claude Code's ``metadata.user_id`` carries
    its session)."""
    out = {**chat, "model": body.model}
    if isinstance(body, MessagesBody) and body.metadata is not None:
        out["metadata"] = body.metadata.model_dump(exclude_none=True)
    return out

"""OpenAI's Responses API translated to and from chat completions, and the response store.

Agent frameworks (openai-agents, pydantic-ai's ``OpenAIResponsesModel``, LiteLLM
``responses()``) speak the Responses API by default; the engines behind Hermes speak chat
completions. This module is the pure half of ``POST /v1/responses``
(:mod:`hermes.gateway.responses_api` is the HTTP half): no FastAPI, no I/O.

- :func:`parse_request` validates a Responses body (:class:`ResponsesRequest`); every client
  error is a :class:`ResponsesError` whose ``param`` names the field as OpenAI does
  (``tools[1].type``, ``input[0].content[2].image_url``, ``text.format.schema``).
- :func:`to_chat` turns it into the chat-completions body the engine gets: ``instructions`` as a
  first system message, then the conversation of the ``previous_response_id`` chain, then the
  input items (``function_call`` items become an assistant message with ``tool_calls``,
  ``function_call_output`` items ``tool`` messages).
- :func:`from_chat` turns the engine's ``chat.completion`` into a ``response`` object;
  :class:`ResponseStreamer` turns its ``chat.completion.chunk`` stream (or plain text pieces)
  into the Responses typed event stream.
- :class:`ResponseStore` keeps stored responses per tenant, with the chat conversation each
  ended with, so that ``previous_response_id`` continues it (retention by age and count).
"""

from __future__ import annotations

import copy
import json
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_OUTPUT_TOKENS = 131_072  # as the chat endpoint's max_tokens bound (openai_api.MAX_TOKENS)
DEFAULT_RETENTION_S = 3600.0
DEFAULT_MAX_STORED = 10_000

#: chat-completions parameters with no Responses equivalent, passed on as they are (as is
#: any other field the gateway does not know: engine extensions such as vLLM's
#: ``top_k``/``min_p``/``ignore_eos`` or the built-in engine's ``sim_agent``, the way the chat
#: endpoint forwards what it does not know)
PASS_THROUGH = ("seed", "stop", "frequency_penalty", "presence_penalty", "logit_bias",
                "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos")  # last 5: vLLM's
#: Responses-only fields accepted and not forwarded: they mean nothing to a chat engine
RESPONSES_ONLY = frozenset({
    "include", "service_tier", "prompt_cache_key", "prompt_cache_retention",
    "safety_identifier", "max_tool_calls", "top_logprobs", "stream_options", "context_management",
})
#: Responses features the gateway cannot serve: a 400 naming the field
UNSUPPORTED = {"background": "background mode", "conversation": "the Conversations API",
               "prompt": "prompt templates"}
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ResponsesError(ValueError):
    """A client error in a Responses request: HTTP ``status``, the field (``param``) and an
    OpenAI error ``code``."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def new_response_id() -> str:
    """A fresh ``resp_...`` id."""
    return _new_id("resp")


# ---------------------------------------------------------------------------------- request
class ResponsesRequest(BaseModel):
    """The body of ``POST /v1/responses``. Fields without a chat equivalent (``include``,
    ``service_tier``, ``prompt_cache_key``, ...) are accepted and ignored; the chat sampling
    parameters in :data:`PASS_THROUGH` are passed on. ``input``, ``tools``, ``tool_choice``
    and ``text`` are checked item by item by :func:`parse_request` (for OpenAI-style
    ``param`` paths)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    input: str | list[Any] | None = None
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_OUTPUT_TOKENS)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = Field(default=None, min_length=1)
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: dict[str, Any] | None = None  # accepted, ignored (no reasoning summaries)


def _param(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """``("tools", 0, "type")`` -> ``"tools[0].type"``."""
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or None


def parse_request(raw: bytes | str | dict[str, Any]) -> ResponsesRequest:
    """A Responses body, validated whole (raises :class:`ResponsesError`): the fields' types
    and ranges, then every input item, tool, the tool choice and ``text.format``, so that a
    request that passes translates to a chat body without further errors."""
    if isinstance(raw, bytes | str):
        try:
            data = json.loads(raw)
        except ValueError:
            raise ResponsesError("the request body is not valid JSON", code="invalid_json") from None
    else:
        data = raw
    if not isinstance(data, dict):
        raise ResponsesError("the request body must be a JSON object", code="invalid_json")
    try:
        req = ResponsesRequest.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        param = _param(err["loc"])
        raise ResponsesError(f"{param}: {err['msg']}" if param else err["msg"], param=param,
                             code="missing" if err["type"] == "missing" else "invalid_value") from None
    for name, what in UNSUPPORTED.items():
        if data.get(name):
            raise ResponsesError(f"{name}: {what} is not supported by this gateway", param=name,
                                 code="unsupported_parameter")
    if req.input is None and req.previous_response_id is None:
        raise ResponsesError("input: required (or previous_response_id)", param="input",
                             code="missing")
    if isinstance(req.input, list) and not req.input and req.previous_response_id is None:
        raise ResponsesError("input: must not be empty", param="input")
    if req.metadata is not None:
        if len(req.metadata) > 16:
            raise ResponsesError("metadata: at most 16 pairs", param="metadata")
        for k, v in req.metadata.items():
            if len(k) > 64 or len(v) > 512:
                raise ResponsesError(f"metadata.{k}: keys are at most 64 characters and values "
                                     "512", param=f"metadata.{k}")
    input_messages(req)
    _chat_tools(req)
    _chat_tool_choice(req)
    _response_format(req)
    return req


# ---------------------------------------------------------------------------------- input
def _text_of_parts(parts: list[Any], where: str, allowed: tuple[str, ...]) -> str:
    """The text parts of a content list joined (as chat templates join text parts)."""
    texts: list[str] = []
    for j, p in enumerate(parts):
        if not isinstance(p, dict) or p.get("type") not in allowed:
            kind = p.get("type") if isinstance(p, dict) else type(p).__name__
            raise ResponsesError(f"{where}[{j}].type: expected one of {list(allowed)}, got {kind!r}",
                                 param=f"{where}[{j}].type")
        text = p.get("refusal") if p["type"] == "refusal" else p.get("text")
        if not isinstance(text, str):
            raise ResponsesError(f"{where}[{j}].text: must be a string", param=f"{where}[{j}].text")
        texts.append(text)
    return "\n".join(texts)


def _user_content(content: list[Any], where: str) -> str | list[dict[str, Any]]:
    """User-side content parts as chat content: one string when all are text (every chat
    template takes it), else chat parts (``input_image`` -> ``image_url``)."""
    parts: list[dict[str, Any]] = []
    for j, p in enumerate(content):
        at = f"{where}[{j}]"
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "input_text":
            if not isinstance(p.get("text"), str):
                raise ResponsesError(f"{at}.text: must be a string", param=f"{at}.text")
            parts.append({"type": "text", "text": p["text"]})
        elif kind == "input_image":
            url = p.get("image_url")
            if not isinstance(url, str) or not url:
                raise ResponsesError(f"{at}.image_url: required (file ids are not supported; "
                                     "send a URL or a data: URL)", param=f"{at}.image_url")
            parts.append({"type": "image_url",
                          "image_url": {"url": url, "detail": p.get("detail") or "auto"}})
        else:
            shown = kind if kind is not None else type(p).__name__
            raise ResponsesError(f"{at}.type: content part {shown!r} is not supported; "
                                 "use input_text or input_image", param=f"{at}.type")
    if all(q["type"] == "text" for q in parts):
        return "\n".join(q["text"] for q in parts)
    return parts


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    """One input message item as a chat message (``developer`` becomes ``system``: not every
    engine's chat template knows the developer role)."""
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise ResponsesError(f"{where}.role: expected user, system, developer or assistant, "
                             f"got {role!r}", param=f"{where}.role")
    content = item.get("content")
    if isinstance(content, str):
        text: str | list[dict[str, Any]] = content
    elif isinstance(content, list):
        if role == "assistant":
            text = _text_of_parts(content, f"{where}.content", ("output_text", "refusal", "input_text"))
        elif role == "user":
            text = _user_content(content, f"{where}.content")
        else:
            text = _text_of_parts(content, f"{where}.content", ("input_text",))
    else:
        raise ResponsesError(f"{where}.content: must be a string or a list of content parts",
                             param=f"{where}.content")
    return {"role": "system" if role == "developer" else role, "content": text}


def _str_field(item: dict[str, Any], key: str, where: str) -> str:
    v = item.get(key)
    if not isinstance(v, str) or (key != "arguments" and not v):
        raise ResponsesError(f"{where}.{key}: required string", param=f"{where}.{key}",
                             code="missing" if v is None else "invalid_value")
    return v


def _output_text(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _text_of_parts(output, f"{where}.output", ("input_text", "output_text"))
    raise ResponsesError(f"{where}.output: must be a string or a list of text parts",
                         param=f"{where}.output")


def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as chat messages (without instructions or history).

    Consecutive ``function_call`` items join the assistant message before them (one assistant
    turn with text and parallel tool calls, as chat expresses it); ``reasoning`` items are
    dropped (engines do not take them back)."""
    if req.input is None:
        return []
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ResponsesError(f"{where}: must be an object", param=where)
        kind = item.get("type")
        if kind == "message" or (kind is None and "role" in item):
            out.append(_message(item, where))
        elif kind == "function_call":
            call = {"id": _str_field(item, "call_id", where), "type": "function",
                    "function": {"name": _str_field(item, "name", where),
                                 "arguments": _str_field(item, "arguments", where)}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and isinstance(
                    last.get("content"), str | None):
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": _str_field(item, "call_id", where),
                        "content": _output_text(item.get("output"), where)})
        elif kind == "reasoning":
            continue
        else:
            raise ResponsesError(f"{where}.type: input item type {kind!r} is not supported; use "
                                 "message, function_call, function_call_output or reasoning",
                                 param=f"{where}.type")
    return out


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as Responses items with ids, as ``GET
    /v1/responses/{id}/input_items`` lists them (``reasoning`` items are not kept)."""
    if req.input is None:
        return []
    raw = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    out: list[dict[str, Any]] = []
    for item in raw:
        kind = item.get("type")
        if kind == "function_call":
            out.append({"type": "function_call", "id": item.get("id") or _new_id("fc"),
                        "call_id": item["call_id"], "name": item["name"],
                        "arguments": item["arguments"], "status": "completed"})
        elif kind == "function_call_output":
            out.append({"type": "function_call_output", "id": item.get("id") or _new_id("fco"),
                        "call_id": item["call_id"], "output": item.get("output"),
                        "status": "completed"})
        elif kind in ("message", None):
            content = item["content"]
            parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
            role = item["role"]
            if role == "assistant":
                content = [{"type": "refusal", "refusal": p["refusal"]} if p["type"] == "refusal"
                           else _output_part(p["text"]) for p in parts]
            else:
                content = [{**p, "detail": p.get("detail") or "auto"} if p["type"] == "input_image"
                           else {"type": "input_text", "text": p["text"]} for p in parts]
            out.append({"type": "message", "id": item.get("id") or _new_id("msg"), "role": role,
                        "status": "completed", "content": content})
    return out


# ---------------------------------------------------------------------------------- tools
def _function_tools(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's tools, checked, in the Responses shape (as echoed in the response)."""
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, t in enumerate(req.tools or ()):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise ResponsesError(f"{where}: must be an object", param=where)
        kind = t.get("type")
        if kind != "function":
            raise ResponsesError(f"{where}.type: tool type {kind!r} is not supported by this "
                                 "gateway; only 'function' tools are", param=f"{where}.type",
                                 code="unsupported_value")
        name = t.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ResponsesError(f"{where}.name: a function name of 1 to 64 letters, digits, "
                                 f"'_' or '-' is required, got {name!r}", param=f"{where}.name")
        if name in names:
            raise ResponsesError(f"{where}.name: duplicate function name {name!r}",
                                 param=f"{where}.name")
        names.add(name)
        params = t.get("parameters")
        if params is not None:
            if not isinstance(params, dict):
                raise ResponsesError(f"{where}.parameters: must be a JSON Schema object",
                                     param=f"{where}.parameters")
            if params and params.get("type") != "object":
                raise ResponsesError(f"{where}.parameters: invalid schema for function {name!r}: "
                                     "it must be a JSON Schema of 'type: \"object\"', got "
                                     f"'type: {params.get('type')!r}'", param=f"{where}.parameters")
            if not isinstance(params.get("properties", {}), dict):
                raise ResponsesError(f"{where}.parameters.properties: must be an object",
                                     param=f"{where}.parameters.properties")
        desc = t.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ResponsesError(f"{where}.description: must be a string",
                                 param=f"{where}.description")
        strict = t.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ResponsesError(f"{where}.strict: must be a boolean", param=f"{where}.strict")
        out.append({"type": "function", "name": name, "description": desc,
                    "parameters": params, "strict": strict})
    return out


def _chat_tools(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The function tools in chat's shape (``{"type": "function", "function": {...}}``)."""
    out = []
    for t in _function_tools(req):
        fn: dict[str, Any] = {"name": t["name"]}
        for key in ("description", "parameters", "strict"):
            if t[key] is not None:
                fn[key] = t[key]
        out.append({"type": "function", "function": fn})
    return out


def _chat_tool_choice(req: ResponsesRequest) -> str | dict[str, Any] | None:
    """``tool_choice`` in chat's shape (``None``: not given)."""
    tc = req.tool_choice
    if tc is None:
        return None
    if isinstance(tc, str):
        if tc not in ("none", "auto", "required"):
            raise ResponsesError(f"tool_choice: expected 'none', 'auto', 'required' or a function, "
                                 f"got {tc!r}", param="tool_choice")
        if tc == "required" and not req.tools:
            raise ResponsesError("tool_choice: 'required' needs tools", param="tool_choice")
        return tc
    if tc.get("type") != "function":
        raise ResponsesError(f"tool_choice.type: only 'function' is supported, got "
                             f"{tc.get('type')!r}", param="tool_choice.type",
                             code="unsupported_value")
    name = tc.get("name")
    if name not in {t.get("name") for t in req.tools or () if isinstance(t, dict)}:
        raise ResponsesError(f"tool_choice.name: no function tool named {name!r}",
                             param="tool_choice.name")
    return {"type": "function", "function": {"name": name}}


def _text_format(req: ResponsesRequest) -> dict[str, Any]:
    """``text.format``, checked (default ``{"type": "text"}``)."""
    fmt = (req.text or {}).get("format")
    if fmt is None:
        return {"type": "text"}
    if not isinstance(fmt, dict):
        raise ResponsesError("text.format: must be an object", param="text.format")
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind != "json_schema":
        raise ResponsesError(f"text.format.type: expected text, json_object or json_schema, "
                             f"got {kind!r}", param="text.format.type")
    name = fmt.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ResponsesError("text.format.name: a name of 1 to 64 letters, digits, '_' or '-' "
                             f"is required, got {name!r}", param="text.format.name")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise ResponsesError("text.format.schema: a JSON Schema object is required",
                             param="text.format.schema",
                             code="missing" if schema is None else "invalid_value")
    strict = fmt.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ResponsesError("text.format.strict: must be a boolean", param="text.format.strict")
    out = {"type": "json_schema", "name": name, "schema": schema, "strict": strict}
    if isinstance(fmt.get("description"), str):
        out["description"] = fmt["description"]
    return out


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (``None`` for plain text)."""
    fmt = _text_format(req)
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    js = {k: v for k, v in fmt.items() if k != "type" and v is not None}
    return {"type": "json_schema", "json_schema": js}


# ---------------------------------------------------------------------------------- to chat
def to_chat(req: ResponsesRequest, history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The chat-completions body for the engine (no ``model``/``stream``: the node adds
    them). ``history``: the conversation the ``previous_response_id`` chain ended with
    (:attr:`StoredResponse.conversation`); its messages are copied, never changed."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    messages.extend(dict(m) for m in history or ())
    messages.extend(input_messages(req))
    body: dict[str, Any] = {"messages": messages}
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    tools = _chat_tools(req)
    if tools:
        body["tools"] = tools
        choice = _chat_tool_choice(req)
        if choice is not None:
            body["tool_choice"] = choice
        if req.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = req.parallel_tool_calls
    fmt = _response_format(req)
    if fmt is not None:
        body["response_format"] = fmt
    if req.user is not None:
        body["user"] = req.user
    extra = req.model_extra or {}
    for key, value in extra.items():
        if value is not None and key not in RESPONSES_ONLY and key not in UNSUPPORTED \
                and key not in body:
            body[key] = value
    return body


# ---------------------------------------------------------------------------------- from chat
def _output_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [_output_part(text)]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def _usage(input_tokens: int, output_tokens: int, cached: int = 0,
           reasoning: int = 0) -> dict[str, Any]:
    return {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": input_tokens + output_tokens}


def _usage_of_chat(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return _usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                  int(cached), int(reasoning))


def _status_of(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    """The response status and ``incomplete_details`` of a chat finish reason."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def response_object(req: ResponsesRequest, *, response_id: str, created_at: float,
                    status: str, output: list[dict[str, Any]],
                    usage: dict[str, Any] | None = None,
                    incomplete_details: dict[str, Any] | None = None,
                    error: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``response`` object: the output and usage with the request's settings echoed."""
    return {
        "id": response_id, "object": "response", "created_at": int(created_at),
        "status": status, "background": False, "error": error,
        "incomplete_details": incomplete_details, "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens, "model": req.model, "output": output,
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None}, "store": req.store,
        "temperature": req.temperature, "text": {"format": _text_format(req)},
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": _function_tools(req), "top_p": req.top_p,
        "truncation": req.truncation or "disabled", "usage": usage, "user": req.user,
        "metadata": req.metadata or {},
    }


def from_chat(chat: dict[str, Any], req: ResponsesRequest, *, response_id: str | None = None,
              created_at: float | None = None) -> dict[str, Any]:
    """The ``response`` for an engine's ``chat.completion``: a message item for its text
    (also when it is empty and there is nothing else), a ``function_call`` item per tool call
    (the chat ``id`` is the ``call_id``), status ``incomplete`` when it stopped at
    ``max_output_tokens``."""
    choices = chat.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    status, details = _status_of(choice.get("finish_reason"))
    output: list[dict[str, Any]] = []
    text = message.get("content")
    calls = message.get("tool_calls") or []
    refusal = message.get("refusal")
    if text or not (calls or refusal):
        output.append(_message_item(_new_id("msg"), text or "",
                                    "incomplete" if status == "incomplete" else "completed"))
    if refusal:
        output.append({"type": "message", "id": _new_id("msg"), "status": "completed",
                       "role": "assistant", "content": [{"type": "refusal", "refusal": refusal}]})
    for tc in calls:
        fn = tc.get("function") or {}
        output.append(_call_item(_new_id("fc"), tc.get("id") or _new_id("call"),
                                 fn.get("name") or "", fn.get("arguments") or "", "completed"))
    return response_object(
        req, response_id=response_id or new_response_id(),
        created_at=created_at if created_at is not None else time.time(), status=status,
        output=output, usage=_usage_of_chat(chat.get("usage")) or _usage(0, 0),
        incomplete_details=details)


def assistant_message(response: dict[str, Any]) -> dict[str, Any]:
    """The chat message a response's output is (the conversation's next turn): its text and
    its function calls as ``tool_calls`` with the same call ids, so that a later
    ``function_call_output`` answers them."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in response.get("output") or ():
        if item.get("type") == "message":
            texts.extend(p.get("text") or p.get("refusal") or "" for p in item.get("content") or ())
        elif item.get("type") == "function_call":
            calls.append({"id": item["call_id"], "type": "function",
                          "function": {"name": item["name"], "arguments": item["arguments"]}})
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
    if calls:
        msg["tool_calls"] = calls
    return msg


# ---------------------------------------------------------------------------------- streaming
class ResponseStreamer:
    """The Responses event stream of one streamed chat completion.

    :meth:`start` gives ``response.created`` and ``response.in_progress``; :meth:`feed_chunk`
    (an engine's ``chat.completion.chunk``) and :meth:`feed_text` (a plain text piece) give
    the item events; :meth:`finish` closes what is open and gives ``response.completed`` (or
    ``response.incomplete``); :meth:`fail` gives ``response.failed``. Items are opened and
    closed in order, as OpenAI streams them: text opens a message item
    (``response.output_item.added``, ``response.content_part.added``, then
    ``response.output_text.delta`` per piece); a tool call (by its chunk ``index``) opens a
    ``function_call`` item (``response.output_item.added`` with the name and empty
    arguments, then ``response.function_call_arguments.delta`` per piece); starting another
    item closes the open one (``response.output_text.done``, ``response.content_part.done``,
    ``response.output_item.done``, or ``response.function_call_arguments.done`` and
    ``response.output_item.done``). Every event has the next ``sequence_number`` (from 0).
    A late piece for an item already closed (an engine interleaving parallel tool calls) is
    kept in the final response but gets no event."""

    def __init__(self, req: ResponsesRequest, *, response_id: str | None = None,
                 created_at: float | None = None) -> None:
        self.req = req
        self.response_id = response_id or new_response_id()
        self.created_at = created_at if created_at is not None else time.time()
        self.output: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.response: dict[str, Any] | None = None  # the final response, once finished
        self._seq = 0
        self._open: int | None = None  # output index of the open item
        self._calls: dict[int, int] = {}  # chunk tool-call index -> output index
        self._generated_call_ids: set[int] = set()
        self._chunk_usage: dict[str, Any] | None = None

    # -------------------------------------------------------------- events
    def _event(self, type_: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": type_, "sequence_number": self._seq, **fields}
        self._seq += 1
        return ev

    def _snapshot(self, status: str, **kw: Any) -> dict[str, Any]:
        return response_object(self.req, response_id=self.response_id,
                               created_at=self.created_at, status=status,
                               output=copy.deepcopy(self.output), **kw)

    def start(self) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress``."""
        return [self._event("response.created", response=self._snapshot("in_progress")),
                self._event("response.in_progress", response=self._snapshot("in_progress"))]

    def feed_chunk(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one ``chat.completion.chunk`` (its first choice)."""
        if isinstance(chunk.get("usage"), dict):
            self._chunk_usage = chunk["usage"]
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text(delta["content"])
            for pos, tc in enumerate(delta.get("tool_calls") or ()):
                events += self._tool(tc, pos)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def feed_text(self, text: str) -> list[dict[str, Any]]:
        """The events of a plain text piece (an engine that streams text alone)."""
        return self._text(text) if text else []

    def _open_message(self) -> list[dict[str, Any]]:
        events = self._close()
        idx = len(self.output)
        item = _message_item(_new_id("msg"), "", "in_progress")
        self.output.append(item)
        self._open = idx
        events.append(self._event("response.output_item.added", output_index=idx,
                                  item={**item, "content": []}))
        events.append(self._event("response.content_part.added", item_id=item["id"],
                                  output_index=idx, content_index=0, part=_output_part("")))
        return events

    def _text(self, piece: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open is None or self.output[self._open]["type"] != "message":
            events += self._open_message()
        idx = self._open
        assert idx is not None
        item = self.output[idx]
        item["content"][0]["text"] += piece
        events.append(self._event("response.output_text.delta", item_id=item["id"],
                                  output_index=idx, content_index=0, delta=piece, logprobs=[]))
        return events

    def _tool(self, tc: dict[str, Any], pos: int) -> list[dict[str, Any]]:
        key = tc.get("index", pos)
        fn = tc.get("function") or {}
        events: list[dict[str, Any]] = []
        idx = self._calls.get(key)
        if idx is None:
            events += self._close()
            idx = len(self.output)
            call_id = tc.get("id")
            if not call_id:
                call_id = _new_id("call")
                self._generated_call_ids.add(idx)
            item = _call_item(_new_id("fc"), call_id, fn.get("name") or "", "", "in_progress")
            self.output.append(item)
            self._calls[key] = idx
            self._open = idx
            events.append(self._event("response.output_item.added", output_index=idx,
                                      item=dict(item)))
        item = self.output[idx]
        if tc.get("id") and idx in self._generated_call_ids:
            item["call_id"] = tc["id"]
            self._generated_call_ids.discard(idx)
        if fn.get("name") and not item["name"]:
            item["name"] = fn["name"]
        args = fn.get("arguments")
        if args:
            item["arguments"] += args
            if self._open == idx:
                events.append(self._event("response.function_call_arguments.delta",
                                          item_id=item["id"], output_index=idx, delta=args))
        return events

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        """Close the open item (if any)."""
        idx = self._open
        if idx is None:
            return []
        self._open = None
        item = self.output[idx]
        item["status"] = status
        if item["type"] == "message":
            part = item["content"][0]
            return [
                self._event("response.output_text.done", item_id=item["id"], output_index=idx,
                            content_index=0, text=part["text"], logprobs=[]),
                self._event("response.content_part.done", item_id=item["id"], output_index=idx,
                            content_index=0, part=copy.deepcopy(part)),
                self._event("response.output_item.done", output_index=idx,
                            item=copy.deepcopy(item)),
            ]
        return [
            self._event("response.function_call_arguments.done", item_id=item["id"],
                        output_index=idx, arguments=item["arguments"]),
            self._event("response.output_item.done", output_index=idx, item=copy.deepcopy(item)),
        ]

    def finish(self, finish_reason: str | None = None, *, input_tokens: int | None = None,
               output_tokens: int | None = None) -> list[dict[str, Any]]:
        """Close the open item and end with ``response.completed`` or, stopped at
        ``max_output_tokens``, ``response.incomplete``. Token counts: the ones given (the
        node's :class:`~hermes.protocol.Done`), else the engine's usage chunk."""
        reason = finish_reason or self.finish_reason or "stop"
        status, details = _status_of(reason)
        events: list[dict[str, Any]] = []
        if not self.output:
            events += self._open_message()
        if self._open is not None and self.output[self._open]["type"] == "message":
            events += self._close("incomplete" if status == "incomplete" else "completed")
        else:
            events += self._close()
        usage = _usage_of_chat(self._chunk_usage) or _usage(0, 0)
        if input_tokens is not None and output_tokens is not None:
            usage = _usage(input_tokens, output_tokens,
                           usage["input_tokens_details"]["cached_tokens"],
                           usage["output_tokens_details"]["reasoning_tokens"])
        self.response = self._snapshot(status, usage=usage, incomplete_details=details)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        events.append(self._event(kind, response=copy.deepcopy(self.response)))
        return events

    def fail(self, message: str, code: str = "server_error") -> list[dict[str, Any]]:
        """End with ``response.failed`` (the items so far, the open one ``incomplete``)."""
        if self._open is not None:
            self.output[self._open]["status"] = "incomplete"
            self._open = None
        self.response = self._snapshot("failed", error={"code": code, "message": message})
        return [self._event("response.failed", response=copy.deepcopy(self.response))]


# ---------------------------------------------------------------------------------- store
@dataclass(slots=True)
class StoredResponse:
    """A stored response: the object as returned, this request's input items (for
    ``input_items``), and the chat conversation it ended with (history, input, reply; no
    instructions, which OpenAI does not carry over a ``previous_response_id``)."""

    tenant: str | None
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]
    stored_at: float
    run_id: str | None = None  # the run that made it (for inferring runs from chains later)


class ResponseStore:
    """Stored responses, per tenant: an id is visible only to the tenant that created it
    (another tenant's id is "not found", as an unknown one). Oldest first out: entries older
    than ``max_age_s`` expire, and past ``max_items`` the oldest is dropped. In memory, one
    per gateway (``clock`` is injectable for tests)."""

    def __init__(self, *, max_age_s: float = DEFAULT_RETENTION_S,
                 max_items: int = DEFAULT_MAX_STORED,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.max_items = max_items
        self.clock = clock
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._items)

    def _expire(self) -> None:
        cutoff = self.clock() - self.max_age_s
        while self._items:
            first = next(iter(self._items.values()))
            if first.stored_at > cutoff:
                break
            self._items.popitem(last=False)

    def put(self, tenant: str | None, response: dict[str, Any], input_items: list[dict[str, Any]],
            conversation: list[dict[str, Any]], *, run_id: str | None = None) -> StoredResponse:
        """Store a finished response (replacing one with the same id)."""
        entry = StoredResponse(tenant, response, input_items, conversation, self.clock(), run_id)
        self._items.pop(response["id"], None)
        self._items[response["id"]] = entry
        self._expire()
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)
        return entry

    def get(self, tenant: str | None, response_id: str) -> StoredResponse | None:
        """The stored response, or None when unknown, expired or another tenant's."""
        self._expire()
        entry = self._items.get(response_id)
        if entry is None or entry.tenant != tenant:
            return None
        return entry

    def delete(self, tenant: str | None, response_id: str) -> bool:
        """Forget a response; False when :meth:`get` would not find it."""
        if self.get(tenant, response_id) is None:
            return False
        del self._items[response_id]
        return True

"""A Responses request: validated (:func:`parse_request`), its input items as chat messages
(:func:`input_messages`, :func:`input_items`), its tools, and the chat-completions body the
engine gets (:func:`to_chat`): ``instructions`` as a first system message, then the
conversation of the ``previous_response_id`` chain, then the input items (``function_call``
items become an assistant message with ``tool_calls``, ``function_call_output`` items
``tool`` messages). Every client error is a :class:`ResponsesError` whose ``param`` names the
field as OpenAI does (``tools[1].type``, ``input[0].content[2].image_url``,
``text.format.schema``).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hermes.core import strict_json
from hermes.gateway.toolspec import (
    FUNCTION_NAME,
    ToolSpecError,
    check_function_name,
    check_parameters,
)

MAX_OUTPUT_TOKENS = 131_072  # as the chat endpoint's max_tokens bound (api.openai_bodies.MAX_TOKENS)
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


class ResponsesError(ValueError):
    """A client error in a Responses request: HTTP ``status``, the field (``param``) and an
    OpenAI error ``code``."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_part(text: str) -> dict[str, Any]:
    """An ``output_text`` content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def new_response_id() -> str:
    """A fresh ``resp_...`` id."""
    return new_id("resp")


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
    try:  # strict JSON: no NaN/Infinity/1e400, lone surrogates or deep nesting anywhere
        if isinstance(raw, bytes | str):
            data = strict_json.loads(raw)
        else:
            data = raw
            strict_json.check(data)
    except strict_json.StrictJSONError as e:
        raise ResponsesError(f"the request body is not valid JSON ({e})", param=e.path or None,
                             code="invalid_json") from None
    if not isinstance(data, dict):
        raise ResponsesError("the request body must be a JSON object", code="invalid_json")
    try:  # strict: a boolean is not a number, 0 is not false
        req = ResponsesRequest.model_validate(data, strict=True)
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
            out.append({"type": "function_call", "id": item.get("id") or new_id("fc"),
                        "call_id": item["call_id"], "name": item["name"],
                        "arguments": item["arguments"], "status": "completed"})
        elif kind == "function_call_output":
            out.append({"type": "function_call_output", "id": item.get("id") or new_id("fco"),
                        "call_id": item["call_id"], "output": item.get("output"),
                        "status": "completed"})
        elif kind in ("message", None):
            content = item["content"]
            parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
            role = item["role"]
            if role == "assistant":
                content = [{"type": "refusal", "refusal": p["refusal"]} if p["type"] == "refusal"
                           else output_part(p["text"]) for p in parts]
            else:
                content = [{**p, "detail": p.get("detail") or "auto"} if p["type"] == "input_image"
                           else {"type": "input_text", "text": p["text"]} for p in parts]
            out.append({"type": "message", "id": item.get("id") or new_id("msg"), "role": role,
                        "status": "completed", "content": content})
    return out


# ---------------------------------------------------------------------------------- tools
def function_tools(req: ResponsesRequest) -> list[dict[str, Any]]:
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
        try:
            name = check_function_name(f"{where}.name", t.get("name"))
        except ToolSpecError as e:
            raise ResponsesError(str(e), param=e.param) from None
        if name in names:
            raise ResponsesError(f"{where}.name: duplicate function name {name!r}",
                                 param=f"{where}.name")
        names.add(name)
        params = t.get("parameters")
        if params is not None:
            try:
                check_parameters(f"{where}.parameters", params)
            except ToolSpecError as e:
                raise ResponsesError(f"{e.param}: invalid schema for function {name!r}: "
                                     f"{e.message}", param=e.param) from None
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
    for t in function_tools(req):
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


def text_format(req: ResponsesRequest) -> dict[str, Any]:
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
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
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
    fmt = text_format(req)
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

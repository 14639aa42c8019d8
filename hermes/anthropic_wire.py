"""Anthropic's Messages API on the wire: its request bodies, their translation to and from
OpenAI chat completions, its event stream and its errors.

Read from Anthropic's API reference (the ``anthropic`` SDK's ``MessageCreateParams``,
``Message``, ``RawMessageStreamEvent`` and ``ErrorResponse`` types):

- :class:`MessagesBody` (``POST /v1/messages``) and :class:`CountTokensBody`
  (``POST /v1/messages/count_tokens``) validate a body in one pass (:func:`validate_body`):
  ``model``, ``messages`` (``user`` / ``assistant`` / ``system`` turns whose content is a
  string or content blocks: ``text``, ``image``, ``tool_use``, ``tool_result``, and
  ``thinking`` / ``redacted_thinking`` in an assistant turn; each turn holds its role's
  blocks), ``max_tokens`` (required), ``system`` (a string or text blocks),
  ``stop_sequences``, ``temperature`` (0..1), ``top_p``, ``top_k``, ``metadata.user_id``,
  ``stream``, ``tools`` and ``tool_choice`` (``auto`` / ``any`` / ``tool`` / ``none``,
  ``disable_parallel_tool_use``). A wrong field is a :class:`MessagesError` naming it
  (``messages.1.content.0.tool_use_id: Field required``). Fields not known here pass through:
  into the chat body (as on the chat route); Anthropic's own fields with no chat counterpart
  (``thinking``, ``cache_control``, ``service_tier``, ...) are dropped by the translation.
- :func:`to_chat`: the chat-completions body of a request: ``system`` as a system message,
  ``tool_use`` blocks as ``tool_calls`` (``input`` as compact JSON ``arguments``),
  ``tool_result`` blocks as ``tool`` messages, images as ``image_url`` parts,
  ``tool_choice`` ``any`` as ``required``, ``stop_sequences`` as ``stop``.
- :func:`from_chat`: a chat completion as an Anthropic ``message`` (``stop_reason``
  ``end_turn`` / ``max_tokens`` / ``stop_sequence`` / ``tool_use``);
  :class:`MessageStreamer`: a chat chunk stream as Anthropic's event stream
  (``message_start``, ``ping``, ``content_block_start`` / ``content_block_delta``
  (``text_delta``, ``input_json_delta``) / ``content_block_stop``, ``message_delta`` with
  ``stop_reason`` and usage, ``message_stop``); :class:`EventContent`: the content an
  Anthropic event stream amounts to (an engine that streams the events itself).
- :func:`assistant_reply`: an answer's content blocks in the chat form :func:`to_chat` gives
  the same blocks when the client sends them back.
- :func:`error_body`: ``{"type": "error", "error": {"type", "message"}}``, the error ``type``
  by status (:func:`error_type`; a 503 is answered 529 ``overloaded_error``: :func:`status`).

The gateway's edge (:mod:`hermes.gateway.api.anthropic_api`) and the built-in engine's HTTP
server (:mod:`hermeslet.sim_server`) both speak it. Pure: pydantic and the standard library.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
)

MAX_TOKENS = 131_072  # as the chat route: a longer max_tokens is a client error
#: a client tool's name (Anthropic: letters, digits, ``_`` and ``-``, at most 128)
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
#: Anthropic's own request fields that have no chat-completions counterpart: the translation
#: drops them (a native engine gets them)
ANTHROPIC_ONLY = frozenset((
    "system", "stop_sequences", "top_k", "metadata", "tool_choice", "tools", "thinking",
    "cache_control", "service_tier", "container", "context_management", "mcp_servers",
    "output_config", "inference_geo", "speed", "diagnostics", "betas"))


#: Anthropic's error ``type`` by HTTP status (its API reference's error list)
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error",
    413: "request_too_large", 415: "invalid_request_error", 422: "invalid_request_error",
    429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error"}


def status(code: int) -> int:
    """The status an Anthropic client gets: 529 (overloaded) for a 503 (no engine can take the
    request now), the status itself otherwise."""
    return 529 if code == 503 else code


def error_type(code: int) -> str:
    """Anthropic's error ``type`` of an HTTP status (``api_error`` for other 5xx)."""
    code = status(code)
    return ERROR_TYPES.get(code, "api_error" if code >= 500 else "invalid_request_error")


def error_body(code: int, message: str) -> dict[str, Any]:
    """An error in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": error_type(code), "message": message}}


class MessagesError(ValueError):
    """A request the Messages route refuses: ``status`` and Anthropic's error ``type``;
    ``param`` names the field when one is at fault (it leads the message too)."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.status = status
        self.param = param
        self.type = error_type(status)


# ---------------------------------------------------------------------------------- bodies
class _Strict(BaseModel):
    """Typed fields are strict (no ``"1"`` for 1); unknown fields are kept (Anthropic adds
    fields, e.g. ``cache_control``, ``citations``, which the translation ignores)."""

    model_config = ConfigDict(extra="allow", strict=True)


class TextBlock(_Strict):
    type: Literal["text"]
    text: str


class ImageSource(_Strict):
    type: Literal["base64", "url"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"] | None = None
    data: str | None = None
    url: str | None = None


class ImageBlock(_Strict):
    type: Literal["image"]
    source: ImageSource


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


def _result_block_tag(v: Any) -> str:
    return str(v.get("type")) if isinstance(v, dict) else "?"


ResultPart = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[ImageBlock, Tag("image")],
    Discriminator(_result_block_tag, custom_error_type="invalid_block",
                  custom_error_message="a tool result's content blocks are 'text' or 'image'")]


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[ResultPart] = ""
    is_error: bool = False


class ThinkingBlock(_Strict):
    """An assistant turn's reasoning (Claude's extended thinking): dropped by the translation."""

    type: Literal["thinking", "redacted_thinking"]


def _block_tag(v: Any) -> str:
    kind = v.get("type") if isinstance(v, dict) else None
    return "thinking" if kind == "redacted_thinking" else str(kind)


Block = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[ImageBlock, Tag("image")]
    | Annotated[ToolUseBlock, Tag("tool_use")] | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ThinkingBlock, Tag("thinking")],
    Discriminator(_block_tag, custom_error_type="invalid_block",
                  custom_error_message="a content block's type is 'text', 'image', 'tool_use', "
                                       "'tool_result', 'thinking' or 'redacted_thinking'")]


class Message(_Strict):
    role: Literal["user", "assistant", "system"]
    content: list[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _string_is_one_text_block(cls, v: Any) -> Any:
        """``"content": "hi"`` is shorthand for one text block (Anthropic's own rule)."""
        return [{"type": "text", "text": v}] if isinstance(v, str) else v


class Metadata(_Strict):
    user_id: str | None = Field(default=None, max_length=512)


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class RequestBody(_Strict):
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None


class MessagesBody(RequestBody):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1, le=MAX_TOKENS)
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None


class CountTokensBody(RequestBody):
    """``POST /v1/messages/count_tokens``."""


_TAGS = frozenset(("text", "image", "tool_use", "tool_result", "thinking", "str",
                   "list[tagged-union[TextBlock,ImageBlock]]",
                   "list[tagged-union[TextBlock,ImageBlock,ToolUseBlock,ToolResultBlock,"
                   "ThinkingBlock]]", "list[TextBlock]"))


def _field_path(loc: Iterable[Any]) -> str:
    """A validation error's location as the client wrote the field (``messages.0.content``),
    without pydantic's union branch names."""
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and
                                                (p in _TAGS or "[" in p)))


def validate_body(raw: bytes, cls: type[RequestBody]) -> RequestBody:
    """The body as ``cls``, or the :class:`MessagesError` (400) naming the field at fault
    (each turn's blocks checked against its role too: :func:`check_turns`)."""
    try:
        body = cls.model_validate_json(raw)
    except ValidationError as e:
        err = e.errors()[0]
        if err["type"] == "json_invalid":
            raise MessagesError("the request body is not valid JSON") from None
        if err["type"] == "model_type" and not err["loc"]:
            raise MessagesError("the request body must be a JSON object") from None
        raise MessagesError(err["msg"], param=_field_path(err["loc"]) or None) from None
    check_turns(body)
    return body


#: the block types each role's turn may hold
_ROLE_BLOCKS: dict[str, tuple[type[BaseModel], ...]] = {
    "user": (TextBlock, ImageBlock, ToolResultBlock),
    "assistant": (TextBlock, ToolUseBlock, ThinkingBlock),
    "system": (TextBlock,),
}


def check_turns(body: RequestBody) -> None:
    """Each turn holds the blocks of its role: ``tool_use`` and ``thinking`` in an assistant
    turn, ``tool_result`` and images in a user turn, text in any."""
    for i, m in enumerate(body.messages):
        allowed = _ROLE_BLOCKS[m.role]
        for j, b in enumerate(m.content):
            if not isinstance(b, allowed):
                kind = getattr(b, "type", "?")
                raise MessagesError(f"a {kind} block cannot be in a {m.role} turn",
                                    param=f"messages.{i}.content.{j}")



# ---------------------------------------------------------------------------------- to chat
def arguments_json(value: Any) -> str:
    """A tool call's ``input`` as chat ``arguments``: compact JSON, non-ASCII kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _image_part(block: ImageBlock) -> dict[str, Any]:
    src = block.source
    if src.type == "base64":
        if not src.data or not src.media_type:
            raise MessagesError("a base64 image needs 'media_type' and 'data'",
                                param="source")
        url = f"data:{src.media_type};base64,{src.data}"
    else:
        if not src.url:
            raise MessagesError("a url image needs 'url'", param="source")
        url = src.url
    return {"type": "image_url", "image_url": {"url": url}}


def _parts_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """One text part as a string (what most clients send and every engine takes)."""
    if len(parts) == 1 and parts[0]["type"] == "text":
        text: str = parts[0]["text"]
        return text
    return parts


def _result_text(content: str | list[Any]) -> tuple[str, list[dict[str, Any]]]:
    """A tool result's text, and its images (a chat tool message holds text only)."""
    if isinstance(content, str):
        return content, []
    texts = [b.text for b in content if isinstance(b, TextBlock)]
    images = [_image_part(b) for b in content if isinstance(b, ImageBlock)]
    return "\n".join(texts), images


def message_to_chat(msg: Message) -> list[dict[str, Any]]:
    """One Anthropic turn as chat messages: a user turn's tool results as ``tool`` messages
    (in order, before the turn's text and images), an assistant turn as one message with its
    text and ``tool_calls``."""
    if msg.role == "assistant":
        text = "".join(b.text for b in msg.content if isinstance(b, TextBlock))
        calls = [{"id": b.id, "type": "function",
                  "function": {"name": b.name, "arguments": arguments_json(b.input)}}
                 for b in msg.content if isinstance(b, ToolUseBlock)]
        out: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            out["tool_calls"] = calls
        return [out]
    if msg.role == "system":
        return [{"role": "system",
                 "content": "\n".join(b.text for b in msg.content if isinstance(b, TextBlock))}]
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for b in msg.content:
        if isinstance(b, ToolResultBlock):
            text, images = _result_text(b.content)
            tools.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": text})
            parts.extend(images)
        elif isinstance(b, TextBlock):
            parts.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageBlock):
            parts.append(_image_part(b))
    if parts or not tools:
        tools.append({"role": "user", "content": _parts_content(parts) if parts else ""})
    return tools


def system_text(system: str | list[TextBlock] | None) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        return system
    return "\n".join(b.text for b in system)


def chat_messages(body: RequestBody) -> list[dict[str, Any]]:
    """The request's conversation in chat form (``system`` first)."""
    out: list[dict[str, Any]] = []
    system = system_text(body.system)
    if system:
        out.append({"role": "system", "content": system})
    for i, m in enumerate(body.messages):
        try:
            out.extend(message_to_chat(m))
        except MessagesError as e:
            raise MessagesError(str(e).split(": ", 1)[1],
                                param=f"messages.{i}.{e.param}") from None
    return out


def chat_tools(body: RequestBody) -> list[dict[str, Any]] | None:
    """Client tools in chat's shape (``input_schema`` as ``parameters``)."""
    if not body.tools:
        return None
    out = []
    for t in body.tools:
        fn: dict[str, Any] = {"name": t["name"], "parameters": t["input_schema"]}
        if t.get("description"):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def to_chat(body: MessagesBody) -> dict[str, Any]:
    """The chat-completions body (no ``model``, no ``stream``: the node sets them) an engine
    without ``/v1/messages`` gets (module docstring); fields the gateway does not know pass
    on as they are."""
    out: dict[str, Any] = {k: v for k, v in (body.model_extra or {}).items()
                           if k not in ANTHROPIC_ONLY}
    out["messages"] = chat_messages(body)
    out["max_tokens"] = body.max_tokens
    for key in ("temperature", "top_p", "top_k"):
        v = getattr(body, key)
        if v is not None:
            out[key] = v
    if body.stop_sequences:
        out["stop"] = body.stop_sequences
    tools = chat_tools(body)
    if tools:
        out["tools"] = tools
    choice = body.tool_choice
    if choice is not None:
        if choice.type == "tool":
            out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        elif tools or choice.type == "none":
            out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
        if choice.disable_parallel_tool_use and tools:
            out["parallel_tool_calls"] = False
    return out


def count_tokens(body: RequestBody) -> int:
    """The prompt's tokens as the gateway estimates them (no tokenizer at the edge): 4
    characters a token over the text of every message, the system prompt and the tools'
    JSON, plus 4 a message (the built-in engine's own count)."""
    msgs = chat_messages(body)
    chars = 0
    for m in msgs:
        c = m.get("content")
        if isinstance(c, str):
            chars += len(c)
        elif isinstance(c, list):
            chars += sum(len(p.get("text", "")) for p in c if isinstance(p, dict))
        if m.get("tool_calls"):
            chars += len(json.dumps(m["tool_calls"], separators=(",", ":")))
    tools = chat_tools(body)
    if tools:
        chars += len(json.dumps(tools, separators=(",", ":")))
    return max(1, -(-chars // 4)) + 4 * len(msgs)


# ---------------------------------------------------------------------------------- from chat
def stop_reason(finish: str | None, matched: Any, stop_sequences: list[str] | None
                ) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` (and ``stop_sequence``) of a chat ``finish_reason``;
    ``matched``: the stop string the engine reports it stopped at (vLLM's ``stop_reason``)."""
    if finish in ("tool_calls", "function_call"):
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if finish == "content_filter":
        return "refusal", None
    if isinstance(matched, str) and stop_sequences and matched in stop_sequences:
        return "stop_sequence", matched
    return "end_turn", None


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's ``arguments`` as Anthropic's ``input`` object (``{}`` for arguments that
    are not a JSON object: cut short at ``max_tokens``, or a model's malformed output)."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def from_chat(chat: dict[str, Any], *, message_id: str, model: str,
              stop_sequences: list[str] | None) -> dict[str, Any]:
    """A chat completion (its first choice) as an Anthropic ``message``."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    msg = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    text = msg.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or "",
                        "name": fn.get("name") or "", "input": tool_input(fn.get("arguments"))})
    reason, seq = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"),
                              stop_sequences)
    usage = chat.get("usage") or {}
    return {"id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": reason, "stop_sequence": seq,
            "usage": {"input_tokens": int(usage.get("prompt_tokens") or 0),
                      "output_tokens": int(usage.get("completion_tokens") or 0)}}


def assistant_reply(content: list[dict[str, Any]]) -> dict[str, Any]:
    """An answer's content blocks as the chat message :func:`to_chat` makes of them when the
    client sends them back (the resolver's conversation evidence): its text and tool calls
    (other blocks, e.g. an engine's ``thinking``, are not part of it)."""
    kept = [b for b in content if isinstance(b, dict) and b.get("type") in ("text", "tool_use")]
    try:
        msg = Message.model_validate({"role": "assistant", "content": kept})
    except ValidationError:  # an engine's malformed block: no evidence rather than a failure
        return {"role": "assistant", "content": ""}
    return message_to_chat(msg)[0]


class MessageStreamer:
    """A chat completion's chunks (first choice) as Anthropic's event stream, as
    ``(event type, data)`` pairs. One content block per text run and per tool call, in order:
    a tool call's block starts on the chunk with its id and name, its ``input`` streams as
    ``input_json_delta`` pieces. :attr:`content` is the answer's blocks once finished."""

    def __init__(self, *, message_id: str, model: str, input_tokens: int,
                 stop_sequences: list[str] | None) -> None:
        self.message_id = message_id
        self.model = model
        self.input_tokens = input_tokens
        self.stop_sequences = stop_sequences
        #: blocks so far: [kind, text or (id, name), argument pieces]
        self._blocks: list[list[Any]] = []
        self._open: int | None = None  # index of the open block
        self._call_block: dict[int, int] = {}  # chat tool-call index -> block index
        self._finish: str | None = None
        self._matched: Any = None
        self.content: list[dict[str, Any]] = []

    def start(self) -> list[tuple[str, dict[str, Any]]]:
        message: dict[str, Any] = {"id": self.message_id, "type": "message", "role": "assistant",
                   "model": self.model, "content": [], "stop_reason": None,
                   "stop_sequence": None,
                   "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}
        return [("message_start", {"type": "message_start", "message": message}),
                ("ping", {"type": "ping"})]

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self._open is None:
            return []
        i, self._open = self._open, None
        return [("content_block_stop", {"type": "content_block_stop", "index": i})]

    def _text(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        if not text:
            return []
        out: list[tuple[str, dict[str, Any]]] = []
        if self._open is None or self._blocks[self._open][0] != "text":
            out += self._close()
            self._open = len(self._blocks)
            self._blocks.append(["text", [], None])
            out.append(("content_block_start", {"type": "content_block_start",
                                                "index": self._open,
                                                "content_block": {"type": "text", "text": ""}}))
        self._blocks[self._open][1].append(text)
        out.append(("content_block_delta", {"type": "content_block_delta", "index": self._open,
                                            "delta": {"type": "text_delta", "text": text}}))
        return out

    def _call(self, tc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        idx = tc.get("index", 0)
        fn = tc.get("function") or {}
        block = self._call_block.get(idx)
        if block is None:
            out += self._close()
            block = self._call_block[idx] = self._open = len(self._blocks)
            ident = [str(tc.get("id") or ""), str(fn.get("name") or "")]
            self._blocks.append(["tool_use", ident, []])
            out.append(("content_block_start", {
                "type": "content_block_start", "index": block,
                "content_block": {"type": "tool_use", "id": ident[0], "name": ident[1],
                                  "input": {}}}))
        # a call's pieces after another block began (not OpenAI's order) cannot reopen its
        # block in Anthropic's stream: they reach the final content only
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            self._blocks[block][2].append(args)
            if block == self._open:
                out.append(("content_block_delta", {
                    "type": "content_block_delta", "index": block,
                    "delta": {"type": "input_json_delta", "partial_json": args}}))
        return out

    def feed_chunk(self, chunk: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The events of one chat chunk (its first choice)."""
        out: list[tuple[str, dict[str, Any]]] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str):
                out += self._text(content)
            for tc in delta.get("tool_calls") or ():
                if isinstance(tc, dict):
                    out += self._call(tc)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
                self._matched = choice.get("stop_reason")
        return out

    def feed_text(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        """The events of a piece of text (an engine that streams text alone)."""
        return self._text(text)

    def finish(self, finish_reason: str | None, *, input_tokens: int, output_tokens: int
               ) -> list[tuple[str, dict[str, Any]]]:
        """The closing events; :attr:`content` is then the whole answer."""
        out = self._close()
        for kind, what, args in self._blocks:
            if kind == "text":
                self.content.append({"type": "text", "text": "".join(what)})
            else:
                self.content.append({"type": "tool_use", "id": what[0], "name": what[1],
                                     "input": tool_input("".join(args))})
        reason, seq = stop_reason(self._finish or finish_reason, self._matched,
                                  self.stop_sequences)
        out.append(("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out


class EventContent:
    """The content blocks an Anthropic event stream amounts to (an engine that streams the
    events itself): text deltas joined per block, a ``tool_use`` block's ``input_json_delta``
    pieces parsed once it ends. Other blocks (``thinking``) are kept as they started."""

    def __init__(self) -> None:
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        index = event.get("index")
        if not isinstance(index, int):
            return
        if kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self._blocks[index] = dict(event["content_block"])
        elif kind == "content_block_delta" and index in self._blocks:
            delta = event.get("delta") or {}
            block = self._blocks[index]
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif delta.get("type") == "input_json_delta":
                self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))

    @property
    def content(self) -> list[dict[str, Any]]:
        out = []
        for i in sorted(self._blocks):
            block = dict(self._blocks[i])
            if block.get("type") == "tool_use" and i in self._json:
                block["input"] = tool_input("".join(self._json[i]))
            out.append(block)
        return out

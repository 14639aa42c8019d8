"""The bodies of OpenAI's completion and embedding requests, checked at the edge.

:func:`parse_body` reads a body as strict JSON (:mod:`hermes.core.strict_json`: no ``NaN``,
``Infinity``, ``1e400``, lone surrogates or deep nesting anywhere, passed-through fields
included) and validates it in strict mode (a boolean is not a number, ``0`` is not
``false``), or answers the 400 that says what is wrong with it (``param`` names the field).
Sizes are bounded before any work proportional to them: at most :data:`MAX_EMBED_INPUTS`
embedding inputs, :data:`MAX_EMBED_DIMS` dimensions and :data:`MAX_EMBED_VALUES` numbers in
an embeddings answer, token ids in ``[0, 2**31)``. :func:`check_agent_fields`
checks ``tools``, ``tool_choice`` and ``response_format`` so that every engine behind the
gateway gets only well-formed ones; :func:`engine_body` is what the node forwards to the
engine. Unknown fields pass through to the engine unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from hermes.core import strict_json
from hermes.gateway.api.errors import body_error, error_response
from hermes.gateway.toolspec import ToolSpecError, check_function_name, check_parameters

MAX_TOKENS = 131_072  # upper bound of max_tokens (longer is a client error, not a long job)
#: inputs of one embeddings request (OpenAI's own limit)
MAX_EMBED_INPUTS = 2048
#: ``dimensions`` of an embedding
MAX_EMBED_DIMS = 8192
#: numbers in one embeddings answer (inputs x dimensions): ~20 MB of JSON, a bounded time
MAX_EMBED_VALUES = 1 << 20
#: a token id (vocabularies are far smaller; negative ids are garbage)
TokenId = Annotated[int, Field(ge=0, lt=1 << 31)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    #: the JSON object it was validated from (:func:`validate_body`), for :func:`engine_body`
    _raw: dict[str, Any] | None = PrivateAttr(default=None)

    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    n: int | None = Field(default=None, ge=1, le=128)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "user", "assistant", "tool", "developer", "function"]
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)


class CompletionBody(_Body):
    prompt: str | list[str] | list[TokenId] = Field(min_length=1)


class EmbeddingBody(BaseModel):
    """``POST /v1/embeddings``: OpenAI's fields; anything else passes on to the engine."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str = Field(min_length=1)
    input: (str | list[str] | list[TokenId]
            | list[Annotated[list[TokenId], Field(min_length=1)]]) = Field(
        min_length=1, max_length=MAX_EMBED_INPUTS)
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(default=None, ge=1, le=MAX_EMBED_DIMS)
    user: str | None = None

    @model_validator(mode="after")
    def _bounded_answer(self) -> EmbeddingBody:
        """inputs x dimensions within :data:`MAX_EMBED_VALUES` (the answer's size)."""
        x = self.input
        n = 1 if isinstance(x, str) or (x and isinstance(x[0], int)) else len(x)
        if self.dimensions is not None and n * self.dimensions > MAX_EMBED_VALUES:
            raise ValueError(f"{n} inputs x {self.dimensions} dimensions is over the limit "
                             f"of {MAX_EMBED_VALUES} numbers per request")
        return self


def read_json(raw: bytes) -> Any | JSONResponse:
    """``raw`` as strict JSON (:mod:`hermes.core.strict_json`), or the 400 naming where it
    is not."""
    try:
        return strict_json.loads(raw)
    except strict_json.StrictJSONError as e:
        return error_response(400, f"the request body is not valid JSON ({e})",
                              param=e.path or None, code="invalid_json")


def validate_body(raw: bytes, cls: type[BaseModel]) -> Any | JSONResponse:
    """``raw`` as ``cls`` (strict JSON, then the model in strict mode), or the 400."""
    data = read_json(raw)
    if isinstance(data, JSONResponse):
        return data
    try:
        body = cls.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        if err["type"] == "value_error" and not err["loc"]:  # EmbeddingBody._bounded_answer
            return error_response(400, f"dimensions: {err['msg']}", param="dimensions",
                                  code="invalid_value")
        if err["loc"] and err["loc"][0] in _UNIONS and len(err["loc"]) > 1:
            name = str(err["loc"][0])
            return error_response(400, f"{name}: {_UNIONS[name]}", param=name,
                                  code="invalid_value")
        return body_error(e)
    if isinstance(body, _Body):
        body._raw = data
    return body


#: fields of several shapes: what they may be (pydantic names every shape it tried)
_UNIONS = {
    "input": f"must be a string, a list of at most {MAX_EMBED_INPUTS} strings, a list of "
             "token ids (integers in [0, 2**31)) or a list of such lists",
    "prompt": "must be a string, a list of strings or a list of token ids (integers in "
              "[0, 2**31))",
}


async def parse_body(request: Request, cls: type[_Body]) -> _Body | JSONResponse:
    """The body as ``cls`` (:func:`validate_body`), or the 400 that says what is wrong."""
    return validate_body(await request.body(), cls)


class BadField(ValueError):
    """A request field the gateway refuses before anything is queued: ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def _check_schema(param: str, schema: Any) -> None:
    """A tool's ``parameters`` or a ``json_schema``'s ``schema`` (:mod:`hermes.gateway.toolspec`)."""
    try:
        check_parameters(param, schema)
    except ToolSpecError as e:
        raise BadField(e.param, e.message) from None


def check_agent_fields(data: dict[str, Any]) -> None:
    """``tools``, ``tool_choice`` and ``response_format`` of a chat body, checked at the edge
    so that every engine behind the gateway gets only well-formed ones and a client learns
    which field is wrong (:class:`BadField`). The values themselves go on unchanged."""
    tools = data.get("tools")
    names: set[str] = set()
    if tools is not None:
        if not isinstance(tools, list):
            raise BadField("tools", "must be a list of tools")
        for i, t in enumerate(tools):
            where = f"tools[{i}]"
            if not isinstance(t, dict) or t.get("type") != "function":
                raise BadField(f"{where}.type", "only 'function' tools are supported")
            fn = t.get("function")
            if not isinstance(fn, dict):
                raise BadField(f"{where}.function", "must be an object with a name")
            try:
                name = check_function_name(f"{where}.function.name", fn.get("name"))
            except ToolSpecError as e:
                raise BadField(e.param, e.message) from None
            if "parameters" in fn:
                _check_schema(f"{where}.function.parameters", fn["parameters"])
            names.add(name)
    choice = data.get("tool_choice")
    if choice is not None:
        if isinstance(choice, str):
            if choice not in ("none", "auto", "required"):
                raise BadField("tool_choice", "must be 'none', 'auto', 'required' or a "
                                "named function")
            if choice == "required" and not names:
                raise BadField("tool_choice", "'required' needs tools")
        elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
            if choice["function"].get("name") not in names:
                raise BadField("tool_choice.function.name", "names no tool of the request")
        else:
            raise BadField("tool_choice", "must be a string or {'type': 'function', "
                            "'function': {'name': ...}}")
    guided = data.get("guided_json")  # vLLM's extension: a schema or its JSON text
    if guided is not None:
        if isinstance(guided, str):
            try:
                guided = strict_json.loads(guided)
            except strict_json.StrictJSONError as e:
                raise BadField("guided_json", f"not a JSON schema: {e}") from None
        if not isinstance(guided, dict | bool):
            raise BadField("guided_json", "must be a JSON Schema (an object or its JSON text)")
    fmt = data.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind not in ("text", "json_object", "json_schema"):
            raise BadField("response_format.type",
                            "must be 'text', 'json_object' or 'json_schema'")
        if kind == "json_schema":
            js = fmt.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("name"), str):
                raise BadField("response_format.json_schema",
                                "must be an object with a 'name' and a 'schema'")
            if "schema" in js:
                _check_schema("response_format.json_schema.schema", js["schema"])


#: fields of a completion body the gateway answers for itself (not forwarded)
_OWN_FIELDS = frozenset(("model", "stream", "stream_options"))


def engine_body(body: _Body) -> dict[str, Any]:
    """What the node forwards to the engine: the request without model/stream options, and
    without fields (nor message fields) that are ``null``.

    Built from the JSON object the body was validated from when it has one (strict
    validation converts nothing, so its values are the model's): the messages' objects go
    on as they are (copied only to drop a ``null``), rather than each dumped from its model
    again, which cost ~1 us a message (timeit, 3 / 11 / 31 messages: 7.4 -> 2.5, 15.6 -> 3.5,
    34.8 -> 5.5 us)."""
    raw = body._raw
    if raw is None:  # built in code (model_validate of a dict it keeps no reference to)
        data = body.model_dump(exclude_none=True, exclude=set(_OWN_FIELDS))
        if isinstance(body, ChatBody):
            data["messages"] = [m.model_dump(exclude_none=True) for m in body.messages]
    else:
        data = {k: v for k, v in raw.items() if v is not None and k not in _OWN_FIELDS}
        if isinstance(body, ChatBody):
            data["messages"] = [m if None not in m.values()
                                else {k: v for k, v in m.items() if v is not None}
                                for m in data["messages"]]
    if isinstance(body, ChatBody) and "max_completion_tokens" in data and "max_tokens" not in data:
        data["max_tokens"] = data.pop("max_completion_tokens")
    return data


#: the fields of a completion body that :func:`check_agent_fields` reads
AGENT_FIELDS = ("tools", "tool_choice", "response_format", "guided_json")


async def parse_completion_body(request: Request,
                                endpoint: Literal["chat", "completions"]) -> _Body | JSONResponse:
    """A chat or completions body, validated, with its agent fields checked
    (:func:`check_agent_fields`), or the 400 that says what is wrong: what every front end
    (the all-in-one gateway, an edge) does before anything is queued."""
    parsed = await parse_body(request, ChatBody if endpoint == "chat" else CompletionBody)
    if isinstance(parsed, JSONResponse):
        return parsed
    extra = parsed.model_extra
    if extra and any(f in extra for f in AGENT_FIELDS):
        try:
            check_agent_fields(extra)
        except BadField as e:
            return error_response(400, str(e), param=e.param, code="invalid_value")
    return parsed


"""What the built-in simulated engine answers: output plans and the OpenAI objects built from them.

Pure functions (no I/O, no clock, no asyncio): given an endpoint, a request body and a
:class:`random.Random`, :func:`plan_output` decides what a real model would have produced,
token by token, so that the engine model can decode exactly that many tokens and agent
frameworks (tool loops, structured outputs, logprobs, ``n`` choices) get well-formed answers.
:func:`stream_chunk` (over the spans of :func:`stream_spans`: one tool call a chunk, its id
and name first), :func:`role_chunk`, :func:`finish_chunk` and :func:`response` build the
OpenAI objects the client sees; :func:`embedding_response` answers ``/v1/embeddings``.

The behaviour (the documented contract; :mod:`hermeslet.engines.sim_engine` repeats it for
users):

- **Choices**: ``n`` independent choices (index ``0..n-1``), each a list of output tokens.
- **Tools** (chat, ``tools`` or the legacy ``functions``): ``tool_choice`` ``"none"`` answers
  in text, ``"required"`` and a named function always call (the named one exactly), ``"auto"``
  (the default) calls on a turn that follows a user message, and after tool results calls
  again with probability :attr:`AgentBehaviour.tool_call_p` while fewer than
  :attr:`AgentBehaviour.max_tool_rounds` tool-call rounds happened since the last user
  message, else answers in text. ``parallel_tool_calls`` (default true) lets one turn call up
  to :attr:`AgentBehaviour.max_parallel` distinct tools. Arguments are a JSON instance of the
  tool's ``parameters`` schema (:func:`schema_instance`); call ids are ``call_`` + 24
  alphanumerics; finish reason ``tool_calls`` (``function_call`` for the legacy fields).
- **Structured text**: ``response_format`` ``json_object`` gives a JSON object,
  ``json_schema`` an instance of its schema (also vLLM's ``guided_json``).
- **Plain text**: vocabulary words (one word, with its leading space, per token) of a natural
  length drawn around :attr:`AgentBehaviour.mean_answer_tokens`; finish ``stop``.
- **Limits**: output is cut at ``max_tokens`` / ``max_completion_tokens`` (default: the
  engine's cap) with finish ``length``, tool calls and JSON too (their text is then
  incomplete, as a real model's). ``ignore_eos: true`` gives exactly the cap in vocabulary
  words with finish ``length`` whatever else is asked (the load generators rely on it);
  ``min_tokens`` lengthens a natural answer. ``stop`` strings end a text at their first
  occurrence (after ``min_tokens`` tokens, as vLLM), finish ``stop``, the stop string not
  included; the token in which it begins is the last one counted. The choice then names the
  string in ``stop_reason``, as vLLM does (what Anthropic's ``stop_sequence`` reports).
- **Tokens**: a text word, a ~4-character piece of JSON text or of a tool call's arguments, and
  a tool call's name are one token each. Prompts count ``ceil(chars / 4)`` of all message text
  (tool calls in the history and the tools' JSON included) plus 4 per message.
- **Logprobs**: chat ``logprobs``/``top_logprobs`` (k <= 20) and completions ``logprobs: k``
  give plausible negative values for the content tokens (the sampled token first in its top
  list); tool-call tokens have none.
- **Embeddings**: a hashing-trick bag of words (similar texts give similar vectors),
  L2-normalised, :data:`DEFAULT_EMBED_DIMS` dimensions or ``dimensions``, ``encoding_format``
  ``float`` or ``base64`` (little-endian float32, as OpenAI).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import random
import re
import string
import struct
import zlib
from dataclasses import dataclass, field, fields, replace
from typing import Any

import rstr

from hermeslet.engines.base import EngineError

#: the words plain text is made of (one word, with its leading space, per token)
VOCAB = (
    "the of and to in is that for it as with was on be by this are from at or an not have "
    "which but all were can has one their more will would there been if they so about than "
    "into time only some could new these two may first any like such then other its our "
    "model token engine run unit graph queue rank state plan tool code data result"
).split()
#: output cap of a request without ``max_tokens`` (a natural answer usually ends first)
DEFAULT_OUTPUT_CAP = 4096
#: dimensions of an embedding without ``dimensions``
DEFAULT_EMBED_DIMS = 256
MAX_EMBED_DIMS = 8192
MAX_N = 128
MAX_TOP_LOGPROBS = 20
#: characters of JSON text (and of tool-call arguments) per token
PIECE_CHARS = 4
_MAX_DEPTH = 8  # schema nesting beyond which only what is required is generated
_ALNUM = string.ascii_letters + string.digits
_STREAM_FIELDS = ("stream", "stream_options")


# ---------------------------------------------------------------------------------- behaviour
@dataclass(frozen=True, slots=True)
class AgentBehaviour:
    """How the simulated model behaves as an agent's model: set per engine, overridable per
    request by the body's ``sim_agent`` object (so a gateway can tune it per app or unit)."""

    tool_call_p: float = 0.5  # after tool results, P(calling tools again) while rounds remain
    max_tool_rounds: int = 4  # tool-call rounds since the last user message before answering
    max_parallel: int = 2  # distinct tools one turn may call (parallel_tool_calls)
    mean_answer_tokens: int = 24  # mean natural length of a text answer

    def __post_init__(self) -> None:
        for f in fields(self):
            problem = _knob_problem(f.name, getattr(self, f.name))
            if problem:
                raise ValueError(f"{f.name} {problem}")

    def overridden(self, raw: Any) -> AgentBehaviour:
        """This behaviour with a request's ``sim_agent`` overrides; a bad field is an
        :class:`EngineError` (status 400) naming it."""
        if raw is None:
            return self
        if not isinstance(raw, dict):
            raise EngineError("'sim_agent' must be an object", status=400)
        known = {f.name for f in fields(self)}
        for k, v in raw.items():
            if k not in known:
                raise EngineError(f"'sim_agent.{k}' is not a known field (known: "
                                  f"{', '.join(sorted(known))})", status=400)
            problem = _knob_problem(k, v)
            if problem:
                raise EngineError(f"'sim_agent.{k}' {problem}", status=400)
        return replace(self, **raw) if raw else self


def _knob_problem(name: str, v: Any) -> str | None:
    """Why ``v`` is not a valid value of the knob ``name`` (``None``: it is)."""
    if name == "tool_call_p":
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0
        return None if ok else "must be a number in [0, 1]"
    least = 0 if name == "max_tool_rounds" else 1
    ok = isinstance(v, int) and not isinstance(v, bool) and v >= least
    return None if ok else f"must be an integer >= {least}"


# ---------------------------------------------------------------------------------- plans
@dataclass(frozen=True, slots=True)
class Token:
    """One output token: ``kind`` ``text`` (content), ``name`` (a tool call's name: starts
    call ``call``) or ``args`` (a piece of call ``call``'s arguments)."""

    kind: str
    text: str
    call: int = 0


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A content token's logprob and its top alternatives (``top[0]`` is the token itself)."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A planned tool call (``arguments`` as produced: cut short when the output was)."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ChoicePlan:
    """One choice: its tokens in order, finish reason, tool calls and content logprobs."""

    index: int
    tokens: list[Token]
    finish_reason: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # per content token, when asked
    stop: str | None = None  # the stop string the text ended at (vLLM's ``stop_reason``)
    _offsets: list[int] | None = field(default=None, repr=False, compare=False)

    def text_offset(self, i: int) -> int:
        """Characters of text before token ``i`` (cumulated once, for streamed logprobs)."""
        if self._offsets is None:
            self._offsets = [0]
            for t in self.tokens:
                self._offsets.append(self._offsets[-1] + len(t.text))
        return self._offsets[i]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def content(self) -> str:
        return "".join(t.text for t in self.tokens if t.kind == "text")


@dataclass(slots=True)
class OutputPlan:
    """What one request produces: its choices and how to render them."""

    endpoint: str
    choices: list[ChoicePlan]
    logprobs: int | None = None  # top-k of the logprobs asked for (None: not asked)
    legacy_functions: bool = False  # ``functions``/``function_call`` instead of tools

    @property
    def output_tokens(self) -> int:
        return sum(c.n_tokens for c in self.choices)


@dataclass(frozen=True, slots=True)
class _Tool:
    name: str
    parameters: Any


@dataclass(frozen=True, slots=True)
class _Request:
    """The fields of a body that shape the output, validated once for all choices."""

    cap: int
    ignore_eos: bool
    min_tokens: int
    stops: tuple[str, ...]
    logprobs: int | None
    fmt: tuple[str, Any] | None  # ("json_object", None) | ("json_schema", schema)
    tools: tuple[_Tool, ...]
    tool_mode: str  # none | auto | required | named
    named: str | None
    parallel: bool
    legacy: bool
    rounds: int  # tool-call rounds since the last user message
    after_results: bool  # tool results since the last user message


def plan_output(endpoint: str, body: dict[str, Any], rng: random.Random,
                behaviour: AgentBehaviour = AgentBehaviour(), *,
                default_cap: int = DEFAULT_OUTPUT_CAP) -> OutputPlan:
    """Plan the output of a chat or completions request (module docstring for what it is).

    ``default_cap`` is the output cap without ``max_tokens``. Bad fields raise
    :class:`EngineError` (status 400). The choices draw from independent generators seeded
    from ``rng`` in order, so one ``rng`` state gives one answer."""
    beh = behaviour.overridden(body.get("sim_agent"))
    n = _int_field(body, "n", 1, least=1)
    if n > MAX_N:
        raise EngineError(f"'n' must be at most {MAX_N}", status=400)
    req = _parse_request(endpoint, body, default_cap)
    choices = [_plan_choice(i, req, beh, random.Random(rng.getrandbits(64)))
               for i in range(n)]
    return OutputPlan(endpoint, choices, req.logprobs, req.legacy)


def _parse_request(endpoint: str, body: dict[str, Any], default_cap: int) -> _Request:
    cap = max_tokens(endpoint, body)
    explicit = cap is not None
    cap = cap if cap is not None else max(1, default_cap)
    ignore_eos = body.get("ignore_eos") or False
    if not isinstance(ignore_eos, bool):
        raise EngineError("'ignore_eos' must be a boolean", status=400)
    min_tokens = _int_field(body, "min_tokens", 0, least=0)
    if explicit and min_tokens > cap:
        raise EngineError("'min_tokens' must be at most 'max_tokens'", status=400)
    tools, mode, named, parallel, legacy = _parse_tools(endpoint, body)
    rounds, after = _turn_state(body.get("messages")) if endpoint == "chat" else (0, False)
    return _Request(cap=cap, ignore_eos=ignore_eos, min_tokens=min(min_tokens, cap),
                    stops=_parse_stops(body), logprobs=_parse_logprobs(endpoint, body),
                    fmt=_parse_format(body), tools=tools, tool_mode=mode, named=named,
                    parallel=parallel, legacy=legacy, rounds=rounds, after_results=after)


def max_tokens(endpoint: str, body: dict[str, Any]) -> int | None:
    """The request's output cap (``max_completion_tokens`` first for chat), ``None`` if
    absent; not a positive integer: :class:`EngineError` (400)."""
    key = "max_completion_tokens" if endpoint == "chat" and \
        body.get("max_completion_tokens") is not None else "max_tokens"
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise EngineError(f"'{key}' must be a positive integer", status=400)
    return v


def _int_field(body: dict[str, Any], key: str, default: int, *, least: int) -> int:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v < least:
        raise EngineError(f"'{key}' must be an integer >= {least}", status=400)
    return v


def _parse_stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise EngineError("'stop' must be a string or a list of strings", status=400)
    return tuple(s for s in stop if s)


def _parse_logprobs(endpoint: str, body: dict[str, Any]) -> int | None:
    """Top-k of the logprobs asked for, ``None`` if none."""
    lp = body.get("logprobs")
    if endpoint == "chat":
        if lp is None or lp is False:
            return None
        if lp is not True:
            raise EngineError("'logprobs' must be a boolean", status=400)
        k = _int_field(body, "top_logprobs", 0, least=0)
        if k > MAX_TOP_LOGPROBS:
            raise EngineError(f"'top_logprobs' must be at most {MAX_TOP_LOGPROBS}", status=400)
        return k
    if lp is None:
        return None
    if not isinstance(lp, int) or isinstance(lp, bool) or not 0 <= lp <= MAX_TOP_LOGPROBS:
        raise EngineError(f"'logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}]",
                          status=400)
    return lp


def _parse_format(body: dict[str, Any]) -> tuple[str, Any] | None:
    guided = body.get("guided_json")  # vLLM's extension
    if guided is not None:
        try:
            schema = json.loads(guided) if isinstance(guided, str) else guided
        except ValueError:
            raise EngineError("'guided_json' is not valid JSON", status=400) from None
        return "json_schema", schema
    rf = body.get("response_format")
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_object", None
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise EngineError("'response_format.json_schema' must be an object", status=400)
        schema = js.get("schema", js.get("json_schema"))
        if schema is not None and not isinstance(schema, (dict, bool)):
            raise EngineError("'response_format.json_schema.schema' must be an object",
                              status=400)
        return "json_schema", schema if schema is not None else {"type": "object"}
    raise EngineError("'response_format.type' must be text, json_object or json_schema",
                      status=400)


def _parse_tools(endpoint: str, body: dict[str, Any]
                 ) -> tuple[tuple[_Tool, ...], str, str | None, bool, bool]:
    """(function tools, mode, named function, parallel calls allowed, legacy fields)."""
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise EngineError("'parallel_tool_calls' must be a boolean", status=400)
    legacy = body.get("tools") is None and body.get("functions") is not None
    raw = body.get("functions") if legacy else body.get("tools")
    choice = body.get("function_call") if legacy else body.get("tool_choice")
    what = "functions" if legacy else "tools"
    tools: list[_Tool] = []
    if raw is not None and endpoint == "chat":
        if not isinstance(raw, list):
            raise EngineError(f"'{what}' must be a list", status=400)
        for i, t in enumerate(raw):
            if not isinstance(t, dict):
                raise EngineError(f"'{what}[{i}]' must be an object", status=400)
            if not legacy and t.get("type", "function") != "function":
                continue  # other tool kinds (custom, built-in) are never called
            fn = t if legacy else t.get("function")
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                where = f"{what}[{i}].name" if legacy else f"{what}[{i}].function.name"
                raise EngineError(f"'{where}' must be a string", status=400)
            tools.append(_Tool(fn["name"], fn.get("parameters")))
    mode, named = _parse_choice(choice, what, legacy)
    if named is not None and named not in {t.name for t in tools}:
        raise EngineError(f"'{'function_call' if legacy else 'tool_choice'}' names "
                          f"{named!r}, which is not among the {what}", status=400)
    if mode == "required" and not tools:
        raise EngineError("'tool_choice' is 'required' but no tools are given", status=400)
    return tuple(tools), mode, named, parallel and not legacy, legacy


def _parse_choice(choice: Any, what: str, legacy: bool) -> tuple[str, str | None]:
    """(mode, named function) of ``tool_choice`` (``function_call`` for the legacy fields)."""
    key = "function_call" if legacy else "tool_choice"
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        if choice in ("none", "auto") or (choice == "required" and not legacy):
            return choice, None
    elif isinstance(choice, dict):
        fn = choice["function"] if isinstance(choice.get("function"), dict) else choice
        if isinstance(fn.get("name"), str):
            return "named", fn["name"]
    modes = "'none', 'auto'" + ("" if legacy else ", 'required'")
    raise EngineError(f"'{key}' must be {modes} or name a function of the {what}",
                      status=400)


def _turn_state(messages: Any) -> tuple[int, bool]:
    """(tool-call rounds, whether tool results came) since the last user message."""
    if not isinstance(messages, list):
        return 0, False
    last_user = -1
    for i, m in enumerate(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            last_user = i
    rounds, results = 0, False
    for m in messages[last_user + 1:]:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "assistant" and (m.get("tool_calls") or m.get("function_call")):
            rounds += 1
        elif m.get("role") in ("tool", "function"):
            results = True
    return rounds, results


def _plan_choice(index: int, req: _Request, beh: AgentBehaviour, rng: random.Random
                 ) -> ChoicePlan:
    if req.ignore_eos:
        tokens = [Token("text", " " + rng.choice(VOCAB)) for _ in range(req.cap)]
        tokens, stopped = _stopped(tokens, req)
        return _with_logprobs(ChoicePlan(index, tokens, "stop" if stopped else "length",
                                         stop=stopped),
                              req, rng)
    if _calls_tools(req, beh, rng):
        return _plan_calls(index, req, beh, rng)
    if req.fmt is not None:
        kind, schema = req.fmt
        value = schema_instance(schema, rng) if kind == "json_schema" else \
            _json_object(rng, _natural_length(beh, rng))
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        tokens = [Token("text", p) for p in pieces(text)]
    else:
        n = max(_natural_length(beh, rng), req.min_tokens)
        tokens = [Token("text", " " + rng.choice(VOCAB)) for _ in range(n)]
    finish = "stop"
    if len(tokens) > req.cap:
        tokens, finish = tokens[:req.cap], "length"
    tokens, stopped = _stopped(tokens, req)
    return _with_logprobs(ChoicePlan(index, tokens, "stop" if stopped else finish,
                                     stop=stopped), req, rng)


def _natural_length(beh: AgentBehaviour, rng: random.Random) -> int:
    """A text answer's natural length: log-normal (sigma 0.5) with mean
    ``mean_answer_tokens``, at least 1."""
    sigma = 0.5
    mu = math.log(beh.mean_answer_tokens) - sigma * sigma / 2
    return max(1, round(rng.lognormvariate(mu, sigma)))


def _stopped(tokens: list[Token], req: _Request) -> tuple[list[Token], str | None]:
    """``tokens`` cut before the first stop string that ends after ``min_tokens`` tokens
    (the token it begins in is kept, shortened); the stop string found (``None``: none)."""
    if not req.stops:
        return tokens, None
    text = "".join(t.text for t in tokens)
    floor = sum(len(t.text) for t in tokens[:req.min_tokens])
    best = -1
    matched: str | None = None
    for s in req.stops:
        at = text.find(s, max(0, floor - len(s) + 1))
        if at >= 0 and (best < 0 or at < best):
            best, matched = at, s
    if best < 0:
        return tokens, None
    out: list[Token] = []
    pos = 0
    for t in tokens:
        end = pos + len(t.text)
        if pos <= best < end:  # the stop string begins in this token
            out.append(Token(t.kind, t.text[:best - pos], t.call))
            break
        out.append(t)
        pos = end
    return out, matched


def _calls_tools(req: _Request, beh: AgentBehaviour, rng: random.Random) -> bool:
    if not req.tools or req.tool_mode == "none":
        return False
    if req.tool_mode in ("required", "named"):
        return True
    if req.rounds >= beh.max_tool_rounds:
        return False
    return not req.after_results or rng.random() < beh.tool_call_p


def _plan_calls(index: int, req: _Request, beh: AgentBehaviour, rng: random.Random
                ) -> ChoicePlan:
    if req.tool_mode == "named":
        chosen = [t for t in req.tools if t.name == req.named][:1]
    else:
        k = rng.randint(1, min(beh.max_parallel, len(req.tools))) if req.parallel else 1
        chosen = rng.sample(list(req.tools), k)
    calls = [ToolCall("call_" + "".join(rng.choices(_ALNUM, k=24)), t.name,
                      json.dumps(schema_instance(t.parameters, rng) if t.parameters is not None
                                 else {}, separators=(",", ":"), ensure_ascii=False))
             for t in chosen]
    tokens: list[Token] = []
    for i, c in enumerate(calls):
        tokens.append(Token("name", c.name, i))
        tokens.extend(Token("args", p, i) for p in pieces(c.arguments))
    finish = "function_call" if req.legacy else "tool_calls"
    if len(tokens) > req.cap:
        tokens, finish = tokens[:req.cap], "length"
        calls = [replace(c, arguments="".join(t.text for t in tokens
                                              if t.kind == "args" and t.call == i))
                 for i, c in enumerate(calls) if any(t.call == i for t in tokens)]
    return ChoicePlan(index, tokens, finish, calls,
                      [] if req.logprobs is not None else None)


def _with_logprobs(plan: ChoicePlan, req: _Request, rng: random.Random) -> ChoicePlan:
    if req.logprobs is not None:
        plan.logprobs = [_token_logprob(t.text, req.logprobs, rng) for t in plan.tokens]
    return plan


def _token_logprob(token: str, k: int, rng: random.Random) -> TokenLogprob:
    """A plausible logprob for ``token`` and its top ``k`` (itself first, descending)."""
    lp = -rng.expovariate(4.0)
    top = [(token, lp)]
    seen = {token}
    alt = lp
    while len(top) < k:
        word = " " + rng.choice(VOCAB)
        if word in seen:
            word = word + str(len(top))
        seen.add(word)
        alt -= 0.05 + rng.expovariate(0.8)
        top.append((word, alt))
    return TokenLogprob(token, lp, tuple(top[:k]))


def pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """``text`` in token-sized pieces of ``size`` characters (the last may be shorter)."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _json_object(rng: random.Random, target_tokens: int) -> dict[str, Any]:
    """A JSON object of vocabulary keys whose text is about ``target_tokens`` pieces."""
    out: dict[str, Any] = {}
    while not out or len(json.dumps(out, separators=(",", ":"))) < target_tokens * PIECE_CHARS:
        key = rng.choice(VOCAB)
        while key in out:
            key += "_" + rng.choice(VOCAB)
        r = rng.random()
        out[key] = (_words(rng, 1, 4) if r < 0.6 else rng.randint(0, 1000) if r < 0.85
                    else rng.random() < 0.5)
    return out


def _words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(rng.randint(lo, hi)))


# ---------------------------------------------------------------------------------- schemas
def schema_instance(schema: Any, rng: random.Random) -> Any:
    """A JSON value that validates against ``schema`` (JSON Schema, as OpenAI tools and
    pydantic's ``model_json_schema()`` write it).

    Supported: ``type`` (one or a list), object ``properties``/``required``/
    ``additionalProperties``/``min``/``maxProperties``, string ``minLength``/``maxLength``/
    ``enum``/``const``/``format`` (date, date-time, time, email, uri, uuid, ipv4, hostname),
    integer and number ``minimum``/``maximum``/``exclusive*``/``multipleOf``, boolean, null,
    array ``items``/``prefixItems``/``minItems``/``maxItems``/``uniqueItems``, ``anyOf``/
    ``oneOf`` (one branch picked: a ``oneOf`` whose branches overlap may match several),
    ``allOf`` (merged), ``$ref`` into ``$defs``/``definitions`` (recursion bounded: deep
    levels generate only what is required). ``pattern``: a string drawn from the regular
    expression (:func:`regex_sample`, ``rstr``) and checked against it and the length bounds;
    when eight draws fail, a plain string is returned."""
    return _SchemaGen(schema, rng).value(schema, 0)


class _SchemaGen:
    """One generation over ``root`` (for ``$ref``)."""

    def __init__(self, root: Any, rng: random.Random) -> None:
        self.root = root
        self.rng = rng

    def value(self, s: Any, depth: int) -> Any:
        if depth > 4 * _MAX_DEPTH:  # a schema that requires itself: no finite instance
            return None
        s = self.resolve(s, depth)
        if s is True or not isinstance(s, dict):
            return _words(self.rng, 1, 3)
        if "const" in s:
            return s["const"]
        if isinstance(s.get("enum"), list) and s["enum"]:
            return self.rng.choice(s["enum"])
        t = self.pick_type(s, depth)
        return getattr(self, "gen_" + t, self.gen_string)(s, depth)

    def resolve(self, s: Any, depth: int) -> Any:
        """``s`` with ``$ref``, ``allOf`` and an ``anyOf``/``oneOf`` branch merged in."""
        for _ in range(64):
            if not isinstance(s, dict):
                return s
            if "$ref" in s:
                target = self.ref(s["$ref"])
                rest = {k: v for k, v in s.items() if k != "$ref"}
                s = _merge(target, rest) if isinstance(target, dict) else target
                continue
            if "allOf" in s and isinstance(s["allOf"], list):
                merged = {k: v for k, v in s.items() if k != "allOf"}
                for sub in s["allOf"]:
                    sub = self.resolve(sub, depth)
                    if isinstance(sub, dict):
                        merged = _merge(merged, sub)
                s = merged
                continue
            for key in ("anyOf", "oneOf"):
                if isinstance(s.get(key), list) and s[key]:
                    rest = {k: v for k, v in s.items() if k != key}
                    s = _merge(rest, self.branch(s[key], depth))
                    break
            else:
                return s
        return s

    def branch(self, branches: list[Any], depth: int) -> Any:
        """A branch of ``anyOf``/``oneOf``: deep in the schema, ``null`` or a branch without
        ``$ref`` when there is one (ends recursion); else mostly not ``null``."""
        def is_null(b: Any) -> bool:
            return isinstance(b, dict) and b.get("type") == "null"

        if depth >= _MAX_DEPTH:
            flat = [b for b in branches if is_null(b)] or \
                [b for b in branches if not (isinstance(b, dict) and "$ref" in b)]
            if flat:
                return flat[0]
        real = [b for b in branches if not is_null(b)]
        if real and (len(real) == len(branches) or self.rng.random() < 0.75):
            return self.rng.choice(real)
        return self.rng.choice(branches)

    def ref(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return {}  # external references: anything
        node = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return {}
        return node

    def pick_type(self, s: dict[str, Any], depth: int) -> str:
        t = s.get("type")
        if isinstance(t, list) and t:
            real = [x for x in t if x != "null"]
            if not real or (depth >= _MAX_DEPTH and "null" in t) or \
                    (len(real) < len(t) and self.rng.random() < 0.25):
                return "null"
            kind: str = self.rng.choice(real)
            return kind
        if isinstance(t, str):
            return t
        if any(k in s for k in ("properties", "additionalProperties", "required",
                                "minProperties", "patternProperties")):
            return "object"
        if any(k in s for k in ("items", "prefixItems", "minItems", "maxItems")):
            return "array"
        if any(k in s for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                "multipleOf")):
            return "number"
        return "string"

    # -- by type
    def gen_null(self, s: dict[str, Any], depth: int) -> None:
        return None

    def gen_boolean(self, s: dict[str, Any], depth: int) -> bool:
        return self.rng.random() < 0.5

    def gen_object(self, s: dict[str, Any], depth: int) -> dict[str, Any]:
        rng = self.rng
        props = s["properties"] if isinstance(s.get("properties"), dict) else {}
        required = [r for r in s.get("required") or () if isinstance(r, str)]
        lo = s.get("minProperties", 0)
        hi = s.get("maxProperties")
        out: dict[str, Any] = {}
        for name in required:
            out[name] = self.value(props.get(name, {}), depth + 1)
        optional = [p for p in props if p not in out]
        for name in optional:
            if depth < _MAX_DEPTH and rng.random() < 0.6 or len(out) < lo:
                if hi is not None and len(out) >= hi:
                    break
                out[name] = self.value(props[name], depth + 1)
        extra = s.get("additionalProperties", True)
        closed = extra is False or "patternProperties" in s
        if not closed and not props and depth < _MAX_DEPTH:
            want = max(lo - len(out), rng.randint(0 if extra is True else 1, 2))
            if hi is not None:
                want = min(want, hi - len(out))
            for _ in range(want):
                key = rng.choice(VOCAB)
                while key in out:
                    key += "_" + rng.choice(VOCAB)
                out[key] = self.value(extra if isinstance(extra, dict) else {}, depth + 1)
        while len(out) < lo and not closed:  # minProperties beyond the named properties
            out[f"{rng.choice(VOCAB)}_{len(out)}"] = self.value(
                extra if isinstance(extra, dict) else {}, depth + 1)
        return out

    def gen_array(self, s: dict[str, Any], depth: int) -> list[Any]:
        rng = self.rng
        prefix = s.get("prefixItems")
        items = s.get("items", {})
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, s.get("additionalItems", {})
        prefix = prefix if isinstance(prefix, list) else []
        lo = int(s.get("minItems", 0))
        hi = s.get("maxItems")
        if items is False:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        top = lo + 3 if hi is None else max(lo, min(int(hi), lo + 3))
        n = lo if depth >= _MAX_DEPTH else rng.randint(max(lo, min(1, top)), top)
        out: list[Any] = []
        seen: set[str] = set()
        for i in range(n):
            sub = prefix[i] if i < len(prefix) else items
            for _ in range(10):
                v = self.value(sub, depth + 1)
                key = json.dumps(v, sort_keys=True)
                if not s.get("uniqueItems") or key not in seen:
                    break
            else:
                if len(out) >= lo:
                    break
            seen.add(key)
            out.append(v)
        return out

    def gen_integer(self, s: dict[str, Any], depth: int) -> int:
        lo, hi = _bounds(s, integer=True)
        m = s.get("multipleOf")
        if isinstance(m, (int, float)) and m > 0:
            ks = (math.ceil(lo / m), math.floor(hi / m))
            if ks[0] <= ks[1]:
                v = self.rng.randint(*ks) * m
                if float(v).is_integer():
                    return int(v)
        return self.rng.randint(int(lo), int(hi)) if lo <= hi else int(lo)

    def gen_number(self, s: dict[str, Any], depth: int) -> float | int:
        lo, hi = _bounds(s, integer=False)
        m = s.get("multipleOf")
        if isinstance(m, (int, float)) and m > 0:
            k0, k1 = math.ceil(lo / m), math.floor(hi / m)
            for _ in range(20):  # float multiples are checked as jsonschema checks them
                if k0 > k1:
                    break
                v = self.rng.randint(k0, k1) * m
                v = round(v, 10) if isinstance(v, float) else v
                if (v / m).is_integer() and lo <= v <= hi:
                    return v
            if lo <= 0 <= hi:
                return 0
        v = round(self.rng.uniform(lo, hi), 2)
        if not lo <= v <= hi:
            v = (lo + hi) / 2
        return v

    def gen_string(self, s: dict[str, Any], depth: int) -> str:
        rng = self.rng
        lo = int(s.get("minLength", 0))
        hi = s.get("maxLength")
        pattern = s.get("pattern")
        if isinstance(pattern, str):
            for _ in range(8):
                v = regex_sample(pattern, rng)
                if v is not None and len(v) >= lo and (hi is None or len(v) <= hi):
                    return v
        fmt = s.get("format")
        v = _formatted(fmt, rng) if isinstance(fmt, str) else None
        if v is None:
            v = _words(rng, 1, 4)
        while len(v) < lo:
            v += " " + rng.choice(VOCAB)
        if hi is not None and len(v) > hi:
            v = v[:int(hi)].rstrip() if len(v[:int(hi)].rstrip()) >= lo else v[:int(hi)]
        return v


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two schemas' keys together (``properties`` merged, ``required`` united)."""
    out = {**a, **b}
    if isinstance(a.get("properties"), dict) and isinstance(b.get("properties"), dict):
        out["properties"] = {**a["properties"], **b["properties"]}
    if isinstance(a.get("required"), list) and isinstance(b.get("required"), list):
        out["required"] = list(dict.fromkeys(a["required"] + b["required"]))
    return out


def _bounds(s: dict[str, Any], *, integer: bool) -> tuple[float, float]:
    """The inclusive range of a number schema (exclusive bounds moved inside)."""
    step = 1 if integer else 0.01
    lo = s.get("minimum")
    hi = s.get("maximum")
    xlo, xhi = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
    if xlo is True and lo is not None:  # draft 4 booleans
        lo = lo + step
    elif isinstance(xlo, (int, float)) and not isinstance(xlo, bool):
        lo = xlo + step if lo is None else max(lo, xlo + step)
    if xhi is True and hi is not None:
        hi = hi - step
    elif isinstance(xhi, (int, float)) and not isinstance(xhi, bool):
        hi = xhi - step if hi is None else min(hi, xhi - step)
    if lo is None:  # a range of 100 up to the bound given (none: [0, 100])
        lo = 0 if hi is None else hi - 100
    if hi is None:
        hi = lo + 100
    if integer:
        lo, hi = math.ceil(lo), math.floor(hi)
    return lo, hi


def _formatted(fmt: str, rng: random.Random) -> str | None:
    """A plausible value of a JSON Schema ``format`` (``None``: not a known one)."""
    y, mo, d = rng.randint(2000, 2030), rng.randint(1, 12), rng.randint(1, 28)
    h, mi, sec = rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59)
    word = rng.choice(VOCAB)
    if fmt == "date":
        return f"{y:04d}-{mo:02d}-{d:02d}"
    if fmt == "date-time":
        return f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{sec:02d}Z"
    if fmt == "time":
        return f"{h:02d}:{mi:02d}:{sec:02d}Z"
    if fmt in ("email", "idn-email"):
        return f"{word}{rng.randint(1, 99)}@example.com"
    if fmt in ("uri", "url", "iri", "uri-reference", "iri-reference"):
        return f"https://example.com/{word}/{rng.randint(1, 999)}"
    if fmt in ("hostname", "idn-hostname"):
        return f"{word}.example.com"
    if fmt == "uuid":
        b = rng.getrandbits(128)
        hx = f"{b:032x}"
        return f"{hx[:8]}-{hx[8:12]}-4{hx[13:16]}-{'89ab'[b & 3]}{hx[17:20]}-{hx[20:]}"
    if fmt == "ipv4":
        return ".".join(str(rng.randint(1, 254)) for _ in range(4))
    if fmt == "ipv6":
        return ":".join(f"{rng.getrandbits(16):x}" for _ in range(8))
    if fmt == "duration":
        return f"P{rng.randint(1, 30)}D"
    return None


def regex_sample(pattern: str, rng: random.Random) -> str | None:
    """A string in which ``pattern`` is found (``re.search``), drawn from the regular
    expression by ``rstr``'s ``xeger`` with ``rng`` (so one seed gives one string); ``None``
    when the pattern does not compile or the draw does not match (``xeger`` emits nothing for
    a look-ahead, so one that demands a character it did not draw fails the check)."""
    try:
        text = rstr.Rstr(rng).xeger(pattern)
    except (re.error, ValueError, KeyError, IndexError, TypeError, RecursionError):
        return None
    return text if re.search(pattern, text) else None


# ---------------------------------------------------------------------------------- prompts
def text_tokens(text: str) -> int:
    """Token count heuristic for text: ``ceil(chars / 4)``, at least 1."""
    return max(1, math.ceil(len(text) / 4))


def content_text(content: Any) -> str:
    """The text of a message's ``content`` (a string or OpenAI content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict)
                       and isinstance(p.get("text", ""), str))
    return ""


def _message_text(m: Any) -> str:
    if not isinstance(m, dict):
        return ""
    text = content_text(m.get("content"))
    for key in ("tool_calls", "function_call"):
        if m.get(key):
            text += json.dumps(m[key], separators=(",", ":"))
    return text


def prompt_tokens(endpoint: str, body: dict[str, Any]) -> tuple[int, str | None, int]:
    """(input tokens, cacheable prefix or None, prefix tokens) of a request body.

    Chat: ``ceil(chars / 4)`` of all message text (tool calls in the history and the
    ``tools``/``functions`` JSON included) plus 4 per message; the first message's text is
    the cacheable prefix. Completions: the prompt's token ids, or ``ceil(chars / 4)``."""
    if endpoint == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise EngineError("'messages' must be a non-empty list", status=400)
        texts = [_message_text(m) for m in msgs]
        tools = "".join(json.dumps(body[k], separators=(",", ":"))
                        for k in ("tools", "functions") if body.get(k))
        n = text_tokens("".join(texts) + tools) + 4 * len(msgs)
        first = content_text(msgs[0].get("content")) if isinstance(msgs[0], dict) else ""
        prefix = first if len(msgs) > 1 and first else None
        return n, prefix, (text_tokens(prefix) + 4 if prefix else 0)
    if "prompt_token_ids" in body and isinstance(body["prompt_token_ids"], list):
        return max(1, len(body["prompt_token_ids"])), None, 0
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return text_tokens(prompt), None, 0
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt), None, 0
    raise EngineError("'prompt' must be a string, one string in a list, or token ids",
                      status=400)


def request_rng(body: dict[str, Any], request_id: str, engine_seed: int) -> random.Random:
    """The generator of one request: with ``seed``, from the seed and a hash of the body
    (stream fields left out), so a repeated request gives the same answer; else from the
    request id and the engine seed."""
    seed = body.get("seed")
    if seed is None:
        return random.Random(_crc(request_id) ^ engine_seed)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise EngineError("'seed' must be an integer", status=400)
    rest = {k: v for k, v in body.items() if k not in _STREAM_FIELDS}
    digest = hashlib.sha256(json.dumps(rest, sort_keys=True, default=str).encode()).digest()
    return random.Random(f"{seed}:{digest.hex()}")


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


# ---------------------------------------------------------------------------------- rendering
@dataclass(frozen=True, slots=True)
class Envelope:
    """The fields every object of one answer shares."""

    id: str
    model: str
    created: int


def _chunk(plan: OutputPlan, env: Envelope, choices: list[dict[str, Any]]) -> dict[str, Any]:
    obj = "chat.completion.chunk" if plan.endpoint == "chat" else "text_completion"
    return {"id": env.id, "object": obj, "created": env.created, "model": env.model,
            "choices": choices}


def role_chunk(plan: OutputPlan, index: int, env: Envelope) -> dict[str, Any] | None:
    """The chat chunk that opens choice ``index`` (``None`` for completions)."""
    if plan.endpoint != "chat":
        return None
    return _chunk(plan, env, [{"index": index, "delta": {"role": "assistant", "content": ""},
                               "logprobs": None, "finish_reason": None}])


def finish_chunk(plan: OutputPlan, index: int, env: Envelope) -> dict[str, Any]:
    """The chunk that ends choice ``index`` with its finish reason."""
    ch = plan.choices[index]
    fr = ch.finish_reason
    if plan.endpoint == "chat":
        c: dict[str, Any] = {"index": index, "delta": {}, "logprobs": None, "finish_reason": fr}
    else:
        c = {"index": index, "text": "", "logprobs": None, "finish_reason": fr}
    if ch.stop is not None:
        c["stop_reason"] = ch.stop
    return _chunk(plan, env, [c])


def stream_spans(plan: OutputPlan, index: int, start: int, end: int) -> list[tuple[int, int]]:
    """Tokens ``start:end`` of choice ``index`` cut into the spans OpenAI's service streams
    as separate chunks: a tool call's name token (its id and name) alone, then its argument
    pieces, never two calls in one chunk (clients such as llama-index's streamed agents key
    a call by the first id in a chunk and lose a second call sharing it). Text tokens stay
    together. Concatenated, the spans are ``start:end``."""
    toks = plan.choices[index].tokens
    spans: list[tuple[int, int]] = []
    s = start
    for i in range(start + 1, end):
        t, prev = toks[i], toks[i - 1]
        if t.kind == "name" or prev.kind == "name" or t.call != prev.call \
                or (t.kind == "text") != (prev.kind == "text"):
            spans.append((s, i))
            s = i
    if s < end:
        spans.append((s, end))
    return spans


def stream_chunk(plan: OutputPlan, index: int, start: int, end: int, env: Envelope
                 ) -> dict[str, Any]:
    """The chunk carrying tokens ``start:end`` of choice ``index`` (content, tool-call deltas
    by call index, logprobs)."""
    ch = plan.choices[index]
    toks = ch.tokens[start:end]
    lps = ch.logprobs[start:end] if ch.logprobs else None
    if plan.endpoint != "chat":
        lp = _completion_logprobs(lps, ch.text_offset(start)) if lps is not None else None
        return _chunk(plan, env, [{"index": index, "text": "".join(t.text for t in toks),
                                   "logprobs": lp, "finish_reason": None}])
    delta: dict[str, Any] = {}
    text = "".join(t.text for t in toks if t.kind == "text")
    if any(t.kind == "text" for t in toks):
        delta["content"] = text
    calls = [t for t in toks if t.kind != "text"]
    if calls and plan.legacy_functions:
        fc: dict[str, Any] = {}
        for t in calls:
            if t.kind == "name":
                fc["name"] = t.text
            fc["arguments"] = fc.get("arguments", "") + (t.text if t.kind == "args" else "")
        delta["function_call"] = fc
    elif calls:
        entries: dict[int, dict[str, Any]] = {}
        for t in calls:
            e = entries.get(t.call)
            if t.kind == "name":
                e = entries[t.call] = {"index": t.call, "id": ch.tool_calls[t.call].id,
                                       "type": "function",
                                       "function": {"name": t.text, "arguments": ""}}
            elif e is None:
                e = entries[t.call] = {"index": t.call, "function": {"arguments": ""}}
            if t.kind == "args":
                e["function"]["arguments"] += t.text
        delta["tool_calls"] = list(entries.values())
    lp = {"content": [_chat_logprob(x) for x in lps]} if lps else None
    return _chunk(plan, env, [{"index": index, "delta": delta, "logprobs": lp,
                               "finish_reason": None}])


def response(plan: OutputPlan, env: Envelope, prompt_tokens: int) -> dict[str, Any]:
    """The whole non-streamed answer: ``chat.completion`` or ``text_completion``, with usage."""
    choices: list[dict[str, Any]] = []
    for ch in plan.choices:
        if plan.endpoint == "chat":
            msg: dict[str, Any] = {"role": "assistant", "content": None if ch.tool_calls
                                   else ch.content, "refusal": None}
            if ch.tool_calls and plan.legacy_functions:
                c = ch.tool_calls[0]
                msg["function_call"] = {"name": c.name, "arguments": c.arguments}
            elif ch.tool_calls:
                msg["tool_calls"] = [{"id": c.id, "type": "function", "function":
                                      {"name": c.name, "arguments": c.arguments}}
                                     for c in ch.tool_calls]
            lp = None
            if ch.logprobs is not None:
                lp = {"content": [_chat_logprob(x) for x in ch.logprobs] if not ch.tool_calls
                      else None, "refusal": None}
            choices.append({"index": ch.index, "message": msg, "logprobs": lp,
                            "finish_reason": ch.finish_reason})
        else:
            lp = _completion_logprobs(ch.logprobs, 0) if ch.logprobs is not None else None
            choices.append({"index": ch.index, "text": ch.content, "logprobs": lp,
                            "finish_reason": ch.finish_reason})
        if ch.stop is not None:
            choices[-1]["stop_reason"] = ch.stop
    out = plan.output_tokens
    return {"id": env.id, "object": "chat.completion" if plan.endpoint == "chat"
            else "text_completion", "created": env.created, "model": env.model,
            "choices": choices, "usage": {"prompt_tokens": prompt_tokens,
                                          "completion_tokens": out,
                                          "total_tokens": prompt_tokens + out}}


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def _chat_logprob(x: TokenLogprob) -> dict[str, Any]:
    return {**_entry(x.token, x.logprob), "top_logprobs": [_entry(t, v) for t, v in x.top]}


def _completion_logprobs(lps: list[TokenLogprob], offset: int) -> dict[str, Any]:
    offsets = []
    for x in lps:
        offsets.append(offset)
        offset += len(x.token)
    return {"tokens": [x.token for x in lps], "token_logprobs": [x.logprob for x in lps],
            "top_logprobs": [dict(x.top) or {x.token: x.logprob} for x in lps],
            "text_offset": offsets}


# ---------------------------------------------------------------------------------- embeddings
def embedding_inputs(body: dict[str, Any]) -> list[str | list[int]]:
    """The inputs of an embeddings request (``input``: a string, strings, token ids or lists
    of token ids); anything else is an :class:`EngineError` (400)."""
    x = body.get("input")
    if isinstance(x, str):
        return [x]
    if isinstance(x, list) and x:
        if all(isinstance(v, str) for v in x):
            return list(x)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in x):
            return [list(x)]
        if all(isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool)
                                                  for t in v) for v in x):
            return [list(v) for v in x]
    raise EngineError("'input' must be a string, a non-empty list of strings, token ids or "
                      "lists of token ids", status=400)


def embed(item: str | list[int], dims: int = DEFAULT_EMBED_DIMS) -> list[float]:
    """A deterministic L2-normalised embedding: a hashing-trick bag of words (lower-cased
    words, or token ids), so that texts sharing words get close vectors."""
    feats = re.findall(r"\w+", item.lower()) if isinstance(item, str) else \
        [f"#{t}" for t in item]
    if not feats:
        feats = [item if isinstance(item, str) else "#"]
    v = [0.0] * dims
    for f in feats:
        h = int.from_bytes(hashlib.blake2b(f.encode(), digest_size=8).digest(), "little")
        v[h % dims] += 1.0 if (h >> 40) & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in v))
    if norm == 0.0:  # features that cancelled out: any fixed unit vector
        v[0], norm = 1.0, 1.0
    return [x / norm for x in v]


def embedding_response(body: dict[str, Any], model: str, *,
                       default_dims: int = DEFAULT_EMBED_DIMS) -> tuple[dict[str, Any], int]:
    """OpenAI's embeddings answer for ``body`` and its prompt tokens."""
    inputs = embedding_inputs(body)
    dims = body.get("dimensions")
    if dims is None:
        dims = default_dims
    elif not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= MAX_EMBED_DIMS:
        raise EngineError(f"'dimensions' must be an integer in [1, {MAX_EMBED_DIMS}]",
                          status=400)
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise EngineError("'encoding_format' must be 'float' or 'base64'", status=400)
    data = []
    for i, item in enumerate(inputs):
        vec = embed(item, dims)
        value: Any = vec if fmt == "float" else \
            base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    n = sum(text_tokens(x) if isinstance(x, str) else len(x) for x in inputs)
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": n, "total_tokens": n}}, n

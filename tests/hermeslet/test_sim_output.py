"""The simulated engine's output planning (``hermeslet.engines.sim_output``), pure: tool calls
valid against their schemas, tool-choice and tool-loop behaviour, structured outputs, limits,
stop strings, seeds, logprobs, n choices, the chunk and answer objects, embeddings."""

from __future__ import annotations

import base64
import json
import math
import random
import struct
from datetime import date, datetime
from enum import StrEnum
from typing import Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from hermeslet.engines.base import EngineError
from hermeslet.engines.sim_output import (
    VOCAB,
    AgentBehaviour,
    Envelope,
    OutputPlan,
    embed,
    embedding_response,
    finish_chunk,
    plan_output,
    prompt_tokens,
    regex_sample,
    request_rng,
    response,
    role_chunk,
    schema_instance,
    stream_chunk,
)

ENV = Envelope("chatcmpl-x", "m", 1)
USER = [{"role": "user", "content": "what is the weather in Paris?"}]


def tool(name: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if params is not None:
        fn["parameters"] = params
    return {"type": "function", "function": fn}


WEATHER = tool("get_weather", {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["C", "F"]}}, "required": ["city"]})
SEARCH = tool("search", {"type": "object", "properties": {"q": {"type": "string"}}})
CLOCK = tool("now")  # no parameters at all
TOOLS = [WEATHER, SEARCH, CLOCK]


def plan(body: dict[str, Any], seed: int = 0, endpoint: str = "chat", **beh: Any) -> OutputPlan:
    return plan_output(endpoint, body, random.Random(seed), AgentBehaviour(**beh))


def chat(**kw: Any) -> dict[str, Any]:
    return {"messages": USER, **kw}


# ---------------------------------------------------------------------------------- schemas
class Colour(StrEnum):
    red = "red"
    green = "green"


class Address(BaseModel):
    street: str = Field(min_length=3, max_length=30)
    zip: str = Field(pattern=r"^\d{5}(-\d{4})?$")
    country: Literal["FR", "DE", "US"] = "FR"


class Tag(BaseModel):
    label: str
    weight: float = Field(gt=0, le=1, multiple_of=0.25)


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, lt=130)
    email: str = Field(json_schema_extra={"format": "email"})
    born: date
    seen: datetime | None = None
    favourite: Colour
    address: Address | None = None
    tags: list[Tag] = Field(default_factory=list, max_length=3)
    scores: dict[str, int] = Field(default_factory=dict)
    friends: list[Person] = Field(default_factory=list)  # recursive: $ref to itself
    kind: Literal["human"] | int


HAND_WRITTEN: list[dict[str, Any]] = [
    {"type": "object", "properties": {"q": {"type": "string", "minLength": 5, "maxLength": 8},
                                      "k": {"type": "integer", "exclusiveMinimum": 0,
                                            "exclusiveMaximum": 4}},
     "required": ["q", "k"], "additionalProperties": False},
    {"type": "object", "properties": {
        "when": {"type": "string", "format": "date-time"},
        "site": {"type": "string", "format": "uri"},
        "id": {"type": "string", "format": "uuid"},
        "n": {"type": "number", "minimum": -2.5, "maximum": -1.5},
        "m": {"type": "integer", "multipleOf": 7, "minimum": 10, "maximum": 60},
        "flag": {"type": "boolean"}, "nothing": {"type": "null"},
        "maybe": {"type": ["string", "null"]},
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
        "const": {"const": "fixed"}},
     "required": ["when", "site", "id", "n", "m", "flag", "nothing", "maybe", "code", "const"]},
    {"type": "object", "properties": {
        "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                 "items": False, "minItems": 2},
        "uniq": {"type": "array", "items": {"enum": [1, 2, 3]}, "uniqueItems": True,
                 "minItems": 2, "maxItems": 3},
        "either": {"oneOf": [{"type": "string", "maxLength": 2},
                             {"type": "object", "properties": {"x": {"type": "integer"}},
                              "required": ["x"]}]},
        "both": {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}},
                            "required": ["a"]},
                           {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
        "node": {"$ref": "#/definitions/node"}},
     "required": ["pair", "uniq", "either", "both", "node"],
     "definitions": {"node": {"type": "object", "properties": {
         "v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/definitions/node"},
                                                      {"type": "null"}]}},
         "required": ["v", "next"]}}},
    {"type": "object", "minProperties": 2, "additionalProperties": {"type": "integer"}},
    {},  # anything
]


@pytest.mark.parametrize("schema", [Person.model_json_schema(), Address.model_json_schema(),
                                    *HAND_WRITTEN],
                         ids=["person", "address", "bounds", "formats", "composed", "map", "any"])
def test_schema_instances_validate(schema: dict[str, Any]) -> None:
    checker = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    for seed in range(200):
        value = schema_instance(schema, random.Random(seed))
        errors = [e.message for e in checker.iter_errors(value)]
        assert not errors, (seed, value, errors)


def test_pydantic_models_accept_the_instances() -> None:
    schema = Person.model_json_schema()
    assert "$defs" in schema  # the case that matters: references into $defs
    people = [Person.model_validate(schema_instance(schema, random.Random(s)))
              for s in range(200)]
    assert {p.favourite for p in people} == {Colour.red, Colour.green}
    assert any(p.address is not None for p in people) and any(p.friends for p in people)
    assert all(re_zip(p.address.zip) for p in people if p.address)


def re_zip(z: str) -> bool:
    import re

    return re.fullmatch(r"\d{5}(-\d{4})?", z) is not None


def test_regex_sample_is_checked_and_deterministic_per_seed() -> None:
    import re

    rng = random.Random(1)
    for pat in (r"^[a-f0-9]{8}$", r"(cat|dog)s?\d", r"^\w+@\w+\.(com|org)$", r"[^xyz]{3}",
                r"(a|b)\1c", r"(?<=b)c"):  # back references and look-behinds too (rstr)
        for _ in range(20):
            assert re.search(pat, regex_sample(pat, rng) or "") is not None, pat
    assert regex_sample(r"(?=x)y", rng) is None  # a look-ahead that the draw ignored: checked
    assert regex_sample("(unclosed", rng) is None
    draws = [regex_sample(r"^[A-Z]{3}-\d{2,4}$", random.Random(s)) for s in (7, 7, 8)]
    assert draws[0] == draws[1] != draws[2]


# ---------------------------------------------------------------------------------- tools
def calls(p: OutputPlan, i: int = 0) -> list[str]:
    return [c.name for c in p.choices[i].tool_calls]


def test_tool_call_arguments_validate_against_each_tool_schema() -> None:
    person = tool("add_person", Person.model_json_schema())
    schemas = {"add_person": Person.model_json_schema(),
               **{t["function"]["name"]: t["function"].get("parameters", {}) for t in TOOLS}}
    seen: set[str] = set()
    for seed in range(100):
        p = plan(chat(tools=[*TOOLS, person]), seed, max_parallel=4)
        ch = p.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.content == ""
        assert len({c.name for c in ch.tool_calls}) == len(ch.tool_calls) <= 4
        for c in ch.tool_calls:
            assert c.id.startswith("call_") and len(c.id) == 29 and c.id[5:].isalnum()
            jsonschema.validate(json.loads(c.arguments), schemas[c.name])
            seen.add(c.name)
        if "now" in calls(p):
            assert json.loads(ch.tool_calls[calls(p).index("now")].arguments) == {}
    assert seen == set(schemas)


def test_tool_choice_none_required_and_named() -> None:
    for seed in range(30):
        assert not plan(chat(tools=TOOLS, tool_choice="none"), seed).choices[0].tool_calls
        assert plan(chat(tools=TOOLS, tool_choice="none"), seed).choices[0].finish_reason \
            == "stop"
        # required calls even after many rounds of tool results
        late = chat(tools=TOOLS, tool_choice="required", messages=[*USER, *round_trip(6)])
        assert calls(plan(late, seed))
        named = {"type": "function", "function": {"name": "search"}}
        assert calls(plan(chat(tools=TOOLS, tool_choice=named), seed)) == ["search"]
    with pytest.raises(EngineError, match="'nope'") as e:
        plan(chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}))
    assert e.value.status == 400
    with pytest.raises(EngineError, match="tool_choice"):
        plan(chat(tools=TOOLS, tool_choice="sometimes"))


def test_parallel_tool_calls() -> None:
    counts = {len(calls(plan(chat(tools=TOOLS), s))) for s in range(60)}
    assert counts == {1, 2}  # up to max_parallel (2) distinct tools
    assert {len(calls(plan(chat(tools=TOOLS, parallel_tool_calls=False), s)))
            for s in range(60)} == {1}
    assert max(len(calls(plan(chat(tools=TOOLS), s, max_parallel=3))) for s in range(60)) == 3


def round_trip(rounds: int) -> list[dict[str, Any]]:
    """``rounds`` assistant tool-call turns, each followed by its tool result."""
    out: list[dict[str, Any]] = []
    for i in range(rounds):
        cid = f"call_{i:024d}"
        out += [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": cid, "type": "function",
                     "function": {"name": "search", "arguments": '{"q":"x"}'}}]},
                {"role": "tool", "tool_call_id": cid, "content": "result"}]
    return out


def test_auto_calls_after_a_user_message_then_rounds_end_in_text() -> None:
    # the turn after a user message calls, whatever tool_call_p
    assert all(calls(plan(chat(tools=TOOLS), s, tool_call_p=0.0)) for s in range(20))
    after_one = chat(tools=TOOLS, messages=[*USER, *round_trip(1)])
    assert all(calls(plan(after_one, s, tool_call_p=1.0)) for s in range(20))
    assert not any(calls(plan(after_one, s, tool_call_p=0.0)) for s in range(20))
    called = sum(bool(calls(plan(after_one, s))) for s in range(400))
    assert 150 < called < 250  # tool_call_p = 0.5
    # max_tool_rounds reached: text, even with tool_call_p = 1
    done = chat(tools=TOOLS, messages=[*USER, *round_trip(4)])
    for s in range(20):
        ch = plan(done, s, tool_call_p=1.0).choices[0]
        assert not ch.tool_calls and ch.finish_reason == "stop" and ch.content
    # a new user message starts counting again
    again = chat(tools=TOOLS, messages=[*USER, *round_trip(4), *USER])
    assert calls(plan(again, 0, tool_call_p=0.0))
    # a whole loop: call until the model answers in text, within max_tool_rounds
    msgs = list(USER)
    for turn in range(10):
        ch = plan(chat(tools=TOOLS, messages=msgs, sim_agent={"max_tool_rounds": 3}),
                  turn).choices[0]
        if not ch.tool_calls:
            break
        msgs += round_trip(1)
    assert 1 <= turn <= 3 and ch.finish_reason == "stop"


def test_sim_agent_overrides_are_validated_by_field_name() -> None:
    after_one = chat(tools=TOOLS, messages=[*USER, *round_trip(1)])
    assert calls(plan({**after_one, "sim_agent": {"tool_call_p": 1}}, 0, tool_call_p=0.0))
    for bad, name in (({"tool_call_p": 1.5}, "tool_call_p"), ({"max_tool_rounds": -1},
                      "max_tool_rounds"), ({"max_parallel": True}, "max_parallel"),
                      ({"mean_answer_tokens": "24"}, "mean_answer_tokens"),
                      ({"temperature": 1}, "temperature")):
        with pytest.raises(EngineError, match=f"sim_agent.{name}") as e:
            plan(chat(sim_agent=bad))
        assert e.value.status == 400
    with pytest.raises(ValueError, match="tool_call_p"):
        AgentBehaviour(tool_call_p=-0.1)


def test_legacy_functions() -> None:
    body = {"messages": USER, "functions": [WEATHER["function"]],
            "function_call": {"name": "get_weather"}}
    p = plan(body)
    ch = p.choices[0]
    assert ch.finish_reason == "function_call" and calls(p) == ["get_weather"]
    msg = response(p, ENV, 10)["choices"][0]["message"]
    assert msg["function_call"]["name"] == "get_weather" and "tool_calls" not in msg
    deltas = [stream_chunk(p, 0, i, i + 1, ENV)["choices"][0]["delta"]
              for i in range(ch.n_tokens)]
    assert "".join(d["function_call"]["arguments"] for d in deltas) == \
        msg["function_call"]["arguments"]


# ---------------------------------------------------------------------------------- text
def test_natural_length_stop_and_max_tokens() -> None:
    lens = [plan(chat(), s).choices[0].n_tokens for s in range(2000)]
    assert 22 < sum(lens) / len(lens) < 26 and min(lens) >= 1 and len(set(lens)) > 20
    long = [plan(chat(), s, mean_answer_tokens=200).choices[0].n_tokens for s in range(500)]
    assert 180 < sum(long) / len(long) < 220
    for s in range(50):
        ch = plan(chat(), s).choices[0]
        assert ch.finish_reason == "stop"
        assert all(t.text[1:] in VOCAB and t.text[0] == " " for t in ch.tokens)
        capped = plan(chat(max_tokens=5), s).choices[0]
        assert capped.n_tokens <= 5
        assert capped.finish_reason == ("length" if ch.n_tokens > 5 else "stop")
        assert plan(chat(max_completion_tokens=3, max_tokens=50), s).choices[0].n_tokens <= 3
        exact = plan(chat(max_tokens=77, ignore_eos=True, tools=TOOLS), s).choices[0]
        assert (exact.n_tokens, exact.finish_reason) == (77, "length")
        assert plan(chat(max_tokens=90, min_tokens=60), s).choices[0].n_tokens >= 60
    with pytest.raises(EngineError, match="max_tokens"):
        plan(chat(max_tokens=0))
    with pytest.raises(EngineError, match="min_tokens"):
        plan(chat(max_tokens=3, min_tokens=4))


def test_tool_calls_and_json_are_cut_at_max_tokens() -> None:
    named = {"type": "function", "function": {"name": "add"}}
    big = tool("add", Person.model_json_schema())
    p = plan(chat(tools=[big], tool_choice=named, max_tokens=6))
    ch = p.choices[0]
    assert (ch.n_tokens, ch.finish_reason) == (6, "length")
    args = ch.tool_calls[0].arguments
    assert len(args) == 5 * 4  # the name, then five 4-character pieces
    with pytest.raises(json.JSONDecodeError):
        json.loads(args)
    js = plan(chat(response_format={"type": "json_object"}, max_tokens=3)).choices[0]
    assert (js.n_tokens, js.finish_reason) == (3, "length")


def test_stop_strings() -> None:
    for s in range(50):
        full = plan(chat(), s).choices[0]
        text = full.content
        word = full.tokens[len(full.tokens) // 2].text  # " word" in the middle
        cut = plan(chat(stop=[word, "never appears"]), s).choices[0]
        assert cut.finish_reason == "stop" and word not in cut.content
        assert cut.content == text[:text.index(word)]
        assert cut.stop == word  # named as vLLM's stop_reason, in the answer and last chunk
        assert response(plan(chat(stop=[word]), s), ENV, 1)["choices"][0]["stop_reason"] == word
        assert finish_chunk(plan(chat(stop=[word]), s), 0, ENV)["choices"][0][
            "stop_reason"] == word
        assert plan(chat(stop="\u2603"), s).choices[0].content == text
        assert "stop_reason" not in response(plan(chat(stop="\u2603"), s), ENV, 1)["choices"][0]
    first = plan(chat(), 3).choices[0].tokens[0].text
    at_start = plan(chat(stop=first), 3).choices[0]
    assert at_start.content == "" and at_start.n_tokens == 1  # the token that stopped it
    with pytest.raises(EngineError, match="'stop'"):
        plan(chat(stop=[1]))


def test_response_formats() -> None:
    schema = Person.model_json_schema()
    strict = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema,
                                                     "strict": True}}
    for s in range(30):
        ch = plan(chat(response_format=strict), s).choices[0]
        assert ch.finish_reason == "stop"
        Person.model_validate_json(ch.content)
        assert all(len(t.text) <= 4 for t in ch.tokens)
        obj = json.loads(plan(chat(response_format={"type": "json_object"}), s).choices[0]
                         .content)
        assert isinstance(obj, dict) and obj
    with pytest.raises(EngineError, match="response_format"):
        plan(chat(response_format={"type": "xml"}))


# ---------------------------------------------------------------------------------- seeds
def test_seed_gives_the_same_answer_and_another_seed_another() -> None:
    body = chat(tools=TOOLS, seed=42, n=2, stream=False)
    a = plan_output("chat", body, request_rng(body, "req-1", 0))
    b_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    b = plan_output("chat", b_body, request_rng(b_body, "req-2", 9))
    assert response(a, ENV, 1) == response(b, ENV, 1)  # other request id, engine seed, stream
    other = {**body, "seed": 43}
    assert response(plan_output("chat", other, request_rng(other, "req-1", 0)), ENV, 1) != \
        response(a, ENV, 1)
    changed = {**body, "messages": [{"role": "user", "content": "something else"}]}
    assert response(plan_output("chat", changed, request_rng(changed, "req-1", 0)), ENV, 1) != \
        response(a, ENV, 1)
    # without a seed: the request id and the engine seed decide
    plain = chat()
    one = plan_output("chat", plain, request_rng(plain, "r", 0)).choices[0].content
    assert one == plan_output("chat", plain, request_rng(plain, "r", 0)).choices[0].content
    assert one != plan_output("chat", plain, request_rng(plain, "r", 1)).choices[0].content
    with pytest.raises(EngineError, match="seed"):
        request_rng({"seed": "x"}, "r", 0)


# ---------------------------------------------------------------------------------- logprobs
def test_chat_logprobs_in_answer_and_chunks() -> None:
    p = plan(chat(logprobs=True, top_logprobs=3, max_tokens=6))
    ch = p.choices[0]
    content = response(p, ENV, 1)["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [t.text for t in ch.tokens]
    for e in content:
        assert e["logprob"] < 0 and e["bytes"] == list(e["token"].encode())
        tops = e["top_logprobs"]
        assert len(tops) == 3 and tops[0]["token"] == e["token"]
        assert [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)
    streamed = [x for i in range(ch.n_tokens)
                for x in stream_chunk(p, 0, i, i + 1, ENV)["choices"][0]["logprobs"]["content"]]
    assert streamed == content
    assert response(plan(chat()), ENV, 1)["choices"][0]["logprobs"] is None
    assert len(response(plan(chat(logprobs=True)), ENV, 1)["choices"][0]["logprobs"]
               ["content"][0]["top_logprobs"]) == 0
    with pytest.raises(EngineError, match="top_logprobs"):
        plan(chat(logprobs=True, top_logprobs=21))


def test_completion_logprobs() -> None:
    p = plan({"prompt": "p", "logprobs": 2, "max_tokens": 5}, endpoint="completions")
    lp = response(p, ENV, 1)["choices"][0]["logprobs"]
    text = p.choices[0].content
    assert "".join(lp["tokens"]) == text and len(lp["token_logprobs"]) == 5
    assert all(len(d) == 2 for d in lp["top_logprobs"])
    assert [text[o:o + len(t)] for o, t in zip(lp["text_offset"], lp["tokens"], strict=True)] \
        == lp["tokens"]
    second = stream_chunk(p, 0, 2, 4, ENV)["choices"][0]["logprobs"]
    assert second["text_offset"] == lp["text_offset"][2:4]


# ---------------------------------------------------------------------------------- objects
def test_n_choices_and_stream_chunks_rebuild_the_answer() -> None:
    p = plan(chat(tools=TOOLS, n=3, parallel_tool_calls=True), 5, max_parallel=3)
    whole = response(p, ENV, 12)
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2]
    assert whole["usage"] == {"prompt_tokens": 12, "completion_tokens": p.output_tokens,
                              "total_tokens": 12 + p.output_tokens}
    assert len({json.dumps(c["message"]) for c in whole["choices"]}) == 3  # independent
    for ch in p.choices:
        first = role_chunk(p, ch.index, ENV)
        assert first is not None
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        acc: dict[int, dict[str, str]] = {}
        for start in range(0, ch.n_tokens, 3):  # three tokens a chunk
            c = stream_chunk(p, ch.index, start, min(start + 3, ch.n_tokens), ENV)
            assert c["object"] == "chat.completion.chunk" and c["id"] == ENV.id
            for d in c["choices"][0]["delta"].get("tool_calls", ()):
                a = acc.setdefault(d["index"], {"id": "", "name": "", "arguments": ""})
                a["id"] = d.get("id", a["id"])
                a["name"] += d["function"].get("name", "")
                a["arguments"] += d["function"]["arguments"]
        want = whole["choices"][ch.index]["message"]["tool_calls"]
        assert [acc[i] for i in sorted(acc)] == [
            {"id": t["id"], "name": t["function"]["name"], "arguments": t["function"]["arguments"]}
            for t in want]
        last = finish_chunk(p, ch.index, ENV)["choices"][0]
        assert last["delta"] == {} and last["finish_reason"] == "tool_calls"


def test_text_chunks_and_completion_objects() -> None:
    p = plan({"prompt": "hello", "n": 2, "max_tokens": 4, "ignore_eos": True},
             endpoint="completions")
    whole = response(p, Envelope("cmpl-1", "m", 1), 2)
    assert whole["object"] == "text_completion"
    for ch in p.choices:
        text = "".join(stream_chunk(p, ch.index, i, i + 1, ENV)["choices"][0]["text"]
                       for i in range(4))
        assert text == whole["choices"][ch.index]["text"] and len(text.split()) == 4
    assert role_chunk(p, 0, ENV) is None
    assert finish_chunk(p, 1, ENV)["choices"][0] == {"index": 1, "text": "", "logprobs": None,
                                                     "finish_reason": "length"}
    with pytest.raises(EngineError, match="'n'"):
        plan(chat(n=0))


def test_prompt_tokens_count_tools_and_tool_calls() -> None:
    base = {"messages": [{"role": "system", "content": "s" * 16}, *USER]}
    n, prefix, prefix_n = prompt_tokens("chat", base)
    assert (n, prefix, prefix_n) == (math.ceil((16 + len(USER[0]["content"])) / 4) + 8,
                                     "s" * 16, 8)
    with_tools, _, _ = prompt_tokens("chat", {**base, "tools": TOOLS})
    assert with_tools - n == pytest.approx(len(json.dumps(TOOLS, separators=(",", ":"))) / 4,
                                           abs=1)
    history = {"messages": [*base["messages"], *round_trip(1)]}
    h, _, _ = prompt_tokens("chat", history)
    calls_json = json.dumps(round_trip(1)[0]["tool_calls"], separators=(",", ":"))
    assert h == math.ceil((16 + len(USER[0]["content"]) + len(calls_json) + 6) / 4) + 16


# ---------------------------------------------------------------------------------- embeddings
def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_embeddings_are_normalised_deterministic_and_similar_for_similar_texts() -> None:
    a = embed("The cat sat on the mat")
    assert len(a) == 256 and cos(a, a) == pytest.approx(1.0)
    assert a == embed("the cat sat on the mat")  # deterministic, case-insensitive
    near = embed("the cat sat on a mat today")
    far = embed("quantum chromodynamics on a lattice")
    assert cos(a, near) > 0.6 > 0.3 > abs(cos(a, far))
    assert len(embed([1, 2, 3], 64)) == 64 and cos(embed([1, 2, 3]), embed([1, 2, 3])) > 0.99


def test_embedding_response_shapes() -> None:
    out, n = embedding_response({"input": ["hello world", "hi"], "dimensions": 16}, "e")
    assert out["object"] == "list" and out["model"] == "e" and n == 3 + 1
    assert out["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    assert [d["index"] for d in out["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 16 for d in out["data"])
    b64, _ = embedding_response({"input": "hello world", "dimensions": 16,
                                 "encoding_format": "base64"}, "e")
    raw = base64.b64decode(b64["data"][0]["embedding"])
    assert list(struct.unpack("<16f", raw)) == pytest.approx(out["data"][0]["embedding"],
                                                             abs=1e-7)
    ids, n_ids = embedding_response({"input": [[1, 2, 3], [4, 5]]}, "e")
    assert n_ids == 5 and len(ids["data"]) == 2
    for bad in ({"input": []}, {"input": 3}, {"input": "x", "dimensions": 0},
                {"input": "x", "encoding_format": "int8"}):
        with pytest.raises(EngineError) as e:
            embedding_response(bad, "e")
        assert e.value.status == 400

"""The run resolver (issue 17, hermes/gateway/resolve): evidence, continuation, apps, units,
run ends, abuse bounds and cost. Pure unit tests: request dicts built by hand, no gateway."""

from __future__ import annotations

import gc
import json
import random
import re
import string
import sys
import types
from typing import Any

import pytest
from pydantic import ValidationError

from hermes.gateway.config import DEFAULT_SESSION_HEADERS
from hermes.gateway.resolve import (
    AppNames,
    Identity,
    IdentityConfig,
    Resolver,
    app_fingerprint,
    idle_close_s,
    tool_signature,
)
from hermes.gateway.resolve.bench import bench
from hermes.gateway.resolve.canon import canonical_message
from hermes.gateway.resolve.templates import turn_skeleton

SYSTEM = "You are a weather agent. Today is 2025-05-01. Use the tools, never guess."
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}},
]
T0 = 1000.0


def chat(*messages: dict[str, Any], tools: list[dict[str, Any]] | None = None,
         model: str = "llama-2-7b", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": list(messages), **extra}
    if tools is not None:
        body["tools"] = tools
    return body


def sys_(text: str = SYSTEM) -> dict[str, Any]:
    return {"role": "system", "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def call(call_id: str, name: str = "get_weather", **args: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": name, "arguments": json.dumps(args)}}]}


def tool(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def text(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def ask(r: Resolver, body: dict[str, Any], reply: dict[str, Any] | None = None, *,
        now: float = T0, tenant: str = "t1", headers: dict[str, str] | None = None,
        response_id: str | None = None) -> Identity:
    """resolve + answered, as the edge does for one request."""
    ident = r.resolve(tenant, body, headers or {}, now)
    if reply is not None or response_id is not None:
        r.answered(ident, reply, now + 0.5, response_id=response_id)
    return ident


def agent_run(r: Resolver, question: str, steps: int, *, run_tag: str, now: float = T0,
              tenant: str = "t1", system: str = SYSTEM,
              tools: list[dict[str, Any]] | None = TOOLS) -> list[Identity]:
    """A tool-calling agent loop: returns the identities of its requests."""
    msgs: list[dict[str, Any]] = [sys_(system), user(question)]
    out = []
    for step in range(steps):
        reply = (call(f"{run_tag}-{step}", city=f"c{step}") if step < steps - 1
                 else text(f"done {run_tag}"))
        out.append(ask(r, chat(*msgs, tools=tools), reply, now=now + step, tenant=tenant))
        msgs += [reply]
        if step < steps - 1:
            msgs += [tool(f"{run_tag}-{step}", f"sunny, {20 + step} degrees in c{step}")]
    return out


# ------------------------------------------------------------------------------ headers
def test_hermes_run_header_passes_through_and_none_opts_out() -> None:
    r = Resolver()
    ident = ask(r, chat(user("hi")), text("hello"),
                headers={"X-Hermes-Run": "run-abc", "X-Hermes-Unit": "plan"})
    assert (ident.run, ident.unit, ident.inferred, ident.evidence) == (
        "run-abc", "plan", False, "header")
    out = ask(r, chat(user("hi")), text("hello"), headers={"x-hermes-run": "None"})
    assert (out.run, out.app, out.unit, out.inferred, out.evidence, out.new_run) == (
        "", "default", "default", False, "opt-out", True)
    assert r.stats()["index_entries"] == 0 and r.open_runs() == 0  # nothing remembered
    # its continuation is not joined to anything
    again = ask(r, chat(user("hi"), text("hello"), user("more")))
    assert again.evidence == "new" and again.new_run


def test_opted_out_conversation_is_never_indexed_even_when_continued() -> None:
    r = Resolver()
    first = ask(r, chat(sys_(), user("q")), text("a"))
    out = ask(r, chat(sys_(), user("q"), text("a"), user("q2")), text("a2"),
              headers={"X-Hermes-Run": "none"})
    assert out.evidence == "opt-out"
    cont = ask(r, chat(sys_(), user("q"), text("a"), user("q2"), text("a2"), user("q3")))
    # the opted-out turn taught nothing: the longest known prefix is the first answer
    assert cont.run == first.run and cont.evidence == "continuation"


def test_app_and_unit_headers_name_them_while_the_run_is_inferred() -> None:
    r = Resolver()
    h = {"X-Hermes-App": "factool", "X-Hermes-Unit": "verify"}
    a = ask(r, chat(sys_(), user("q")), call("c1", city="x"), headers=h)
    b = ask(r, chat(sys_(), user("q"), call("c1", city="x"), tool("c1", "ok")), headers=h)
    assert (a.app, a.unit, a.inferred, a.new_run) == ("factool", "verify", True, True)
    assert (b.app, b.run, b.evidence, b.new_run) == ("factool", a.run, "continuation", False)
    other = ask(r, chat(sys_(), user("q")), headers=h, tenant="t2")
    assert other.app == "factool" and other.app_id != a.app_id and other.run != a.run


def test_inference_off_is_the_per_request_baseline() -> None:
    r = Resolver(IdentityConfig(infer=False))
    a = ask(r, chat(sys_(), user("q")), text("a"))
    b = ask(r, chat(sys_(), user("q"), text("a"), user("q2")))
    assert (a.evidence, b.evidence, a.run, a.app) == ("off", "off", "", "default")


# ------------------------------------------------------------------------------ explicit ids
@pytest.mark.parametrize("header", DEFAULT_SESSION_HEADERS)
def test_each_session_header_groups_first_turns_into_one_run(header: str) -> None:
    r = Resolver()
    a = ask(r, chat(sys_(), user("first task")), text("x"), headers={header.upper(): "S-1"})
    b = ask(r, chat(sys_(), user("an unrelated prompt")), headers={header: "S-1"}, now=T0 + 5)
    c = ask(r, chat(sys_(), user("first task")), headers={header: "S-2"})
    assert b.run == a.run and b.evidence == f"session:{header}" and not b.new_run
    assert c.run != a.run and c.new_run


@pytest.mark.parametrize(("field", "value", "source"), [
    ("litellm_session_id", "s1", "body:litellm_session_id"),
    ("session_id", "s1", "body:session_id"),
    ("conversation", "conv_1", "body:conversation"),
    ("conversation", {"id": "conv_1"}, "body:conversation"),
    ("metadata", {"session_id": "s1"}, "metadata:session_id"),
    ("metadata", {"thread_id": "s1"}, "metadata:thread_id"),
    ("metadata", {"trace_id": "s1"}, "metadata:trace_id"),
    ("metadata", {"user_id": "user_ab_account_12_session_0f9e"}, "metadata:user_id"),
    ("user", "user_ab_account_12_session_0f9e", "user"),
])
def test_session_ids_in_the_body(field: str, value: Any, source: str) -> None:
    r = Resolver()
    a = ask(r, chat(user("one"), **{field: value}), text("x"))
    b = ask(r, chat(user("two"), **{field: value}))
    assert b.run == a.run and b.evidence == f"session:{source}"


def test_session_ids_are_bounded_and_configurable() -> None:
    r = Resolver(IdentityConfig(session_headers=["X-My-Trace"], metadata_keys=[]))
    a = ask(r, chat(user("one")), headers={"x-my-trace": "t"})
    b = ask(r, chat(user("two")), headers={"X-MY-TRACE": "t"})
    c = ask(r, chat(user("three"), metadata={"session_id": "m"}))
    d = ask(r, chat(user("four"), metadata={"session_id": "m"}))
    assert b.run == a.run and c.run != d.run  # metadata keys switched off
    long_id = "x" * 300
    e = ask(r, chat(user("five")), headers={"x-my-trace": long_id})
    f = ask(r, chat(user("six")), headers={"x-my-trace": long_id})
    assert e.run != f.run and e.evidence == "new"  # over max_id_len: ignored


def test_previous_response_id_chains_continue_the_run() -> None:
    r = Resolver()
    first = {"model": "m", "instructions": SYSTEM, "input": "what is the weather?", "tools": [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}
    a = ask(r, first, call("fc1", city="x"), response_id="resp_1")
    second = {"model": "m", "instructions": SYSTEM, "previous_response_id": "resp_1", "input": [
        {"type": "function_call_output", "call_id": "fc1", "output": "sunny"}]}
    b = ask(r, second, text("it is sunny"), response_id="resp_2", now=T0 + 1)
    third = {"model": "m", "previous_response_id": "resp_2", "input": "thanks, and tomorrow?"}
    c = ask(r, third, now=T0 + 2)
    assert a.new_run and (b.run, c.run) == (a.run, a.run)
    assert (b.evidence, c.evidence) == ("previous_response_id", "previous_response_id")
    assert b.unit != a.unit and b.unit.endswith(".tool")  # a function_call_output turn
    unknown = ask(r, {"model": "m", "previous_response_id": "resp_404", "input": "hi"})
    assert unknown.new_run and unknown.evidence == "new"


def test_weak_ids_join_only_requests_with_unmatched_history() -> None:
    r = Resolver()
    a = ask(r, chat(sys_(), user("task one"), user="alice"), call("c1", city="x"))
    b = ask(r, chat(sys_(), user("task two"), user="alice"))
    assert b.run != a.run  # a first turn with a known user is a new run
    # a client that rewrote its history (the echo matches nothing): joins alice's latest run
    c = ask(r, chat(sys_(), user("task two"), text("(summarised)"), user("go on"), user="alice"))
    assert c.run == b.run and c.evidence == "affinity:user"
    # an exact continuation still wins over the weak id
    d = ask(r, chat(sys_(), user("task one"), call("c1", city="x"), tool("c1", "ok"), user="alice"))
    assert d.run == a.run and d.evidence == "continuation"


# ------------------------------------------------------------------------------ continuation
def test_continuation_through_tool_results_is_one_run_with_two_units() -> None:
    r = Resolver()
    ids = agent_run(r, "weather in Paris plus 3?", 6, run_tag="r1")
    assert len({i.run for i in ids}) == 1
    assert ids[0].new_run and not any(i.new_run for i in ids[1:])
    assert [i.evidence for i in ids] == ["new"] + ["continuation"] * 5
    assert ids[0].unit == "weather-agent.input"
    assert {i.unit for i in ids[1:]} == {"weather-agent.tool"}
    # a new user turn after the text answer continues it as well
    msgs = [sys_(), user("weather in Paris plus 3?")]
    for step in range(5):
        msgs += [call(f"r1-{step}", city=f"c{step}"), tool(f"r1-{step}", f"sunny, {20 + step} "
                                                          f"degrees in c{step}")]
    more = ask(r, chat(*msgs, text("done r1"), user("and in Rome?"), tools=TOOLS), now=T0 + 9)
    assert more.run == ids[0].run and more.evidence == "continuation"


def test_continuation_survives_how_frameworks_echo_the_reply() -> None:
    """LangChain re-serialises arguments (spaces, ASCII escapes) and sends "" for None
    content; some clients send text parts instead of a string; reasoning is dropped; the
    instructions may change (a handoff)."""
    r = Resolver()
    reply = {"role": "assistant", "content": None, "reasoning_content": "hmm", "tool_calls": [
        {"id": "c9", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Orléans","n":[1,2]}'}}]}
    a = ask(r, chat(sys_(), user("weather?")), reply)
    langchain_args = json.dumps({"city": "Orléans", "n": [1, 2]})  # spaces, \\u escapes
    assert "\\u00e9" in langchain_args
    echoed = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c9", "type": "function",
         "function": {"name": "get_weather", "arguments": langchain_args}}]}
    b = ask(r, chat(sys_("You are the billing agent."), user("weather?"), echoed,
                    tool("c9", "sunny")), text("It is sunny."))
    assert b.run == a.run and b.evidence == "continuation"
    assert b.unit.startswith("billing-agent.")  # the handoff's own unit
    parts = {"role": "assistant", "content": [{"type": "text", "text": "It is sunny. "}]}
    c = ask(r, chat(sys_(), user("weather?"), echoed, tool("c9", "sunny"), parts, user("thx")))
    assert c.run == a.run and c.evidence == "continuation"


def test_branch_and_retry_of_one_answered_request_both_continue_its_run() -> None:
    r = Resolver()
    a = ask(r, chat(sys_(), user("q")), call("c1", city="x"))
    base = [sys_(), user("q"), call("c1", city="x")]
    b1 = ask(r, chat(*base, tool("c1", "sunny")), text("branch one"), now=T0 + 1)
    b2 = ask(r, chat(*base, tool("c1", "rainy (retried)")), text("branch two"), now=T0 + 2)
    assert b1.run == b2.run == a.run
    c1 = ask(r, chat(*base, tool("c1", "sunny"), text("branch one"), user("go")), now=T0 + 3)
    c2 = ask(r, chat(*base, tool("c1", "rainy (retried)"), text("branch two"), user("go")),
             now=T0 + 3)
    assert c1.run == c2.run == a.run


def test_runs_with_the_same_first_prompt_stay_apart() -> None:
    r = Resolver()
    one = agent_run(r, "same question", 4, run_tag="A")
    two = agent_run(r, "same question", 4, run_tag="B", now=T0 + 0.1)
    assert len({i.run for i in one}) == 1 and len({i.run for i in two}) == 1
    assert one[0].run != two[0].run
    assert one[0].app == two[0].app  # and both runs of one app


def test_canonical_message_is_length_prefixed() -> None:
    a = canonical_message({"role": "user", "content": "a4:b"})
    b = canonical_message({"role": "user", "content": "a", "tool_call_id": "b"})
    assert a != b


# ------------------------------------------------------------------------------ apps
def test_app_fingerprint_is_stable_across_runs_and_inputs() -> None:
    r = Resolver()
    a = agent_run(r, "weather in Paris?", 2, run_tag="a")[0]
    b = agent_run(r, "what about Oslo, 2 days from now?", 2, run_tag="b",
                  system=SYSTEM.replace("2025-05-01", "2025-06-17"))[0]
    assert a.app_id == b.app_id and a.app == b.app
    # a tenant's inferred app is its own: TENANT.NAME (hidden from, and closed to, others)
    assert re.fullmatch(r"t1\.weather-agent-add-get_weather-[0-9a-f]{6}", a.app), a.app
    # tool order and spacing do not matter; the schemas and names do
    assert tool_signature(list(reversed(TOOLS))) == tool_signature(TOOLS)
    other_tools = TOOLS[:1]
    other_schema = [TOOLS[0], {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}}]
    c = agent_run(r, "weather?", 1, run_tag="c", tools=other_tools)[0]
    d = agent_run(r, "weather?", 1, run_tag="d", tools=other_schema)[0]
    e = agent_run(r, "weather?", 1, run_tag="e", tenant="t2")[0]
    f = ask(r, chat(sys_(), user("weather?"), tools=TOOLS, model="other-model"))
    assert len({a.app_id, c.app_id, d.app_id, e.app_id, f.app_id}) == 5
    assert len({a.app, c.app, d.app, e.app, f.app}) == 5
    assert app_fingerprint("t", "m", b"x", []) == app_fingerprint("t", "m", b"x", [])


def test_two_tenants_with_identical_prompts_are_never_merged() -> None:
    r = Resolver()
    a = agent_run(r, "weather?", 3, run_tag="same", tenant="acme")
    b = agent_run(r, "weather?", 3, run_tag="same", tenant="globex")  # byte-identical traffic
    assert {i.run for i in a}.isdisjoint({i.run for i in b})
    assert a[0].app_id != b[0].app_id and a[0].app != b[0].app
    # globex replaying acme's conversation (same ids, same reply) joins only its own run
    replay = ask(r, chat(sys_(), user("weather?"), call("same-0", city="c0"),
                         tool("same-0", "x"), tools=TOOLS), tenant="globex")
    assert replay.run == b[0].run and replay.tenant == "globex"
    # and an id another tenant uses names nothing here
    ask(r, chat(user("q")), text("a"), tenant="acme", headers={"x-session-id": "S"})
    other = ask(r, chat(user("q")), tenant="globex", headers={"x-session-id": "S"})
    assert other.new_run


def test_renames_and_merges_are_a_storable_mapping() -> None:
    names = AppNames()
    r = Resolver(names=names)
    a = agent_run(r, "q", 1, run_tag="a")[0]
    b = agent_run(r, "q", 1, run_tag="b", tools=TOOLS[:1])[0]
    names.rename(a.app_id, "weather")
    names.merge(b.app_id, a.app_id)
    c = agent_run(r, "q2", 1, run_tag="c", tools=TOOLS[:1])[0]  # fingerprinted as b
    assert (c.app, c.app_id) == ("weather", a.app_id)
    assert {x.name for x in r.app_list()} >= {"weather"}
    loaded = AppNames.model_validate_json(names.model_dump_json())
    assert loaded == names and loaded.canonical(b.app_id) == a.app_id
    with pytest.raises(ValueError):
        names.merge(a.app_id, b.app_id)  # would be a cycle
    with pytest.raises(ValueError):
        names.rename(a.app_id, "bad name!")


# ------------------------------------------------------------------------------ units
REACT = ("Answer the question. You have access to: search, lookup.\n"
         "Use this format:\nQuestion: the input question\nThought: ...\nAction: tool[input]\n"
         "Observation: the result\n... (repeat)\nFinal Answer: the answer")


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
                    for _ in range(n))


def test_react_observations_share_one_unit_across_runs() -> None:
    """A text ReAct loop (no native tools): the same template, observations of any length
    and shape (several lines, numbers, quotes) -> one unit; the questions -> another."""
    rng = random.Random(11)
    r = Resolver()
    question_units: set[str] = set()
    observation_units: set[str] = set()
    runs: set[str] = set()
    for run in range(25):
        msgs = [sys_(REACT), user(f"Question: {_words(rng, rng.randint(3, 15))}?")]
        for step in range(rng.randint(2, 6)):
            reply = text(f"Thought: {_words(rng, 6)}\nAction: search[{_words(rng, 2)}]")
            ident = ask(r, chat(*msgs), reply, now=T0 + run + step / 10)
            (question_units if step == 0 else observation_units).add(ident.unit)
            if step == 0:
                runs.add(ident.run)
            else:
                assert ident.evidence == "continuation"
            lines = [_words(rng, rng.randint(1, 25)) for _ in range(rng.randint(1, 4))]
            lines[0] += f' (score {rng.random():.3f}, "{_words(rng, 2)}")'
            msgs += [reply, user("Observation: " + "\n".join(lines))]
    assert len(runs) == 25
    assert len(question_units) == 1 and len(observation_units) == 1
    assert question_units != observation_units
    (obs,) = observation_units
    assert obs.startswith("answer-question.")  # instructions' words + the turn's label


def test_templates_with_the_same_instructions_are_different_units() -> None:
    r = Resolver()
    generic = sys_("You are a helpful assistant.")
    units: dict[str, set[str]] = {}
    for i, who in enumerate(["Alice", "Bob", "Carol"]):
        units.setdefault("poem", set()).add(ask(r, chat(generic, user(
            f"Write a short poem about {who}:\nmake it rhyme")), now=T0 + i).unit)
        units.setdefault("claims", set()).add(ask(r, chat(generic, user(
            f"Extract the claims from the text below:\n{who} went to {i + 2} places."))).unit)
        units.setdefault("verify", set()).add(ask(r, chat(generic, user(
            f"Verify the claim.\nClaim: {who} is tall\nEvidence: none"))).unit)
        units.setdefault("chat", set()).add(ask(r, chat(generic, user(
            f"hey, can you tell {who} a joke about {i} cats?"))).unit)
    assert all(len(v) == 1 for v in units.values()), units
    assert len(set().union(*units.values())) == 4
    assert units["chat"] == {"assistant.input"}


def test_turn_skeletons() -> None:
    def sk(s: str) -> str:
        return turn_skeleton({"role": "user", "content": s})
    assert sk("What's the weather in Paris?") == "<*>"
    assert sk("Observation: it is 20C\nand sunny\nall day") == "Observation: <*>"
    assert sk("## Context\nfoo bar\n## Question\nwhy?") == "Context: | <*> | Question: | <*>"
    assert sk("<document>\nx\n</document>\nSummarize.") == "<document> | <*> | </document> | <*>"
    assert turn_skeleton({"role": "tool", "content": "x"}) == "<tool>"
    long = "Question: " + "word " * 10_000
    assert sk(long) == "Question: <*>"  # only the head is read


# ------------------------------------------------------------------------------ run end
def test_idle_close_s_is_p99_times_margin_bounded_with_a_prior() -> None:
    assert idle_close_s([]) == 60.0  # the prior
    gaps = [1.0] * 99 + [10.0]
    # p99 by nearest rank: 1.0 of 100 gaps (one outlier), 10.0 of 101 (two)
    assert idle_close_s(gaps, margin=2.0, min_s=0.5) == pytest.approx(2.0)
    assert idle_close_s(gaps + [10.0], margin=2.0, min_s=0.5) == pytest.approx(20.0)
    assert idle_close_s([1000.0] * 50) == 600.0  # max
    assert idle_close_s([0.1] * 50) == 5.0  # min
    few = idle_close_s([10.0] * 5, min_gaps=20, prior_s=60.0, margin=2.0)
    assert few == pytest.approx(0.25 * 20.0 + 0.75 * 60.0)  # shrunk towards the prior
    # while learning, never sooner than margin x the longest gap seen: a 100 s tool call
    # once seen must not split the next runs at the 60 s prior (0.05 x 200 + 0.95 x 60 = 67)
    assert idle_close_s([100.0], min_gaps=20, prior_s=60.0, margin=2.0) == pytest.approx(200.0)
    # with enough gaps the p99 rules again (one outlier of 100 in 100 gaps)
    assert idle_close_s([1.0] * 99 + [100.0], min_gaps=20, margin=2.0, min_s=0.5) == 2.0


def test_the_gap_books_kept_order_gives_the_figure_of_its_window() -> None:
    """The idle-close figure read at every sweep comes from gaps kept sorted as they arrive
    and leave the window: always what the window's gaps give, across evictions and apps."""
    import random

    from hermes.gateway.resolve.runend import GapBook

    rng = random.Random(3)
    book = GapBook(samples=50, max_apps=3)
    kw = dict(margin=2.0, min_s=5.0, max_s=600.0, prior_s=60.0, min_gaps=20)
    for step in range(2000):
        app = f"a{rng.randrange(5)}"
        book.add(app, rng.choice([rng.expovariate(0.2), 0.0, -1.0, 3.0, 700.0]))
        for a in list(book._gaps):
            assert book.close_after(a) == idle_close_s(book.gaps(a), **kw), (step, a)
            assert book._sorted[a] == sorted(book.gaps(a))
    assert set(book._sorted) == set(book._gaps) and len(book) == 3


def test_a_run_whose_last_answer_called_tools_closes_by_its_apps_gap() -> None:
    """No fixed wait for tool results (structured output through a forced tool call ends a
    run on a tool call): such a run closes by its app's learned gap like any other, and a
    tool call longer than that, once seen late, teaches the app its gap."""
    cfg = IdentityConfig(close_min_gaps=1, close_margin=2.0, close_min_s=1.0)
    r = Resolver(cfg)
    done = agent_run(r, "q", 3, run_tag="a")  # gaps ~0.5 s: the app closes after ~1 s idle
    assert r.gaps.close_after(done[0].app_id) == pytest.approx(1.0)
    r2 = ask(r, chat(sys_(), user("other question"), tools=TOOLS), call("b-0", city="c0"),
             now=T0 + 100).run
    assert r2 != done[0].run
    closed = {c.run for c in r.sweep(T0 + 102)}  # answered at T0+100.5: 1.5 s idle
    assert {done[0].run, r2} <= closed and not r.is_open(r2)
    # its results come back 30 s later: a new run that follows it, and the app learns
    late = ask(r, chat(sys_(), user("other question"), call("b-0", city="c0"),
                       tool("b-0", "sunny"), tools=TOOLS), now=T0 + 130.5)
    assert late.new_run and late.follows == r2
    assert r.gaps.close_after(done[0].app_id) >= 60.0


def test_quoted_tool_call_ids_join_the_run_that_received_them() -> None:
    """A client that rewrote the assistant turn (other text, re-serialised calls) but sends
    back the tool-call ids Hermes issued: structured ids and ids in text both decide."""
    r = Resolver()
    a = ask(r, chat(sys_(), user("weather in Paris"), tools=TOOLS),
            call("call_PARISabcdef012345", city="Paris"))
    b = ask(r, chat(sys_(), user("weather in Lima"), tools=TOOLS),
            call("call_LIMAabcdef0123456", city="Lima"))
    assert a.run != b.run
    # a history whose assistant turn gained text (no conversation digest matches)
    edited = {**call("call_LIMAabcdef0123456", city="Lima"), "content": "Let me look."}
    got = ask(r, chat(sys_(), user("weather in Lima"), edited,
                      tool("call_LIMAabcdef0123456", "sunny"), tools=TOOLS))
    assert (got.run, got.evidence) == (b.run, "tool_call_id")
    # only the tool message carries the id (the assistant turn was dropped)
    got = ask(r, chat(sys_(), user("other words"), tool("call_PARISabcdef012345", "x"),
                      tools=TOOLS))
    assert (got.run, got.evidence) == (a.run, "tool_call_id")
    # an id quoted in text
    got = ask(r, chat(sys_(), user("weather in Paris"),
                      text("I called [{'id': 'call_PARISabcdef012345'}]"), user("and?"),
                      tools=TOOLS))
    assert (got.run, got.evidence) == (a.run, "tool_call_id")
    # an id Hermes never issued is no evidence; ids in the instructions are not read
    got = ask(r, chat(sys_("call_PARISabcdef012345 is an example"), user("x"),
                      text("call_UNKNOWNabcdef0123"), user("y"), tools=TOOLS))
    assert got.evidence == "new"
    off = Resolver(IdentityConfig(call_ids=False))
    first = ask(off, chat(sys_(), user("q"), tools=TOOLS), call("call_QQQQabcdef012345", city="c"))
    got = ask(off, chat(sys_(), user("other"), tool("call_QQQQabcdef012345", "x"), tools=TOOLS))
    assert got.run != first.run


def smol(task: str, steps: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """smolagents' ToolCallingAgent history: its earlier tool calls as assistant text, their
    results as user ``Observation:`` messages."""
    msgs = [sys_("You are an expert assistant who can solve any task using tool calls."),
            user(f"New task:\n{task}")]
    for cid, obs in steps:
        msgs.append(text("Calling tools:\n[{'id': '" + cid + "', 'type': 'function', "
                         "'function': {'name': 'get_weather', 'arguments': {'city': 'x'}}}]"))
        msgs.append(user(f"Observation:\n{obs}"))
    return msgs


def test_a_history_rewritten_as_text_continues_its_run() -> None:
    r = Resolver()
    ids = []
    for task in ("Paris", "Lima"):  # two runs of one app, interleaved
        ids.append(ask(r, chat(*smol(task, []), tools=TOOLS),
                       call(f"call_{task.upper()}000000001", city=task)))
    for k, task in enumerate(("Paris", "Lima")):
        steps = [(f"call_{task.upper()}000000001", "sunny")]
        got = ask(r, chat(*smol(task, steps), tools=TOOLS),
                  call(f"call_{task.upper()}000000002", city=task), now=T0 + 2)
        assert (got.run, got.evidence) == (ids[k].run, "tool_call_id")
        steps.append((f"call_{task.upper()}000000002", "sunny"))
        got = ask(r, chat(*smol(task, steps), tools=TOOLS), text("done"), now=T0 + 4)
        assert got.run == ids[k].run
    assert r.open_runs() == 2
    # without the ids (a framework that keeps no ids): the messages Hermes answered with a
    # tool call, then the call as text, continue that run
    r2 = Resolver(IdentityConfig(call_ids=False))
    first = ask(r2, chat(*smol("Oslo", []), tools=TOOLS), call("call_OSLO0000000001", city="O"))
    got = ask(r2, chat(*smol("Oslo", [("call_OSLO0000000001", "rain")]), tools=TOOLS))
    assert (got.run, got.evidence) == (first.run, "rewritten")
    # a failed step: its calls dropped, the error merged into the task turn with a line break
    merged = smol("Oslo", [])
    merged[-1] = user(merged[-1]["content"] + "\nError:\nIf you want to return an answer...")
    got = ask(r2, chat(*merged, tools=TOOLS))
    assert (got.run, got.evidence) == (first.run, "rewritten")
    # a first turn with the same task is a new run, and a text reply is not rewritten evidence
    again = ask(r2, chat(*smol("Oslo", []), tools=TOOLS), text("no tools today"))
    assert again.new_run and again.run != first.run
    plain = ask(r2, chat(sys_(), user("hello")), text("hi"))
    other = ask(r2, chat(sys_(), user("hello"), text("a reply Hermes never gave"), user("?")))
    assert other.run != plain.run


def test_apps_without_instructions_or_tools_differ_by_template_schema_and_api() -> None:
    r = Resolver()

    def app(body: dict[str, Any]) -> str:
        return ask(r, body, text("x")).app_id

    summarize = [app(chat(user(f"Summarize the article below.\nArticle: {w}")))
                 for w in ("alpha beta", "the cat sat on the mat", "gamma")]
    assert len(set(summarize)) == 1  # one template, values vary
    translate = app(chat(user("Translate the text below into French.\nText: good morning")))
    assert translate != summarize[0]
    # free text (a person's question) is one template: plain chat stays one app
    assert app(chat(user("hi there"))) == app(chat(user("what is the capital of Peru?")))
    schema = {"type": "json_schema", "json_schema": {"name": "City", "schema": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    structured = app(chat(user("Summarize the article below.\nArticle: eta"),
                          response_format=schema))
    assert structured not in (summarize[0], translate)
    responses = app({"model": "llama-2-7b", "input": "Summarize the article below.\nArticle: x"})
    assert responses not in (summarize[0], structured)
    # with a system prompt or tools, the app is what it was: the user's words do not matter
    sys_apps = {app(chat(sys_(), user(q))) for q in ("Summarize it", "Translate it")}
    assert len(sys_apps) == 1


def test_call_id_pattern_is_checked_and_the_fixed_tool_wait_is_gone() -> None:
    with pytest.raises(ValidationError, match="call_id_pattern"):
        IdentityConfig(call_id_pattern="call_[")
    with pytest.raises(ValidationError, match="close_tool_call_s"):
        IdentityConfig.model_validate({"close_tool_call_s": 600})


def test_sweep_closes_idle_runs_and_a_late_continuation_starts_a_new_run() -> None:
    cfg = IdentityConfig(close_min_gaps=1, close_margin=2.0, close_min_s=1.0)
    r = Resolver(cfg)
    # the app's gaps are ~1 s: after 2 s idle a run is over
    ids = agent_run(r, "q", 4, run_tag="a")
    assert r.gaps.close_after(ids[0].app_id) == pytest.approx(1.0)
    busy = r.resolve("t1", chat(sys_(), user("other")), {}, T0 + 3.6)  # in flight
    assert r.sweep(T0 + 4.0) == []  # last answer at T0+3.5: idle 0.5 s
    closed = r.sweep(T0 + 20.0)
    assert [(c.run, c.reason, c.requests) for c in closed] == [(ids[0].run, "idle", 4)]
    assert r.open_runs() == 1  # the busy one stays open
    late = ask(r, chat(sys_(), user("q"), call("a-0", city="c0"), tool("a-0", "x"),
                       tools=TOOLS), now=T0 + 30)
    assert late.new_run and late.follows == ids[0].run and late.app == ids[0].app
    assert late.run != ids[0].run
    r.abandoned(busy, T0 + 30)
    assert busy.run in {c.run for c in r.sweep(T0 + 1000)}


def test_open_runs_are_capped_and_evictions_reported() -> None:
    r = Resolver(IdentityConfig(max_open_runs=16))
    ids = [ask(r, chat(user(f"q{i}")), text("a"), now=T0 + i) for i in range(20)]
    assert r.open_runs() == 16
    evicted = [c for c in r.sweep(T0 + 20) if c.reason == "evicted"]
    assert [c.run for c in evicted] == [i.run for i in ids[:4]]


# ------------------------------------------------------------------------------ config
def test_identity_config_is_a_strict_section() -> None:
    assert IdentityConfig(session_headers=["X-A"]).session_headers == ["x-a"]
    with pytest.raises(ValidationError):
        IdentityConfig.model_validate({"no_such_key": 1})


# ------------------------------------------------------------------------------ abuse
def _name(i: int) -> str:
    """A fixed-width word (6 letters) for ``i``: never-repeating text of constant size."""
    out = ""
    for _ in range(6):
        i, d = divmod(i, 26)
        out += chr(97 + d)
    return out


def _retained_bytes(root: object) -> int:
    """Bytes of every object reachable from ``root`` (``sys.getsizeof`` over a walk of
    ``gc.get_referents``; classes, modules and functions excluded): what the resolver holds."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType,
                                               types.BuiltinFunctionType)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def test_memory_stays_bounded_under_100k_never_repeating_conversations() -> None:
    """100,000 conversations that never repeat (every 10th with its own instructions: a new
    app; every 5th with a new template header line: drain3 input; every 4th continued with a
    history nothing matches): the index, runs, apps, units and miner stay within their caps,
    and what the resolver holds stops growing once they are reached (all are by 50k)."""
    cfg = IdentityConfig(index_max_entries=20_000, index_max_per_tenant=20_000,
                         max_open_runs=5_000, max_apps=1_000, max_units=2_000,
                         drain_max_clusters=200, index_ttl_s=600.0,
                         dataflow_max_entries=20_000, dataflow_max_per_tenant=20_000)
    r = Resolver(cfg)
    no_headers: dict[str, str] = {}

    def drive(start: int, stop: int) -> None:
        for i in range(start, stop):
            now = T0 + i * 0.01
            system = SYSTEM if i % 10 else f"You are agent {_name(i)} of the {_name(i * 7)} team."
            first = (f"Task {_name(i)}:\n{_name(i * 3)} {_name(i * 5)}" if i % 5 == 0
                     else f"please help with {_name(i)}")
            ident = r.resolve("abuser", chat(sys_(system), user(first), user=f"u{i}"),
                              no_headers, now)
            r.answered(ident, call(f"c{i}", city=_name(i)), now)
            if i % 4 == 0:
                again = chat(sys_(system), user(first), text(_name(i * 11)), user("more"),
                             user=f"u{i}")
                # a reply whose lines are long enough to be passages, never repeated
                r.answered(r.resolve("abuser", again, no_headers, now),
                           text(f"the witness {_name(i)} and the judge {_name(i * 13)} said so\n"
                                f"and then {_name(i * 17)} with {_name(i * 19)} agreed with it"),
                           now)
            if i % 1000 == 999:
                r.sweep(now)

    drive(0, 50_000)
    mid = _retained_bytes(r)
    drive(50_000, 100_000)
    end = _retained_bytes(r)
    s = r.stats()
    print(f"resolver holds {mid / 2**20:.2f} MiB after 50k conversations, {end / 2**20:.2f} MiB "
          f"after 100k; {s}")
    assert s["index_entries"] <= 20_000 and s["index_evicted"] > 100_000
    assert s["passage_entries"] <= 20_000 and s["passage_evicted"] > 20_000
    assert s["open_runs"] <= 5_000 and s["apps"] <= 1_000 and s["units"] <= 2_000
    assert s["miner_clusters"] <= 200 and s["instruction_templates"] <= 4096
    # flat (dict tables resize as entries churn: a few % either way; a leak of 50 bytes per
    # conversation would be +25%)
    assert abs(end - mid) < 0.05 * mid, (mid, end)
    assert end < 32 * 2**20


# ------------------------------------------------------------------------------ cost
def test_cpu_per_request_at_20_messages_is_under_a_tenth_of_a_millisecond() -> None:
    row = bench(runs=200, messages=20, repeats=3)
    print(f"resolver cost: {row}")
    assert row["messages"] == 20
    # target 100 us; 2.5x margin for a loaded 2-core CI box (typically ~45 us here)
    assert row["at_messages_median_us"] < 250, row
    # a program's next stage (8,000 characters scanned for passages): ~100 us here
    assert row["stage_median_us"] < 1000, row


def test_a_late_continuation_teaches_its_app_the_gap_the_close_missed() -> None:
    """A run closed during a long tool call and then continued: the gap is learned, so that
    the app's next runs stay open through such calls."""
    cfg = IdentityConfig(close_prior_s=60.0, close_min_gaps=5, close_margin=2.0)
    r = Resolver(cfg)
    now = 0.0
    splits = []
    for i in range(12):
        msgs = [{"role": "system", "content": "You run long jobs."},
                {"role": "user", "content": f"job {i}"}]
        first = r.resolve("t", {"messages": msgs}, {}, now)
        reply = {"role": "assistant", "content": f"started {i}"}
        r.answered(first, reply, now + 1)
        now += 1 + 100.0  # a 100 s tool call: past the 60 s prior
        r.sweep(now)
        nxt = r.resolve("t", {"messages": [*msgs, reply, {"role": "user", "content": "done"}]},
                        {}, now)
        r.answered(nxt, {"role": "assistant", "content": "ok"}, now + 1)
        splits.append(nxt.run != first.run)
        now += 1000.0
        r.sweep(now)
    assert splits[0]  # the prior closes the first run during the call
    # the gap it taught is the floor while the app learns: no later run splits
    assert not any(splits[1:]), splits
    assert r.gaps.close_after(first.app_id) >= 100.0


# ------------------------------------------------------------------------------ fan-outs
SCORER = "You score a document from 1 to 10. Answer with the number only."


def _one_shot(r: Resolver, n: int = 20, *, now: float = 0.0) -> float:
    """``n`` single scoring prompts, each closed (past the 60 s prior) before the next: the
    app is one-shot."""
    for i in range(n):
        ask(r, chat(sys_(SCORER), user(f"doc {i}: lorem")), text("7"), now=now)
        now += 100.0
        r.sweep(now)
    return now


def test_a_burst_of_independent_prompts_of_a_one_shot_app_is_one_run() -> None:
    r = Resolver()
    now = _one_shot(r)
    app = r.resolve("t1", chat(sys_(SCORER), user("x")), {}, now)
    assert r.gaps.one_shot(app.app_id)
    r.abandoned(app, now)
    now += 100.0
    r.sweep(now)
    burst = [r.resolve("t1", chat(sys_(SCORER), user(f"part {k}: ipsum")), {}, now + 0.01 * k)
             for k in range(5)]
    assert len({i.run for i in burst}) == 1
    assert [i.evidence for i in burst] == ["new"] + ["fanout"] * 4
    assert burst[0].new_run and not any(i.new_run for i in burst[1:])
    late = r.resolve("t1", chat(sys_(SCORER), user("part 9")), {}, now + 0.5)  # past the window
    assert late.run != burst[0].run and late.evidence == "new"
    for i in burst:
        r.answered(i, text("5"), now + 1)
    closed = {c.run: c for c in r.sweep(now + 100)}
    assert closed[burst[0].run].requests == 5
    # a fan-out run is no continuation: the app stays one-shot
    assert r.gaps.one_shot(burst[0].app_id)


def test_fanouts_need_a_one_shot_app_the_same_weak_id_and_stay_bounded() -> None:
    # a new (not yet one-shot) app: co-arriving first turns are separate runs
    r = Resolver()
    a = r.resolve("t1", chat(sys_(SCORER), user("a")), {}, T0)
    b = r.resolve("t1", chat(sys_(SCORER), user("b")), {}, T0 + 0.01)
    assert a.run != b.run
    # one-shot app: different users are not grouped, the same user (or none) is
    r = Resolver(IdentityConfig(fanout_max_requests=3))
    now = _one_shot(r)
    u1 = r.resolve("t1", chat(sys_(SCORER), user("a"), user="alice"), {}, now)
    u2 = r.resolve("t1", chat(sys_(SCORER), user("b"), user="bob"), {}, now + 0.01)
    u3 = r.resolve("t1", chat(sys_(SCORER), user("c"), user="alice"), {}, now + 0.02)
    assert u1.run != u2.run and u3.run == u1.run
    now += 10.0
    capped = [r.resolve("t1", chat(sys_(SCORER), user(f"p{k}")), {}, now + 0.01 * k)
              for k in range(5)]
    runs = [i.run for i in capped]
    assert runs[0] == runs[1] == runs[2] and runs[3] != runs[0]  # at most 3 per fan-out
    # another tenant's burst never joins
    other = r.resolve("t2", chat(sys_(SCORER), user("p")), {}, now + 0.05)
    assert other.run not in runs
    # off
    r = Resolver(IdentityConfig(fanout_window_s=0.0))
    now = _one_shot(r)
    ids = [r.resolve("t1", chat(sys_(SCORER), user(f"p{k}")), {}, now) for k in range(3)]
    assert len({i.run for i in ids}) == 3


def test_continuations_are_never_fanouts() -> None:
    """A conversation's next turn (it carries history) is matched by continuation or starts
    a new run: the fan-out rule only groups first turns."""
    r = Resolver()
    now = _one_shot(r)
    first = r.resolve("t1", chat(sys_(SCORER), user("doc")), {}, now)
    nxt = r.resolve("t1", chat(sys_(SCORER), user("doc"), text("7"), user("why?")), {}, now + 0.01)
    assert nxt.evidence != "fanout" and nxt.run != first.run


# ------------------------------------------------------------------------------ dataflow
MERGER = "You are a legal expert. Merge NDAs into one, keeping every clause."
JUDGE = "You are a legal expert. Score how well a merged NDA keeps the clauses."
AGGREGATOR = "You are a legal expert. Combine candidate merges of NDAs into one better merge."


def _merge(tag: str, i: int) -> str:
    """A candidate merge as a model writes it: a boilerplate opener (common to every run),
    then lines of its own."""
    return (f"Here is the merged agreement you asked for:\n"
            f"1. In variant {i}, confidential information of {tag} means every document "
            f"disclosed.\n"
            f"2. In variant {i}, the receiving party of {tag} keeps it secret for five years.")


def got_program(r: Resolver, tag: str, now: float, *, tenant: str = "t1",
                cut: int | None = None) -> list[Identity]:
    """A Graph-of-Thoughts pass as the real program sends it: two candidate merges at once,
    a score prompt per candidate holding it, an aggregate prompt holding both (``cut``: the
    program cuts each embedded candidate to that many characters, keeping the head)."""
    out: list[Identity] = []
    gen = [r.resolve(tenant, chat(sys_(MERGER), user(f"Documents:\n{tag} nda text")), {},
                     now + 0.001 * k) for k in range(2)]
    cands = [_merge(tag, k) for k in range(2)]
    for k, ident in enumerate(gen):
        r.answered(ident, text(cands[k]), now + 1)
    out += gen

    def held(c: str) -> str:
        return c if cut is None else c[:cut]

    now += 1.2
    for c in cands:
        s = r.resolve(tenant, chat(sys_(JUDGE), user(f"Merged NDA:\n{held(c)}\nScore:")), {}, now)
        r.answered(s, text("7"), now + 0.5)
        out.append(s)
        now += 0.6
    agg = r.resolve(tenant, chat(sys_(AGGREGATOR), user(
        "Candidates:\n" + "\n\n".join(held(c) for c in cands) + "\nCombined NDA:")), {}, now)
    r.answered(agg, text(_merge(tag, 9)), now + 1)
    out.append(agg)
    return out


def test_a_programs_stages_join_by_dataflow_into_one_run() -> None:
    """Each stage of a GoT program is a fresh prompt (no conversation); its score and
    aggregate prompts hold the candidates Hermes returned, so they continue the run."""
    r = Resolver()
    first = got_program(r, "acme", T0)
    gen, scores, agg = first[:2], first[2:4], first[4]
    # the very first run: its burst is not yet known to be a program's (two runs) ...
    assert gen[0].run != gen[1].run
    assert [s.evidence for s in scores] == ["dataflow", "dataflow"]
    assert scores[0].run == gen[0].run and scores[1].run == gen[1].run
    assert agg.evidence == "dataflow" and agg.run in (gen[0].run, gen[1].run)
    # ... the app has shown a dataflow continuation: later runs' bursts are fan-outs, and
    # every request of a run lands in it
    for n, tag in enumerate(("globex", "initech")):
        ids = got_program(r, tag, T0 + 100 * (n + 1))
        assert len({i.run for i in ids}) == 1, [(i.evidence, i.run) for i in ids]
        assert [i.evidence for i in ids] == ["new", "fanout"] + ["dataflow"] * 3
        # the stages keep their own units, under the first stage's app
        assert len({i.app_id for i in ids}) == 1 and len({i.unit for i in ids}) == 3
    # a dataflow join is no conversation: the app is still a program of independent prompts
    assert not r.gaps.conversational(gen[0].app_id) and r.gaps.fans_out(gen[0].app_id)


def test_dataflow_finds_an_output_cut_to_fit_by_its_head() -> None:
    r = Resolver(IdentityConfig(dataflow_head_chars=48))
    ids = got_program(r, "acme", T0, cut=len("Here is the merged agreement you asked for:\n") + 60)
    assert [i.evidence for i in ids[2:]] == ["dataflow"] * 3


def test_boilerplate_lines_are_ambiguous_and_tenants_never_meet() -> None:
    r = Resolver()
    a = got_program(r, "acme", T0)
    b = got_program(r, "globex", T0 + 100)
    # the opener line is in every run's replies: it is not evidence of any one run
    probe = chat(sys_(JUDGE), user("Merged NDA:\nHere is the merged agreement you asked for:\n"
                                   "Score:"))
    assert r.resolve("t1", probe, {}, T0 + 200).evidence == "new"
    # a run's own line is, for its tenant only
    line = _merge("globex", 0).splitlines()[1]
    mine = r.resolve("t1", chat(sys_(JUDGE), user(f"Merged NDA:\n{line}\nScore:")), {}, T0 + 200)
    assert mine.evidence == "dataflow" and mine.run in {i.run for i in b}
    assert mine.run not in {i.run for i in a}
    other = r.resolve("t2", chat(sys_(JUDGE), user(f"Merged NDA:\n{line}\nScore:")), {}, T0 + 200)
    assert other.evidence == "new"
    # short lines are never passages; switched off, nothing joins
    short = r.resolve("t1", chat(sys_(JUDGE), user("Merged NDA:\n7\nScore:")), {}, T0 + 200)
    assert short.evidence == "new"
    off = Resolver(IdentityConfig(dataflow=False))
    assert {i.evidence for i in got_program(off, "acme", T0)[2:]} == {"new"}


def test_dataflow_memory_and_scan_are_bounded() -> None:
    """A reply of 1,000 distinct long lines indexes ``dataflow_max_passages`` of them; a
    prompt is scanned over ``dataflow_max_scan_chars`` characters only."""
    cfg = IdentityConfig(dataflow_max_passages=4, dataflow_max_scan_chars=1000)
    r = Resolver(cfg)
    ident = r.resolve("t1", chat(sys_(MERGER), user("go")), {}, T0)
    lines = [f"line {k:04d} of a very long answer that goes on and on" for k in range(1000)]
    r.answered(ident, text("\n".join(lines)), T0 + 1)
    # the conversation's digest in the evidence index, 4 passages in their own
    assert len(r.index) == 1 and len(r.passages) == 4
    late = r.resolve("t1", chat(sys_(JUDGE), user("x" * 2000 + "\n" + lines[0])), {}, T0 + 2)
    assert late.evidence == "new"  # its only passage lies past the scan limit
    early = r.resolve("t1", chat(sys_(JUDGE), user(lines[0] + "\n" + "x" * 2000)), {}, T0 + 2)
    assert early.evidence == "dataflow" and early.run == ident.run


def test_a_new_session_is_a_new_run_whatever_its_text_holds() -> None:
    r = Resolver()
    a = got_program(r, "acme", T0)
    line = _merge("acme", 0).splitlines()[1]
    s = r.resolve("t1", chat(sys_(JUDGE), user(f"Merged NDA:\n{line}")),
                  {"x-session-id": "fresh"}, T0 + 10)
    assert s.evidence.startswith("session") and s.new_run and s.run not in {i.run for i in a}


def test_a_claim_picked_out_of_a_listed_reply_joins_its_run() -> None:
    """FacTool: the extraction lists claims (``1. "..."``); each query prompt holds one
    claim after a label."""
    r = Resolver()
    ext = r.resolve("t1", chat(sys_("You extract the factual claims a text makes."),
                               user("Text: the tower opened in 1889")), {}, T0)
    claims = ["The Eiffel Tower opened to the public in March 1889.",
              "It was the tallest man-made structure until the Chrysler Building."]
    r.answered(ext, text("\n".join(f'{k + 1}. "{c}"' for k, c in enumerate(claims))), T0 + 1)
    qs = [r.resolve("t1", chat(sys_("You write search queries that verify a claim."),
                               user(f"Claim: {c}\nQueries:")), {}, T0 + 1.1) for c in claims]
    assert [q.evidence for q in qs] == ["dataflow", "dataflow"]
    assert {q.run for q in qs} == {ext.run}


def test_gapbook_snapshot_keeps_which_apps_converse() -> None:
    from hermes.gateway.resolve.runend import GapBook

    g = GapBook(one_shot_runs=2)
    g.add("chat", 3.0)  # a conversation's next turn
    g.add("got", 0.2, conversation=False)  # a dataflow continuation
    for _ in range(2):
        g.closed("got", False)
    assert g.conversational("chat") and not g.fans_out("chat")
    assert not g.conversational("got") and g.fans_out("got") and g.one_shot("got")
    back = GapBook(one_shot_runs=2)
    back.restore(json.loads(json.dumps(g.snapshot())))
    assert back.conversational("chat") and back.fans_out("got") and back.one_shot("got")
    assert back.gaps("got") == [0.2]
    # a snapshot from before dataflow (no "conv"): every app with gaps had conversed
    old = GapBook()
    old.restore({"gaps": {"chat": [3.0]}, "single": {"x": 5}})
    assert old.conversational("chat") and not old.conversational("x")

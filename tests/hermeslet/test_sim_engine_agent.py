"""The built-in engine as an agent's model: streamed chunk objects, whole answers, n choices
as side-by-side sequences in the engine model, seeds, embeddings priced as prefill only."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from hermeslet.engines.base import EngineError, GenChunk, GenResult
from hermeslet.engines.sim_engine import SimEngine
from hermeslet.engines.sim_output import AgentBehaviour

pytestmark = pytest.mark.timeout(60)

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}},
    {"type": "function", "function": {"name": "fetch", "parameters": {
        "type": "object", "properties": {"url": {"type": "string", "format": "uri"}},
        "required": ["url"]}}}]
USER = [{"role": "user", "content": "find it"}]


async def run(eng: SimEngine, endpoint: str, body: dict[str, Any], stream: bool,
              rid: str) -> list[GenChunk | GenResult]:
    return [x async for x in eng.generate(endpoint, body, stream, request_id=rid)]


async def test_streamed_chunks_are_openai_objects_that_add_up_to_the_answer():
    eng = SimEngine(time_scale=1000)
    try:
        out = await run(eng, "chat", {"messages": USER, "tools": TOOLS}, True, "t1")
        chunks, res = out[:-1], out[-1]
        assert isinstance(res, GenResult) and all(isinstance(c, GenChunk) for c in chunks)
        assert chunks[0].n_tokens == 0 and chunks[-1].n_tokens == 0
        assert chunks[0].chunk["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert chunks[-1].chunk["choices"][0]["finish_reason"] == "tool_calls"
        assert all(c.chunk["object"] == "chat.completion.chunk" and c.chunk["id"] ==
                   "chatcmpl-t1" for c in chunks)
        assert sum(c.n_tokens for c in chunks) == res.output_tokens > 0
        acc: dict[int, str] = {}
        for c in chunks[1:-1]:
            for d in c.chunk["choices"][0]["delta"]["tool_calls"]:
                acc[d["index"]] = acc.get(d["index"], "") + d["function"]["arguments"]
        calls = res.response["choices"][0]["message"]["tool_calls"]
        assert [acc[i] for i in sorted(acc)] == [c["function"]["arguments"] for c in calls]
        assert all(json.loads(a) for a in acc.values())
        assert res.response["usage"]["completion_tokens"] == res.output_tokens
        # text: the chunks' text is the first choice's text
        out = await run(eng, "chat", {"messages": USER}, True, "t2")
        res = out[-1]
        assert "".join(c.text for c in out[:-1]) == res.text
        assert res.finish_reason == "stop" and res.response["choices"][0]["message"][
            "content"] == res.text
        # a non-streamed request yields its answer alone
        [only] = await run(eng, "completions", {"prompt": "p", "max_tokens": 3,
                                                "ignore_eos": True}, False, "t3")
        assert only.output_tokens == 3 and only.response["object"] == "text_completion"
        assert eng.stats().extra["generation_tokens"] == eng.generation_tokens_total
    finally:
        await eng.close()


async def test_stream_sends_one_tool_call_a_chunk_its_id_and_name_first():
    """As OpenAI's service: each chunk carries one call's delta; a call's first delta has its
    id and name (and ``arguments: ""``), the later ones argument pieces only. A fast engine
    (time_scale 1e6) hands several tokens a step, so a step spans two calls' tokens."""
    eng = SimEngine(time_scale=1e6, behaviour=AgentBehaviour(max_parallel=2))
    body = {"messages": USER, "tools": TOOLS, "tool_choice": "required", "seed": 0}
    try:
        two = 0
        for seed in range(8):
            out = await run(eng, "chat", {**body, "seed": seed}, True, f"p{seed}")
            res = out[-1]
            calls = res.response["choices"][0]["message"]["tool_calls"]
            two += len(calls) == 2
            seen: dict[int, dict[str, str]] = {}
            for c in out[:-1]:
                deltas = c.chunk["choices"][0]["delta"].get("tool_calls") or []
                assert len(deltas) <= 1, c.chunk
                for d in deltas:
                    if d["index"] not in seen:  # the call's first delta: id and name only
                        assert d["id"] and d["function"] == {"name": d["function"]["name"],
                                                             "arguments": ""}, d
                        seen[d["index"]] = {"id": d["id"], "name": d["function"]["name"],
                                            "arguments": ""}
                    else:
                        assert "id" not in d and "name" not in d["function"], d
                        seen[d["index"]]["arguments"] += d["function"]["arguments"]
            assert [seen[i] for i in sorted(seen)] == [
                {"id": t["id"], **t["function"]} for t in calls]
        assert two >= 2  # parallel calls were exercised
    finally:
        await eng.close()


async def test_n_choices_are_sequences_decoded_side_by_side():
    eng = SimEngine(time_scale=20)
    body = {"prompt": "x" * 40, "n": 3, "max_tokens": 40, "ignore_eos": True}
    try:
        await eng.start()
        t0 = eng.now()
        task = asyncio.ensure_future(run(eng, "completions", body, True, "n3"))
        for _ in range(200):
            await asyncio.sleep(0.005)
            if len(eng.core.running) == 3:
                break
        assert set(eng.core.requests) == {"n3", "n3#1", "n3#2"}
        out = await task
        model_s = eng.now() - t0
        res = out[-1]
        assert res.output_tokens == 120 and res.input_tokens == 10
        assert [c["index"] for c in res.response["choices"]] == [0, 1, 2]
        per_choice = {i: sum(c.n_tokens for c in out[:-1] if c.chunk["choices"][0]["index"] == i)
                      for i in range(3)}
        assert per_choice == {0: 40, 1: 40, 2: 40}
        assert eng.requests_finished == 1 and eng.generation_tokens_total == 120
        # side by side: about one sequence's time (40 decode iterations), not three
        one = eng.cost.iteration_s(0, 3, 3 * 60) * 40
        assert model_s < 2 * one
        assert not eng.core.requests and eng.core.kv_used == 0
    finally:
        await eng.close()


async def test_aborting_a_request_with_n_choices_frees_every_sequence():
    eng = SimEngine(time_scale=1)
    try:
        body = {"prompt": "p", "n": 2, "max_tokens": 2000, "ignore_eos": True}
        task = asyncio.ensure_future(run(eng, "completions", body, True, "long"))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if len(eng.core.running) == 2:
                break
        with pytest.raises(EngineError, match="duplicate request id"):
            await run(eng, "completions", body, False, "long")
        assert len(eng.core.running) == 2
        await eng.abort("long")
        with pytest.raises(EngineError) as e:
            await task
        assert e.value.status == 499
        assert not eng.core.requests and eng.core.kv_used == 0
        assert eng.requests_aborted == 1
    finally:
        await eng.close()


async def test_seeded_requests_repeat_and_behaviour_is_per_engine():
    eng = SimEngine(time_scale=1000, behaviour=AgentBehaviour(mean_answer_tokens=3))
    try:
        body = {"messages": USER, "seed": 5, "tools": TOOLS, "tool_choice": "none"}
        a = (await run(eng, "chat", body, False, "a"))[-1]
        b = (await run(eng, "chat", {**body, "stream": True}, True, "b"))[-1]
        assert a.response["choices"] == b.response["choices"]
        lens = [(await run(eng, "chat", {"messages": USER}, False, f"l{i}"))[-1].output_tokens
                for i in range(40)]
        assert sum(lens) / len(lens) < 6  # the engine's mean_answer_tokens = 3
        with pytest.raises(EngineError, match="KV tokens, more than the engine's capacity"):
            await run(eng, "completions", {"prompt": "p", "max_tokens": 10**7}, False, "big")
    finally:
        await eng.close()


async def test_embeddings_are_prefill_only_and_tasks_are_kept_apart():
    emb = SimEngine(model="emb", time_scale=1000, task="embed")
    gen = SimEngine(model="gen", time_scale=1000)
    try:
        [res] = await run(emb, "embeddings", {"input": ["hello there", "x" * 40]}, False, "e1")
        assert (res.input_tokens, res.output_tokens) == (3 + 10, 0)
        assert res.response["usage"] == {"prompt_tokens": 13, "total_tokens": 13}
        assert len(res.response["data"]) == 2 and res.response["model"] == "emb"
        st = emb.stats().extra
        assert st["prompt_tokens"] == 13 and st["generation_tokens"] == 0
        assert st["request_success"] == 1 and not emb.core.requests
        with pytest.raises(EngineError, match="`emb` does not support chat completions.*"
                                              "'embed'") as e:
            await run(emb, "chat", {"messages": USER}, False, "e2")
        assert e.value.status == 400
        with pytest.raises(EngineError, match="`gen` does not support embeddings.*'generate'"):
            await run(gen, "embeddings", {"input": "hi"}, False, "g1")
        with pytest.raises(ValueError, match="task"):
            SimEngine(task="rerank")  # type: ignore[arg-type]
    finally:
        await emb.close()
        await gen.close()


def test_sim_engine_behaviour_flags(capsys):
    """``hermeslet sim-engine`` takes the agent-model knobs; a bad one is refused by name."""
    from hermeslet.cli import _parser, main

    args = _parser().parse_args(["sim-engine", "--port", "1", "--task", "embed",
                                 "--tool-call-p", "0.25", "--max-tool-rounds", "2",
                                 "--max-parallel-tools", "3", "--mean-answer-tokens", "50"])
    assert (args.task, args.tool_call_p, args.max_tool_rounds, args.max_parallel,
            args.mean_answer_tokens) == ("embed", 0.25, 2, 3, 50)
    assert main(["sim-engine", "--port", "1", "--tool-call-p", "1.5"]) == 2
    assert "tool_call_p" in capsys.readouterr().err
    assert main(["sim-engine", "--port", "1", "--mean-answer-tokens", "0"]) == 2
    assert "mean_answer_tokens" in capsys.readouterr().err

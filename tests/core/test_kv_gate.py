"""The KV gate (hermes.core.kv_gate) and the engine model with it: a long prompt that does not
fit beside the running requests thrashes under vLLM's first-chunk admission and waits, whole,
behind the gate; the policy's order is kept; an idle engine takes anything."""

from __future__ import annotations

import pytest

from hermes.core.costmodel import get_cost_model
from hermes.core.engine_model import EngineModel, EngineRequest
from hermes.core.kv_gate import KvGate

# the calibrated A100 setup: chunked prefill, 8,192-token budget; a small KV to make it tight
COST = get_cost_model("llama2-7b-a100-cal").with_overrides(kv_capacity_tokens=20_000)


def req(rid: str, p: int, o: int, key: float) -> EngineRequest:
    return EngineRequest(rid, run_id=rid, input_tokens=p, output_tokens=o, key=(key,))


def test_admits_a_prompt_that_fits_and_holds_one_that_does_not():
    gate = KvGate()
    assert gate.admits(5_000, 5_000, busy=True)
    assert not gate.admits(5_001, 5_000, busy=True)
    assert gate.admits(50_000, 0, busy=False)  # an idle engine takes anything
    reserved = KvGate(reserve_tokens=1_000)
    assert reserved.admits(4_000, 5_000, busy=True)
    assert not reserved.admits(4_001, 5_000, busy=True)
    with pytest.raises(ValueError, match="reserve_tokens"):
        KvGate(reserve_tokens=-1)


def run(gate: KvGate | None) -> tuple[EngineModel, list[str], dict[str, float], int]:
    """Two 5,000-token decoders running, then a 10,000-token prompt (priority 2) and a small
    one behind it (priority 3): the long one fits only once a decoder has finished."""
    eng = EngineModel(COST, kv_gate=gate)
    eng.add(req("d1", 5_000, 400, 0.0), 0.0)
    eng.add(req("d2", 5_000, 200, 1.0), 0.0)
    now = 0.0
    for _ in range(3):  # both prefilled and decoding
        now += eng.step(now).duration_s
    eng.add(req("long", 10_000, 20, 2.0), now)
    eng.add(req("small", 500, 20, 3.0), now)
    admitted: list[str] = []
    done: dict[str, float] = {}
    preemptions = 0
    while eng.has_work:
        before = {r.request_id for r in eng.running}
        res = eng.step(now)
        now += res.duration_s
        preemptions += len(res.preempted)
        admitted += [r.request_id for r in eng.running if r.request_id not in before]
        for rid in res.finished:
            done[rid] = now
    return eng, admitted, done, preemptions


def test_without_the_gate_the_long_prompt_thrashes():
    _, admitted, done, preemptions = run(None)
    assert admitted.count("long") > 5  # admitted by its first chunk, preempted, again ...
    assert preemptions >= admitted.count("long") - 1
    assert set(done) == {"d1", "d2", "long", "small"}


def test_with_the_gate_it_waits_whole_and_nothing_is_recomputed():
    _, admitted, done, preemptions = run(KvGate())
    assert preemptions == 0
    assert admitted.count("long") == 1
    # the head blocks: the small request behind it does not jump the policy's order
    assert admitted.index("long") < admitted.index("small")
    assert done["d2"] <= done["long"]  # it started only once a decoder had left room
    _, _, done_off, _ = run(None)
    assert done["long"] < done_off["long"]  # and finishes sooner than by thrashing
    assert max(done.values()) < max(done_off.values())


def test_the_gate_does_not_change_an_engine_with_room():
    """Short prompts that fit: the same iterations with and without the gate."""
    def finish(gate: KvGate | None) -> dict[str, float]:
        eng = EngineModel(COST, kv_gate=gate)
        for i in range(6):
            eng.add(req(f"r{i}", 1_000 + 300 * i, 50 + 10 * i, float(i)), 0.0)
        now, out = 0.0, {}
        while eng.has_work:
            res = eng.step(now, until=now + 5.0)
            now += res.duration_s
            out.update({rid: now for rid in res.finished})
        return out

    assert finish(KvGate()) == pytest.approx(finish(None))

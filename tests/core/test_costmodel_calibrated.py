"""The calibrated cost terms, checked by hand, and the engine model's two scheduler modes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hermes.core.costmodel import (
    CostModel,
    get_cost_model,
    split_mode,
    with_mode,
)
from hermes.core.engine_model import EngineModel, EngineRequest

#: a hand-made calibrated model: 10 ms + 1 ms per sequence; per-token operators flat to 100
#: tokens, +10 ms at 200, +30 ms at 300 (then 0.2 ms per token); 1 us per context token;
#: 1 ns per prefill pair; 0.5 ms per prefilling sequence
HAND = CostModel(
    name="hand",
    base_s=0.010,
    prefill_s_per_token=0.2e-3,
    decode_s_per_seq=0.001,
    decode_s_per_ctx_token=1e-6,
    kv_capacity_tokens=100_000,
    max_batched_tokens=1000,
    token_knots=((1.0, 0.0), (100.0, 0.0), (200.0, 0.010), (300.0, 0.030)),
    prefill_seq_s=0.0005,
    prefill_attn_s_per_pair=1e-9,
)


def test_excess_is_piecewise_linear_and_extrapolates_the_last_slope() -> None:
    assert HAND.excess_s(1) == 0.0
    assert HAND.excess_s(50) == 0.0
    assert HAND.excess_s(150) == pytest.approx(0.005)
    assert HAND.excess_s(250) == pytest.approx(0.020)
    assert HAND.excess_s(300) == pytest.approx(0.030)
    assert HAND.excess_s(400) == pytest.approx(0.050)  # 0.2 ms per token beyond the knots
    xs = np.array([0.0, 1.0, 150.0, 250.0, 400.0])
    assert HAND._excess_np(xs) == pytest.approx([HAND.excess_s(x) for x in xs])


def test_iteration_terms_by_hand() -> None:
    # 3 decodes with 1,000 context tokens in all, and one 150-token chunk after 50 cached
    t = HAND.iteration_s(150, 3, 1000, prefill_seqs=1, prefill_pairs=150 * (50 + 75))
    want = 0.010 + 3 * 0.001 + 0.0005 + HAND.excess_s(153) + 1000e-6 + 150 * 125 * 1e-9
    assert t == pytest.approx(want)
    # default: the prefill tokens are one fresh prompt
    assert HAND.iteration_s(150, 0, 0) == pytest.approx(
        0.010 + 0.0005 + HAND.excess_s(150) + 0.5 * 150 * 150 * 1e-9
    )
    # the linear model ignores the calibrated arguments
    lin = get_cost_model("llama2-7b-a100-ideal")
    assert lin.iteration_s(150, 3, 1000, prefill_seqs=7, prefill_pairs=1e9) == pytest.approx(
        lin.base_s + 150 * lin.prefill_s_per_token + 3 * lin.decode_s_per_seq
        + 1000 * lin.decode_s_per_ctx_token
    )


def _isolated_by_iterations(cost: CostModel, inputs: list[int], outputs: list[int]) -> float:
    """The isolated unit, iteration by iteration: one prefill of all prompts, then decodes
    whose batch shrinks as requests finish."""
    t = 0.0
    live = [(i, o) for i, o in zip(inputs, outputs, strict=True)]
    if sum(inputs):
        pairs = sum(0.5 * i * i for i in inputs)
        t += cost.iteration_s(sum(inputs), 0, 0, prefill_seqs=sum(1 for i in inputs if i),
                              prefill_pairs=pairs)
    for step in itertools.count():
        batch = [(i, o) for i, o in live if o > step]
        if not batch:
            return t
        # the closed form's context is o*i + o*o/2: half a token more per iteration than
        # the engine's i + step (its convention since the linear model)
        t += cost.iteration_s(0, len(batch), sum(i + step + 0.5 for i, _ in batch))
    raise AssertionError("unreachable")


@pytest.mark.parametrize("cost", [HAND, get_cost_model("llama2-7b-a100-cal")],
                         ids=["hand", "calibrated"])
def test_unit_service_is_the_sum_of_its_iterations(cost: CostModel) -> None:
    rng = np.random.default_rng(5)
    for _ in range(30):
        p = int(rng.integers(1, 6))
        i = rng.integers(0, 400, p).tolist()
        o = rng.integers(0, 150, p).tolist()
        want = _isolated_by_iterations(cost, i, o)
        got = float(cost.unit_service_s(np.array([i + [0]]), np.array([o + [0]]))[0])
        assert got == pytest.approx(want, rel=1e-9)
        # what the simulator credits as attained service, at the unit's end
        assert cost.partial_service_s(i, o, i) == pytest.approx(want, rel=1e-9)
        if p == 1:
            assert cost.request_service_s(i[0], o[0]) == pytest.approx(want, rel=1e-9)


def test_setup_names_and_modes() -> None:
    assert split_mode("llama2-7b-a100@vllm-0.4") == ("llama2-7b-a100", "vllm-0.4")
    assert split_mode("llama2-7b-a100") == ("llama2-7b-a100", None)
    assert with_mode("llama2-7b-a100", "vllm-0.4") == "llama2-7b-a100@vllm-0.4"
    assert with_mode("llama2-7b-a100@vllm-0.4", "vllm-v1") == "llama2-7b-a100"
    with pytest.raises(ValueError, match="mode"):
        with_mode("llama2-7b-a100", "vllm-0.9")
    v1 = get_cost_model("llama2-7b-a100-cal")
    v04 = get_cost_model("llama2-7b-a100-cal", mode="vllm-0.4")
    assert get_cost_model("llama2-7b-a100-cal@vllm-0.4") == v04
    assert (v1.chunked_prefill, v1.max_batched_tokens) == (True, 8192)
    assert (v04.chunked_prefill, v04.max_batched_tokens, v04.mode) == (False, 4096, "vllm-0.4")
    # the 0.4 era's engine loop spends more CPU per iteration and per sequence
    assert v04.iteration_s(0, 64, 0) > v1.iteration_s(0, 64, 0)
    lin = get_cost_model("llama2-7b-a100-ideal", mode="vllm-0.4")
    assert (lin.chunked_prefill, lin.max_batched_tokens) == (False, 4096)
    assert lin.base_s == get_cost_model("llama2-7b-a100-ideal").base_s
    with pytest.raises(ValueError, match="mode"):
        get_cost_model("llama2-7b-a100@vllm-0.4", mode="vllm-v1")


def _req(rid: str, p: int, o: int, key: float = 0.0) -> EngineRequest:
    return EngineRequest(rid, run_id=rid, input_tokens=p, output_tokens=o, key=(key,))


V04 = get_cost_model("llama2-7b-a100-cal", mode="vllm-0.4")
V1 = get_cost_model("llama2-7b-a100-cal")


def test_v1_chunks_a_long_prompt_and_mixes_it_with_decodes() -> None:
    eng = EngineModel(V1)
    eng.add(_req("d", 100, 50), 0.0)
    eng.step(0.0)  # d prefilled
    eng.add(_req("p", 10_000, 5), 0.0)
    res = eng.step(0.0)
    assert res.emitted == {"d": 1}  # the decode goes on beside the chunk
    assert res.prefilled == {"p": 8191}  # budget 8,192 minus the decode
    # the chunk attends to itself only (nothing cached before it)
    assert res.duration_s == pytest.approx(V1.iteration_s(
        8191, 1, 100, prefill_seqs=1, prefill_pairs=8191 * 8191 / 2))
    res = eng.step(0.0)
    assert res.prefilled == {"p": 10_000 - 8191}
    assert res.duration_s == pytest.approx(V1.iteration_s(
        1809, 1, 101, prefill_seqs=1, prefill_pairs=1809 * (8191 + 1809 / 2)))


def test_v04_prefill_first_stalls_decodes_and_never_chunks() -> None:
    eng = EngineModel(V04)
    eng.add(_req("d", 100, 50), 0.0)
    eng.step(0.0)
    eng.add(_req("p1", 3000, 5), 0.0)
    eng.add(_req("p2", 3000, 5), 0.0)
    eng.add(_req("big", 6000, 5), 0.0)
    res = eng.step(0.0)
    assert res.prefilled == {"p1": 3000} and not res.emitted  # d's decode is stalled
    res = eng.step(0.0)
    assert res.prefilled == {"p2": 3000} and not res.emitted  # 3000 + 3000 > 4,096
    res = eng.step(0.0)
    assert res.prefilled == {"big": 6000}  # longer than the budget: whole, alone
    assert res.duration_s == pytest.approx(V04.iteration_s(6000, 0, 0))
    res = eng.step(0.0)  # nothing waits: every running request decodes
    assert set(res.emitted) == {"d", "p1", "p2", "big"} and not res.prefilled


def test_v04_admits_prompts_in_key_order_up_to_the_budget() -> None:
    eng = EngineModel(V04)
    for k, p in enumerate([1000, 1000, 1000, 2000]):
        eng.add(_req(f"r{k}", p, 3, key=float(k)), 0.0)
    res = eng.step(0.0)
    assert list(res.prefilled) == ["r0", "r1", "r2"]  # r3 would pass 4,096: next iteration
    pairs = 3 * 0.5 * 1000 * 1000
    assert res.duration_s == pytest.approx(V04.iteration_s(3000, 0, 0, prefill_seqs=3,
                                                           prefill_pairs=pairs))


@pytest.mark.parametrize("cost", [V1, V04], ids=["vllm-v1", "vllm-0.4"])
def test_multi_iteration_decode_runs_are_exact_in_both_modes(cost: CostModel) -> None:
    """step(until=...) equals running the iterations one by one, with arrivals between."""
    rng = np.random.default_rng(11)
    arrivals = sorted((float(t), int(p), int(o)) for t, p, o in zip(
        rng.uniform(0, 20, 40), rng.integers(50, 3000, 40), rng.integers(1, 300, 40),
        strict=True))

    def run(multi: bool) -> dict[str, float]:
        eng = EngineModel(cost)
        now, k, done = 0.0, 0, {}
        while k < len(arrivals) or eng.has_work:
            while k < len(arrivals) and arrivals[k][0] <= now:
                eng.add(_req(f"r{k}", arrivals[k][1], arrivals[k][2], key=float(k)), now)
                k += 1
            nxt = arrivals[k][0] if k < len(arrivals) else float("inf")
            if not eng.has_work:
                now = nxt
                continue
            res = eng.step(now, until=nxt if multi else None)
            if res.batch is not None and now + res.duration_s > nxt:
                keep = EngineModel.iterations_started(res, nxt - now)
                eng.truncate(res, keep)
            now += res.duration_s
            for rid in res.finished:
                done[rid] = now
        return done

    one, many = run(False), run(True)
    assert one.keys() == many.keys() and len(one) == len(arrivals)
    for rid in one:
        assert many[rid] == pytest.approx(one[rid], rel=1e-9)


def test_v04_is_slower_than_v1_on_a_mixed_load() -> None:
    """Prefill-first iterations stall the decodes and the era's CPU time adds up."""

    def finish(cost: CostModel) -> float:
        eng = EngineModel(cost)
        for k in range(40):
            eng.add(_req(f"r{k}", 600, 200, key=float(k)), 0.0)
        now = 0.0
        while eng.has_work:
            now += eng.step(now, until=float("inf")).duration_s
        return now

    assert finish(V04) > finish(V1)


def test_a_one_request_observation_is_priced_as_the_batch_formula_bit_for_bit() -> None:
    """The plain-float price of a one-request unit (the live gateway's every header-less
    request) is exactly what the numpy batch formula gives under the linear cost models, and
    the calibrated ones keep the batch formula: the simulator's figures cannot move."""
    import random

    import numpy as np

    from hermes.core.costmodel import MODES, SETUPS, get_cost_model
    from hermes.core.state import UnitObservation

    rng = random.Random(5)
    for setup in SETUPS:
        for mode in MODES:
            cm = get_cost_model(setup, mode=mode)
            for _ in range(2000):
                i = rng.choice([0, rng.randint(1, 64), rng.randint(1, 60_000)])
                o = rng.choice([0, 1, rng.randint(1, 8_000)])
                obs = UnitObservation.from_requests("u", [i], [o], cm, duration_s=1.0,
                                                    started=0.0, finished=1.0)
                want = float(cm.unit_service_s(np.array([[i]], dtype=float),
                                               np.array([[o]], dtype=float))[0])
                assert obs.service_s == want, (setup, mode, i, o)
                assert (obs.input_tokens, obs.output_tokens, obs.parallelism) == (i, o, 1)

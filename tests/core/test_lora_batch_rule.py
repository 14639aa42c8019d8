"""vLLM's LoRA batch rule in the engine model (at most ``max_loras`` distinct adapters running,
others wait; loads stall the admitting iteration) and LoRA slot eviction that spares the
adapters of running and queued requests."""

from __future__ import annotations

import pytest

from hermes.core.costmodel import get_cost_model
from hermes.core.engine_model import EngineModel, EngineRequest
from hermes.core.warm_models import LoraSlots

COST = get_cost_model("llama2-7b-a100")


def lreq(rid: str, lora: str | None, p: int = 100, o: int = 20, key: float = 0.0) -> EngineRequest:
    return EngineRequest(rid, run_id=rid, input_tokens=p, output_tokens=o, key=(key,), lora=lora)


class SlotHook:
    """Admission hook: the adapter load stall from :class:`LoraSlots` wired to the engine."""

    def __init__(self, eng: EngineModel, slots: LoraSlots) -> None:
        self.slots = slots
        self.admitted: list[tuple[str, float]] = []
        slots.running = lambda a: a in eng.running_loras
        slots.queued = lambda a: a in eng.waiting_loras

    def on_admit(self, req: EngineRequest, now: float) -> float:
        self.admitted.append((req.request_id, now))
        return self.slots.admit(req.lora, now) if req.lora else 0.0


def run_until_idle(eng: EngineModel, until: float | None = None) -> dict[str, float]:
    now, done = 0.0, {}
    while eng.has_work:
        res = eng.step(now, until)
        assert not res.idle
        now += res.duration_s
        for rid in res.finished:
            done[rid] = now
    return done


def test_third_adapter_waits_while_two_run_and_runs_once_one_finishes():
    eng = EngineModel(COST, max_loras=2)
    eng.add(lreq("a", "A", o=10), 0.0)
    eng.add(lreq("b", "B", o=40), 0.0)
    eng.add(lreq("c", "C", o=10), 0.0)
    eng.add(lreq("d", None, o=10), 0.0)  # behind c: admitted past it (c is skipped)
    eng.step(0.0)
    running = {r.request_id for r in eng.running}
    assert running == {"a", "b", "d"}
    assert "c" in eng.waiting and eng.lora_blocked(eng.requests["c"])
    now, c_started, a_done = 0.0, None, None
    while eng.has_work:
        res = eng.step(now)
        now += res.duration_s
        if "a" in res.finished:
            a_done = now
            assert "c" in eng.waiting  # admitted from the next iteration on
        if c_started is None and any(r.request_id == "c" for r in eng.running):
            c_started = now
            assert {r.lora for r in eng.running} <= {"B", "C", None}
    assert a_done is not None and c_started is not None
    assert c_started > a_done  # ran only after A's request had left the batch
    assert not eng.running_loras and not eng.waiting_loras


def test_same_adapter_requests_share_the_batch_and_the_rule_is_off_by_default():
    eng = EngineModel(COST, max_loras=1)
    for i in range(3):
        eng.add(lreq(f"a{i}", "A"), 0.0)
    eng.add(lreq("b", "B"), 0.0)
    eng.step(0.0)
    assert {r.request_id for r in eng.running} == {"a0", "a1", "a2"}
    free = EngineModel(COST)  # no max_loras: every adapter is batched
    for i, a in enumerate("ABC"):
        free.add(lreq(f"r{i}", a), 0.0)
    free.step(0.0)
    assert len(free.running) == 3


def test_skipped_request_keeps_its_queue_position():
    eng = EngineModel(COST, max_loras=1)
    eng.add(lreq("a", "A", o=5, key=0.0), 0.0)
    eng.add(lreq("b1", "B", o=5, key=1.0), 0.0)
    eng.add(lreq("b2", "B", o=5, key=1.0), 0.0)
    eng.step(0.0)
    assert [r.request_id for r in eng.running] == ["a"]
    assert [r.request_id for r in eng.waiting.ordered()] == ["b1", "b2"]  # FIFO kept
    done = run_until_idle(eng)
    assert done["a"] < done["b1"] <= done["b2"]


def test_multi_iteration_decode_matches_single_steps_under_the_rule():
    def build() -> EngineModel:
        eng = EngineModel(COST, max_loras=2)
        for i, (a, o) in enumerate([("A", 30), ("B", 50), ("C", 20), ("A", 60), ("D", 10)]):
            eng.add(lreq(f"r{i}", a, p=80 + 10 * i, o=o), 0.0)
        return eng

    one = run_until_idle(build())
    fast = run_until_idle(build(), until=float("inf"))
    assert fast.keys() == one.keys()
    for rid in one:
        assert fast[rid] == pytest.approx(one[rid])


def test_admission_loads_the_adapter_and_stalls_the_iteration():
    eng = EngineModel(COST, max_loras=2)
    slots = LoraSlots(2, 4, disk_load_s=0.25, cpu_load_s=0.02)
    eng.admission_hook = SlotHook(eng, slots)
    eng.add(lreq("a", "A", p=100, o=3), 0.0)
    res = eng.step(0.0)
    assert res.duration_s == pytest.approx(COST.iteration_s(100, 0, 0) + 0.25)  # from disk
    assert slots.is_warm("A")
    res = eng.step(res.duration_s)
    assert res.duration_s == pytest.approx(COST.iteration_s(0, 1, 100))  # nothing to load


def test_loads_never_evict_a_running_adapter_and_prefetch_spares_queued_ones():
    eng = EngineModel(COST, max_loras=2)
    slots = LoraSlots(2, 4, disk_load_s=0.25, cpu_load_s=0.02)
    eng.admission_hook = SlotHook(eng, slots)
    eng.add(lreq("a", "A", o=50), 0.0)
    eng.add(lreq("b", "B", o=50), 0.0)
    eng.step(0.0)
    assert set(slots.gpu) == {"A", "B"}
    # both slots serve running requests: a prefetch goes to host memory only
    assert slots.prefetch("C", 1.0, planned=True) is None
    assert set(slots.gpu) == {"A", "B"} and "C" in slots.cpu
    # A's request finishes; a request of B queues, and one of D waits
    eng.abort("a")
    eng.add(lreq("d", "D", o=5), 1.0)
    # a planned prefetch may now take A's slot (unused), but not B's (running)
    assert slots.prefetch("E", 1.0, planned=True) is not None
    assert set(slots.gpu) == {"B", "E"}
    # a prefetch for a queued request may not evict E if E is queued for a request
    eng.add(lreq("e", "E", o=5), 1.0)
    assert slots.prefetch("D", 1.0) is None  # B runs, E is queued: no slot to take
    assert set(slots.gpu) == {"B", "E"} and "D" in slots.cpu
    # admission of D (the rule lets it run next to B) evicts E, the only non-running one
    eng.abort("e")
    eng.step(1.0)
    assert "D" in slots.gpu and "B" in slots.gpu


def test_requests_of_one_adapter_admitted_together_wait_for_one_load():
    eng = EngineModel(COST, max_loras=2)
    slots = LoraSlots(2, 4, disk_load_s=0.25, cpu_load_s=0.02)
    eng.admission_hook = SlotHook(eng, slots)
    for i in range(3):
        eng.add(lreq(f"a{i}", "A", p=100, o=3), 0.0)
    eng.add(lreq("b", "B", p=100, o=3), 0.0)
    res = eng.step(0.0)
    # A and B load one after the other (0.5 s); the other two requests of A share A's load
    assert res.duration_s == pytest.approx(COST.iteration_s(400, 0, 0) + 0.5)
    assert slots.stats.stall_s == pytest.approx(0.5)
    assert (slots.stats.misses, slots.stats.warming_hits) == (2, 2)


def test_a_request_sharing_a_copy_from_host_memory_is_a_host_hit_one_sharing_a_disk_read_is_not():
    """A LoRA hit is an adapter in host memory or a GPU slot at admission (nothing read from
    disk): requests admitted with one that is being copied from host memory count as host
    hits; requests admitted with one being read from disk do not."""
    eng = EngineModel(COST, max_loras=2)
    slots = LoraSlots(2, 4, disk_load_s=0.25, cpu_load_s=0.02)
    eng.admission_hook = SlotHook(eng, slots)
    slots._to_cpu("A", -1.0)  # A is in host memory, B nowhere
    for rid, lora in [("a0", "A"), ("a1", "A"), ("b0", "B"), ("b1", "B")]:
        eng.add(lreq(rid, lora, p=100, o=3), 0.0)
    res = eng.step(0.0)
    assert res.duration_s == pytest.approx(COST.iteration_s(400, 0, 0) + 0.02 + 0.25)
    st = slots.stats
    assert (st.cpu_hits, st.misses, st.warming_hits) == (2, 1, 1)

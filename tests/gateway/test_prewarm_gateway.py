"""Prewarm signals end to end: a real gateway plans, a HermesLet (over TCP) warms and acks."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from threaded_node import ThreadedNode

from hermes.gateway.server import gateway_state
from hermes.procs import free_port

# hermeslet is imported inside the helpers: importing the package while the gateway tests are
# collected would shadow tests/hermeslet (a package of the same name) for pytest

MODEL = "pw-model"


def _graph(p_classify: float) -> dict:
    """gen (LLM) -> classify (dnn:resnet50) with p, else -> answer (LLM)."""
    nxt = {"classify": p_classify, "answer": round(1 - p_classify, 6)}
    nxt = {k: v for k, v in nxt.items() if v > 0}
    return {
        "version": 1, "app": "pwapp", "entry": {"gen": 1.0},
        "units": {
            "gen": {"backend": f"llm:{MODEL}", "next": nxt, "consumption": {
                "input_tokens": [400] * 20, "output_tokens": [300, 350, 400, 450] * 5,
                "parallelism": [1] * 20}},
            "classify": {"backend": "dnn:resnet50", "next": {"": 1.0},
                         "consumption": {"duration_s": [1.0] * 20}},
            "answer": {"backend": f"llm:{MODEL}", "next": {"": 1.0}, "consumption": {
                "input_tokens": [100] * 20, "output_tokens": [20] * 20, "parallelism": [1] * 20}},
        },
    }


def _embedded_gateway(tmp_path, *engines: dict):  # noqa: ANN001, ANN202
    """A gateway with its embedded HermesLet serving ``engines`` (``[[engines]]`` tables),
    on its own thread; the caller stops it."""
    from hermes.gateway.config import load_config
    from hermes.gateway.server import start_background

    return start_background(load_config(
        None, environ={"HERMES_ENGINES": json.dumps(list(engines))}, port=0, bind="",
        kb=str(tmp_path / "kb"), state_dir=str(tmp_path / "state"), time_scale=50.0,
        log_level="warning"))


def _record_warms(kvp) -> list[tuple[str, str | None]]:  # noqa: ANN001
    """The (prefix, model) of every warm-up request the KV prefix prewarmer ``kvp`` makes from
    now on (queued at the node or sent at once), which still go to the engine."""
    warmed: list[tuple[str, str | None]] = []
    real_body = kvp.request_body

    def recording_body(prefix: str, model: str | None = None) -> dict:
        warmed.append((prefix, model))
        return real_body(prefix, model)

    kvp.request_body = recording_body
    return warmed


def _wait(pred, why, timeout: float = 10.0) -> None:  # noqa: ANN001
    """Poll until ``pred()`` holds; on timeout fail with ``why()`` (what the state was)."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, why()
        time.sleep(0.02)


def _ask(http: httpx.Client, run: str, model: str, system: str, *, max_tokens: int = 1,
         user: str = "q") -> None:
    """A chat request of unit ``answer`` of ``run`` carrying ``system`` as its prefix."""
    r = http.post("/v1/chat/completions", headers={"X-Hermes-Run": run, "X-Hermes-Unit": "answer"},
                  json={"model": model, "max_tokens": max_tokens, "messages": [
                      {"role": "system", "content": system}, {"role": "user", "content": user}]})
    assert r.status_code == 200, r.text


class _Node(ThreadedNode):
    """A HermesLet with a DNN prewarmer, on its own event loop in a thread."""

    def __init__(self, address: str) -> None:
        from hermeslet.prewarmers import DnnHook, NodePrewarmer

        self.hook = DnnHook(load_fn=lambda: time.sleep(0.05) or object())
        self.prewarmer = NodePrewarmer(dnn={"resnet50": self.hook})
        super().__init__(address)

    def make(self, address: str) -> Any:
        from hermeslet.agent import HermesLet
        from hermeslet.engines.sim_engine import SimEngine

        engine = SimEngine(name="sim", model=MODEL, time_scale=50.0)
        return HermesLet("pw-node", address, [engine], heartbeat_s=0.2, prewarmer=self.prewarmer)


def test_gateway_prewarms_the_next_units_dnn_model_on_the_node(make_gateway) -> None:  # noqa: ANN001
    address = f"tcp://127.0.0.1:{free_port()}"
    srv = make_gateway(bind=address, embedded_node=False)
    sched = gateway_state(srv).scheduler
    node = _Node(address)
    try:
        _wait(lambda: bool(sched.nodes), lambda: "the HermesLet did not connect", timeout=20)
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            r = http.put("/v1/apps/pwapp", content=json.dumps(_graph(1.0)))
            assert r.status_code in (200, 201), r.text
            run_id = http.post("/v1/runs", json={"app": "pwapp"}).json()["run_id"]
            ev = f"/v1/runs/{run_id}/events"
            assert http.post(ev, json={"unit": "gen", "event": "start",
                                       "backend": f"llm:{MODEL}"}).status_code == 200
            # gen takes ~4-6 model s (= ~0.1 s wall at time scale 50): the planner starts
            # the DNN load before it ends and the node loads the model
            _wait(lambda: node.hook.loads > 0, sched.prewarm.stats)
            # the ack taught t_p
            _wait(lambda: sched.prewarm.strategy.learner.observations > 0, sched.prewarm.stats,
                  timeout=5)
            assert sched.prewarm.strategy.learner.estimate("dnn:resnet50") >= 0.05
            http.post(ev, json={"unit": "gen", "event": "finish"})
            http.post(ev, json={"unit": "classify", "event": "start", "backend": "dnn:resnet50"})
            http.post(ev, json={"unit": "classify", "event": "finish"})
            assert http.post(f"/v1/runs/{run_id}/finish").status_code == 200
        st = sched.prewarm.stats()
        assert st["prewarm_started"] == 1 and st["prewarm_used"] == 1 and st["prewarm_wasted"] == 0
        assert st["prewarm_sent_start"] == 1 and st["prewarm_acks_failed"] == 0
        assert node.prewarmer.stats()["dnn_resnet50_loads"] == 1
    finally:
        node.stop()


def test_per_request_k_above_the_branch_probability_sends_nothing(make_gateway) -> None:  # noqa: ANN001
    srv = make_gateway()
    sched = gateway_state(srv).scheduler
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.put("/v1/apps/pwapp", content=json.dumps(_graph(0.6))).status_code in (200, 201)
        run_id = http.post("/v1/runs", json={"app": "pwapp", "k": 0.8}).json()["run_id"]
        http.post(f"/v1/runs/{run_id}/events", json={"unit": "gen", "event": "start",
                                                     "backend": f"llm:{MODEL}"})
        time.sleep(0.3)
        assert sched.prewarm.stats()["prewarm_planned"] == 0  # p 0.6 < K 0.8
        # (run 1 stays open: a finished run would teach the profiler that gen ends the app)
        run2 = http.post("/v1/runs", json={"app": "pwapp", "k": 0.5}).json()["run_id"]
        http.post(f"/v1/runs/{run2}/events", json={"unit": "gen", "event": "start",
                                                   "backend": f"llm:{MODEL}"})
        _wait(lambda: sched.prewarm.stats()["prewarm_sent_start"] > 0, sched.prewarm.stats,
              timeout=5)
        # the embedded node has no DNN hook: it says so, and the planner counts it
        _wait(lambda: sched.prewarm.stats()["prewarm_acks_failed"] > 0, sched.prewarm.stats,
              timeout=5)
        # the run ends before classify: the started prewarm is released and counted as waste
        http.post(f"/v1/runs/{run2}/finish")
        st = sched.prewarm.stats()
        assert st["prewarm_cancelled"] == 1 and st["prewarm_wasted"] == 1
        assert st["prewarm_sent_release"] == 1
        http.post(f"/v1/runs/{run_id}/finish")


def test_gateway_prewarms_the_next_units_prefix_on_the_embedded_engine(tmp_path) -> None:  # noqa: ANN001
    """KV end to end on the embedded built-in engine with a KV block pool: a first run's
    request teaches the gateway the answer unit's system prompt; in a second run, when gen
    starts, the planner prewarms that prefix, the embedded node prefills it through the
    engine's adapter and acks with the warm-up time, and the answer request finds it cached."""
    srv = _embedded_gateway(tmp_path, {"name": "sim0", "model": MODEL, "kv_cache_gb": 2})
    state = gateway_state(srv)
    sched, node = state.scheduler, state.node
    engine = node.slots["sim0"].engine
    released: list[str] = []
    node.release_log = lambda _engine, rid: released.append(rid)
    system = "You answer from the retrieved passages only. " * 40
    res = f"kv:{MODEL}/default/pwapp/answer"  # per tenant

    def ask(http: httpx.Client, run: str) -> None:
        _ask(http, run, MODEL, system, max_tokens=2, user="what is the answer?")

    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            r = http.put("/v1/apps/pwapp", content=json.dumps(_graph(0.0)))
            assert r.status_code in (200, 201), r.text
            run1 = http.post("/v1/runs", json={"app": "pwapp"}).json()["run_id"]
            ask(http, run1)  # teaches the prefix of (pwapp, answer)
            run2 = http.post("/v1/runs", json={"app": "pwapp"}).json()["run_id"]
            ev = f"/v1/runs/{run2}/events"
            assert http.post(ev, json={"unit": "gen", "event": "start",
                                       "backend": f"llm:{MODEL}"}).status_code == 200
            # the ack taught t_p
            _wait(lambda: sched.prewarm.strategy.learner.observations > 0, sched.prewarm.stats)
            assert node.prewarmer.prefixes[MODEL].counters.started == 1
            # it carried the run's queue key and went through the node's window, as the
            # unit's request will
            assert [r for r in released if r.startswith("prewarm-kv-")] != []
            assert sched.prewarm.strategy.learner.estimate(res) > 0
            hits = engine.stats().extra["prefix_cache_hits"]
            http.post(ev, json={"unit": "gen", "event": "finish"})
            ask(http, run2)
            assert engine.stats().extra["prefix_cache_hits"] - hits >= 400
            http.post(f"/v1/runs/{run1}/finish")
            http.post(f"/v1/runs/{run2}/finish")
        st = sched.prewarm.stats()
        assert st["prewarm_sent_start"] == 1 and st["prewarm_acks_failed"] == 0
        assert st["prewarm_used"] == 1
    finally:
        srv.stop()


def test_kv_prewarm_carries_the_runs_own_tenants_prompt(tmp_path) -> None:  # noqa: ANN001
    """Two tenants deploy the same app with their own system prompts: a run of tenant A gets
    A's prompt prewarmed, even though B's request came last (the gateway keys prefixes by
    tenant, and names the resource per tenant)."""
    srv = _embedded_gateway(tmp_path, {"name": "sim0", "model": MODEL})
    state = gateway_state(srv)
    sched, model = state.scheduler, MODEL
    warmed = _record_warms(state.node.prewarmer.prefixes[model])  # the real prewarms
    prompts = {"A": "Tenant A's answerer. " * 30, "B": "Tenant B's answerer. " * 30}
    graph = _graph(0.0)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            assert http.put("/v1/apps/pwapp", content=json.dumps(graph)).status_code in (200, 201)
            runs = {}
            for t in ("A", "B"):  # B's request comes last
                runs[t] = http.post("/v1/runs", json={"app": "pwapp", "tenant": t}).json()["run_id"]
                _ask(http, runs[t], model, prompts[t])
            run = http.post("/v1/runs", json={"app": "pwapp", "tenant": "A"}).json()["run_id"]
            http.post(f"/v1/runs/{run}/events", json={"unit": "gen", "event": "start",
                                                      "backend": f"llm:{model}"})
            _wait(lambda: bool(warmed), sched.prewarm.stats)
            assert [p for p, _ in warmed] == [prompts["A"]]
            assert f"kv:{model}/A/pwapp/answer" in sched.prewarm.warm
            for rid in (*runs.values(), run):
                http.post(f"/v1/runs/{rid}/finish")
    finally:
        srv.stop()


def test_unit_of_a_lora_adapter_gets_the_adapter_and_its_prefix_prewarmed(tmp_path) -> None:  # noqa: ANN001
    """A unit whose requests name a LoRA adapter (``model: ad1``, served on the embedded
    engine's base model): the planner plans the adapter (``lora:BASE@ad1``) and the prefix,
    and the prefix's prewarm request runs with the adapter (its KV blocks are the adapter's)."""
    srv = _embedded_gateway(tmp_path, {"name": "sim0", "model": MODEL, "loras": ["ad1"]})
    state = gateway_state(srv)
    sched = state.scheduler
    warmed = _record_warms(state.node.prewarmer.prefixes[MODEL])  # the real prewarms
    graph = _graph(0.0)
    graph["units"]["answer"]["backend"] = "llm:ad1"
    system = "You are the ad1-tuned answerer. " * 30
    assert sched.base_model("ad1") == MODEL and sched.base_model(MODEL) is None
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            assert http.put("/v1/apps/pwapp", content=json.dumps(graph)).status_code in (200, 201)
            run1 = http.post("/v1/runs", json={"app": "pwapp"}).json()["run_id"]
            _ask(http, run1, "ad1", system)
            run2 = http.post("/v1/runs", json={"app": "pwapp"}).json()["run_id"]
            http.post(f"/v1/runs/{run2}/events", json={"unit": "gen", "event": "start",
                                                       "backend": f"llm:{MODEL}"})
            _wait(lambda: bool(warmed), sched.prewarm.stats)
            assert warmed == [(system, "ad1")]
            by_type = sched.prewarm.strategy.stats_by_type()
            assert by_type["lora"]["planned"] == 1 and by_type["kv"]["planned"] == 1
            for rid in (run1, run2):
                http.post(f"/v1/runs/{rid}/finish")
    finally:
        srv.stop()


def test_prefix_held_by_the_running_unit_is_not_prefilled_again(tmp_path) -> None:  # noqa: ANN001
    """A chat loop (answer -> answer, p 0.9): while a run's answer unit runs, the planner
    starts the prewarm of the next answer's prefix, which is the prefix the running unit's
    requests carry: the engine holds it for them, so no prefill request is sent (the planner
    still counts the prewarm as started and used). The prefix of a unit that is not running
    is still sent (the test above)."""
    srv = _embedded_gateway(tmp_path, {"name": "sim0", "model": MODEL})
    state = gateway_state(srv)
    sched = state.scheduler
    warmed = _record_warms(state.node.prewarmer.prefixes[MODEL])
    system = "You answer from the retrieved passages only. " * 40
    graph = {"version": 1, "app": "chat", "entry": {"answer": 1.0}, "units": {
        "answer": {"backend": f"llm:{MODEL}", "next": {"answer": 0.9, "": 0.1}, "consumption": {
            "input_tokens": [400] * 20, "output_tokens": [300] * 20, "parallelism": [1] * 20}}}}
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            assert http.put("/v1/apps/chat", content=json.dumps(graph)).status_code in (200, 201)
            run1 = http.post("/v1/runs", json={"app": "chat"}).json()["run_id"]
            _ask(http, run1, MODEL, system)  # teaches the prefix of (chat, answer)
            http.post(f"/v1/runs/{run1}/finish")
            run2 = http.post("/v1/runs", json={"app": "chat"}).json()["run_id"]
            ev = f"/v1/runs/{run2}/events"
            assert http.post(ev, json={"unit": "answer", "event": "start",
                                       "backend": f"llm:{MODEL}"}).status_code == 200
            _wait(lambda: sched.prewarm.stats()["prewarm_started"] >= 1, sched.prewarm.stats)
            st = sched.prewarm.stats()
            assert st["prewarm_held"] == 1 and st["prewarm_sent_start"] == 0, st
            assert warmed == []  # no prefill of the prefix reached the engine
            http.post(ev, json={"unit": "answer", "event": "finish"})
            assert http.post(ev, json={"unit": "answer", "event": "start",
                                       "backend": f"llm:{MODEL}"}).status_code == 200
            st = sched.prewarm.stats()
            assert st["prewarm_used"] == 1 and st["prewarm_sent_release"] == 0, st
            http.post(f"/v1/runs/{run2}/finish")
            # a cancelled run's running unit is not closed one by one: its hold ends too
            run3 = http.post("/v1/runs", json={"app": "chat"}).json()["run_id"]
            assert http.post(f"/v1/runs/{run3}/events", json={
                "unit": "answer", "event": "start", "backend": f"llm:{MODEL}"}).status_code == 200
            assert sched.prewarm._running != {}
            assert http.delete(f"/v1/runs/{run3}").status_code == 200
            assert sched.prewarm._running == {} and sched.prewarm._holding == {}
        r = httpx.get(srv.url + "/metrics")
        (held,) = [float(line.split()[-1]) for line in r.text.splitlines()
                   if line.startswith("hermes_prewarm_held_total")]
        assert held >= 1
    finally:
        srv.stop()


def test_prefix_of_a_unit_that_just_ended_is_not_prefilled_again(tmp_path) -> None:  # noqa: ANN001
    """gen -> answer: a run's gen starts soon after the end of another run's answer unit
    whose requests carried answer's prefix (within ``prewarm_kv_recent_s``, 1 s by default):
    the engine holds those blocks (the most recently used of its cache), so the planner's
    prewarm of that prefix is held, not sent. Past the window it is sent, as without it."""
    srv = _embedded_gateway(tmp_path, {"name": "sim0", "model": MODEL})
    state = gateway_state(srv)
    sched = state.scheduler
    assert sched.prewarm.kv_recent_s == 1.0  # the default
    sched.prewarm.kv_recent_s = 30.0  # (no flake on a slow machine: the expiry is below)
    warmed = _record_warms(state.node.prewarmer.prefixes[MODEL])
    system = "You answer from the retrieved passages only. " * 40
    resource = f"kv:{MODEL}/default/pwapp/answer"

    def gen_then_answer(http: httpx.Client, check: Callable[[], None] | None = None) -> None:
        run = http.post("/v1/runs", json={"app": "pwapp"}).json()["run_id"]
        ev = f"/v1/runs/{run}/events"
        assert http.post(ev, json={"unit": "gen", "event": "start",
                                   "backend": f"llm:{MODEL}"}).status_code == 200
        if check is not None:
            check()
        http.post(ev, json={"unit": "gen", "event": "finish"})
        _ask(http, run, MODEL, system)
        assert http.post(f"/v1/runs/{run}/finish").status_code == 200

    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            assert http.put("/v1/apps/pwapp", content=json.dumps(_graph(0.0))).status_code in (
                200, 201)
            gen_then_answer(http)  # teaches the prefix
            gen_then_answer(http)  # its answer unit holds the prefix: ends recent
            assert resource in sched.prewarm._recent
            st0 = sched.prewarm.stats()

            def held() -> None:
                _wait(lambda: sched.prewarm.stats()["prewarm_held"] > st0["prewarm_held"],
                      sched.prewarm.stats)

            gen_then_answer(http, held)
            st = sched.prewarm.stats()
            assert st["prewarm_sent_start"] == st0["prewarm_sent_start"], st
            sent = len(warmed)
            sched.prewarm.kv_recent_s = 0.3
            time.sleep(0.5)  # past the window

            def sent_again() -> None:
                _wait(lambda: len(warmed) > sent, sched.prewarm.stats)

            gen_then_answer(http, sent_again)
            assert warmed[-1] == (system, None)
            st1 = sched.prewarm.stats()
            assert st1["prewarm_sent_start"] == st0["prewarm_sent_start"] + 1, st1
            assert st1["prewarm_held"] == st["prewarm_held"], st1
    finally:
        srv.stop()

"""Gateway and HermesLet metrics count what really happened in a live gateway."""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hermes.gateway.server import gateway_state
from hermes.metrics import GatewayMetrics, prewarm_counts
from tests.ops.conftest import QUICK_APPS, drive_load


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of a /metrics page."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(m: dict, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, lv), v in m.items() if n == name and want <= set(lv))


def test_metrics_count_runs_requests_tools_and_engine_state(make_ops_gateway) -> None:  # noqa: ANN001
    # the chats (X-Hermes-App, no run) are inferred runs of app chatbot: an idle close of an
    # hour (model time, 36 s wall) keeps them open while the test looks
    srv = make_ops_gateway(identity={"close_prior_s": 3600.0, "close_max_s": 3600.0})
    load = drive_load(srv.url, runs=6, chats=4, tools=1)
    time.sleep(1.5)  # a heartbeat refreshes the engine's own counters
    m = scrape(srv.url)
    runs = load["runs"]
    assert all(r["state"] == "finished" for r in runs)
    for app in QUICK_APPS:
        mine = [r for r in runs if r["app"] == app]
        assert total(m, "hermes_run_act_seconds_count", app=app) == len(mine)
        assert total(m, "hermes_run_act_seconds_sum", app=app) == pytest.approx(
            sum(r["finished"] - r["submitted"] for r in mine), rel=1e-9)
        met = sum(1 for r in mine if r["finished"] <= r["deadline"])
        assert total(m, "hermes_run_deadline_total", app=app, outcome="met") == met
        assert total(m, "hermes_run_deadline_total", app=app, outcome="missed") == len(mine) - met
        # estimator error: runs that finished once the app's prediction was ready (it is
        # computed off the event loop when the first run arrives): actual = their service
        n_err = total(m, "hermes_estimator_abs_error_seconds_count", app=app)
        assert 1 <= n_err <= len(mine)
        assert total(m, "hermes_estimator_predicted_service_seconds_total", app=app) > 0
        actual = total(m, "hermes_estimator_actual_service_seconds_total", app=app)
        if n_err == len(mine):
            assert actual == pytest.approx(sum(r["attained_s"] for r in mine), rel=1e-9)
        assert 0 < actual <= sum(r["attained_s"] for r in mine) * (1 + 1e-9)
    assert 0 < sum(1 for r in runs if r["finished"] <= r["deadline"]) < len(runs)
    # every LLM request (hosted steps and chats) was observed once at its engine
    llm = sum(1 for r in runs for u in r["units"] for q in u["requests"] if q["kind"] == "llm")
    assert total(m, "hermes_request_queue_seconds_count", engine="sim0", node="embedded") == \
        llm + len(load["chats"])
    assert total(m, "hermes_tool_duration_seconds_count", backend_type="docker",
                 start="warm") == 1
    assert total(m, "hermes_runs_started_total") == len(runs) + len(load["chats"]) + 1
    ended = Counter(r["state"] for r in runs)
    assert total(m, "hermes_runs_ended_total", state="finished") == ended["finished"] + 1
    # runs by state agree with the admin API (the inferred chat runs stay active)
    active = httpx.get(srv.url + "/admin/runs", params={"state": "active"}).json()["runs"]
    assert total(m, "hermes_runs") == len(active) == len(load["chats"])
    assert m[("hermes_policy_info", (("policy", "hermes"),))] == 1
    # engine state from the embedded HermesLet: window size, prefix-cache counters (the chats
    # share a system prompt, so later ones hit)
    assert total(m, "hermeslet_engine_max_inflight_requests", engine="sim0") == 32
    assert total(m, "hermeslet_engine_prefix_cache_hits_total", engine="sim0") > 0
    assert total(m, "hermeslet_engine_prefix_cache_queries_total", engine="sim0") >= \
        total(m, "hermeslet_engine_prefix_cache_hits_total", engine="sim0")
    assert ("hermeslet_engine_kv_cache_usage_ratio", (("engine", "sim0"), ("kind", "sim"),
            ("model", "llama-2-7b"), ("node", "embedded"))) in m
    assert total(m, "hermes_rank_refresh_seconds_count") > 0
    # prewarm counters exist for every backend type (at zero until a prewarm starts) and say
    # what the scheduler's prewarm planner counted (it may plan for the hosted runs' next
    # units; read around a scrape until nothing changed in between)
    planner = gateway_state(srv).scheduler.prewarm
    for _ in range(20):
        before = prewarm_counts(planner.stats())
        m = scrape(srv.url)
        if prewarm_counts(planner.stats()) == before:
            break
        time.sleep(0.1)
    for t in ("docker", "lora", "kv"):
        assert m[("hermes_prewarm_started_total", (("backend_type", t),))] == \
            before.get(t, {}).get("started", 0.0)
    # the policy's memo of walks: the hosted runs were ranked from the shipped PDGraphs
    memo = gateway_state(srv).scheduler.policy.estimators.stats()
    assert total(m, "hermes_sample_cache_misses_total") >= 1
    assert total(m, "hermes_sample_cache_hits_total") + total(
        m, "hermes_sample_cache_misses_total") <= memo["sample_cache_hits"] + memo[
            "sample_cache_misses"]
    assert total(m, "hermes_sample_cache_bytes") > 0


def test_two_gateways_in_one_process_keep_separate_metrics(make_ops_gateway) -> None:  # noqa: ANN001
    a, b = make_ops_gateway(), make_ops_gateway()
    # a known app (shipped PDGraph): unknown ones are counted as app="other" (issue 15)
    r = httpx.post(a.url + "/v1/runs", json={"app": "factool_kbqa"})
    assert r.status_code == 201
    assert total(scrape(a.url), "hermes_runs_started_total", app="factool_kbqa") == 1
    assert total(scrape(b.url), "hermes_runs_started_total", app="factool_kbqa") == 0


def test_prewarm_stats_from_a_scheduler_component(make_ops_gateway) -> None:  # noqa: ANN001
    """The contract with the prewarm planner: ``scheduler.prewarm.stats()`` per backend type."""

    class Planner:
        def stats(self) -> dict:
            return {"docker": {"started": 4, "used": 3, "wasted": 1, "wasted_s": 2.5},
                    "lora": {"started": 2, "used": 2, "wasted": 0, "wasted_s": 0.0}}

    srv = make_ops_gateway()
    gateway_state(srv).scheduler.prewarm = Planner()
    m = scrape(srv.url)
    assert m[("hermes_prewarm_started_total", (("backend_type", "docker"),))] == 4
    assert m[("hermes_prewarm_used_total", (("backend_type", "docker"),))] == 3
    assert m[("hermes_prewarm_wasted_backend_seconds_total", (("backend_type", "docker"),))] == 2.5
    assert m[("hermes_prewarm_used_total", (("backend_type", "lora"),))] == 2
    assert m[("hermes_prewarm_started_total", (("backend_type", "kv"),))] == 0


def test_prewarm_counts_accepts_flat_and_nested_stats() -> None:
    flat = prewarm_counts({"started": 5, "used": 2, "wasted": 3, "wasted_seconds": 7.0})
    assert flat["all"] == {"started": 5, "used": 2, "wasted": 3, "wasted_s": 7.0}
    assert flat["docker"]["started"] == 0
    nested = prewarm_counts({"kv": {"started": 1, "used": 1, "wasted_backend_s": 0.5}})
    assert nested["kv"] == {"started": 1, "used": 1, "wasted": 0, "wasted_s": 0.5}
    assert prewarm_counts(None)["lora"]["started"] == 0


def test_per_request_hooks_cost_microseconds() -> None:
    """The per-request hooks must not dent a gateway that serves >= 500 requests/s."""
    m = GatewayMetrics()
    n = 20_000
    t0 = time.perf_counter()
    for i in range(n):
        m.on_request_done("node-a", "sim0", 0.01 * (i % 7), 0.2)
    per_call = (time.perf_counter() - t0) / n
    print(f"on_request_done: {per_call * 1e6:.1f} us per request")
    assert per_call < 100e-6  # 500 req/s leaves 2000 us per request; this is a small share


def test_the_real_prewarm_planner_is_exported_per_backend_type(make_ops_gateway) -> None:  # noqa: ANN001
    srv = make_ops_gateway()
    planner = gateway_state(srv).scheduler.prewarm.strategy
    planner._bump("docker:python", "started")
    planner._bump("docker:python", "cancelled")
    planner._bump("docker:python", "wasted_backend_s", 1.5)
    planner._bump("kv:llama/app/unit", "started")
    m = scrape(srv.url)
    assert m[("hermes_prewarm_started_total", (("backend_type", "docker"),))] == 1
    assert m[("hermes_prewarm_wasted_total", (("backend_type", "docker"),))] == 1
    assert m[("hermes_prewarm_wasted_backend_seconds_total", (("backend_type", "docker"),))] == 1.5
    assert m[("hermes_prewarm_started_total", (("backend_type", "kv"),))] == 1
    assert m[("hermes_prewarm_started_total", (("backend_type", "lora"),))] == 0


def test_a_joining_nodes_engine_series_exist_at_zero_before_any_request(make_ops_gateway) -> None:  # noqa: ANN001
    """rate() needs a sample before the first increment: a series born at its first request
    loses that request (CI saw the per-engine panels empty after a short load)."""
    srv = make_ops_gateway()
    m = scrape(srv.url)
    for name in ("hermes_request_queue_seconds_count", "hermes_request_service_seconds_count"):
        labels = {dict(lv).get("engine") for (n, lv), _ in m.items()
                  if n == name and dict(lv).get("node") == "embedded"}
        assert labels == {"sim0", "embed0"}, (name, labels)
        assert total(m, name, node="embedded", engine="sim0") == 0


def test_runs_waiting_to_be_finished_are_a_gauge(make_ops_gateway) -> None:  # noqa: ANN001
    """``hermes_runs_closing``: the closed runs every queue of the scheduler still holds
    (the resolver's sweep, an edge link's), 0 when none waits."""
    from hermes.gateway.slices import SlicedQueue

    srv = make_ops_gateway()
    sched = gateway_state(srv).scheduler
    assert scrape(srv.url)[("hermes_runs_closing", ())] == 0
    q: SlicedQueue[int] = SlicedQueue(lambda i: None, name="test")
    q._items.extend(range(7))  # waiting (this thread runs no loop that would take them)
    sched.closing_queues.append(q)
    assert scrape(srv.url)[("hermes_runs_closing", ())] == 7

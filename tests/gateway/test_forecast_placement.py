"""The gateway's per-model demand forecast (``GET /admin/forecast``, hermes/gateway/demand.py)
and ``hermes plan placement --from-gateway``: the placement input is what the gateway's runs
and PDGraphs say, not declared rates (issue 22)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from threaded_node import ThreadedNode

from hermes.cli import main
from hermes.core.pdgraph import Consumption, PDGraph, UnitNode
from hermes.gateway.server import BackgroundServer


def agent_graph() -> PDGraph:
    """plan (7B) -> search (API) -> answer (13B) -> end."""
    return PDGraph(
        version=1, app="agent", entry={"plan": 1.0},
        units={
            "plan": UnitNode(backend="llm:llama-2-7b", next={"search": 1.0},
                             consumption=Consumption(input_tokens=[400, 600], output_tokens=[50],
                                                     gap_s=[0.5])),
            "search": UnitNode(backend="api:web", next={"answer": 1.0},
                               consumption=Consumption(duration_s=[2.0], gap_s=[0.5])),
            "answer": UnitNode(backend="llm:llama-2-13b", next={"": 1.0},
                               consumption=Consumption(input_tokens=[900], output_tokens=[300],
                                                       gap_s=[0.5])),
        },
    )


def test_forecast_and_placement_from_the_gateway(gateway: BackgroundServer, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    http = httpx.Client(base_url=gateway.url, timeout=30)
    empty = http.get("/admin/forecast").json()
    assert empty["services"] == [] and empty["runs_in_flight"] == 0
    assert main(["plan", "placement", "--from-gateway", gateway.url, "--gpus", "2"]) != 0
    assert "forecasts no LLM calls" in capsys.readouterr().err

    r = http.put("/admin/apps/agent", content=agent_graph().to_json())
    assert r.status_code in (200, 201), r.text
    for _ in range(3):
        assert http.post("/v1/runs", json={"app": "agent"}).status_code == 201
    doc = http.get("/admin/forecast", params={"horizon_s": 60, "window_s": 300}).json()
    assert doc["app_rates"]["agent"] > 0
    by = {s["model"]: s for s in doc["services"]}
    assert set(by) == {"llama-2-7b", "llama-2-13b"}  # the API tool is not a GPU service
    assert by["llama-2-7b"]["calls_per_s"] == pytest.approx(by["llama-2-13b"]["calls_per_s"],
                                                            rel=0.35)
    assert by["llama-2-7b"]["input_tokens"] == pytest.approx(500)
    assert by["llama-2-13b"]["output_tokens"] == pytest.approx(300)
    for bad in ({"horizon_s": 0}, {"window_s": "nan"}, {"horizon_s": 1e9}):
        r = http.get("/admin/forecast", params=bad)
        assert r.status_code == 422 and next(iter(bad)) in r.json()["error"]["message"]

    out = tmp_path / "plan.json"
    assert main(["plan", "placement", "--from-gateway", gateway.url, "--gpus", "2",
                 "--emit", str(out)]) == 0
    assert "calls/s" in capsys.readouterr().err
    plan = json.loads(out.read_text())
    served = {e["model"] for g in plan["groups"] for e in g["engines"]}
    assert served == {"llama-2-7b", "llama-2-13b"}
    rates = {s["served_model"]: s["rate"] for s in plan["services"]}
    assert rates["llama-2-7b"] == pytest.approx(by["llama-2-7b"]["calls_per_s"], rel=0.5)
    # a served name the planner does not know is named, with the flag that maps it
    from hermes.plan.placement import services_from_forecast

    with pytest.raises(ValueError, match="--model-map my-model=MODEL"):
        services_from_forecast({"services": [{"model": "my-model", "calls_per_s": 1.0,
                                              "input_tokens": 10, "output_tokens": 10}]})
    mapped = services_from_forecast(
        {"services": [{"model": "my-model", "calls_per_s": 1.0, "input_tokens": 10,
                       "output_tokens": 10}]}, {"my-model": "llama-2-7b"})
    assert (mapped[0].model, mapped[0].served) == ("llama-2-7b", "my-model")


def test_the_gateway_re_places_its_models_by_itself(make_gateway, tmp_path: Path) -> None:  # noqa: ANN001
    """``[placement] auto``: the gateway forecasts, places and sends the plan to its embedded
    node, which starts engines for the forecast models (its embedding engine stays); a run's
    requests for the 13B model, which no engine served before, are then served; the interval
    adapts from the forecast against the calls dispatched."""
    import time

    # window_s: the scheduler clock runs 50x wall time, so a placement search's wall seconds
    # (its own process; many on a loaded machine) are minutes of scheduler time between
    # rounds: with the default 300 s arrival-rate window the three runs left it by the fourth
    # round on a loaded machine and the forecast went empty
    srv = make_gateway(placement={"auto": True, "gpus": 2, "interval_s": 60.0,
                                  "min_interval_s": 30.0, "max_interval_s": 600.0,
                                  "window_s": 86_400.0})
    http = httpx.Client(base_url=srv.url, timeout=30)
    first = http.get("/admin/placement").json()
    assert first["auto"] is True and first["engines"] is None  # no demand seen yet
    assert first["rounds"] and first["rounds"][0]["why"] == "no LLM demand forecast"
    assert http.put("/admin/apps/agent", content=agent_graph().to_json()).status_code in (200, 201)
    runs = [http.post("/v1/runs", json={"app": "agent"}).json()["run_id"] for _ in range(3)]
    deadline = time.monotonic() + 30
    engines: dict[str, str] = {}
    while time.monotonic() < deadline:
        doc = http.get("/admin/placement").json()
        engines = doc["engines"] or {}
        served = {e["model"] for e in http.get("/admin/engines").json()["engines"]}
        if {"llama-2-7b", "llama-2-13b"} <= served and engines:
            break
        time.sleep(0.2)
    assert set(engines.values()) == {"llama-2-7b", "llama-2-13b"}, doc
    rows = http.get("/admin/engines").json()["engines"]
    names = {e["engine"] for e in rows}
    assert set(engines) <= names and "embed0" in names  # the plan's engines, embeddings kept
    assert "sim0" not in names  # the 7B engine the config started is re-placed by the plan
    r = http.post("/v1/chat/completions", headers={"X-Hermes-Run": runs[0]},
                  json={"model": "llama-2-13b", "max_tokens": 4,
                        "messages": [{"role": "user", "content": "answer"}]})
    assert r.status_code == 200, r.text
    # later rounds compare the forecast with what was dispatched, and adapt the interval;
    # the same forecast gives the same plan, which is not sent again (the plan in force is
    # kept unless a new one scores placement.min_gain better)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rounds = http.get("/admin/placement").json()["rounds"]
        if len(rounds) >= 4:
            break
        time.sleep(0.2)
    assert len(rounds) >= 4, rounds
    assert [x["sent"] for x in rounds[:2]] == [False, True]
    assert not any(x["sent"] for x in rounds[2:4])
    assert all(x["why"] == "the plan in force stays: no plan found 10.0% better"
               for x in rounds[2:4])
    # round 2 expected calls, round 3 saw fewer dispatched (one request in the interval)
    assert rounds[2]["observed_calls_per_s"] < 0.9 * rounds[1]["expected_calls_per_s"]
    assert rounds[2]["interval_s"] == pytest.approx(rounds[1]["interval_s"] * 0.9)


class _PlacingNode(ThreadedNode):
    """A HermesLet that accepts plans, with ``gpus`` GPUs of ``device``, on its own event loop
    in a thread (one built-in engine of an unplanned model to start with)."""

    def __init__(self, name: str, address: str, gpus: int, device: str) -> None:
        self.name, self.gpus, self.device = name, gpus, device
        super().__init__(address)

    def make(self, address: str) -> Any:
        from hermeslet.agent import HermesLet
        from hermeslet.engines.sim_engine import SimEngine
        from hermeslet.placement import build_engines

        return HermesLet(
            self.name, address, [SimEngine(name="base", model="other", time_scale=50.0)],
            heartbeat_s=0.1, placement_gpus=self.gpus, placement_device=self.device,
            placement_builder=lambda launches: build_engines(launches, "sim", time_scale=50.0))


def test_nodes_with_other_gpus_get_their_own_plans(make_gateway) -> None:  # noqa: ANN001
    """Nodes that accept plans, one A100-80 and four H100s: each gets a plan for its own GPUs,
    for a share of the forecast in proportion to GPUs x achieved memory bandwidth; a third,
    one RTX 3090 Ti, cannot hold the 13B model: it serves the 7B model only."""
    import time

    from hermes.core.cluster.devices import get_device
    from hermes.gateway.server import gateway_state
    from hermes.procs import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    srv = make_gateway(bind=address, embedded_node=False,
                       placement={"auto": True, "gpus": 2, "interval_s": 30.0,
                                  "min_interval_s": 30.0, "draws": 1})
    sched = gateway_state(srv).scheduler
    nodes = [_PlacingNode("small", address, 1, "A100-80"), _PlacingNode("big", address, 4, "H100"),
             _PlacingNode("tiny", address, 1, "RTX3090Ti")]  # 24 GB: no room for the 13B model
    try:
        deadline = time.monotonic() + 20
        while len(sched.nodes) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(n.gpus or 0 for n in sched.nodes.values()) == [1, 1, 4]
        http = httpx.Client(base_url=srv.url, timeout=30)
        assert http.put("/admin/apps/agent", content=agent_graph().to_json()).status_code in (200, 201)
        for _ in range(3):
            http.post("/v1/runs", json={"app": "agent"})
        deadline = time.monotonic() + 40
        doc: dict = {}
        while time.monotonic() < deadline:
            doc = http.get("/admin/placement").json()
            if set(doc.get("nodes") or {}) == {"small", "big", "tiny"}:
                break
            time.sleep(0.2)
        assert set(doc["nodes"]) == {"small", "big", "tiny"}, doc
        rnd = next(r for r in doc["rounds"] if r["sent"])
        kinds = {k["nodes"][0]: k for k in rnd["kinds"]}
        assert (kinds["small"]["gpus"], kinds["small"]["device"]) == (1, "A100-80")
        assert (kinds["big"]["gpus"], kinds["big"]["device"]) == (4, "H100")
        ratio = 4 * get_device("H100").achieved_hbm / get_device("A100-80").achieved_hbm
        assert kinds["big"]["share"] / kinds["small"]["share"] == pytest.approx(ratio)
        assert sum(k["share"] for k in kinds.values()) == pytest.approx(1.0)
        # the node whose GPU cannot hold the 13B model places the 7B only (the 13B model's
        # calls go to the other two)
        assert sorted(kinds["small"]["models"]) == sorted(kinds["big"]["models"]) == [
            "llama-2-13b", "llama-2-7b"]
        assert kinds["tiny"]["sent"] and kinds["tiny"]["models"] == ["llama-2-7b"]
        assert set(doc["nodes"]["tiny"].values()) == {"llama-2-7b"}
        # each plan uses its node's GPUs: one group on the A100, groups over 4 GPUs on the H100s
        assert "|" not in kinds["small"]["plan"]
        gpus_big = sum(int(g.split(":")[0][2:]) for g in kinds["big"]["plan"].split(" | "))
        assert gpus_big == 4, kinds["big"]["plan"]
        # both nodes now serve the two models the forecast names (their other engine stays)
        served = {(e["node"], e["model"]) for e in http.get("/admin/engines").json()["engines"]}
        for n in ("small", "big"):
            assert {(n, "llama-2-7b"), (n, "llama-2-13b"), (n, "other")} <= served, served
        assert ("tiny", "llama-2-7b") in served and ("tiny", "llama-2-13b") not in served
    finally:
        for n in nodes:
            n.stop()


def test_hermeslet_gpus_need_accept_placement_and_a_known_device(
        capsys: pytest.CaptureFixture[str]) -> None:
    from hermeslet.cli import main as hermeslet_main

    assert hermeslet_main(["run", "--gpus", "4"]) == 2
    assert "--accept-placement" in capsys.readouterr().err
    assert hermeslet_main(["run", "--accept-placement", "--device", "Z80"]) == 2
    assert "--device: unknown device 'Z80'" in capsys.readouterr().err
    assert hermeslet_main(["run", "--accept-placement", "--gpus", "0"]) == 2
    assert "--gpus must be >= 1" in capsys.readouterr().err


def test_a_dead_search_process_is_replaced(make_gateway) -> None:  # noqa: ANN001
    """The placement search runs in a worker process; killed (out of memory, an operator), it
    is replaced at the next round and re-placement goes on."""
    import os
    import signal
    import time

    from hermes.gateway.server import gateway_state

    srv = make_gateway(placement={"auto": True, "gpus": 2, "interval_s": 30.0,
                                  "min_interval_s": 30.0, "draws": 1})
    http = httpx.Client(base_url=srv.url, timeout=30)
    assert http.put("/admin/apps/agent", content=agent_graph().to_json()).status_code in (200, 201)
    http.post("/v1/runs", json={"app": "agent"})
    placer = gateway_state(srv).placer

    def placed_rounds() -> int:
        return sum("plan" in r for r in http.get("/admin/placement").json()["rounds"])

    deadline = time.monotonic() + 30
    while placed_rounds() < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert placed_rounds() >= 1
    pids = list(placer._pool._processes)  # the search's worker, started by the first round
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    before = placed_rounds()
    deadline = time.monotonic() + 30
    while placed_rounds() < before + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert placed_rounds() >= before + 2, "re-placement stopped with its search process"
    assert set(placer._pool._processes).isdisjoint(pids)


def test_a_node_that_restarts_gets_the_plan_in_force_again(make_gateway) -> None:  # noqa: ANN001
    """A node that comes back with only its own engines (restarted) announces none of the
    plan's: it gets the plan in force again at that hello, not at the next round (whose
    forecast may have changed or gone by then: the scheduler clock runs 50x here, so on a
    loaded machine the three runs left the rate window before that round, which then sent
    nothing, or another plan). Back with other GPUs, it waits for a round to place it."""
    import time

    from hermes.gateway.server import gateway_state
    from hermes.procs import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    srv = make_gateway(bind=address, embedded_node=False,
                       placement={"auto": True, "gpus": 2, "interval_s": 30.0,
                                  "min_interval_s": 30.0, "max_interval_s": 30.0, "draws": 1})
    sched = gateway_state(srv).scheduler
    http = httpx.Client(base_url=srv.url, timeout=30)

    def served() -> set[str]:
        return {e["model"] for e in http.get("/admin/engines").json()["engines"]
                if e["node"] == "n1"}

    def rounds() -> list[dict[str, Any]]:
        return http.get("/admin/placement").json()["rounds"]

    def wait_until(cond: Any, what: str, timeout: float = 40.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert cond(), what

    node = _PlacingNode("n1", address, 2, "A100-80")
    try:
        wait_until(lambda: "n1" in sched.nodes, "the node did not connect", 20)
        assert http.put("/admin/apps/agent", content=agent_graph().to_json()).status_code in (200, 201)
        for _ in range(3):
            http.post("/v1/runs", json={"app": "agent"})
        wait_until(lambda: {"llama-2-7b", "llama-2-13b"} <= served(), "the plan was not applied")
        sent_rounds = [r for r in rounds() if r["sent"]]
        sent, first = len(sent_rounds), sent_rounds[-1]["plan"]
        assert "hello" not in sent_rounds[-1]
        node.stop()
        node = _PlacingNode("n1", address, 2, "A100-80")  # back with its own engine only
        wait_until(lambda: any(r.get("hello") == "n1" for r in rounds()),
                   "the restarted node was not sent the plan in force at its hello", 20)
        resent = [r for r in rounds() if r["sent"]][sent:]
        # at its hello, before any round; the same plan (not a new one from a changed forecast)
        assert resent[0].get("hello") == "n1" and resent[0]["plan"] == first, (first, resent)
        wait_until(lambda: {"llama-2-7b", "llama-2-13b"} <= served(),
                   "the restarted node did not apply the plan in force")
        # back with 4 H100s: the plan in force was made for 2 A100s, so it is not sent at
        # the hello (a round places the node on its GPUs); later than min_interval_s after
        # the last send at a hello, so that its once-per-interval limit is not what holds it
        wait_until(lambda: sched.now() > resent[0]["time"] + 30.0, "the scheduler clock")
        hellos = sum(r.get("hello") == "n1" for r in rounds())
        node.stop()
        node = _PlacingNode("n1", address, 4, "H100")
        wait_until(lambda: "n1" in sched.nodes and sched.nodes["n1"].gpus == 4,
                   "the node did not come back with 4 GPUs", 20)
        assert sum(r.get("hello") == "n1" for r in rounds()) == hellos
    finally:
        node.stop()

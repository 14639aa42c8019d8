"""``hermes plan placement`` (issue 22 item 5): the emitted plan's groups, engines and vLLM
arguments; the HermesLet reads it back; bad input exits 2 naming what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hermes.cli import main
from hermes.core.cluster.cost import to_cost_model
from hermes.core.cluster.devices import get_device
from hermes.core.cluster.models import get_model
from hermes.core.multillm.placement import Group, PlacementPlan
from hermes.plan.placement import (
    FORMAT,
    PRESETS,
    WINDOW_S,
    emit_placement,
    estimate,
    parse_services,
    place,
    request_stream,
)
from hermeslet.placement import build_engines, parse_placement, plan_change

TWO = [{"name": "chat", "model": "llama-2-7b", "rate": 6.0, "input_tokens": 400,
        "output_tokens": 200},
       {"name": "code", "model": "llama-2-13b", "rate": 1.0, "served_model": "coder"}]


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _plan(tmp_path: Path, services: Any, *extra: str) -> dict[str, Any]:
    src = tmp_path / "services.json"
    src.write_text(json.dumps(services))
    out = tmp_path / "plan.json"
    assert main(["plan", "placement", "--services", str(src), "--emit", str(out), *extra]) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def test_two_services_on_two_gpus(tmp_path: Path) -> None:
    doc = _plan(tmp_path, TWO, "--gpus", "2")
    assert doc["format"] == FORMAT and doc["gpus"] == 2 and doc["device"] == "A100-80"
    used: list[int] = []
    served = {}
    for i, g in enumerate(doc["groups"]):
        assert g["tp"] == len(g["gpus"]) and g["tp"] in (1, 2)
        used += g["gpus"]
        assert [e["service"] for e in g["engines"]] == g["services"]
        shares = []
        for e in g["engines"]:
            assert e["name"] == f"g{i}-{e['service']}"
            served[e["service"]] = e["model"]
            a = e["vllm_args"]
            assert _arg(a, "--tensor-parallel-size") == str(g["tp"])
            assert _arg(a, "--served-model-name") == e["model"]
            assert e["env"] == {"CUDA_VISIBLE_DEVICES": ",".join(map(str, g["gpus"]))}
            assert e["builtin"] == {"engine": "sim", "model": _arg(a, "--model").split("/")[-1]
                                    .lower().replace("-hf", ""), "device": "A100-80",
                                    "tp": g["tp"]}
            shares.append(float(_arg(a, "--gpu-memory-utilization")))
        assert 0 < sum(shares) <= 0.9 + 1e-9
    assert sorted(used) == [0, 1]  # each GPU in exactly one group
    assert served == {"chat": "chat", "code": "coder"}  # every service placed
    # the node reads it back: the engines' names, models, GPUs; built-in engines with the
    # planner's costs for (model, device, tp)
    launches = parse_placement(doc)
    assert [e.name for e in launches] == [e["name"] for g in doc["groups"] for e in g["engines"]]
    engines = build_engines(launches, "sim", time_scale=10.0)
    for eng, ln in zip(engines, launches, strict=True):
        assert (eng.name, eng.model) == (ln.name, ln.model)
        b = ln.builtin
        assert eng.cost == to_cost_model(get_model(b["model"]), get_device(b["device"]), b["tp"])  # type: ignore[attr-defined]


def test_two_models_share_one_gpu() -> None:
    services = parse_services(TWO)
    plan, _ = place(services, 1)
    assert plan == PlacementPlan((Group((0,), ("chat", "code")),))
    doc = emit_placement(services, plan, "A100-80", 1)
    (g,) = doc["groups"]
    shares = {e["service"]: float(_arg(e["vllm_args"], "--gpu-memory-utilization"))
              for e in g["engines"]}
    # each its weights (7B: 13.5 GB, 13B: 26 GB of 80) plus an equal part of the rest
    assert shares["code"] > shares["chat"] > 13.4 / 80 and sum(shares.values()) <= 0.9
    assert shares["code"] - shares["chat"] == pytest.approx((26.0 - 13.5) / 80, abs=0.01)


def test_estimate_prefers_spreading_a_busy_service() -> None:
    """The simulator's evaluation: a service alone on a GPU does better than sharing it with a
    busy one, and an unplaced service misses all its requests (its whole synthetic stream: a
    Poisson count around rate x window)."""
    busy = parse_services([{"name": "a", "model": "llama-2-7b", "rate": 6.0},
                           {"name": "b", "model": "llama-2-7b", "rate": 6.0}])
    apart = estimate(busy, "A100-80", PlacementPlan((Group((0,), ("a",)), Group((1,), ("b",)))))
    shared = estimate(busy, "A100-80", PlacementPlan((Group((0,), ("a", "b")), Group((1,), ()))))
    assert apart["a"].l_n < shared["a"].l_n
    none = estimate(busy, "A100-80", PlacementPlan((Group((0,), ("a",)),)))
    n_b = request_stream(busy, "A100-80").count("b")
    assert abs(n_b - 6.0 * WINDOW_S) < 4 * (6.0 * WINDOW_S) ** 0.5
    assert none["b"].unserved == n_b and none["b"].n == 0
    assert none["a"].n == apart["a"].n == request_stream(busy, "A100-80").count("a")


def test_preset_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    assert main(["plan", "placement", "--preset", "seallm", "--gpus", "8", "--emit",
                 str(out)]) == 0
    doc = json.loads(out.read_text())
    placed = {s for g in doc["groups"] for s in g["services"]}
    assert placed == {s["name"] for s in PRESETS["seallm"]}
    assert "g0-" in capsys.readouterr().out


def test_plan_change() -> None:
    ch = plan_change({"g0-a": "a", "g1-b": "b", "g2-c": "c"},
                     [("g0-a", "a"), ("g1-b", "x"), ("g3-d", "d")])
    assert ch.kept == ("g0-a",) and ch.drained == ("g1-b", "g2-c")
    assert ch.started == ("g1-b", "g3-d")
    with pytest.raises(ValueError, match="unique"):
        plan_change({}, [("e", "a"), ("e", "b")])


@pytest.mark.parametrize("services, extra, msg", [
    ([{"name": "a", "model": "gpt-9", "rate": 1}], [], "service 'a': unknown model 'gpt-9'"),
    (TWO, ["--gpus", "0"], "--gpus must be >= 1, got 0"),
    ([{"name": "big", "model": "llama-2-70b", "rate": 1}], ["--gpus", "1"],
     "service 'big' (llama-2-70b) fits no group of 1 A100-80 GPUs"),
    ([{"name": f"s{i}", "model": "llama-2-7b", "rate": 1} for i in range(3)], ["--gpus", "1"],
     "places all of ['s0', 's1', 's2'] on 1 GPUs"),
    ({"name": "a"}, [], "expected a non-empty JSON list of services"),
    ([{"name": "a", "model": "llama-2-7b", "rate": "fast"}], [],
     "service 'a': rate / token counts must be numbers"),
    ([{"name": "a", "model": "llama-2-7b", "rate": 1, "gpus": 2}], [],
     "service 'a': unknown fields ['gpus']"),
    ([{"name": "a", "model": "llama-2-7b"}, {"name": "a", "model": "llama-2-13b"}], [],
     "service names must be unique"),
    (TWO, ["--device", "B300"], "unknown device 'B300'"),
])
def test_bad_input(services: Any, extra: list[str], msg: str, tmp_path: Path,
                   capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "s.json"
    src.write_text(json.dumps(services))
    assert main(["plan", "placement", "--services", str(src), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hermes: error: ") and msg in err, err


@pytest.mark.parametrize("extra, msg", [
    (["--min-gain", "2"], "argument --min-gain: expected a fraction in [0, 1), got '2'"),
    (["--min-gain", "-0.1"], "argument --min-gain: expected a fraction in [0, 1)"),
    (["--max-per-group", "0"], "argument --max-per-group: expected a positive integer"),
    (["--horizon", "-5"], "argument --horizon: expected a number > 0, got '-5'"),
])
def test_bad_flags_stop_at_the_command_line(extra: list[str], msg: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Values no search can use are refused by argparse (exit 2, the flag named), where
    --min-gain 2 without --current was silently ignored."""
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "placement", "--preset", "seallm", *extra])
    assert exit_.value.code == 2 and msg in capsys.readouterr().err


def test_malformed_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "s.json"
    src.write_text("[{name: a}")
    assert main(["plan", "placement", "--services", str(src)]) == 2
    assert f"--services {src}: not JSON" in capsys.readouterr().err
    assert main(["plan", "placement", "--services", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_bad_plan_refused_by_the_node() -> None:
    with pytest.raises(ValueError, match="format 'hermes-batch-plan/1'"):
        parse_placement({"format": "hermes-batch-plan/1"})
    with pytest.raises(ValueError, match="GPU ids outside 0..0"):
        parse_placement({"format": FORMAT, "gpus": 1, "groups": [{"gpus": [1], "engines": []}]})


def test_preset_is_the_benchmarks_services() -> None:
    """``--preset seallm`` is a snapshot of ``hermes bench seallm``'s services (``hermes.plan``
    may not import the benchmark): the same names, models, mean lengths and rate shares as the
    benchmark's clustering of the trace computes now."""
    import numpy as np

    from hermes.bench import seallm as S

    bench = S._services()
    total = sum(len(s.input_lengths) for s in bench) / len(S.MODELS)
    want = [{"name": s.name, "model": s.model,
             "rate": round(S.DEFAULT_RATE * len(s.input_lengths) / total / len(S.MODELS), 3),
             "input_tokens": round(float(np.mean(s.input_lengths))),
             "output_tokens": round(float(np.mean(s.output_lengths)))} for s in bench]
    assert PRESETS["seallm"] == want


def test_current_plan_kept_unless_the_new_one_is_min_gain_better(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--current``: two services on two GPUs; the plan in force shares one GPU and leaves the
    other idle (far worse); it is replaced when the asked gain is small and kept when no plan
    could be that much better."""
    services = parse_services(TWO)
    best, best_score = place(services, 2)
    shared = PlacementPlan((Group((0,), ("chat", "code")), Group((1,), ())))
    assert shared != best
    in_force = tmp_path / "in-force.json"
    in_force.write_text(json.dumps(emit_placement(services, shared, "A100-80", 2)))
    src = tmp_path / "services.json"
    src.write_text(json.dumps(TWO))
    out = tmp_path / "plan.json"
    base = ["plan", "placement", "--services", str(src), "--gpus", "2", "--emit", str(out),
            "--current", str(in_force)]
    assert main([*base, "--min-gain", "0.001"]) == 0
    assert "is replaced" in capsys.readouterr().err
    new = json.loads(out.read_text())
    assert [g["services"] for g in new["groups"]] == [list(g.services) for g in best.groups]
    assert main([*base, "--min-gain", "0.999"]) == 0
    assert "keeping the plan in force" in capsys.readouterr().err
    kept = json.loads(out.read_text())
    assert [g["services"] for g in kept["groups"]] == [["chat", "code"], []]
    # the library call: the same decision, with the kept plan's own score
    plan, score = place(services, 2, current=shared, min_gain=0.999)
    assert plan == shared and score >= best_score
    # a file that is not a plan, or a bad gain, is refused naming the option
    in_force.write_text(json.dumps({"groups": []}))
    assert main(base) == 2
    assert "--current" in capsys.readouterr().err
    assert main([*base[:-2], "--current", str(tmp_path / "missing.json")]) == 2
    assert "--current" in capsys.readouterr().err


def test_split_demand_sends_each_model_to_the_nodes_that_hold_it() -> None:
    """Two one-GPU RTX 3090 Ti nodes (24 GB: no 13B model) and one node of four H100s: the
    13B model's calls all go to the H100 node, the 7B model's are split between the three
    nodes by GPUs x achieved memory bandwidth; a model no node holds is returned apart."""
    from hermes.plan.nodes import NodeKind, node_capacity, split_demand

    services = parse_services([{"name": "a", "model": "llama-2-7b", "rate": 6.0},
                               {"name": "b", "model": "llama-2-13b", "rate": 2.0}])
    small, big = NodeKind(1, "RTX3090Ti", 2), NodeKind(4, "H100", 1)
    (on_small, on_big), homeless = split_demand(services, [small, big])
    assert not homeless
    assert [s.name for s in on_small] == ["a"] and [s.name for s in on_big] == ["a", "b"]
    c_small, c_big = node_capacity(1, "RTX3090Ti"), node_capacity(4, "H100")
    assert on_small[0].rate == pytest.approx(6.0 * c_small / (2 * c_small + c_big))
    assert 2 * on_small[0].rate + on_big[0].rate == pytest.approx(6.0)  # nothing lost
    assert on_big[1].rate == pytest.approx(2.0)
    (only_small,), homeless = split_demand(services, [small])
    assert [s.name for s in only_small] == ["a"] and [s.name for s in homeless] == ["b"]

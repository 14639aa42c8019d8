"""``hermeslet run-plan``: a batch plan carried out stage by stage on built-in engines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hermes.cli.plan import assign_gpus
from hermes.core.batchplan.oracle import EngineOracle
from hermes.core.batchplan.search import plan
from hermes.core.batchplan.workload import App, ModelNode, Request
from hermes.core.cluster.devices import get_device
from hermes.core.cluster.models import get_model
from hermes.plan.emit import emit_plan
from hermeslet.cli import main
from hermeslet.plan_runner import parse_plan, run_plan, sim_factory

SCALE = 50.0  # built-in engines 50x faster than the modelled A100s


def _pair(name: str, dp: int, tp: int, gpus: list[list[int]]) -> dict[str, Any]:
    return {"name": name, "model": "llama-2-7b", "dp": dp, "tp": tp, "load_s": 2.0,
            "engines": [{"gpu_ids": g, "vllm_args": ["--model", "m", "--tensor-parallel-size",
                                                     str(tp)],
                         "builtin": {"engine": "sim", "model": "llama-2-7b",
                                     "device": "A100-80", "tp": tp}} for g in gpus]}


def _doc(requests: dict[str, int], stages: list[list[dict[str, Any]]], n: int = 2,
         out: dict[str, int] | None = None) -> dict[str, Any]:
    """A plan by hand: ``requests[m]`` requests of 64 prompt tokens and ``out[m]`` (default
    32) output tokens each."""
    out = out or {}
    return {"format": "hermes-batch-plan/1", "n_gpus": n, "predicted_s": 0.0,
            "models": {m: {"model": "llama-2-7b",
                           "requests": [[i, 64, out.get(m, 32), []] for i in range(k)]}
                       for m, k in requests.items()},
            "stages": [{"pairs": s} for s in stages]}


def _run(doc: dict[str, Any]) -> tuple[list[str], int]:
    lines: list[str] = []
    rep = run_plan(parse_plan(doc), sim_factory(SCALE), progress=lines.append,
                   load_scale=1.0 / SCALE)
    return rep.events, rep.restarted


def test_model_finishing_early_keeps_the_other_running() -> None:
    # planned: a finishes first, then b gets both GPUs; b (4 requests) finishes first instead:
    # a's last stage is stage 0, so it keeps running on its GPU (paper 4.3, rule 1)
    ev, restarted = _run(_doc({"a": 200, "b": 4},
                              [[_pair("a", 1, 1, [[0]]), _pair("b", 1, 1, [[1]])],
                               [_pair("b", 2, 1, [[0], [1]])]], out={"a": 400, "b": 4}))
    assert ev[0].startswith("stage 0")
    assert ev.index("stop b (finished)") < ev.index("stop a (finished)")
    assert not any(e.startswith("stop a (stage") for e in ev)
    assert restarted == 0


def test_replanned_model_is_stopped_and_restarted() -> None:
    # b finishes first as planned; a moves from 1 GPU to dp=2: stopped, restarted on both GPUs
    ev, restarted = _run(_doc({"a": 300, "b": 2},
                              [[_pair("a", 1, 1, [[0]]), _pair("b", 1, 1, [[1]])],
                               [_pair("a", 2, 1, [[0], [1]])]], out={"a": 400, "b": 4}))
    stop = next(i for i, e in enumerate(ev) if e.startswith("stop a (stage 1"))
    restart = next(i for i, e in enumerate(ev) if e.startswith("start a dp=2 tp=1 on GPUs 0 1"))
    assert ev.index("stop b (finished)") < stop < restart
    assert restarted > 0  # a's in-flight requests start over on the new engines
    assert ev[-2] == "stop a (finished)"


def test_dependent_requests_wait_for_their_inputs() -> None:
    doc = _doc({"s": 6, "e": 0}, [[_pair("s", 1, 1, [[0]]), _pair("e", 1, 1, [[1]])]])
    doc["models"]["e"]["requests"] = [[i, 40, 8, [["s", i]]] for i in range(6)]
    ev, _ = _run(doc)
    assert ev.index("stop s (finished)") < ev.index("stop e (finished)")


@pytest.mark.parametrize("mutate, msg", [
    (lambda d: d.update(format="x"), "format 'x'"),
    (lambda d: d["stages"][0]["pairs"][0].update(dp=2), "engines do not match dp=2"),
    (lambda d: d["stages"][0]["pairs"][0]["engines"][0].update(gpu_ids=[5]), "outside 0..1"),
    (lambda d: d["stages"][0]["pairs"][0].update(name="zz"), "unknown model 'zz'"),
])
def test_bad_plan_is_named(mutate: Any, msg: str) -> None:
    doc = _doc({"a": 1}, [[_pair("a", 1, 1, [[0]])]])
    mutate(doc)
    with pytest.raises(ValueError, match=msg):
        parse_plan(doc)


def test_emitted_plan_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Planner -> emit -> ``hermeslet run-plan`` on built-in engines."""
    spec = get_model("llama-2-7b")
    app = App({"sum": ModelNode("sum", spec, [Request(i, 200, 40) for i in range(30)]),
               "judge": ModelNode("judge", get_model("llama-2-13b"),
                                  [Request(i, 80, 10, (("sum", i),)) for i in range(30)])})
    sched = plan(app, EngineOracle(app, get_device("A100-80"), 2), "greedy")
    doc = emit_plan(app, sched, "2xA100-80", assign_gpus(sched, 2))
    eng = doc["stages"][0]["pairs"][0]["engines"][0]
    assert eng["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, eng["gpu_ids"]))
    args = eng["vllm_args"]
    assert args[args.index("--tensor-parallel-size") + 1] == str(doc["stages"][0]["pairs"][0]["tp"])
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.9"
    assert doc["models"]["judge"]["requests"][3] == [3, 80, 10, [["sum", 3]]]
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(doc))
    assert main(["run-plan", str(f), "--time-scale", str(SCALE)]) == 0
    out = capsys.readouterr()
    assert f"ran {len(doc['stages'])} stages" in out.out
    assert "stop judge (finished)" in out.err and "stop sum (finished)" in out.err


def test_cli_bad_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"format": "hermes-batch-plan/1"}))
    assert main(["run-plan", str(f)]) == 2
    assert "lacks 'n_gpus'" in capsys.readouterr().err


def test_stalled_plan_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # model b is in no stage: once a is done nothing can run it
    f = tmp_path / "p.json"
    f.write_text(json.dumps(_doc({"a": 2, "b": 2}, [[_pair("a", 1, 1, [[0]])]])))
    assert main(["run-plan", str(f), "--time-scale", str(SCALE)]) == 1
    assert "stalled: unfinished b" in capsys.readouterr().err


def test_plan_batch_emit_then_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``hermes plan batch --dag ... --emit FILE`` then ``hermeslet run-plan FILE``."""
    from hermes.cli import main as hermes_main

    dag = tmp_path / "dag.json"
    dag.write_text(json.dumps({"models": [
        {"name": "a", "model": "llama-2-7b", "requests": [{"input": 50, "output": 20}] * 20},
        {"name": "b", "model": "mistral-7b",
         "requests": [{"input": 30, "output": 10, "after": [["a", i]]} for i in range(20)]},
    ]}))
    plan_file = tmp_path / "plan.json"
    assert hermes_main(["plan", "batch", "--dag", str(dag), "--gpus", "2xA100-80",
                        "--workers", "1", "--emit", str(plan_file)]) == 0
    doc = json.loads(plan_file.read_text())
    assert doc["format"] == "hermes-batch-plan/1" and doc["n_gpus"] == 2
    assert doc["models"]["b"]["hf_model"] == "mistralai/Mistral-7B-v0.1"
    capsys.readouterr()
    assert main(["run-plan", str(plan_file), "--time-scale", str(SCALE)]) == 0
    assert "stop b (finished)" in capsys.readouterr().err

"""``hermes plan batch``: bad input exits 2 naming it; a small end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes.cli import main


def _dag(tmp_path: Path, models: list[dict]) -> str:
    p = tmp_path / "dag.json"
    p.write_text(json.dumps({"models": models}))
    return str(p)


@pytest.mark.parametrize("gpus, msg", [("8xB300", "unknown device 'B300'"),
                                       ("eightA100", "malformed --gpus")])
def test_bad_gpus(gpus: str, msg: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dag = _dag(tmp_path, [{"name": "a", "model": "llama-2-7b", "requests": [{"input": 5, "output": 5}]}])
    assert main(["plan", "batch", "--dag", dag, "--gpus", gpus, "--workers", "1"]) == 2
    assert msg in capsys.readouterr().err


def test_cyclic_dag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dag = _dag(tmp_path, [
        {"name": "a", "model": "llama-2-7b", "requests": [{"input": 5, "output": 5, "after": [["b", 0]]}]},
        {"name": "b", "model": "llama-2-7b", "requests": [{"input": 5, "output": 5, "after": [["a", 0]]}]},
    ])
    assert main(["plan", "batch", "--dag", dag, "--gpus", "2xA100-80", "--workers", "1"]) == 2
    assert "cyclic DAG" in capsys.readouterr().err


def test_model_fits_nowhere(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dag = _dag(tmp_path, [{"name": "big", "model": "llama-2-70b", "requests": [{"input": 5, "output": 5}]}])
    assert main(["plan", "batch", "--dag", dag, "--gpus", "1xA100-40", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "'big'" in err and "fits nowhere" in err


def test_unknown_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dag = _dag(tmp_path, [{"name": "a", "model": "gpt-9", "requests": [{"input": 5, "output": 5}]}])
    assert main(["plan", "batch", "--dag", dag, "--gpus", "2xA100-80", "--workers", "1"]) == 2
    assert "unknown model 'gpt-9'" in capsys.readouterr().err


def test_dag_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reqs = [{"input": 100, "output": 50} for _ in range(40)]
    dag = _dag(tmp_path, [
        {"name": "sum", "model": "llama-2-7b", "requests": reqs},
        {"name": "judge", "model": "llama-2-13b",
         "requests": [{"input": 80, "after": [["sum", i]]} for i in range(40)],
         "output_ecdf": [20, 40, 60], "limit": 50},
    ])
    out = tmp_path / "plan.json"
    assert main(["plan", "batch", "--dag", dag, "--gpus", "4xA100-80", "--workers", "1",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    for k in ("plan_s", "max_heuristic_s", "min_heuristic_s", "search_s", "stages"):
        assert k in doc
    assert doc["plan_s"] > 0 and doc["stages"]
    m = doc["stages"][0]["models"][0]
    assert {"model", "tp", "gpu_ids", "gpu_memory_utilization"} <= set(m)
    used = [g for s in doc["stages"][:1] for mm in s["models"] for r in mm["gpu_ids"] for g in r]
    assert len(used) == len(set(used)) and max(used) < 4


def test_scenario_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "e.json"
    assert main(["plan", "batch", "--scenario", "ensembling", "--requests", "60",
                 "--gpus", "8xA100-80", "--workers", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["plan_s"] <= doc["max_heuristic_s"] * 1.5
    assert len({m["name"] for s in doc["stages"] for m in s["models"]}) == 9

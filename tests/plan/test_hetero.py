"""`hermes plan hetero`: JSON output, vLLM expressibility, bad input -> exit 2."""

from __future__ import annotations

import json

import pytest

from hermes.cli.plan import add_plan_parser
from hermes.core.cluster.cost import Placement, StageSpec
from hermes.core.cluster.models import get_model
from hermes.plan.hetero import PRESETS, price_per_hour, vllm_args


def run(argv):
    import argparse

    p = argparse.ArgumentParser()
    add_plan_parser(p.add_subparsers(dest="cmd"))
    a = p.parse_args(["plan", "hetero", *argv])
    return a.func(a)


def write(tmp_path, obj):
    f = tmp_path / "c.json"
    f.write_text(json.dumps(obj))
    return str(f)


def test_preset_budgets():
    assert price_per_hour(PRESETS["homogeneous-16xA100-40"]) == pytest.approx(65.54)
    assert price_per_hour(PRESETS["hexgen-hetero"]) == pytest.approx(65.04)
    assert sum(n.n_gpus for n in PRESETS["hexgen-hetero"].nodes) == 58


def test_cli_json(tmp_path, capsys):
    path = write(tmp_path, {"nodes": [{"device": "A6000", "gpus": 4, "region": "a"},
                                      {"device": "A5000", "gpus": 4, "region": "b"}],
                            "links": [{"regions": ["a", "b"], "latency_ms": 50, "gbps": 1}]})
    out = tmp_path / "o.json"
    rc = run(["--cluster", path, "--rate", "0.5", "--generations", "2", "--population", "3",
              "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert set(d) >= {"pipelines", "slo_attainment", "search_s"}
    assert d["pipelines"]
    for p in d["pipelines"]:
        assert sum(s["layers"][1] - s["layers"][0] for s in p["stages"]) == 80
    assert "generation" in capsys.readouterr().err


@pytest.mark.parametrize(("obj", "msg"), [
    ({"nodes": [{"device": "B9000", "gpus": 2}]}, "unknown device 'B9000'"),
    ({"nodes": [{"device": "A6000", "gpus": 2, "region": "a"},
                {"device": "A6000", "gpus": 2, "region": "b"}]}, "missing links between regions: a<->b"),
    ({"nodes": [{"device": "A5000", "gpus": 2}]}, "fits nowhere"),
])
def test_cli_errors(tmp_path, capsys, obj, msg):
    assert run(["--cluster", write(tmp_path, obj)]) == 2
    assert msg in capsys.readouterr().err


def test_cli_needs_one_source(capsys):
    assert run([]) == 2
    assert "exactly one" in capsys.readouterr().err


def test_vllm_expressibility():
    m = get_model("llama-2-70b")
    from hermes.core.cluster.topology import GpuId
    g = [GpuId(0, i) for i in range(8)]
    even = Placement(m, (StageSpec(tuple(g[:4]), 40), StageSpec(tuple(g[4:]), 40)))
    assert vllm_args(even) == {"expressible": True, "args": ["--tensor-parallel-size", "4",
                                                             "--pipeline-parallel-size", "2"]}
    asym = Placement(m, (StageSpec(tuple(g[:4]), 48), StageSpec(tuple(g[4:6]), 20),
                         StageSpec(tuple(g[6:]), 12)))
    r = vllm_args(asym)
    assert not r["expressible"]
    assert any("different TP" in w for w in r["why"]) and any("uneven" in w for w in r["why"])

"""The Grafana dashboards and provisioning files are valid and agree with the exported metrics
(fast: no Prometheus needed)."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import yaml

from tests.ops.conftest import REPO

GRAFANA = REPO / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
#: PromQL words that are not metric names
PROMQL = {"sum", "by", "rate", "increase", "histogram_quantile", "max", "min", "clamp_min",
          "or", "le", "app", "node", "engine", "backend_type", "start", "scope", "name", "state",
          "outcome", "stat", "instance", "policy", "on", "ignoring", "without", "h"}


def _datasource_uid() -> str:
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (only,) = ds["datasources"]
    assert only["type"] == "prometheus"
    return only["uid"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> set[str]:  # noqa: ANN001
    """Series names a real gateway (with its embedded HermesLet) exports on /metrics: every
    metric family is listed (``# TYPE``) even before it has samples."""
    import httpx

    from hermes.gateway.config import load_config
    from hermes.gateway.server import start_background

    d = tmp_path_factory.mktemp("gw")
    with start_background(load_config(None, environ={}, port=0, bind="", kb=str(d / "kb"),
                                      state_dir=str(d / "st"), log_level="warning")) as srv:
        text = httpx.get(srv.url + "/metrics", timeout=10).text
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names |= _series_names(name, kind)
    return names


def _series_names(name: str, kind: str) -> set[str]:
    """Series of a ``# TYPE`` line (counters and infos already carry _total/_info there)."""
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return {name}


def test_four_dashboards_and_provisioning() -> None:
    assert {p.name for p in DASHBOARDS} == {"hermes-overview.json", "hermes-scheduler.json",
                                            "hermes-engines.json", "hermes-prewarm.json"}
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "hermes.yml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    # the compose file mounts the dashboards where the provider looks for them
    compose = yaml.safe_load((REPO / "deploy" / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert any(m.endswith(":" + provider["options"]["path"] + ":ro") or
               m.endswith(":" + provider["options"]["path"]) for m in mounts), mounts


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_valid_grafana_json(path, exported) -> None:  # noqa: ANN001
    uid = _datasource_uid()
    d = json.loads(path.read_text())
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    panels = d["panels"]
    assert panels
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {path.name}"
    for var in d["templating"]["list"]:
        assert var["datasource"]["uid"] == uid
    for p in panels:
        assert p["type"] in {"timeseries", "stat", "gauge", "table", "bargauge"}
        assert p["datasource"] == {"type": "prometheus", "uid": uid}, p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            expr = t["expr"]
            assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}")
            assert t["datasource"]["uid"] == uid
            words = set(re.findall(r"\b[a-z_][a-z0-9_:]*\b", re.sub(r'"[^"]*"', "", expr)))
            metrics = {w for w in words if w.startswith(("hermes_", "hermeslet_"))}
            assert metrics, f"{p['title']}: no Hermes metric in {expr}"
            unknown = metrics - exported
            assert not unknown, f"{path.name} / {p['title']}: not exported: {unknown}"
            assert not (words - metrics - PROMQL - {"rate_interval", "__rate_interval"}), (
                f"{p['title']}: unexpected words {words - metrics - PROMQL}")


def test_committed_dashboards_match_the_generator() -> None:
    spec = importlib.util.spec_from_file_location("build_dashboards",
                                                  GRAFANA / "build_dashboards.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    built = mod.build()
    for name, text in built.items():
        assert (GRAFANA / "dashboards" / name).read_text() == text, (
            f"{name} is stale: run python deploy/grafana/build_dashboards.py")

"""The deployment beyond one machine (deploy/k8s/ha, the compose stack's edges and schedulers
behind haproxy), checked offline by the tools that run here:

- every Kubernetes manifest (deploy/k8s and deploy/k8s/ha) validates strictly against the
  Kubernetes API schemas ``kubernetes-validate`` ships (no cluster needed);
- the HA manifests are wired as docs/ha-state.md says: edges a Deployment with an autoscaler,
  two leader-elected schedulers with stable names that the nodes and edges list, RBAC for a
  Kubernetes Lease, Redis persistent; both roles' configuration loads with the gateway's own
  loader and points at the same shared store;
- the compose stack has two edges behind haproxy (``haproxy -c`` accepts its config, whose
  servers are those edges) and a standby scheduler the HermesLets follow too.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes.gateway.config import load_config
from tests.ops.conftest import REPO

DEPLOY = REPO / "deploy"
K8S_VERSION = "1.30.0"  # the oldest Kubernetes the manifests target (autoscaling/v2, policy/v1)


def _kustomized(folder: Path) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for res in yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]:
        for d in yaml.safe_load_all((folder / res).read_text()):
            out[(d["kind"], d["metadata"]["name"])] = d
    return out


@pytest.mark.parametrize("folder", ["k8s", "k8s/ha"])
def test_manifests_validate_against_the_kubernetes_schemas(folder: str) -> None:
    kv = pytest.importorskip("kubernetes_validate")  # dev extra
    docs = _kustomized(DEPLOY / folder)
    assert docs
    for (kind, name), doc in docs.items():
        try:
            kv.validate(doc, K8S_VERSION, strict=True)
        except kv.ValidationError as e:  # names the manifest, the field and the rule
            pytest.fail(f"{folder}: {kind}/{name}: {e.path}: {e.message}")


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    return c


def _flag_values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_ha_manifests_are_wired_for_failover(tmp_path: Path) -> None:
    docs = _kustomized(DEPLOY / "k8s" / "ha")
    sched = docs[("StatefulSet", "hermes-scheduler")]
    assert sched["spec"]["replicas"] == 2
    headless = docs[("Service", sched["spec"]["serviceName"])]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    pods = [f"hermes-scheduler-{i}.{sched['spec']['serviceName']}" for i in range(2)]
    sc = _container(sched)
    assert sc["args"][:3] == ["serve", "--role", "scheduler"]
    # readiness: alive, not "leader" (a standby would stall every rolling update)
    assert sc["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # the nodes and the edges list both schedulers' stable names
    node = _container(docs[("Deployment", "hermes-node")])
    assert _flag_values(node["args"], "--scheduler") == [f"tcp://{p}:5557" for p in pods]
    edge = docs[("Deployment", "hermes-edge")]
    ec = _container(edge)
    assert ec["args"][:3] == ["serve", "--role", "edge"]
    assert _flag_values(ec["args"], "--scheduler") == [f"http://{p}:8000" for p in pods]
    # the autoscaler scales the edges, never below two
    hpa = docs[("HorizontalPodAutoscaler", "hermes-edge")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": "hermes-edge"}
    assert hpa["minReplicas"] >= 2 and ec["resources"]["requests"]["cpu"]
    assert docs[("Service", "hermes")]["spec"]["selector"] == \
        edge["spec"]["selector"]["matchLabels"]
    # RBAC: the schedulers' service account may hold the Kubernetes Lease
    spec = sched["spec"]["template"]["spec"]
    binding = docs[("RoleBinding", "hermes-scheduler-lease")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": spec["serviceAccountName"]}]
    rules = docs[("Role", binding["roleRef"]["name"])]["rules"]
    verbs = {v for r in rules if r["resources"] == ["leases"]
             and r["apiGroups"] == ["coordination.k8s.io"] for v in r["verbs"]}
    assert {"create", "get", "update"} <= verbs
    # Redis keeps what it holds across its own restart
    redis = docs[("StatefulSet", "hermes-redis")]
    assert "--appendonly" in _container(redis)["args"] and redis["spec"]["volumeClaimTemplates"]
    # both roles' configuration loads and shares one store; the election env is the Redis one
    data = docs[("ConfigMap", "hermes-ha-config")]["data"]
    cfgs = {}
    for role in ("scheduler", "edge"):
        (tmp_path / f"{role}.toml").write_text(data[f"{role}.toml"])
        cfgs[role] = load_config(tmp_path / f"{role}.toml", environ={})
    s, e = cfgs["scheduler"], cfgs["edge"]
    assert s.cluster.store == e.cluster.store != ""
    assert s.scheduler.embedded_node is False and s.scheduler.bind.endswith(":5557")
    assert s.durability.state_redis and e.security.auth_redis
    assert {"name": "HERMES_HA__ELECTION", "value": s.durability.state_redis} in sc["env"]
    redis_svc = docs[("Service", "hermes-redis")]["spec"]["ports"][0]["port"]
    for url in (s.cluster.store, s.durability.state_redis, e.security.auth_redis, s.stores.kb):
        assert url.startswith(f"redis://hermes-redis:{redis_svc}/")


def test_compose_has_two_edges_behind_haproxy_and_a_standby_scheduler() -> None:
    svcs = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    edges = ["gateway", "gateway-b"]
    for name in edges:
        assert svcs[name]["command"][:3] == ["serve", "--role", "edge"]
        assert "ports" not in svcs[name]  # reached through haproxy only
    for name in ("scheduler", "scheduler-standby"):
        assert svcs[name]["command"][:3] == ["serve", "--role", "scheduler"]
        assert svcs[name]["environment"]["HERMES_HA__ELECTION"].startswith("redis://redis:")
    assert svcs["haproxy"]["ports"] == ["8000:8000"]
    cmd = svcs["hermeslet"]["command"]
    assert _flag_values(cmd, "--scheduler") == ["tcp://scheduler:5557",
                                                 "tcp://scheduler-standby:5557"]
    cfg = (DEPLOY / "haproxy.cfg").read_text()
    servers = [ln.split()[2] for ln in cfg.splitlines() if ln.strip().startswith("server ")]
    assert servers == [f"{n}:8000" for n in edges]
    assert "option httpchk GET /readyz" in cfg
    mount = svcs["haproxy"]["volumes"][0].split(":")[0]
    assert (DEPLOY / mount).resolve() == (DEPLOY / "haproxy.cfg").resolve()


def test_haproxy_config_is_valid() -> None:
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.skip("haproxy not installed (apt-get install -y haproxy)")
    r = subprocess.run([haproxy, "-c", "-f", str(DEPLOY / "haproxy.cfg")], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr

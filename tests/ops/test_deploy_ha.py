"""The deployment beyond one machine (deploy/k8s/ha, the compose stack's edges and schedulers
behind haproxy), checked offline by the tools that run here:

- every Kubernetes manifest (deploy/k8s and deploy/k8s/ha) validates strictly against the
  Kubernetes API schemas ``kubernetes-validate`` ships (no cluster needed);
- the HA manifests are wired as docs/ha-state.md says: edges (``hermes serve --role edge``)
  a Deployment with an autoscaler, ready while they reach the active scheduler; two
  leader-elected schedulers (``--role scheduler``) with stable names that the nodes list and
  a socket for edges; RBAC for a Kubernetes Lease, Redis persistent; both configurations
  load with the gateway's own loader and every store URL points at the Redis Service;
- the compose stack has two edges behind haproxy in front of two elected schedulers (active
  and standby), which the HermesLet both connects to; ``haproxy -c`` accepts its
  configuration.
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


def _haproxy_servers(cfg: str) -> list[str]:
    return [ln.split()[2].strip('"') for ln in cfg.splitlines()
            if ln.strip().startswith("server ")]


def test_ha_manifests_are_wired_for_failover(tmp_path: Path) -> None:
    docs = _kustomized(DEPLOY / "k8s" / "ha")
    sched = docs[("StatefulSet", "hermes-scheduler")]
    assert sched["spec"]["replicas"] == 2
    service = sched["spec"]["serviceName"]
    headless = docs[("Service", service)]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    pods = [f"hermes-scheduler-{i}.{service}" for i in range(2)]
    sc = _container(sched)
    assert sc["args"][0] == "serve"
    # readiness: alive, not "leader" (a standby would stall every rolling update)
    assert sc["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # the nodes list both gateways' stable names
    node = _container(docs[("Deployment", "hermes-node")])
    assert _flag_values(node["args"], "--scheduler") == [f"tcp://{p}:5557" for p in pods]
    # the edges: Hermes edges, ready while they reach the active scheduler, which they find
    # in the same lease record the schedulers write; nodes answer them at their pod IP
    edge = docs[("Deployment", "hermes-edge")]
    ec = _container(edge)
    assert ec["args"] == ["serve", "--config", "/etc/hermes/edge.toml"]
    assert ec["readinessProbe"]["httpGet"]["path"] == "/readyz"
    eenv = {e["name"]: e for e in ec["env"]}
    senv = {e["name"]: e for e in sc["env"]}
    assert eenv["HERMES_HA__ELECTION"]["value"] == senv["HERMES_HA__ELECTION"]["value"]
    for env in (eenv, senv):
        assert env["HERMES_HA__ADVERTISE"]["valueFrom"] == {"fieldRef": {"fieldPath":
                                                                          "status.podIP"}}
    assert {p["containerPort"] for p in sc["ports"]} >= {8000, 5557, 5560}
    assert {p["containerPort"] for p in ec["ports"]} >= {8000, 5570}
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
    # the gateways' configuration loads; the election and every store are the Redis Service
    data = docs[("ConfigMap", "hermes-ha-config")]["data"]
    election = {"HERMES_HA__ELECTION": senv["HERMES_HA__ELECTION"]["value"]}
    (tmp_path / "scheduler.toml").write_text(data["scheduler.toml"])
    s = load_config(tmp_path / "scheduler.toml", environ=election)
    assert s.ha.role == "scheduler" and s.ha.edge_bind.endswith(":5560")
    (tmp_path / "edge.toml").write_text(data["edge.toml"])
    e = load_config(tmp_path / "edge.toml", environ=election)
    assert e.ha.role == "edge" and e.scheduler.bind.endswith(":5570")
    assert e.security.auth_redis == s.security.auth_redis and e.cluster.store == s.cluster.store
    assert s.scheduler.embedded_node is False and s.scheduler.bind.endswith(":5557")
    assert s.durability.durable and s.durability.state_redis and s.cluster.store
    assert {"name": "HERMES_HA__ELECTION", "value": s.durability.state_redis} in sc["env"]
    redis_svc = docs[("Service", "hermes-redis")]["spec"]["ports"][0]["port"]
    for url in (s.cluster.store, s.durability.state_redis, s.security.auth_redis, s.stores.kb):
        assert url.startswith(f"redis://hermes-redis:{redis_svc}/")


def test_compose_has_two_edges_and_two_elected_schedulers_behind_haproxy() -> None:
    svcs = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    gateways, edges = ["gateway", "gateway-b"], ["edge", "edge-b"]
    for name in gateways:
        env = svcs[name]["environment"]
        assert env["HERMES_HA__ELECTION"].startswith("redis://redis:")
        assert env["HERMES_HA__ROLE"] == "scheduler" and env["HERMES_HA__EDGE_BIND"]
        assert env["HERMES_HA__ADVERTISE"] == name  # edges dial it by its service name
        assert env["HERMES_DURABILITY__STATE_REDIS"] and env["HERMES_CLUSTER__STORE"]
        assert env["HERMES_EMBEDDED_NODE"] == "false"  # the election needs remote nodes
        assert "ports" not in svcs[name]  # reached through the edges only
    for name in edges:
        env = svcs[name]["environment"]
        assert env["HERMES_HA__ROLE"] == "edge" and env["HERMES_HA__ADVERTISE"] == name
        assert env["HERMES_HA__ELECTION"] == svcs["gateway"]["environment"]["HERMES_HA__ELECTION"]
        assert env["HERMES_BIND"].startswith("tcp://0.0.0.0:")  # the nodes' answers
        assert env["HERMES_SECURITY__AUTH_REDIS"] == \
            svcs["gateway"]["environment"]["HERMES_SECURITY__AUTH_REDIS"]  # one key store
        assert "ports" not in svcs[name]
    assert svcs["haproxy"]["ports"] == ["8000:8000"]
    cmd = svcs["hermeslet"]["command"]
    assert _flag_values(cmd, "--scheduler") == [f"tcp://{g}:5557" for g in gateways]
    cfg = (DEPLOY / "haproxy.cfg").read_text()
    assert _haproxy_servers(cfg) == [f"{e}:8000" for e in edges]
    assert "option httpchk GET /readyz" in cfg
    mount = svcs["haproxy"]["volumes"][0].split(":")[0]
    assert (DEPLOY / mount).resolve() == (DEPLOY / "haproxy.cfg").resolve()


def test_haproxy_config_is_valid() -> None:
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.skip("haproxy not installed (apt-get install -y haproxy)")
    cfg = DEPLOY / "haproxy.cfg"
    r = subprocess.run([haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True,
                       timeout=30, env={"PATH": "/usr/sbin:/usr/bin:/bin"})
    assert r.returncode == 0, f"{cfg}: {r.stdout}{r.stderr}"

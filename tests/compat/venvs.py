"""Agent frameworks that cannot share the gateway's venv (their openai or protobuf pins),
run as client subprocesses from venvs of their own (``.ci/compat-venvs.sh`` builds them
under ``$HERMES_COMPAT_VENVS``): the scripts in ``tests/compat/clients`` talk to the gateway
over loopback and print one JSON object of what they saw.

Without the venvs the tests skip, naming the script to run; with ``HERMES_REQUIRE_COMPAT=1``
(CI's compat tier) a missing venv is a failure."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

CLIENTS = Path(__file__).parent / "clients"
#: telemetry off for every framework, whatever it reads: nothing may leave loopback
NO_TELEMETRY = {
    "DO_NOT_TRACK": "1", "ANONYMIZED_TELEMETRY": "False", "OTEL_SDK_DISABLED": "true",
    "LANGCHAIN_TRACING_V2": "false", "LANGSMITH_TRACING": "false",
    "AUTOGEN_DISABLE_RUNTIME_TRACING": "true", "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false",
    "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
}


def venv_python(name: str) -> str:
    """The interpreter of the compat venv ``name`` (skip, or fail in CI, when absent)."""
    root = os.environ.get("HERMES_COMPAT_VENVS", str(Path.home() / ".cache" / "hermes-compat"))
    python = Path(root) / name / "bin" / "python"
    if not (Path(root) / name / ".hermes-compat-ok").exists():
        msg = (f"the {name!r} client venv is not built under {root}: run "
               f"HERMES_COMPAT_VENVS={root} .ci/compat-venvs.sh")
        if os.environ.get("HERMES_REQUIRE_COMPAT") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return str(python)


def run_client(venv: str, script: str, *args: str, timeout_s: float = 240) -> dict[str, Any]:
    """Run ``clients/<script>`` with the venv's python; its JSON output (a failure shows the
    client's stderr)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           **NO_TELEMETRY}
    proc = subprocess.run([venv_python(venv), str(CLIENTS / script), *args], env=env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    assert proc.returncode == 0, f"{script} {' '.join(args)} failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])

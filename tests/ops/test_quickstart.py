"""What a newcomer meets first: ``hermes serve`` says when it is ready and how to use it,
``hermes run APP`` waits for it and fails loudly, a taken port is named, Ctrl-C stops the
gateway without a traceback."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes.procs import free_port

pytestmark = pytest.mark.timeout(120)


def _hermes(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hermes.cli", *argv], capture_output=True,
                          text=True, timeout=timeout)


def test_serve_says_how_to_use_it_and_a_run_waits_for_it(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes.cli", "serve", "--port", str(port), "--time-scale", "50",
         "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # a real terminal's Ctrl-C (background jobs of a script ignore SIGINT otherwise)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # started before the gateway is up: it waits for /healthz instead of failing
        run = subprocess.Popen([sys.executable, "-m", "hermes.cli", "run", "factool_kbqa",
                                "--url", url, "--input", '{"seed": 1}', "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        banner: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            banner.append(line)
            if "stop: Ctrl-C" in line:
                break
        text = "".join(banner)
        assert f"hermes gateway ready on {url}" in text, text
        assert f"OpenAI base URL: {url}/v1" in text and "model: llama-2-7b" in text
        assert f"curl {url}/v1/chat/completions" in text and "OpenAI(base_url=" in text
        assert f"state: {tmp_path / 'state'}" in text
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        done = json.loads(out)
        assert done["state"] == "finished" and done["app"] == "factool_kbqa", done

        bad = _hermes("run", "no_such_app", "--url", url)
        assert bad.returncode == 2 and "is not a hosted app" in bad.stderr, bad.stderr

        taken = _hermes("serve", "--port", str(port), "--state-dir", str(tmp_path / "s2"))
        assert taken.returncode == 1 and "Traceback" not in taken.stderr
        assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in taken.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, rest[-2000:]
    assert "Traceback" not in rest and "gateway stopped" in rest, rest[-2000:]


def test_run_without_a_gateway_fails_loudly() -> None:
    t0 = time.monotonic()
    r = _hermes("run", "factool_kbqa", "--url", f"http://127.0.0.1:{free_port()}",
                "--ready-timeout", "1")
    assert r.returncode == 2
    assert "no gateway ready at http://127.0.0.1:" in r.stderr and "after 1 s" in r.stderr
    assert time.monotonic() - t0 < 30

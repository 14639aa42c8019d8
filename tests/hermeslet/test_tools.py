"""The subprocess tool sandbox: output capture, exit codes, timeout kill, limits."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from hermeslet.tools import SubprocessSandbox, ToolLimits, ToolRunner

SANDBOXES = [False] + ([True] if shutil.which("bwrap") else [])


@pytest.fixture(params=SANDBOXES, ids=lambda b: "bwrap" if b else "plain")
def box(request) -> SubprocessSandbox:
    return SubprocessSandbox(use_bwrap=request.param, max_output_chars=1000)


async def test_output_and_nonzero_exit(box):
    r = await box.run(code="import sys; print('out'); print('err', file=sys.stderr); sys.exit(7)")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (7, "out\n", "err\n", False)
    r = await box.run(command=["sh", "-c", "echo $((6*7))"])
    assert (r.exit_code, r.stdout) == (0, "42\n")


async def test_timeout_kills_the_whole_process_group(box, tmp_path):
    marker = tmp_path / "survivor"
    # a grandchild that would write a file after the timeout, if it survived
    code = ("import subprocess, time; subprocess.Popen(['sh', '-c', 'sleep 1.5; touch "
            f"{marker}']); time.sleep(30)")
    t0 = time.monotonic()
    r = await box.run(code=code, timeout_s=0.5)
    assert r.timed_out and r.exit_code < 0
    # a surviving grandchild would hold the output pipe open until it exits (1.5 s)
    assert time.monotonic() - t0 < 1.3
    time.sleep(1.6)
    assert not marker.exists()


async def test_output_truncated(box):
    r = await box.run(code="print('x' * 5000)")
    assert r.stdout.startswith("x" * 1000) and "truncated" in r.stdout and len(r.stdout) < 1100


async def test_memory_limit_applies():
    box = SubprocessSandbox(use_bwrap=False, limits=ToolLimits(memory_bytes=200 << 20))
    r = await box.run(code="b = bytearray(400 << 20)")
    assert r.exit_code != 0 and "MemoryError" in r.stderr


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bwrap not installed")
async def test_bwrap_root_is_read_only_and_tmp_private(tmp_path):
    box = SubprocessSandbox(use_bwrap=True)
    if not box.sandboxed:
        pytest.skip("bwrap unusable here")
    target = tmp_path / "escape"
    r = await box.run(code=f"open({str(target)!r}, 'w').write('x')")
    assert r.exit_code != 0 and not target.exists()
    r = await box.run(code="open('/tmp/ok', 'w').write('x'); print(open('/tmp/ok').read())")
    assert (r.exit_code, r.stdout) == (0, "x\n")
    assert not os.path.exists("/tmp/ok")


async def test_runner_routes_docker_backend_to_subprocess_without_docker():
    runner = ToolRunner(SubprocessSandbox(use_bwrap=False))
    assert runner.kinds == ["subprocess"]
    r = await runner.run("docker:python:3.10-slim", code="print(1 + 1)")
    assert r.stdout == "2\n" and not r.cold

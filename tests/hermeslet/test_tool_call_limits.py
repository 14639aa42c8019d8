"""A tool call is bounded as a whole: output streamed and cut at the limit (never buffered),
memory and process count per call enforced by the kernel (a cgroup per call), and a loud
fallback where no cgroup can be made."""

from __future__ import annotations

import logging
import shutil

import pytest

from hermeslet.cgroups import detect
from hermeslet.tools import SubprocessSandbox, ToolLimits, ToolRunner

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap not installed")
HAVE_CGROUPS = detect() is not None
needs_cgroups = pytest.mark.skipif(not HAVE_CGROUPS, reason="no writable cgroup here")


def _vm(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


async def test_a_gigabyte_of_output_is_cut_without_being_held() -> None:
    box = SubprocessSandbox(max_output_chars=64 * 1024)
    with open("/proc/self/clear_refs", "w") as f:  # reset this process's RSS high-water mark
        f.write("5")
    before = _vm("VmRSS")
    r = await box.run(code="import sys\nb = b'x' * (1 << 20)\n"
                           "for _ in range(1024): sys.stdout.buffer.write(b)", timeout_s=120)
    grew = _vm("VmHWM") - before
    assert r.exit_code == 0 and len(r.stdout) < 64 * 1024 + 100, len(r.stdout)
    assert "truncated" in r.stdout[-80:]
    assert grew < 64 << 20, f"RSS grew by {grew >> 20} MiB for a 1 GiB output"


FORK_HOG = """
import os, time
kids = []
for _ in range(5):
    pid = os.fork()
    if pid == 0:
        b = bytearray(200 << 20)
        for i in range(0, len(b), 4096):
            b[i] = 1
        time.sleep(1)
        os._exit(0)
    kids.append(pid)
print(sum(1 for k in kids if os.waitpid(k, 0)[1] != 0))
"""

FORK_BOMB = """
import os, time
n = 0
try:
    for _ in range(300):
        if os.fork() == 0:
            time.sleep(2)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)
"""


@needs_cgroups
async def test_memory_is_bounded_per_call_not_per_process() -> None:
    box = SubprocessSandbox(limits=ToolLimits(memory_bytes=512 << 20, pids=64))
    assert box.kernel_limits in ("cgroup2", "cgroup1")
    r = await box.run(code=FORK_HOG, timeout_s=60)
    # 5 x 200 MiB against 512 MiB for the call: some children are killed by the kernel
    assert int(r.stdout) >= 2, (r.stdout, r.stderr)
    assert "memory limit" in r.stderr


@needs_cgroups
async def test_process_count_is_bounded_per_call() -> None:
    box = SubprocessSandbox(limits=ToolLimits(pids=32))
    r = await box.run(code=FORK_BOMB, timeout_s=60)
    assert int(r.stdout) < 32, r.stdout


@needs_cgroups
async def test_call_cgroups_are_removed_with_whatever_was_left() -> None:
    root = detect()
    assert root is not None
    before = {p.name for d in root.dirs for p in d.iterdir() if p.is_dir()}
    box = SubprocessSandbox(cgroup=root)
    r = await box.run(code="import subprocess; subprocess.Popen(['sleep', '30'])", timeout_s=10)
    assert r.exit_code == 0
    after = {p.name for d in root.dirs for p in d.iterdir() if p.is_dir()}
    assert after == before  # the call's cgroup (and the daemonised sleep) are gone


async def test_without_cgroups_the_fallback_is_loud(caplog) -> None:  # noqa: ANN001
    caplog.set_level(logging.INFO)
    box = SubprocessSandbox(cgroup="off", limits=ToolLimits(pids=16))
    assert box.kernel_limits == "rlimit"
    ToolRunner(box).log_status()
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("per PROCESS only" in r.getMessage() for r in warned), caplog.text
    r = await box.run(code="print(1)")
    assert r.stdout == "1\n" and box.rlimit_fallbacks == 1
    from prometheus_client.core import Metric

    from hermeslet.metrics import sandbox_metrics
    got: dict[str, float] = {}
    for fam in sandbox_metrics("n1", box):
        assert isinstance(fam, Metric)
        for s in fam.samples:
            got[s.name + s.labels.get("mode", "")] = s.value
    assert got["hermeslet_tool_sandbox_kernel_limitsrlimit"] == 1.0
    assert got["hermeslet_tool_sandbox_kernel_limitscgroup1"] == 0.0
    assert got["hermeslet_tool_rlimit_fallback_calls_total"] == 1.0

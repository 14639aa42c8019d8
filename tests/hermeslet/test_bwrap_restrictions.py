"""The embedded (bubblewrap) sandbox is restricted like the Docker one: no network, user
nobody, no capabilities, read-only root, killed on timeout (tested in test_tools)."""

from __future__ import annotations

import shutil
import socket

import pytest

from hermeslet.tools import SubprocessSandbox


@pytest.fixture
def bwrap_box() -> SubprocessSandbox:
    if not shutil.which("bwrap"):
        pytest.skip("bwrap not installed (apt-get install bubblewrap)")
    box = SubprocessSandbox(use_bwrap=True)
    if not box.sandboxed:
        pytest.skip(f"bwrap unusable on this host: {box.why_not}")
    return box


async def test_bwrap_no_network_nobody_no_capabilities(bwrap_box: SubprocessSandbox) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        code = (
            "import os, socket\n"
            "print(os.getuid(), os.getgid())\n"
            "print([l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]])\n"
            "print([l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1])\n"
            "s = socket.socket()\n"
            "s.settimeout(2)\n"
            f"print('connected' if s.connect_ex(('127.0.0.1', {port})) == 0 else 'refused')\n"
            "try:\n    open('/etc/hermes-escape', 'w')\nexcept OSError as e:\n    print('ro', e.errno)\n"
        )
        r = await bwrap_box.run(code=code, timeout_s=20)
        lines = r.stdout.splitlines()
        assert r.exit_code == 0, r.stderr
        assert lines[0] == "65534 65534"
        assert lines[1] == "['lo']"
        assert lines[2] == "0000000000000000"
        assert lines[3] == "refused"  # the host's loopback is not the sandbox's
        assert lines[4].startswith("ro ")
    finally:
        srv.close()

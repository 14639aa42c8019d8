"""The ``hermes`` command starts fast: building its parser imports only the chosen command's
module, so ``hermes --help`` and the admin commands load neither numpy, scipy, the gateway
nor the simulator (they took 3-7 s to start when every command's module was imported)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hermes.cli import COMMANDS, build_parser

HEAVY = ("numpy", "scipy", "fastapi", "uvicorn", "zmq", "hermes.gateway", "hermes.bench",
         "hermes.sim", "hermes.core", "hermes.plan")


def _imported(*argv: str) -> set[str]:
    """The modules ``python -X importtime -m hermes.cli ARGV`` imports."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "hermes.cli", *argv],
                       capture_output=True, text=True, timeout=60)
    names = set()
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def _heavy(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == h or n.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("argv", [("--help",), ("--version",), ("runs", "list", "--help"),
                                  ("apps", "list", "--help"), ("keys", "list", "--help")])
def test_help_and_admin_commands_import_nothing_heavy(argv: tuple[str, ...]) -> None:
    names = _imported(*argv)
    assert "hermes.cli" in names
    assert _heavy(names) == []
    if argv[0].startswith("-"):
        assert "httpx" not in names  # the admin client comes with the admin commands only


def test_help_starts_in_well_under_half_a_second() -> None:
    """Wall time, with margin for a loaded machine: the best of five runs (0.08 s idle, 0.22-0.33 s
    at load average 12 on 2 cores, where the old parser took 7.2-7.7 s)."""
    import time

    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hermes.cli", "--help"], check=True,
                       capture_output=True, timeout=60)
        best = min(best, time.perf_counter() - t0)
    assert best < 0.5, f"hermes --help took {best:.2f} s"


def test_the_stub_help_of_every_command_is_its_modules_own() -> None:
    """The one-line help ``hermes --help`` shows (COMMANDS) is the one the command's module
    gives when built in full: they cannot drift apart."""
    full = build_parser()
    sub = next(a for a in full._actions if a.dest == "command")
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert set(helps) == set(COMMANDS)
    assert {name: h for name, (_, h) in COMMANDS.items()} == helps


def test_a_command_runs_through_its_own_module() -> None:
    r = subprocess.run([sys.executable, "-m", "hermes.cli", "example-config"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "[scheduler]" in r.stdout
    r = subprocess.run([sys.executable, "-m", "hermes.cli", "nosuch"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "invalid choice: 'nosuch'" in r.stderr

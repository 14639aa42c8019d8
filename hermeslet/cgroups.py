"""Per-call resource limits enforced by the kernel: one control group per tool call.

A tool call may fork: rlimits (``RLIMIT_AS``) bound each process, not the call, so five
children of 700 MB each passed a stated 1 GiB. A control group bounds the call: every
process of the call lives in one cgroup whose memory (``memory.max``, swap included) and
process count (``pids.max``) the kernel enforces, and the whole group is killed at the end.

:func:`detect` finds what this host offers, in order:

- **cgroup v2**: a directory the operator delegated (``root``, e.g. a systemd unit's
  ``Delegate=yes`` sub-cgroup, ``hermeslet run --cgroup-root``), or ``/sys/fs/cgroup/hermes``
  where the unified hierarchy is writable (running as root); the ``memory`` and ``pids``
  controllers are enabled in its ``cgroup.subtree_control``;
- **cgroup v1**: ``/sys/fs/cgroup/{memory,pids}/hermes`` where those hierarchies are mounted
  and writable (hybrid hosts, e.g. some VMs and older distributions);
- otherwise ``None``: the caller falls back to per-process rlimits and says so LOUDLY (a
  warning at startup and the metric ``hermeslet_tool_sandbox_kernel_limits{mode="rlimit"}``):
  memory is then bounded per process only, and the process count per user.

A :class:`CallCgroup` is made before the call's process starts; the child enters it itself
(:meth:`CallCgroup.enter`, between fork and exec), so that nothing the call runs is ever
outside it. No I/O at import; everything here is a small file write.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger("hermeslet.cgroups")

CGROUP_FS = Path("/sys/fs/cgroup")
Mode = Literal["cgroup2", "cgroup1", "rlimit"]
_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class CgroupRoot:
    """Where call cgroups are made: ``mode`` and the parent directories (one for v2, the
    memory and the pids hierarchy for v1)."""

    mode: Literal["cgroup2", "cgroup1"]
    dirs: tuple[Path, ...]

    def create(self, memory_bytes: int, pids: int) -> CallCgroup:
        """A fresh cgroup for one call with its limits written (raises OSError)."""
        name = f"call-{os.getpid()}-{next(_ids)}"
        made: list[Path] = []
        try:
            for parent in self.dirs:
                d = parent / name
                d.mkdir()
                made.append(d)
            if self.mode == "cgroup2":
                d = made[0]
                (d / "memory.max").write_text(f"{memory_bytes}\n")
                with contextlib.suppress(FileNotFoundError):  # no swap accounting: no file
                    (d / "memory.swap.max").write_text("0\n")
                (d / "pids.max").write_text(f"{pids}\n")
            else:
                mem, pid = made
                (mem / "memory.limit_in_bytes").write_text(f"{memory_bytes}\n")
                with contextlib.suppress(OSError):  # swap accounting off: memory alone
                    (mem / "memory.memsw.limit_in_bytes").write_text(f"{memory_bytes}\n")
                (pid / "pids.max").write_text(f"{pids}\n")
        except OSError:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
        return CallCgroup(self.mode, tuple(made))


@dataclass(frozen=True, slots=True)
class CallCgroup:
    """One tool call's cgroup (v2: one directory; v1: memory and pids directories)."""

    mode: Literal["cgroup2", "cgroup1"]
    dirs: tuple[Path, ...]

    def enter(self) -> None:
        """Move the calling process into the cgroup (the child, between fork and exec: no
        logging, no locks; ``0`` is "myself")."""
        for d in self.dirs:
            fd = os.open(d / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the call for memory."""
        name = "memory.events" if self.mode == "cgroup2" else "memory.oom_control"
        try:
            for line in (self.dirs[0] / name).read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill" and int(v) > 0:
                    return True
        except (OSError, ValueError):
            pass
        return False

    def pids(self) -> list[int]:
        out: list[int] = []
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                out += [int(x) for x in (d / "cgroup.procs").read_text().split()]
        return sorted(set(out))

    def close(self, timeout_s: float = 2.0) -> None:
        """Kill whatever of the call is left (``cgroup.kill`` on v2; SIGKILL to every
        member otherwise) and remove the cgroup. Never raises."""
        if self.mode == "cgroup2":
            with contextlib.suppress(OSError):
                (self.dirs[0] / "cgroup.kill").write_text("1\n")
        deadline = time.monotonic() + timeout_s
        while True:
            left = self.pids()
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        for d in reversed(self.dirs):
            try:
                d.rmdir()
            except OSError as e:
                log.warning("tool call cgroup %s not removed: %s", d, e)


def _v2_ready(d: Path) -> bool:
    """``d`` is a writable cgroup v2 directory with memory and pids for its children."""
    try:
        if not (d / "cgroup.controllers").is_file():
            return False
        have = set((d / "cgroup.controllers").read_text().split())
        if not {"memory", "pids"} <= have:
            return False
        enabled = set((d / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            (d / "cgroup.subtree_control").write_text("+memory +pids\n")
        probe = d / f"probe-{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def _v2(root: Path | None) -> CgroupRoot | None:
    if root is not None:
        return CgroupRoot("cgroup2", (root,)) if _v2_ready(root) else None
    top = CGROUP_FS
    if not (top / "cgroup.controllers").is_file():
        return None
    have = set((top / "cgroup.controllers").read_text().split())
    if not {"memory", "pids"} <= have:
        return None
    try:
        enabled = set((top / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            (top / "cgroup.subtree_control").write_text("+memory +pids\n")
        d = top / "hermes"
        d.mkdir(exist_ok=True)
    except OSError:
        return None
    return CgroupRoot("cgroup2", (d,)) if _v2_ready(d) else None


def _v1() -> CgroupRoot | None:
    mem, pids = CGROUP_FS / "memory", CGROUP_FS / "pids"
    if not (mem / "memory.limit_in_bytes").is_file() or not (pids / "cgroup.procs").is_file():
        return None
    try:
        dirs = (mem / "hermes", pids / "hermes")
        for d in dirs:
            d.mkdir(exist_ok=True)
            probe = d / f"probe-{os.getpid()}"
            probe.mkdir()
            probe.rmdir()
    except OSError:
        return None
    return CgroupRoot("cgroup1", dirs)


def detect(root: str | Path | None = None) -> CgroupRoot | None:
    """Where this host lets call cgroups be made (module docstring), or ``None``: ``root``
    (a delegated cgroup v2 directory) is the operator's; without it, the unified hierarchy,
    then v1's memory and pids hierarchies, are tried."""
    if root is not None:
        return _v2(Path(root))
    return _v2(None) or _v1()

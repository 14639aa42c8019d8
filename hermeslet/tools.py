"""Tool runner: run a tool call's code in a sandbox and capture what it printed.

Two sandboxes, one result type (:class:`ToolResult`):

- :class:`SubprocessSandbox` (embedded default): ``bwrap --unshare-all --die-with-parent
  --ro-bind / / --tmpfs /tmp`` when bubblewrap is on ``PATH`` (no network, read-only root, user
  nobody in its own user namespace, no capabilities, a new session), else
  a plain subprocess. In both cases the child gets resource limits (CPU seconds, address space,
  no core files) and its own process group, which is killed when the timeout expires.
- :class:`DockerSandbox` (when configured): a fresh container per call through the Docker SDK
  with ``network_mode="none"``, memory (no extra swap)/CPU/pids limits, a read-only root, user
  ``nobody`` (65534), all capabilities dropped, no-new-privileges; killed on timeout. The SDK is blocking, so it runs in a worker thread.

A tool call is either ``code`` (Python source, run with the sandbox's ``python3``) or
``command`` (an argv list). Output is truncated to ``max_output_chars`` per stream.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_OUTPUT = 64 * 1024


@dataclass(slots=True)
class ToolResult:
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    cold: bool
    timed_out: bool


@dataclass(slots=True)
class ToolLimits:
    """Per-call resource limits (subprocess: rlimits; Docker: container limits)."""

    cpu_s: int = 60
    memory_bytes: int = 1 << 30
    pids: int = 64
    cpus: float = 1.0


def _truncate(data: bytes, limit: int) -> str:
    text = data.decode("utf-8", errors="replace")
    if len(text) > limit:
        return text[:limit] + f"\n...[truncated {len(text) - limit} chars]"
    return text


def _argv(code: str | None, command: list[str] | None, python: str) -> list[str]:
    if (code is None) == (command is None):
        raise ValueError("a tool call needs exactly one of code and command")
    if code is not None:
        return [python, "-c", code]
    assert command is not None
    if not command:
        raise ValueError("empty command")
    return list(command)


class Sandbox(ABC):
    """Runs one tool call to completion (or timeout)."""

    kind: str

    @abstractmethod
    async def run(
        self,
        *,
        code: str | None = None,
        command: list[str] | None = None,
        timeout_s: float = 30.0,
        image: str | None = None,
    ) -> ToolResult: ...


class SubprocessSandbox(Sandbox):
    """Subprocess in bubblewrap (when available) with rlimits; process-group kill on timeout."""

    kind = "subprocess"

    def __init__(
        self,
        *,
        limits: ToolLimits | None = None,
        use_bwrap: bool | None = None,
        max_output_chars: int = DEFAULT_MAX_OUTPUT,
        python: str | None = None,
    ) -> None:
        self.limits = limits or ToolLimits()
        bwrap = shutil.which("bwrap")
        self.bwrap = bwrap if (use_bwrap is None or use_bwrap) and bwrap else None
        if use_bwrap and not self.bwrap:
            raise RuntimeError("bwrap requested but not on PATH")
        self.max_output_chars = max_output_chars
        self.python = python or ("python3" if self.bwrap else sys.executable)
        self._bwrap_ok: bool | None = None

    def _preexec(self) -> None:
        import resource

        cpu = int(self.limits.cpu_s)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        mem = int(self.limits.memory_bytes)
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def _wrap(self, argv: list[str]) -> list[str]:
        if not self.bwrap:
            return argv
        return [
            self.bwrap,
            "--unshare-all",
            "--unshare-user", "--uid", "65534", "--gid", "65534",  # nobody, even when run as root
            "--cap-drop", "ALL",
            "--new-session",  # no TIOCSTI into the agent's terminal
            "--die-with-parent",
            "--ro-bind", "/", "/",
            "--dev", "/dev",
            "--proc", "/proc",
            "--tmpfs", "/tmp",
            "--chdir", "/tmp",
            "--",
            *argv,
        ]  # fmt: skip

    async def _probe_bwrap(self) -> None:
        """Some hosts forbid user namespaces: fall back to a plain subprocess once, loudly."""
        if self._bwrap_ok is not None or not self.bwrap:
            return
        proc = await asyncio.create_subprocess_exec(
            *self._wrap(["true"]),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        self._bwrap_ok = proc.returncode == 0
        if not self._bwrap_ok:
            print(f"hermeslet: bwrap unusable ({err.decode().strip()}); plain subprocess",
                  file=sys.stderr)
            self.bwrap = None
            self.python = sys.executable

    async def run(
        self,
        *,
        code: str | None = None,
        command: list[str] | None = None,
        timeout_s: float = 30.0,
        image: str | None = None,
    ) -> ToolResult:
        await self._probe_bwrap()
        argv = self._wrap(_argv(code, command, self.python))
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=self._preexec,
            start_new_session=True,  # own process group: the timeout kills all of it
            cwd="/tmp",
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
                 "PYTHONDONTWRITEBYTECODE": "1"},
        )
        timed_out = False
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
        except TimeoutError:
            timed_out = True
            _killpg(proc.pid)
            out, err = await proc.communicate()
        except asyncio.CancelledError:
            _killpg(proc.pid)
            raise
        rc = proc.returncode if proc.returncode is not None else -9
        return ToolResult(
            exit_code=rc,
            stdout=_truncate(out, self.max_output_chars),
            stderr=_truncate(err, self.max_output_chars),
            duration_s=time.monotonic() - t0,
            cold=False,
            timed_out=timed_out,
        )


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def sandbox_container_options(limits: ToolLimits) -> dict[str, Any]:
    """The ``containers.create`` options of every Docker tool sandbox (one-shot or pooled):
    no network, memory without extra swap, CPU and pids limits, read-only root with a small
    ``/tmp``, user nobody (numeric: images without ``/etc/passwd``), no capabilities,
    no-new-privileges. One place, so the sandboxes cannot drift apart."""
    return {
        "network_mode": "none",
        "mem_limit": int(limits.memory_bytes),
        "memswap_limit": int(limits.memory_bytes),  # no swap beyond the memory limit
        "nano_cpus": int(limits.cpus * 1e9),
        "pids_limit": limits.pids,
        "read_only": True,
        "user": "65534:65534",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "tmpfs": {"/tmp": "size=64m"},
        "working_dir": "/tmp",
    }


def docker_client(base_url: str | None) -> Any:
    """A Docker SDK client for ``base_url`` (``None``: the environment's, e.g. DOCKER_HOST)."""
    import docker

    return docker.DockerClient(base_url=base_url) if base_url else docker.from_env()


class BlockingDockerSandbox(Sandbox):
    """A Docker sandbox whose work is a blocking SDK call (``run_blocking``), run in a worker
    thread so the event loop stays free."""

    kind = "docker"
    default_image: str

    @abstractmethod
    def run_blocking(self, argv: list[str], image: str, timeout_s: float) -> ToolResult:
        """Run ``argv`` in a container of ``image``, killed after ``timeout_s``."""

    async def run(
        self,
        *,
        code: str | None = None,
        command: list[str] | None = None,
        timeout_s: float = 30.0,
        image: str | None = None,
    ) -> ToolResult:
        argv = _argv(code, command, "python3")
        return await asyncio.to_thread(
            self.run_blocking, argv, image or self.default_image, timeout_s
        )


class DockerSandbox(BlockingDockerSandbox):
    """One container per call (``cold=True``), no network, limits, read-only root, nobody."""

    def __init__(
        self,
        *,
        base_url: str | None = None,
        limits: ToolLimits | None = None,
        default_image: str = "python:3.10-slim",
        max_output_chars: int = DEFAULT_MAX_OUTPUT,
        client: Any = None,
    ) -> None:
        self.limits = limits or ToolLimits()
        self.default_image = default_image
        self.max_output_chars = max_output_chars
        self._base_url = base_url
        self._client = client

    def _docker(self) -> Any:
        if self._client is None:
            self._client = docker_client(self._base_url)
        return self._client

    def run_blocking(self, argv: list[str], image: str, timeout_s: float) -> ToolResult:
        client = self._docker()
        t0 = time.monotonic()
        container = client.containers.create(
            image, argv, detach=True, **sandbox_container_options(self.limits)
        )
        timed_out = False
        try:
            container.start()
            try:
                status = container.wait(timeout=timeout_s)
                rc = int(status.get("StatusCode", -1))
            except Exception:  # requests' ReadTimeout / ConnectionError on timeout
                timed_out = True
                try:
                    container.kill()
                except Exception:
                    pass
                rc = -9
            out = container.logs(stdout=True, stderr=False)
            err = container.logs(stdout=False, stderr=True)
        finally:
            try:
                container.remove(force=True)
            except Exception:
                pass
        return ToolResult(
            exit_code=rc,
            stdout=_truncate(out, self.max_output_chars),
            stderr=_truncate(err, self.max_output_chars),
            duration_s=time.monotonic() - t0,
            cold=True,
            timed_out=timed_out,
        )



class ToolRunner:
    """Routes a tool call by its backend string to a sandbox.

    ``docker:IMAGE`` runs in Docker when a :class:`DockerSandbox` is configured, else in the
    subprocess sandbox (the host's Python stands in for the image). Every other backend kind
    (``api:``, ``dnn:``, ``subprocess``) runs in the subprocess sandbox.
    """

    def __init__(self, subprocess: SubprocessSandbox | None = None,
                 docker: DockerSandbox | None = None) -> None:
        self.subprocess = subprocess or SubprocessSandbox()
        self.docker = docker

    @property
    def kinds(self) -> list[str]:
        return ["subprocess", "docker"] if self.docker else ["subprocess"]

    async def run(
        self,
        backend: str,
        *,
        code: str | None = None,
        command: list[str] | None = None,
        timeout_s: float = 30.0,
    ) -> ToolResult:
        kind, _, rest = backend.partition(":")
        if kind == "docker" and self.docker is not None:
            return await self.docker.run(
                code=code, command=command, timeout_s=timeout_s, image=rest or None
            )
        return await self.subprocess.run(code=code, command=command, timeout_s=timeout_s)
